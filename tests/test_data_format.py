"""LeRobot v2.1 writer and reader: round trip, resume, LeRobot 0.3.x layout, every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tutorial_utils.data.cli import main
from tutorial_utils.data.libero_schema import LIBERO_FPS, LIBERO_ROBOT_TYPE, libero_features
from tutorial_utils.data.reader import LeRobotDataset, episode_grouped_order
from tutorial_utils.data.schema import REQUIRED_INFO_KEYS
from tutorial_utils.data.synth import generate_dataset, synth_episode
from tutorial_utils.data.video import decode_all_frames, encode_video
from tutorial_utils.data.writer import LeRobotWriter
from tutorial_utils.errors import DatasetError

SIZE = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return generate_dataset(tmp_path_factory.mktemp("ds") / "tiny", n_episodes=3, mean_length=20, image_size=SIZE)


@pytest.fixture
def copy(tiny, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(tiny, dst)
    return dst


def _episode(t=12, seed=0):
    return synth_episode(t, SIZE, np.random.default_rng(seed))


# ----------------------------------------------------------------------------- schema


def test_libero_features_schema():
    f = libero_features(256)
    assert f["observation.images.image"]["shape"] == [256, 256, 3]
    assert f["observation.images.wrist_image"]["dtype"] == "video"
    assert f["observation.state"] == {
        "dtype": "float32",
        "shape": [8],
        "names": {"motors": ["x", "y", "z", "roll", "pitch", "yaw", "gripper", "gripper"]},
    }
    assert f["action"]["shape"] == [7] and f["action"]["dtype"] == "float32"
    for k in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert f[k]["shape"] == [1]
    assert LIBERO_FPS == 20 and LIBERO_ROBOT_TYPE == "franka"
    with pytest.raises(ValueError):
        libero_features(33)


def test_lerobot_03_layout(tiny):
    """What LeRobot 0.3.x's v2.1 loader reads: info keys, paths, parquet types, video info, stats."""
    import pyarrow.parquet as pq

    info = json.loads((tiny / "meta/info.json").read_text())
    for key in REQUIRED_INFO_KEYS + ("video_path",):
        assert key in info
    assert info["codebase_version"] == "v2.1" and info["total_videos"] == 6 and info["splits"] == {"train": "0:3"}
    assert info["data_path"] == "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    vinfo = info["features"]["observation.images.image"]["info"]
    assert vinfo["video.codec"] == "h264" and vinfo["video.pix_fmt"] == "yuv420p" and vinfo["video.fps"] == 20
    schema = pq.read_schema(tiny / "data/chunk-000/episode_000000.parquet")
    assert str(schema.field("timestamp").type) == "float"
    assert str(schema.field("index").type) == "int64"
    assert schema.field("observation.state").type.list_size == 8
    table = pq.read_table(tiny / "data/chunk-000/episode_000001.parquet")
    ts = table.column("timestamp").to_numpy()
    np.testing.assert_allclose(ts, table.column("frame_index").to_numpy() / 20, atol=1e-6)
    first = json.loads((tiny / "meta/episodes.jsonl").read_text().splitlines()[0])
    assert table.column("index").to_numpy()[0] == first["length"]  # global index continues
    for name in ("episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl", "stats.json"):
        assert (tiny / "meta" / name).is_file()
    ep_stats = json.loads((tiny / "meta/episodes_stats.jsonl").read_text().splitlines()[0])["stats"]
    assert np.asarray(ep_stats["observation.images.image"]["mean"]).shape == (3, 1, 1)
    assert set(ep_stats["action"]) == {"min", "max", "mean", "std", "count"}
    # video timestamps match the parquet timestamps (LeRobot decodes by timestamp, tolerance 1e-4 s)
    import av

    with av.open(str(tiny / "videos/chunk-000/observation.images.image/episode_000001.mp4")) as c:
        times = [f.time for f in c.decode(video=0)]
    np.testing.assert_allclose(times, ts, atol=1e-4)


def test_stats_json_aggregates_episodes(tiny):
    ds = LeRobotDataset(tiny)
    stats = json.loads((tiny / "meta/stats.json").read_text())
    allstate = np.concatenate([ds.episode(i).state for i in range(ds.num_episodes)])
    np.testing.assert_allclose(stats["observation.state"]["mean"], allstate.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["observation.state"]["std"], allstate.std(0), rtol=1e-4, atol=1e-6)
    assert stats["observation.state"]["count"] == [len(allstate)]


