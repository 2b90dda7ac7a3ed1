"""stats_gr00t.json, the step index, dataset_statistics.json and the cache that knows when it is stale."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import numpy as np
import pytest

from tutorial_utils.data import stats as st
from tutorial_utils.data.libero_schema import libero_features
from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.data.synth import generate_dataset, synth_episode
from tutorial_utils.data.writer import LeRobotWriter
from tutorial_utils.errors import DatasetError


@pytest.fixture
def root(tmp_path):
    return generate_dataset(tmp_path / "d", n_episodes=3, mean_length=20, image_size=32)


def test_matches_pandas_reference(root):
    res = st.compute_all(root)
    ref = st.reference_stats_pandas(root)
    assert set(res["stats_gr00t"]) == set(ref)
    for col in ref:
        for k in st.STAT_KEYS:
            np.testing.assert_allclose(res["stats_gr00t"][col][k], ref[col][k], rtol=1e-9, atol=1e-9)
    assert st.max_difference(res["stats_gr00t"], ref) < 1e-9
    ref["action"]["q99"][6] += 0.5
    assert st.max_difference(res["stats_gr00t"], ref) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="different columns"):
        st.max_difference(res["stats_gr00t"], {"action": ref["action"]})
    assert json.loads((root / st.STATS_GR00T_PATH).read_text()) == res["stats_gr00t"]


def test_step_index_safe_format(root):
    res = st.compute_all(root)
    idx = st.load_step_index(root)
    ds = LeRobotDataset(root)
    assert len(idx["trajectory_ids"]) == len(ds) == res["num_transitions"]
    assert res["num_trajectories"] == 3
    assert idx["base_indices"][: ds.lengths[0]].tolist() == list(range(ds.lengths[0]))
    assert idx["trajectory_ids"].dtype == np.int64
    assert not (root / st.STEPS_PKL_PATH).exists()  # pickle only on request


def test_pkl_only_on_request(root):
    st.compute_all(root, write_pkl=True)
    raw = (root / st.STEPS_PKL_PATH).read_bytes()
    payload = pickle.loads(raw)  # the test reads a pickle the project itself just wrote
    assert set(payload) == {
        "config_key",
        "steps",
        "num_trajectories",
        "total_steps",
        "computed_timestamp",
        "delete_pause_frame",
    }
    assert payload["steps"][0] == (0, 0) and payload["total_steps"] == len(payload["steps"])


def test_dataset_statistics_franka(root, tmp_path):
    res = st.compute_all(root, run_dir=tmp_path / "run")
    d = json.loads((tmp_path / "run/dataset_statistics.json").read_text())
    assert d == res["dataset_statistics"]
    fr = d["franka"]
    assert fr["action"]["mask"] == [True] * 6 + [False]
    assert len(fr["state"]["mean"]) == 8 and len(fr["action"]["q99"]) == 7
    assert fr["num_trajectories"] == 3 and fr["num_transitions"] == len(LeRobotDataset(root))
    with pytest.raises(ValueError, match="mask"):
        st.dataset_statistics(res["stats_gr00t"], 1, 1, action_mask=[True])


def test_cache_hit_and_stale_recompute(root):
    first = st.compute_all(root)
    assert first["cached"] is False
    second = st.compute_all(root)
    assert second["cached"] is True and second["stats_gr00t"] == first["stats_gr00t"]
    # the data changes: one more episode -> the cache is stale, stats change
    w = LeRobotWriter(root, libero_features(32), 20)
    ep = synth_episode(30, 32, np.random.default_rng(9))
    ep["action"][:] = 0.9
    w.add_episode(ep, "new")
    w.finalize()
    third = st.compute_all(root)
    assert third["cached"] is False and third["num_trajectories"] == 4
    assert third["stats_gr00t"]["action"]["max"] != first["stats_gr00t"]["action"]["max"]
    assert st.load_step_index(root)["trajectory_ids"].max() == 3


def test_cache_stale_after_in_place_rewrite(root):
    import pyarrow.parquet as pq

    st.compute_all(root)
    p = root / "data/chunk-000/episode_000000.parquet"
    table = pq.read_table(p)
    pq.write_table(table, p)  # same content, new file: mtime changes
    os.utime(p, ns=(1, 1))
    assert st.compute_all(root)["cached"] is False


def test_corrupt_or_foreign_stats_recomputed(root):
    st.compute_all(root)
    (root / st.STATS_GR00T_PATH).write_text("{broken")
    assert st.compute_all(root)["cached"] is False
    (root / st.CACHE_PATH).unlink()  # e.g. a downloaded dataset with upstream stats
    assert st.compute_all(root)["cached"] is False
    assert st.compute_all(root, force=True)["cached"] is False


def test_stale_pickle_is_refreshed(root):
    st.compute_all(root, write_pkl=True)
    before = (root / st.STEPS_PKL_PATH).read_bytes()
    w = LeRobotWriter(root, libero_features(32), 20)
    w.add_episode(synth_episode(5, 32, np.random.default_rng(1)), "x")
    w.finalize()
    st.compute_all(root)
    assert (root / st.STEPS_PKL_PATH).read_bytes() != before


def test_bad_dataset(tmp_path):
    with pytest.raises(DatasetError, match="info.json is missing"):
        st.compute_all(tmp_path)
    root = generate_dataset(tmp_path / "d", n_episodes=1, mean_length=5, image_size=32)
    shutil.rmtree(root / "data")
    with pytest.raises(DatasetError, match="no parquet files"):
        st.compute_all(root)


def _rewrite(path, fn):
    import pyarrow.parquet as pq

    pq.write_table(fn(pq.read_table(path)), path)


@pytest.fixture
def root4(tmp_path):
    return generate_dataset(tmp_path / "d4", n_episodes=4, mean_length=12, image_size=32)


def test_bad_parquet_files_are_named(root4):
    """Each broken episode file gives a DatasetError naming that file (and the column), and no
    statistics file is written from a half-read dataset."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ep2 = root4 / "data/chunk-000/episode_000002.parquet"
    good = ep2.read_bytes()

    _rewrite(ep2, lambda t: t.drop_columns(["task_index"]))
    with pytest.raises(DatasetError, match="column is missing") as e:
        st.compute_all(root4)
    assert e.value.file == str(ep2) and e.value.key == "task_index"

    ep2.write_bytes(good)  # columns in another order: read by name, same statistics as before
    _rewrite(ep2, lambda t: t.select(list(reversed(t.column_names))))
    ref = st.reference_stats_pandas(root4)
    res = st.compute_all(root4)
    for col in ref:  # a file read by position would mix up columns here
        for k in st.STAT_KEYS:
            np.testing.assert_allclose(res["stats_gr00t"][col][k], ref[col][k], rtol=1e-9, atol=1e-12)

    ep2.write_bytes(good)  # another writer marks a column non-nullable: same values, read as usual
    _rewrite(
        ep2,
        lambda t: t.cast(
            t.schema.set(t.schema.get_field_index("frame_index"), t.schema.field("frame_index").with_nullable(False))
        ),
    )
    assert st.max_difference(st.compute_all(root4, force=True)["stats_gr00t"], ref) < 1e-9

    ep2.write_bytes(good)
    _rewrite(
        ep2,
        lambda t: t.set_column(
            t.column_names.index("frame_index"), "frame_index", pc.cast(t.column("frame_index"), pa.float64())
        ),
    )
    with pytest.raises(DatasetError, match="column type double differs from int64") as e:
        st.compute_all(root4, force=True)
    assert e.value.file == str(ep2) and e.value.key == "frame_index"

    ep2.write_bytes(good[: len(good) // 2])  # a truncated download
    with pytest.raises(DatasetError, match="not a readable parquet file") as e:
        st.compute_all(root4, force=True)
    assert e.value.file == str(ep2)

    ep2.write_bytes(good)
    _rewrite(
        ep2,
        lambda t: t.set_column(
            t.column_names.index("action"),
            "action",
            pa.array([row[:5] for row in t.column("action").to_pylist()], pa.list_(pa.float32())),
        ),
    )
    with pytest.raises(DatasetError, match="column type") as e:  # list<float> vs fixed_size_list[7]
        st.compute_all(root4, force=True)
    assert e.value.file == str(ep2) and e.value.key == "action"

    # the same parquet layout, but without the stored Arrow schema the lists read back variable-size
    ep2.write_bytes(good)
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(ep2), ep2, store_schema=False)
    with pytest.raises(DatasetError, match="column type list<element: float> differs") as e:
        st.compute_all(root4, force=True)
    assert e.value.file == str(ep2) and e.value.key == "observation.state"


def test_wrong_row_width_is_named(root4):
    """Variable-length list columns (as some writers store them) with a row of the wrong width."""
    import pyarrow as pa

    def as_lists(t, cut=False):
        rows = t.column("action").to_pylist()
        if cut:
            rows[3] = rows[3][:6]
        return t.set_column(t.column_names.index("action"), "action", pa.array(rows, pa.list_(pa.float32())))

    files = sorted((root4 / "data/chunk-000").glob("*.parquet"))
    for f in files:
        _rewrite(f, as_lists)
    assert len(st.compute_all(root4)["stats_gr00t"]["action"]["mean"]) == 7  # list<float> is fine
    written = {p: (root4 / p).read_bytes() for p in (st.STATS_GR00T_PATH, st.STEP_INDEX_PATH, st.CACHE_PATH)}
    _rewrite(files[1], lambda t: as_lists(t, cut=True))
    with pytest.raises(DatasetError, match=r"rows hold 6..7 values, meta/info.json says shape \[7\]") as e:
        st.compute_all(root4)
    assert e.value.file == str(files[1]) and e.value.key == "action"
    assert {p: (root4 / p).read_bytes() for p in written} == written  # nothing half-written


def test_cli_stats(root, tmp_path, capsys):
    from tutorial_utils.data.cli import main

    assert main(["stats", str(root), "--run-dir", str(tmp_path / "run")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["cached"] is False and out["num_trajectories"] == 3
    assert (tmp_path / "run/dataset_statistics.json").is_file()


def test_in_memory_statistics_have_a_datasets_layout():
    """The synthetic source and chapter 2's one-episode statistics are computed like a recorded
    dataset's dataset_statistics.json (data.stats.statistics_of), not built by hand."""
    from tutorial_utils.data import stats as S
    from tutorial_utils.report.concepts import action_statistics
    from tutorial_utils.train.data import synthetic_source

    src = synthetic_source(n_episodes=2, length=8, image_size=16)
    block = src.statistics["franka"]
    assert set(block["action"]) == {*S.STAT_KEYS, "mask"} and set(block["state"]) == set(S.STAT_KEYS)
    assert block["action"]["mask"] == S.FRANKA_ACTION_MASK and block["num_trajectories"] == 2
    assert (
        block["action"]
        == S.dataset_statistics(
            {"action": S.column_stats(src.action), "observation.state": S.column_stats(src.state)}, 2, len(src.action)
        )["franka"]["action"]
    )
    one = action_statistics(src.action)["franka"]
    assert one["action"] == block["action"] and one["state"] == {} and one["num_transitions"] == len(src.action)
