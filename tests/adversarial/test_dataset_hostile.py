"""Hostile and unlucky datasets (issue 15): every case ends in a DatasetError that names the file,
the key and the fix, and nothing is deleted or computed from bad data.

- the writer resuming a folder whose commit log (meta/episodes.jsonl) is missing, unreadable or
  inconsistent refuses and deletes nothing (it used to count 0 episodes and delete every file);
- info.json path templates stay inside the dataset folder, and files that resolve outside it
  (symlinks) do not validate;
- malformed metadata gives teaching errors, not tracebacks; an empty dataset does not validate;
- NaN/inf fail `validate --deep` and `stats`; a column of strings fails validate, and `stats`
  blames the file that holds it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tutorial_utils.data import stats as st
from tutorial_utils.data.cli import main as dataset_cli
from tutorial_utils.data.libero_schema import LIBERO_FPS, libero_features
from tutorial_utils.data.modality import ModalityError, build_modality, validate_modality
from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.data.synth import generate_dataset
from tutorial_utils.data.writer import LeRobotWriter
from tutorial_utils.errors import DatasetError

SIZE = 32
EP0 = "data/chunk-000/episode_000000.parquet"
EP1 = "data/chunk-000/episode_000001.parquet"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return generate_dataset(tmp_path_factory.mktemp("hostile") / "base", n_episodes=2, mean_length=8, image_size=SIZE)


@pytest.fixture(scope="module")
def base4(tmp_path_factory) -> Path:
    return generate_dataset(tmp_path_factory.mktemp("hostile4") / "base", n_episodes=4, mean_length=6, image_size=SIZE)


@pytest.fixture
def ds(base, tmp_path) -> Path:
    return shutil.copytree(base, tmp_path / "ds")


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def data_snapshot(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(root).items() if k.startswith(("data/", "videos/"))}


def edit_json(path: Path, fn) -> None:
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def edit_jsonl(path: Path, fn) -> None:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    path.write_text("".join(json.dumps(r) + "\n" for r in fn(rows)))


def open_writer(root: Path) -> LeRobotWriter:
    return LeRobotWriter(root, libero_features(SIZE), LIBERO_FPS)


def rewrite_column(path: Path, key: str, fn) -> None:
    """Rewrite one list column of a parquet file: ``fn`` maps its (T, D) float32 values."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    col = table.column(key).combine_chunks()
    values = col.flatten().to_numpy().reshape(len(col), -1).copy()
    values = fn(values)
    new = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    pq.write_table(table.set_column(table.column_names.index(key), key, new), path)


# ----------------------------------------------------------------------------- 1. the writer's resume


def assert_refused_and_untouched(root: Path, match: str) -> DatasetError:
    before = snapshot(root)
    with pytest.raises(DatasetError, match=match) as e:
        open_writer(root)
    assert "deleted nothing" in e.value.problem and "move the folder aside" in e.value.fix
    assert snapshot(root) == before  # not one file deleted or rewritten
    return e.value


def test_writer_refuses_when_the_commit_log_is_missing(ds):
    (ds / "meta/episodes.jsonl").unlink()
    err = assert_refused_and_untouched(ds, r"episodes\.jsonl \(the commit log\) is missing.*total_episodes 2")
    assert err.file == str(ds / "meta/episodes.jsonl")
    assert "6 episode files on disk (episodes 0..1" in err.problem  # says what is there


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda rows: [dict(rows[0], episode_index="0"), rows[1]], r"\[line 1: episode_index\].*found '0'"),
        (lambda rows: [rows[0], dict(rows[1], episode_index=2)], r"\[line 2: episode_index\].*expected .*1, found 2"),
        (lambda rows: [rows[0], dict(rows[1], episode_index=True)], r"\[line 2: episode_index\]"),
        (lambda rows: [dict(rows[0], length="8"), rows[1]], r"\[line 1: length\].*whole number"),
        (lambda rows: [dict(rows[0], tasks="abc"), rows[1]], r"\[line 1: tasks\]"),
        (lambda rows: [rows[0], rows[0]], r"line 2: episode_index"),
        (lambda rows: [rows[0]], r"info\.json \[total_episodes\]: says 2 but meta/episodes\.jsonl lists 1"),
        (lambda rows: [rows[0], dict(rows[1], length=rows[1]["length"] + 1)], r"\[length\].*parquet has \d+ rows"),
    ],
    ids=["string-index", "gap", "bool-index", "string-length", "tasks-not-list", "duplicate", "lost-line", "length"],
)
def test_writer_refuses_an_inconsistent_commit_log(ds, mutate, match):
    edit_jsonl(ds / "meta/episodes.jsonl", mutate)
    assert_refused_and_untouched(ds, match)