# ----------------------------------------------------------------------------- round trip and sampling


def test_round_trip(tmp_path):
    ep = _episode(15)
    with LeRobotWriter(tmp_path / "d", libero_features(SIZE), 20) as w:
        assert w.add_episode(ep, "do it") == 0
    ds = LeRobotDataset(tmp_path / "d")
    assert len(ds) == 15 and ds.tasks == {0: "do it"} and ds.fps == 20
    e = ds.episode(0)
    np.testing.assert_array_equal(e.state, ep["observation.state"])
    np.testing.assert_array_equal(e.action, ep["action"])
    frames = e.frames("observation.images.image")
    assert frames.shape == ep["observation.images.image"].shape
    assert np.abs(frames.astype(int) - ep["observation.images.image"]).mean() < 6  # lossy h264, close


def test_sample_window_padding_and_deltas(tiny):
    ds = LeRobotDataset(tiny)
    t0 = int(ds.lengths[0])
    s = ds.sample(t0 - 3, action_horizon=8, video_delta_indices=(-2, 0, 5))
    assert s["episode_index"] == 0 and s["frame_index"] == t0 - 3
    assert s["action"].shape == (8, 7) and s["action"].dtype == np.float32
    assert s["action_mask"].tolist() == [True] * 3 + [False] * 5
    ep = ds.episode(0)
    np.testing.assert_array_equal(s["action"][3:], np.repeat(ep.action[-1:], 5, 0))
    np.testing.assert_array_equal(s["state"], ep.state[t0 - 3])
    img = s["observation.images.image"]
    assert img.shape == (3, SIZE, SIZE, 3) and img.dtype == np.uint8
    full = ep.frames("observation.images.image")
    np.testing.assert_array_equal(img[2], full[t0 - 1])  # +5 clamps to the last frame
    np.testing.assert_array_equal(img[0], full[t0 - 5])
    s2 = ds.sample(t0)  # first frame of episode 1
    assert s2["episode_index"] == 1 and s2["frame_index"] == 0 and s2["task"] == ds.tasks[s2["task_index"]]
    with pytest.raises(IndexError):
        ds.sample(len(ds))


def test_random_access_matches_sequential(tiny):
    ds = LeRobotDataset(tiny, cache_mb=0)  # force eviction between episodes
    ref = {i: ds.episode(i).frames("observation.images.wrist_image") for i in range(3)}
    rng = np.random.default_rng(0)
    for idx in rng.integers(0, len(ds), 25):
        s = ds.sample(int(idx))
        np.testing.assert_array_equal(s["observation.images.wrist_image"][0], ref[s["episode_index"]][s["frame_index"]])


def test_a_frame_asked_for_at_another_size_is_resized_once_and_cached_at_that_size(tiny, monkeypatch):
    """The training reads every frame once per epoch at the model's size: the video cache resizes it
    the first time (the same function the trainer used per sample, so the same bytes) and keeps the
    small frame, not the full-size RGB."""
    from tutorial_utils.data import images
    from tutorial_utils.train.data import LeRobotSource, WindowDataset, dataset_statistics

    key = "observation.images.image"
    full = LeRobotDataset(tiny).frame(1, key, 5)
    calls = []
    real = images.resize
    monkeypatch.setattr(images, "resize", lambda img, size: calls.append(size) or real(img, size))
    ds = LeRobotDataset(tiny)
    small = ds.frame(1, key, 5, size=16)
    assert small.shape == (16, 16, 3) and calls == [16]
    np.testing.assert_array_equal(small, real(full, 16))
    assert ds.frame(1, key, 5, size=16) is small and calls == [16]  # the second epoch: no resize
    vid = ds._video(1, key)
    assert (5, 16) in vid.resized and not isinstance(vid.frames[5], np.ndarray)  # no full-size RGB kept
    assert ds.frame(1, key, 5, size=SIZE).shape == (SIZE, SIZE, 3) and calls == [16]  # its own size: no resize
    np.testing.assert_array_equal(ds.frame(1, key, 5), full)  # full size still there for other readers
    # the training windows: same images as resizing the full-size frames per sample
    src = LeRobotSource(tiny, dataset_statistics(tiny, None))
    windows = WindowDataset(src, np.arange(len(src)), 4, 16)
    plain = LeRobotDataset(tiny)
    for k in (0, 7, len(src) - 1):
        ep, f = plain.locate(k)
        np.testing.assert_array_equal(windows[k][key], real(plain.frame(ep, key, f), 16))


