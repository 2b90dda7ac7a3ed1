"""Fuzz the dataset metadata reader with hypothesis (issue 15).

A small valid dataset (2 episodes, 8 frames, 32x32 videos) has its metadata mutated: any JSON
value (of every type) set at a key of ``meta/info.json`` (top-level keys, features and their
dtype/shape/names), of a row of ``meta/episodes.jsonl`` or ``meta/tasks.jsonl``, keys deleted,
rows dropped, duplicated or replaced, and garbage bytes written into, appended to or cut from
any metadata file. Then the dataset is opened and validated the way ``dataset validate --deep``
does, its statistics computed, and its modality checked; separately the writer resumes it.

Nothing but the package's own errors (:class:`~tutorial_utils.errors.TutorialError`, i.e.
``DatasetError`` and ``ModalityError``) may escape, and a writer that refuses to resume leaves
every file as it was. Examples are derandomised and bounded (80 per fuzzer: about 10 s for the
file on a 2-core machine); explore more with
``TUTORIAL_FUZZ_EXAMPLES=2000 pytest tests/adversarial/test_dataset_fuzz.py``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import fuzz_settings
from tutorial_utils.data import stats as dstats
from tutorial_utils.data.libero_schema import LIBERO_FPS, libero_features
from tutorial_utils.data.modality import build_modality, validate_modality
from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.data.schema import REQUIRED_INFO_KEYS
from tutorial_utils.data.synth import generate_dataset
from tutorial_utils.data.writer import LeRobotWriter
from tutorial_utils.errors import TutorialError

FUZZ = fuzz_settings(80)
META_FILES = ("info.json", "episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl", "stats.json", "modality.json")

# --- strategies ---------------------------------------------------------------------------------

#: values a hostile or careless editor puts in dataset metadata
TRICKY = [
    None, True, False, 0, -1, 1, 2, 7, 8, 2**63, -(2**70), 0.5, 20.0, 1e308, float("nan"), float("inf"),
    "", "0", "20", "float32", "video", "string", "object", "v2.1", "v3.0", "../x", "/etc/passwd",
    "{episode_index}", "{unknown}", "data/{episode_index:c}.parquet", "data/{}.parquet",
    "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet", "\u2028", "\x00",
    [], [7], ["7"], [0], [-1], [32, 32], [32, 32, 3], [2**40], [[7]], {}, {"dtype": "float32"},
    {"dtype": "float32", "shape": [7]}, {"dtype": "video", "shape": [32, 32, 3]}, {"motors": ["x"]},
]  # fmt: skip

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(TRICKY),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8,
)
FEATURES = ["action", "observation.state", "observation.images.image", "observation.images.wrist_image"]
FEATURES += ["timestamp", "frame_index", "episode_index", "index", "task_index", "new.feature"]
INFO_KEYS = list(REQUIRED_INFO_KEYS) + ["video_path", "new_key"]
EPISODE_KEYS = ["episode_index", "length", "tasks", "other"]
TASK_KEYS = ["task_index", "task", "other"]


@st.composite
def mutation(draw):
    kind = draw(
        st.sampled_from(
            ["info", "info-del", "feature", "feature-field", "row", "row-del", "rows", "line", "bytes", "cut"]
        )
    )
    if kind == "info":
        return (kind, draw(st.sampled_from(INFO_KEYS)), draw(json_values))
    if kind == "info-del":
        return (kind, draw(st.sampled_from(INFO_KEYS)))
    if kind == "feature":
        return (kind, draw(st.sampled_from(FEATURES)), draw(json_values))
    if kind == "feature-field":
        return (
            kind,
            draw(st.sampled_from(FEATURES)),
            draw(st.sampled_from(["dtype", "shape", "names"])),
            draw(json_values),
        )
    if kind in ("row", "row-del"):
        file = draw(st.sampled_from(["episodes.jsonl", "tasks.jsonl"]))
        keys = EPISODE_KEYS if file == "episodes.jsonl" else TASK_KEYS
        value = draw(json_values) if kind == "row" else None
        return (kind, file, draw(st.integers(0, 2)), draw(st.sampled_from(keys)), value)
    if kind == "rows":  # drop, duplicate, reverse or empty the rows
        return (
            kind,
            draw(st.sampled_from(["episodes.jsonl", "tasks.jsonl"])),
            draw(st.sampled_from(["drop", "dup", "rev", "empty"])),
        )
    if kind == "line":  # a whole line replaced by any JSON value
        return (
            kind,
            draw(st.sampled_from(["episodes.jsonl", "tasks.jsonl"])),
            draw(st.integers(0, 2)),
            draw(json_values),
        )
    if kind == "bytes":  # garbage written over / into / after a file
        where = draw(st.sampled_from(["replace", "insert", "append"]))
        return (kind, draw(st.sampled_from(META_FILES)), where, draw(st.integers(0, 400)), draw(st.binary(max_size=24)))
    return (kind, draw(st.sampled_from(META_FILES)), draw(st.integers(0, 400)))  # cut: truncated file


mutations = st.lists(mutation(), min_size=1, max_size=3)

# --- applying them ------------------------------------------------------------------------------


def _apply(root: Path, ops: list[tuple]) -> None:
    meta = root / "meta"
    info = json.loads((meta / "info.json").read_text())
    rows = {
        f: [json.loads(x) for x in (meta / f).read_text().splitlines() if x.strip()]
        for f in ("episodes.jsonl", "tasks.jsonl")
    }
    raw: list[tuple] = []
    for op in ops:
        kind = op[0]
        if kind == "info":
            info[op[1]] = op[2]
        elif kind == "info-del":
            info.pop(op[1], None)
        elif kind == "feature":
            if isinstance(info.get("features"), dict):
                info["features"][op[1]] = op[2]
        elif kind == "feature-field":
            ft = info["features"].get(op[1]) if isinstance(info.get("features"), dict) else None
            if isinstance(ft, dict):
                ft[op[2]] = op[3]
        elif kind in ("row", "row-del"):
            _, file, i, key, value = op
            if i < len(rows[file]) and isinstance(rows[file][i], dict):
                if kind == "row":
                    rows[file][i][key] = value
                else:
                    rows[file][i].pop(key, None)
        elif kind == "rows":
            r = rows[op[1]]
            rows[op[1]] = {"drop": r[1:], "dup": r + r[-1:], "rev": r[::-1], "empty": []}[op[2]]
        elif kind == "line":
            _, file, i, value = op
            if i < len(rows[file]):
                rows[file][i] = value
            else:
                rows[file].append(value)
        else:  # bytes / cut: applied to the serialised files below
            raw.append(op)
    (meta / "info.json").write_text(json.dumps(info))
    for file, r in rows.items():
        (meta / file).write_text("".join(json.dumps(x) + "\n" for x in r))
    for op in raw:
        path = meta / op[1]
        data = path.read_bytes() if path.is_file() else b""
        if op[0] == "bytes":
            _, _, where, at, junk = op
            at = min(at, len(data))
            data = {"replace": junk, "insert": data[:at] + junk + data[at:], "append": data + junk}[where]
        else:
            data = data[: op[2]]
        path.write_bytes(data)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = generate_dataset(tmp_path_factory.mktemp("fuzz") / "base", n_episodes=2, mean_length=8, image_size=32)
    build_modality(root)
    return root


@pytest.fixture(scope="module")
def scratch(base, tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """A copy of the dataset and its pristine bytes; :func:`_reset` puts it back between examples
    (rewriting a few small files is much cheaper than copying the folder on a slow disk)."""
    root = shutil.copytree(base, tmp_path_factory.mktemp("fuzz-scratch") / "d")
    return root, _snapshot(root)


def _reset(root: Path, pristine: dict[str, bytes]) -> None:
    for p in [p for p in root.rglob("*") if p.is_file()]:
        rel = p.relative_to(root).as_posix()
        if rel not in pristine:
            p.unlink()  # files the last example wrote (stats, the step index...)
        elif rel.startswith("meta/"):
            p.write_bytes(pristine[rel])
    for rel, data in pristine.items():
        if not (root / rel).is_file():  # an episode file the writer removed
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)


# --- the fuzzers --------------------------------------------------------------------------------


@pytest.mark.slow
def test_mutated_metadata_only_raises_teaching_errors(scratch):
    seen: dict[str, int] = {}
    t0 = time.perf_counter()

    @FUZZ
    @given(ops=mutations)
    def run(ops):
        root, pristine = scratch
        _reset(root, pristine)
        _apply(root, ops)
        outcome = "ok"
        try:
            ds = LeRobotDataset(root, verify_videos=True)
            ds.validate(deep=True)
            ds.sample(0)
            ds.summary()
            dstats.compute_all(root, force=True)
            validate_modality(root)
        except TutorialError as exc:  # anything else fails the test with hypothesis's minimal example
            outcome = type(exc).__name__
            assert str(exc) and "Fix:" in str(exc)
        seen[outcome] = seen.get(outcome, 0) + 1

    run()
    elapsed = time.perf_counter() - t0
    print(f"reader fuzz: {sum(seen.values())} examples in {elapsed:.1f} s, outcomes {seen}")
    assert seen.get("DatasetError", 0) > 0  # the fuzzer does reach the checks


def test_a_writer_resuming_mutated_metadata_refuses_cleanly_or_resumes(scratch):
    seen: dict[str, int] = {}
    t0 = time.perf_counter()

    @FUZZ
    @given(ops=mutations)
    def run(ops):
        root, pristine = scratch
        _reset(root, pristine)
        _apply(root, ops)
        before = _snapshot(root)
        try:
            w = LeRobotWriter(root, libero_features(32), LIBERO_FPS)
        except TutorialError as exc:
            assert _snapshot(root) == before, f"the writer refused ({exc}) but changed files"
            seen["refused"] = seen.get("refused", 0) + 1
            return
        try:
            assert w.num_episodes <= 2
            kept = {k: v for k, v in _snapshot(root).items() if k.startswith(("data/", "videos/"))}
            lost = [k for k in before if k.startswith(("data/", "videos/")) and k not in kept]
            # only the files of the episode after the committed ones (an interrupted write) may go
            assert all(f"episode_{w.num_episodes:06d}." in k for k in lost), lost
        finally:
            w.close()
        seen["resumed"] = seen.get("resumed", 0) + 1

    run()
    elapsed = time.perf_counter() - t0
    print(f"writer fuzz: {sum(seen.values())} examples in {elapsed:.1f} s, outcomes {seen}")
    assert seen.get("refused", 0) > 0