@pytest.mark.parametrize(
    "content,match",
    [(b"\xff\xfe{garbage\n", "not UTF-8"), (b'{"episode_index": 0,\n', "not valid JSON"), (b"[1, 2]\n", "JSON object")],
    ids=["not-utf8", "not-json", "not-object"],
)
def test_writer_refuses_an_unreadable_commit_log(ds, content, match):
    (ds / "meta/episodes.jsonl").write_bytes(content)
    assert_refused_and_untouched(ds, match)


def test_writer_refuses_episode_files_the_log_does_not_list(base4, tmp_path):
    """The log and info.json agree on 2 episodes, but the parquet and mp4 files of episodes 2 and 3
    are there: only episode 2's files could be an interrupted write, episode 3's cannot."""
    root = shutil.copytree(base4, tmp_path / "d")
    edit_jsonl(root / "meta/episodes.jsonl", lambda rows: rows[:2])
    edit_json(root / "meta/info.json", lambda i: i.update(total_episodes=2))
    assert_refused_and_untouched(
        root, r"episode file\(s\) that meta/episodes\.jsonl \(2 episodes\) does not account for"
    )


def test_writer_refuses_a_committed_episode_with_an_unreadable_parquet(ds):
    (ds / EP1).write_bytes(b"PAR1 not really")
    assert_refused_and_untouched(ds, r"episode_000001\.parquet \[episode 1\]: not a readable parquet file")


def test_writer_refuses_an_unreadable_info_json_and_changes_nothing(ds):
    (ds / "meta/info.json").write_bytes(b"\x80\x81")
    before = snapshot(ds)
    with pytest.raises(DatasetError, match="not UTF-8.*Fix: the writer changed nothing"):
        open_writer(ds)
    assert snapshot(ds) == before


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("fps", "20", "different dataset.*fps '20'"),
        ("features", "float32", r"\[features\]: must be a non-empty object"),
        ("chunks_size", 0, r"\[chunks_size\]: must be between 1"),
        ("data_path", "../x/{episode_index}.parquet", "different dataset.*data_path"),
    ],
)
def test_writer_refuses_malformed_info_without_a_traceback(ds, key, value, match):
    edit_json(ds / "meta/info.json", lambda i: i.update({key: value}))
    before = snapshot(ds)
    with pytest.raises(DatasetError, match=match):
        open_writer(ds)
    assert snapshot(ds) == before


def test_writer_still_resumes_a_genuine_interrupted_episode(ds):
    """The legitimate case: episode 2 was being written (its files there, not committed), and a
    temporary file of an atomic write was left behind. Resume removes exactly those."""
    for sub in ("data/chunk-000", "videos/chunk-000/observation.images.image"):
        src = next((ds / sub).glob("episode_000001.*"))
        shutil.copy(src, src.with_name(src.name.replace("000001", "000002")))
    (ds / "meta/.info.json.tmp123").write_text("half")
    kept = data_snapshot(ds)
    w = open_writer(ds)
    try:
        assert w.num_episodes == 2
        assert not list(ds.rglob("episode_000002.*")) and not (ds / "meta/.info.json.tmp123").exists()
        assert data_snapshot(ds) == {k: v for k, v in kept.items() if "000002" not in k}
    finally:
        w.close()


def test_writer_resumes_a_recording_killed_before_its_first_commit(tmp_path):
    """info.json written, no commit log yet, episode 0 half written: resume starts from 0."""
    root = tmp_path / "d"
    open_writer(root).close()
    (root / "data/chunk-000").mkdir(parents=True)
    (root / EP0).write_bytes(b"half")
    w = open_writer(root)
    try:
        assert w.num_episodes == 0 and not (root / EP0).exists()
    finally:
        w.close()