def test_dataloader_workers(tiny):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    ds = LeRobotDataset(tiny)
    ds.sample(0)  # caches in the parent must not leak into workers
    order = episode_grouped_order(ds.lengths, seed=1)
    assert sorted(order.tolist()) == list(range(len(ds)))
    dl = torch.utils.data.DataLoader(ds, batch_size=8, sampler=order.tolist(), num_workers=2, collate_fn=lambda b: b)
    n = sum(len(b) for b in dl)
    assert n == len(ds)


def test_iter_episodes(tiny):
    ds = LeRobotDataset(tiny)
    eps = list(ds.iter_episodes())
    assert [e.index for e in eps] == [0, 1, 2]
    assert sum(e.length for e in eps) == len(ds)


# ----------------------------------------------------------------------------- writer: resume and atomicity


def test_writer_resume_and_discard_half_written(tmp_path):
    root = tmp_path / "d"
    w = LeRobotWriter(root, libero_features(SIZE), 20)
    w.add_episode(_episode(10, 0), "a")
    w.add_episode(_episode(11, 1), "b")
    # simulate a crash in the middle of episode 2: files written, never committed
    (root / "data/chunk-000/episode_000002.parquet").write_bytes(b"half")
    (root / "videos/chunk-000/observation.images.image/.episode_000002.mp4.xyz.mp4").write_bytes(b"tmp")
    w.close()  # the crashed writer's process is gone, and its lock with it
    w2 = LeRobotWriter(root, libero_features(SIZE), 20)
    assert w2.num_episodes == 2 and w2.num_frames == 21
    assert not (root / "data/chunk-000/episode_000002.parquet").exists()
    assert not list(root.rglob(".*.mp4"))
    assert w2.add_episode(_episode(12, 2), "a") == 2
    w2.finalize()
    ds = LeRobotDataset(root)
    assert ds.num_episodes == 3 and ds.tasks == {0: "a", 1: "b"}
    assert ds.sample(21)["index"] == 21 and ds.sample(21)["task_index"] == 0


def test_writer_refuses_a_committed_episode_with_a_missing_file(tmp_path):
    """A file of a committed episode is gone (by hand: the writer fsyncs before it commits). The
    writer refuses to resume, names the file, and deletes nothing (it used to drop the episode
    and delete its other files)."""
    root = tmp_path / "d"
    w = LeRobotWriter(root, libero_features(SIZE), 20)
    w.add_episode(_episode(10, 0), "a")
    w.add_episode(_episode(10, 1), "a")
    gone = root / "videos/chunk-000/observation.images.wrist_image/episode_000001.mp4"
    gone.unlink()
    w.close()
    before = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    with pytest.raises(DatasetError, match="lists episode 1 but this file is missing.*deleted nothing") as e:
        LeRobotWriter(root, libero_features(SIZE), 20)
    assert e.value.file == str(gone) and "move the folder aside" in e.value.fix
    assert sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()) == before


def test_writer_refuses_other_dataset(tiny, tmp_path):
    with pytest.raises(DatasetError, match="different dataset.*fps"):
        LeRobotWriter(tiny, libero_features(SIZE), 10)
    with pytest.raises(DatasetError, match="features differ"):
        LeRobotWriter(tiny, libero_features(64), 20)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not empty"):
        LeRobotWriter(tmp_path / "other", libero_features(SIZE), 20)


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    root = tmp_path / "d"
    w = LeRobotWriter(root, libero_features(SIZE), 20)
    w.add_episode(_episode(10, 0), "a")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    meta_before = {p.name: p.read_bytes() for p in (root / "meta").iterdir()}

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(w, "_write_parquet", boom)
    with pytest.raises(OSError):
        w.add_episode(_episode(10, 1), "new task")
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert {p.name: p.read_bytes() for p in (root / "meta").iterdir()} == meta_before
    monkeypatch.undo()
    assert w.add_episode(_episode(10, 1), "b") == 1
    assert w.finalize() == root
    assert LeRobotDataset(root).tasks == {0: "a", 1: "b"}


def test_finalize_idempotent(tmp_path):
    root = generate_dataset(tmp_path / "d", 2, 10, SIZE)
    snap = {p.name: p.read_bytes() for p in (root / "meta").iterdir()}
    w = LeRobotWriter(root, libero_features(SIZE), 20)
    w.finalize()
    w.finalize()
    assert {p.name: p.read_bytes() for p in (root / "meta").iterdir()} == snap


def test_add_episode_bad_frames(tmp_path):
    w = LeRobotWriter(tmp_path / "d", libero_features(SIZE), 20)
    ep = _episode(10)
    with pytest.raises(ValueError, match="missing"):
        w.add_episode({k: v for k, v in ep.items() if k != "action"}, "t")
    bad = dict(ep, action=ep["action"][:, :6])
    with pytest.raises(ValueError, match="shape"):
        w.add_episode(bad, "t")
    bad = dict(ep, **{"observation.images.image": ep["observation.images.image"].astype(np.float32)})
    with pytest.raises(ValueError, match="uint8"):
        w.add_episode(bad, "t")
    nan = ep["action"].copy()
    nan[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        w.add_episode(dict(ep, action=nan), "t")
    with pytest.raises(ValueError, match="task"):
        w.add_episode(ep, "")
    assert w.num_episodes == 0 and not list((tmp_path / "d").rglob("*.parquet"))


# ----------------------------------------------------------------------------- bad input on open


def _edit_info(root, **changes):
    p = root / "meta/info.json"
    info = json.loads(p.read_text())
    for k, v in changes.items():
        if v is None:
            info.pop(k)
        else:
            info[k] = v
    p.write_text(json.dumps(info))


def test_missing_info(copy):
    (copy / "meta/info.json").unlink()
    with pytest.raises(DatasetError, match=r"info\.json.*missing.*Fix: point at the dataset root"):
        LeRobotDataset(copy)


@pytest.mark.parametrize("key", ["fps", "features", "codebase_version", "data_path"])
def test_missing_info_key(copy, key):
    _edit_info(copy, **{key: None})
    with pytest.raises(DatasetError, match=rf"\[{key}\]: required key is missing"):
        LeRobotDataset(copy)


@pytest.mark.parametrize("version,hint", [("v3.0", "v2.1 revision"), ("v2.0", "convert")])
def test_unsupported_version(copy, version, hint):
    _edit_info(copy, codebase_version=version)
    with pytest.raises(DatasetError, match=rf"codebase_version.*{version}.*Fix: .*{hint}"):
        LeRobotDataset(copy)


def _rewrite_parquet(path, drop=None, replace=None):
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if drop:
        table = table.drop_columns([drop])
    if replace:
        name, arr = replace
        table = table.set_column(table.column_names.index(name), name, arr)
    pq.write_table(table, path)


def test_parquet_missing_column(copy):
    _rewrite_parquet(copy / "data/chunk-000/episode_000001.parquet", drop="action")
    with pytest.raises(DatasetError, match=r"episode_000001\.parquet \[action\]: column is missing"):
        LeRobotDataset(copy)


def test_parquet_wrong_shape_fixed(copy):
    import pyarrow as pa

    p = copy / "data/chunk-000/episode_000000.parquet"
    import pyarrow.parquet as pq

    n = pq.read_metadata(p).num_rows
    arr = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 6, np.float32)), 6)
    _rewrite_parquet(p, replace=("observation.state", arr))
    with pytest.raises(DatasetError, match=r"\[observation\.state\]: rows hold 6 values.*shape \[8\]"):
        LeRobotDataset(copy)


def test_parquet_wrong_shape_variable_list(copy):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = copy / "data/chunk-000/episode_000002.parquet"
    n = pq.read_metadata(p).num_rows
    arr = pa.array([[0.0] * 7] * n, type=pa.list_(pa.float32()))  # a variable list with 7 values
    _rewrite_parquet(p, replace=("observation.state", arr))
    ds = LeRobotDataset(copy)  # variable lists can only be checked when read
    with pytest.raises(DatasetError, match=r"\[observation\.state\]: rows hold 7\.\.7 values"):
        ds.sample(len(ds) - 1)
    with pytest.raises(DatasetError):
        ds.validate(deep=True)