def test_record_refuses_instead_of_re_recording(tmp_path):
    """`record` used to re-record silently after the writer deleted everything."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers import fake_record_item as fake_item
    from helpers import record_config as cfg
    from tutorial_utils.sim import record as rec

    root = tmp_path / "ds"
    rec.record(root, cfg(), episode_fn=fake_item, progress=False, log=None)
    (root / "meta/episodes.jsonl").unlink()
    before = snapshot(root)
    calls = []

    def counting(c, it):
        calls.append(it)
        return fake_item(c, it)

    with pytest.raises(DatasetError, match="commit log.*missing"):
        rec.record(root, cfg(), episode_fn=counting, progress=False, log=None)
    assert calls == [] and snapshot(root) == before


# ----------------------------------------------------------------------------- 2. paths stay inside the root


@pytest.mark.parametrize(
    "key,template,match",
    [
        ("data_path", "../outside/episode_{episode_index:06d}.parquet", "leaves the dataset folder"),
        ("data_path", "data/../../outside/episode_{episode_index:06d}.parquet", "leaves the dataset folder"),
        ("data_path", "/etc/passwd", "absolute path"),
        ("data_path", "ABS/episode_{episode_index:06d}.parquet", "absolute path"),
        ("data_path", "data/{episode_index:06d}/{user}.parquet", r"unknown field \{user\}"),
        ("data_path", "data/{video_key}/{episode_index}.parquet", r"unknown field \{video_key\}"),
        ("data_path", "data/{}.parquet", r"unknown field \{\}"),
        ("data_path", "data/{episode_index.real}.parquet", "unknown field"),
        ("data_path", "data/{episode_index:c}{episode_index:c}/x.parquet", "unsupported format"),
        ("data_path", "data/{episode_index!r}.parquet", "unsupported format"),
        ("data_path", "data/{episode_index", "not a valid path template"),
        ("data_path", 7, "must be a path template string"),
        ("video_path", "../videos/{video_key}/episode_{episode_index:06d}.mp4", "leaves the dataset folder"),
        ("video_path", "videos/{video_key}/{camera}.mp4", r"unknown field \{camera\}"),
    ],
)
def test_path_templates_are_confined_to_the_dataset(ds, tmp_path, key, template, match):
    if isinstance(template, str) and template.startswith("ABS/"):
        template = str(tmp_path / "outside") + template[3:]
    # the files the template points at exist outside the dataset: the error is the template's
    for ep in (0, 1):
        out = tmp_path / "outside" / f"episode_{ep:06d}.parquet"
        out.parent.mkdir(exist_ok=True)
        shutil.copy(ds / f"data/chunk-000/episode_{ep:06d}.parquet", out)
    edit_json(ds / "meta/info.json", lambda i: i.update({key: template}))
    with pytest.raises(DatasetError, match=match) as e:
        LeRobotDataset(ds)
    assert e.value.key.startswith(key) and "LeRobot v2.1 template" in e.value.fix
    assert dataset_cli(["validate", str(ds)]) == 1


def test_a_video_feature_named_to_escape_is_refused(ds):
    def rename(info):
        info["features"]["../../../escaped"] = info["features"].pop("observation.images.wrist_image")

    edit_json(ds / "meta/info.json", rename)
    with pytest.raises(DatasetError, match=r"\[video_path / features\.\.\./\.\./\.\./escaped\].*leaves the dataset"):
        LeRobotDataset(ds)


def test_files_that_resolve_outside_the_root_do_not_validate(ds, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere.parquet"
    shutil.move(ds / EP0, elsewhere)
    (ds / EP0).symlink_to(elsewhere)
    with pytest.raises(DatasetError, match="resolves to .*outside the dataset folder") as e:
        LeRobotDataset(ds).validate()
    assert e.value.file == str(ds / EP0) and "cp -rL" in e.value.fix
    assert dataset_cli(["validate", str(ds)]) == 1
    assert "outside the dataset folder" in capsys.readouterr().err


def test_a_symlinked_dataset_root_still_validates(ds, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(ds)
    assert LeRobotDataset(link).validate()["ok"] is True


# ----------------------------------------------------------------------------- 3. teaching errors


@pytest.mark.parametrize("name", ["episodes.jsonl", "tasks.jsonl", "stats.json", "episodes_stats.jsonl"])
def test_non_utf8_metadata_is_named(ds, name):
    (ds / "meta" / name).write_bytes(b'{"a": "\xff\xfe"}\n')
    with pytest.raises(DatasetError, match=r"not UTF-8 text") as e:
        LeRobotDataset(ds).validate()
    assert e.value.file == str(ds / "meta" / name) and e.value.fix


def test_non_utf8_modality_json_is_named(ds):
    build_modality(ds)
    (ds / "meta/modality.json").write_bytes(b"\xff{}")
    with pytest.raises(ModalityError, match=r"modality\.json: not UTF-8"):
        validate_modality(ds)
    assert dataset_cli(["validate", str(ds)]) == 1


@pytest.mark.parametrize(
    "content,match",
    [
        (b"{broken", r"stats\.json: not valid JSON"),
        (b"[1, 2, 3]", r"stats\.json: expected a JSON object"),
        (b'{"action": "big"}', r"stats\.json \[action\]: expected an object"),
        (b'{"action": {"mean": "abc"}}', r"stats\.json \[action\.mean\]: expected numbers"),
        (b'{"action": {"mean": [[1, 2], [3]]}}', r"stats\.json \[action\.mean\]: expected numbers"),
    ],
)
def test_invalid_stats_json_is_named(ds, content, match):
    (ds / "meta/stats.json").write_bytes(content)
    with pytest.raises(DatasetError, match=match) as e:
        LeRobotDataset(ds)
    assert "finalize()" in e.value.fix


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda i: i.update(fps="20"), r"\[fps\]: must be a whole number, found '20'"),
        (lambda i: i.update(fps=0), r"\[fps\]: must be between 1"),
        (lambda i: i.update(fps=None), r"\[fps\]: must be a whole number"),
        (lambda i: i.update(chunks_size=0), r"\[chunks_size\]: must be between 1"),
        (lambda i: i.update(total_frames="19"), r"\[total_frames\]: must be a whole number"),
        (lambda i: i["features"]["action"].update(shape=["7"]), r"\[features\.action\.shape\]: must be a whole"),
        (lambda i: i["features"]["action"].update(shape=7), r"\[features\.action\.shape\]: must be a list"),
        (lambda i: i["features"]["action"].update(shape=[]), r"\[features\.action\.shape\]: must be a list"),
        (lambda i: i["features"]["action"].update(shape=[7.5]), r"\[features\.action\.shape\]: must be a whole"),
        (lambda i: i["features"]["action"].update(dtype="object"), r"\[features\.action\.dtype\]: unknown dtype"),
        (lambda i: i["features"]["action"].update(dtype=["float32"]), r"\[features\.action\.dtype\]: unknown dtype"),
        (lambda i: i["features"].update(action="float32"), r"\[features\.action\]: must be an object"),
        (lambda i: i["features"].update(action=["dtype", "shape"]), r"\[features\.action\]: must be an object"),
        (lambda i: i["features"]["observation.images.image"].update(shape=[32, 32]), r"\[height, width, channels\]"),
        (lambda i: i["features"]["task_index"].update(shape=[2]), r"\[task_index\]: column holds scalars"),
        (lambda i: i.update(features=[]), r"\[features\]: must be a non-empty object"),
    ],
)
def test_malformed_info_json_gives_teaching_errors(ds, edit, match):
    edit_json(ds / "meta/info.json", edit)
    with pytest.raises(DatasetError, match=match) as e:
        LeRobotDataset(ds)
    assert e.value.fix


@pytest.mark.parametrize(
    "file,mutate,match",
    [
        ("episodes.jsonl", lambda r: [dict(r[0], length="8"), r[1]], r"\[line 1: length\]: must be a whole number"),
        ("episodes.jsonl", lambda r: [dict(r[0], length=-1), r[1]], r"\[line 1: length\]: must be between 1"),
        ("episodes.jsonl", lambda r: [dict(r[0], episode_index="0"), r[1]], r"\[line 1: episode_index\]"),
        ("episodes.jsonl", lambda r: [dict(r[0], tasks=[1]), r[1]], r"\[line 1: tasks\]"),
        ("tasks.jsonl", lambda r: [dict(r[0], task_index="0")], r"\[line 1: task_index\]: must be a whole number"),
        ("tasks.jsonl", lambda r: [dict(r[0], task=["a"])], r"\[line 1: task\]: must be a string"),
        ("tasks.jsonl", lambda r: [{"task": "x"}], r"\[line 1: task_index\]: required key is missing"),
    ],
)
def test_malformed_jsonl_rows_give_teaching_errors(ds, file, mutate, match):
    edit_jsonl(ds / "meta" / file, mutate)
    with pytest.raises(DatasetError, match=match):
        LeRobotDataset(ds)


@pytest.mark.parametrize("line", [b"[1, 2]", b"7", b'"text"', b"null"])
def test_a_jsonl_line_that_is_not_an_object_is_named(ds, line):
    (ds / "meta/tasks.jsonl").write_bytes(line + b"\n")
    with pytest.raises(DatasetError, match=r"tasks\.jsonl \[line 1\]: expected a JSON object"):
        LeRobotDataset(ds)


def test_an_empty_dataset_does_not_validate(tmp_path, capsys):
    root = tmp_path / "empty"
    with open_writer(root):
        pass  # finalize() with no episode
    ds = LeRobotDataset(root)
    assert ds.num_episodes == 0
    with pytest.raises(DatasetError, match="the dataset has no episodes"):
        ds.validate()
    assert dataset_cli(["validate", str(root)]) == 1
    assert "no episodes" in capsys.readouterr().err


def test_stats_and_modality_name_a_malformed_info(ds):
    edit_json(ds / "meta/info.json", lambda i: i["features"].update(action="float32"))
    with pytest.raises(DatasetError, match=r"\[features\.action\]: must be an object"):
        st.compute_all(ds)
    with pytest.raises(DatasetError, match=r"\[features\.action\]: must be an object"):
        build_modality(ds, preset="generic")


# ----------------------------------------------------------------------------- 4. non-finite values and types


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_validate_deep_fails_on_non_finite_values(ds, bad, capsys):
    def poison(v):
        v[3, 2] = bad
        return v

    rewrite_column(ds / EP1, "action", poison)
    LeRobotDataset(ds).validate()  # the shallow check does not read values
    with pytest.raises(
        DatasetError, match=r"\[action\]: 1 non-finite value\(s\); the first is .* at frame 3 \(dim 2\)"
    ) as e:
        LeRobotDataset(ds).validate(deep=True)
    assert e.value.file == str(ds / EP1) and "re-record or drop this episode" in e.value.fix
    assert dataset_cli(["validate", str(ds), "--deep"]) == 1
    assert "episode_000001.parquet [action]" in capsys.readouterr().err


def test_validate_deep_fails_on_an_all_nan_action_column(ds):
    rewrite_column(ds / EP0, "action", lambda v: np.full_like(v, np.nan))
    with pytest.raises(DatasetError, match=r"\[action\]: \d+ non-finite value\(s\); the first is nan at frame 0"):
        LeRobotDataset(ds).validate(deep=True)


def test_stats_refuse_to_write_non_finite_statistics(ds, capsys):
    st.compute_all(ds)  # good data: cached
    written = {p: (ds / p).read_bytes() for p in (st.STATS_GR00T_PATH, st.STEP_INDEX_PATH, st.CACHE_PATH)}

    def poison(v):
        v[5, 0] = np.inf
        return v

    rewrite_column(ds / EP1, "observation.state", poison)
    with pytest.raises(
        DatasetError, match=r"\[observation\.state\]: 1 non-finite .* inf at frame 5 \(dim 0\) of episode 1"
    ) as e:
        st.compute_all(ds)
    assert e.value.file == str(ds / EP1) and "no statistics were written" in e.value.problem
    assert {p: (ds / p).read_bytes() for p in written} == written
    assert dataset_cli(["stats", str(ds)]) == 1
    assert "non-finite" in capsys.readouterr().err


def test_cached_non_finite_statistics_are_not_reused(ds):
    """Statistics cached with NaN (written before this check) are recomputed, not served."""
    st.compute_all(ds)
    stats = json.loads((ds / st.STATS_GR00T_PATH).read_text())
    stats["action"]["mean"][0] = float("nan")
    (ds / st.STATS_GR00T_PATH).write_text(json.dumps(stats))
    res = st.compute_all(ds)
    assert res["cached"] is False and np.isfinite(res["stats_gr00t"]["action"]["mean"]).all()


def _strings_in(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    as_text = pa.array([json.dumps(r) for r in t.column("action").to_pylist()])
    pq.write_table(t.set_column(t.column_names.index("action"), "action", as_text), path)


@pytest.mark.parametrize("episode", [0, 1])
def test_an_action_column_of_strings_fails_and_is_blamed_on_its_file(ds, episode):
    bad = ds / f"data/chunk-000/episode_{episode:06d}.parquet"
    _strings_in(bad)
    with pytest.raises(DatasetError, match=r"\[action\]: the column holds string.*dtype float32") as e:
        LeRobotDataset(ds).validate()
    assert e.value.file == str(bad)
    with pytest.raises(DatasetError, match=r"\[action\]") as e:
        st.compute_all(ds)
    assert e.value.file == str(bad)  # it used to blame episode 1 for episode 0's strings


def test_stats_blame_the_file_whose_type_differs_from_info(base4, tmp_path):
    """Episode 0 stores float64 actions where info.json (and every other file) says float32:
    episode 0 is the one named, not the first file that agrees with info.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = shutil.copytree(base4, tmp_path / "d")
    p = root / EP0
    t = pq.read_table(p)
    col = t.column("action").combine_chunks()
    new = pa.FixedSizeListArray.from_arrays(pa.array(col.flatten().to_numpy().astype(np.float64)), 7)
    pq.write_table(t.set_column(t.column_names.index("action"), "action", new), p)
    with pytest.raises(
        DatasetError, match=r"column type .*double.* differs from .*float.* in episode_000001\.parquet"
    ) as e:
        st.compute_all(root)
    assert e.value.file == str(p) and e.value.key == "action"