def test_episode_length_disagrees(copy):
    p = copy / "meta/episodes.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    rows[1]["length"] += 1
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _edit_info(copy, total_frames=sum(r["length"] for r in rows))
    with pytest.raises(DatasetError, match=r"episode_000001\.parquet \[length\]: meta/episodes\.jsonl says episode 1"):
        LeRobotDataset(copy)


def test_total_frames_disagrees(copy):
    _edit_info(copy, total_frames=1)
    with pytest.raises(DatasetError, match=r"\[total_frames\]"):
        LeRobotDataset(copy)


def test_missing_mp4(copy):
    (copy / "videos/chunk-000/observation.images.wrist_image/episode_000002.mp4").unlink()
    with pytest.raises(DatasetError, match=r"episode_000002\.mp4 \[observation\.images\.wrist_image\]: video.*missing"):
        LeRobotDataset(copy, verify_videos=False)


def test_truncated_mp4(copy):
    p = copy / "videos/chunk-000/observation.images.image/episode_000001.mp4"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(DatasetError, match=r"episode_000001\.mp4.*truncated.*Fix: re-download"):
        LeRobotDataset(copy, verify_videos=True)
    ds = LeRobotDataset(copy, verify_videos=False)  # a fast open misses it; decoding names the file
    with pytest.raises(DatasetError, match=r"episode_000001\.mp4"):
        for i in range(int(ds.starts[1]), int(ds.starts[1] + ds.lengths[1])):
            ds.sample(i)


def test_video_fewer_frames_than_parquet(copy):
    p = copy / "videos/chunk-000/observation.images.image/episode_000000.mp4"
    frames = decode_all_frames(p)
    encode_video(p, frames[:-4], 20)
    with pytest.raises(DatasetError, match=r"video has \d+ frames but the parquet has \d+ rows"):
        LeRobotDataset(copy, verify_videos=True)
    ds = LeRobotDataset(copy, verify_videos=False)
    with pytest.raises(DatasetError, match=r"video ends before frame \d+ but the parquet has \d+ rows"):
        ds.sample(int(ds.lengths[0]) - 1)


def test_bad_jsonl(copy):
    (copy / "meta/tasks.jsonl").write_text("{not json\n{}\n")
    with pytest.raises(DatasetError, match=r"tasks\.jsonl \[line 1\]: not valid JSON"):
        LeRobotDataset(copy)


def test_cli_info_validate_generate(tmp_path, capsys):
    root = tmp_path / "g"
    assert main(["generate", str(root), "--episodes", "2", "--length", "8", "--image-size", "32"]) == 0
    assert main(["validate", str(root), "--deep"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ok"] is True
    assert main(["info", str(root)]) == 0
    (root / "meta/info.json").unlink()
    assert main(["validate", str(root)]) == 1
    assert "Fix:" in capsys.readouterr().err


def test_seek_random_access_long_episode(tmp_path):
    """Far and backward jumps seek to a keyframe; the frames still match a full decode."""
    root = generate_dataset(tmp_path / "long", n_episodes=2, lengths=[90, 70], image_size=SIZE)
    ds = LeRobotDataset(root, cache_mb=0)
    ref = [ds.episode(i).frames("observation.images.image") for i in range(2)]
    order = [85, 3, 60, 59, 89, 0, 40, 90 + 65, 90 + 2, 41, 90 + 69, 20]
    for idx in order:
        s = ds.sample(idx)
        np.testing.assert_array_equal(s["observation.images.image"][0], ref[s["episode_index"]][s["frame_index"]])


def test_a_second_writer_on_the_same_dataset_is_refused(tmp_path):
    from tutorial_utils.data.libero_schema import libero_features
    from tutorial_utils.data.writer import LeRobotWriter
    from tutorial_utils.errors import DatasetError

    root = tmp_path / "ds"
    first = LeRobotWriter(root, libero_features(32), fps=20)
    with pytest.raises(DatasetError, match="another writer .* is writing this dataset"):
        LeRobotWriter(root, libero_features(32), fps=20)
    first.close()
    second = LeRobotWriter(root, libero_features(32), fps=20)  # free again once the first is done
    second.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ds.writer.lock", "ds"]
