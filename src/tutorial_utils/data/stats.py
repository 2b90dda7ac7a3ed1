"""Dataset statistics: LeRobot v2.1's own, and those and the step index that DiT4DiT's
GR00T-style loader needs, cached.

LeRobot v2.1's statistics are ``min, max, mean, std, count`` per feature: per episode
(:func:`feature_stats`, :func:`image_stats` for a camera, on a subset of frames like LeRobot),
which :class:`~tutorial_utils.data.writer.LeRobotWriter` stores in ``meta/episodes_stats.jsonl``,
and pooled over the episodes (:func:`aggregate_stats`) into ``meta/stats.json``, which
:func:`read_stats_json` reads back for :class:`~tutorial_utils.data.reader.LeRobotDataset`.

DiT4DiT's are three products (docs/FACTS.md section 2):

- ``meta/stats_gr00t.json``: ``mean, std, min, max, q01, q99`` of every parquet column over
  all frames (upstream concatenates every ``data/*/*.parquet`` with pandas).
- the step index: one ``(trajectory_id, base_index)`` per frame. Kept in a safe format,
  ``meta/steps_index.npz`` (plain arrays, read with ``allow_pickle=False``). The upstream
  ``meta/steps_data_index.pkl`` is written only when asked (``write_pkl=True``); this module
  never unpickles anything.
- ``<run_dir>/dataset_statistics.json``: ``{"franka": {"action": {..., "mask"}, "state": {...},
  "num_trajectories", "num_transitions"}}``, the normaliser the policy server loads.

Upstream computes the stats once and never notices when the data changes. Here a cache file
(``meta/stats_cache.json``) stores a fingerprint of the data files (names, sizes, mtimes);
a different fingerprint means recompute. The cold path reads only the numeric columns, file
after file, with pyarrow's low-level parquet reader (:func:`load_columns` says what was measured
against the alternatives).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tutorial_utils.data.columns import NON_FINITE_FIX, arrow_value_type, check_column_type, column_to_numpy
from tutorial_utils.data.schema import (
    EPISODES_PATH,
    INFO_PATH,
    NON_NUMERIC_DTYPES,
    check_features,
    numeric_dtype,
    read_info,
    read_json_object,
    short_repr,
)
from tutorial_utils.errors import DatasetError
from tutorial_utils.io import atomic_path, atomic_write_json

STATS_GR00T_PATH = "meta/stats_gr00t.json"
STEP_INDEX_PATH = "meta/steps_index.npz"
STEPS_PKL_PATH = "meta/steps_data_index.pkl"
CACHE_PATH = "meta/stats_cache.json"
CACHE_VERSION = 1
STAT_KEYS = ("mean", "std", "min", "max", "q01", "q99")
#: DiT4DiT's ``libero_franka`` config: min-max normalise x..yaw, leave the gripper raw.
FRANKA_ACTION_MASK = [True] * 6 + [False]


# --------------------------------------------------------------------------------------
# LeRobot v2.1's own statistics: meta/episodes_stats.jsonl and meta/stats.json
# --------------------------------------------------------------------------------------


#: the statistics of each feature that :func:`read_stats_json` checks are numbers
STAT_FIELDS = ("min", "max", "mean", "std")


def read_stats_json(path: Path) -> dict:
    """``meta/stats.json``: an object of features, each with min/max/mean/std as numbers or
    nested lists of numbers. Anything else raises :class:`DatasetError`."""
    fix = "delete meta/stats.json and re-run LeRobotWriter.finalize() (it is recomputed), or re-download it"
    stats = read_json_object(path, fix)
    for key, entry in stats.items():
        if not isinstance(entry, dict):
            raise DatasetError(path, key, f"expected an object of statistics, found {short_repr(entry)}", fix)
        for k in STAT_FIELDS:
            if k not in entry:
                continue
            try:
                arr = np.asarray(entry[k], dtype=np.float64)
            except (TypeError, ValueError, OverflowError):
                arr = None
            if arr is None or arr.size == 0:
                raise DatasetError(path, f"{key}.{k}", f"expected numbers, found {short_repr(entry[k])}", fix)
    return stats


def feature_stats(x: np.ndarray) -> dict:
    """min/max/mean/std/count over axis 0, as LeRobot v2.1 stores them (lists)."""
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[:, None]
    x64 = x.astype(np.float64)
    return {
        "min": x64.min(0).tolist(),
        "max": x64.max(0).tolist(),
        "mean": x64.mean(0).tolist(),
        "std": x64.std(0).tolist(),
        "count": [int(x.shape[0])],
    }


def image_stats(frames: np.ndarray, max_samples: int = 100, max_side: int = 64) -> dict:
    """Per-channel stats of a (T,H,W,3) uint8 video in [0,1], shape (3,1,1) like LeRobot.

    Like LeRobot, on a subset: up to ``max_samples`` frames, spatially strided to ``max_side``.
    """
    t, h, w = frames.shape[:3]
    idx = np.unique(np.linspace(0, t - 1, num=min(t, max_samples)).round().astype(int))
    step = max(1, int(np.ceil(max(h, w) / max_side)))
    sub = frames[idx, ::step, ::step]
    ch = np.ascontiguousarray(np.moveaxis(sub, -1, 0)).reshape(sub.shape[-1], -1)  # (3, M) uint8
    mean = ch.mean(axis=1, dtype=np.float64)
    std = ch.std(axis=1, dtype=np.float64)

    def c11(v):
        return [[[float(a) / 255.0]] for a in v]

    return {
        "min": c11(ch.min(axis=1)),
        "max": c11(ch.max(axis=1)),
        "mean": c11(mean),
        "std": c11(std),
        "count": [int(len(idx))],
    }


def aggregate_stats(per_episode: Sequence[dict]) -> dict:
    """Combine per-episode stats (pooled mean and variance weighted by count)."""
    out: dict[str, dict] = {}
    keys = sorted({k for s in per_episode for k in s})
    for key in keys:
        items = [s[key] for s in per_episode if key in s]
        counts = np.array([it["count"][0] for it in items], dtype=np.float64)
        means = np.stack([np.asarray(it["mean"], dtype=np.float64) for it in items])
        stds = np.stack([np.asarray(it["std"], dtype=np.float64) for it in items])
        w = (counts / counts.sum()).reshape((-1,) + (1,) * (means.ndim - 1))
        mean = (w * means).sum(0)
        var = (w * (stds**2 + (means - mean) ** 2)).sum(0)
        out[key] = {
            "min": np.min(np.stack([np.asarray(it["min"]) for it in items]), 0).tolist(),
            "max": np.max(np.stack([np.asarray(it["max"]) for it in items]), 0).tolist(),
            "mean": mean.tolist(),
            "std": np.sqrt(var).tolist(),
            "count": [int(counts.sum())],
        }
    return out


# --------------------------------------------------------------------------------------
# DiT4DiT's statistics and step index
# --------------------------------------------------------------------------------------


def data_files(root: Path) -> list[Path]:
    import glob

    # sorted as strings (chunk-000/episode_000000.parquet, ...): cheaper than sorting Path objects
    pattern = os.path.join(glob.escape(os.fspath(root)), "data", "*", "*.parquet")
    return [Path(p) for p in sorted(glob.glob(pattern))]


def fingerprint(root: str | os.PathLike, files: list[Path] | None = None) -> str:
    """A hash of the data files' names, sizes and mtimes, plus info.json and episodes.jsonl.

    ``files``: :func:`data_files` of ``root`` when the caller already listed them."""
    root = Path(root)
    base = os.fspath(root) + os.sep
    h = hashlib.sha256()
    for p in (data_files(root) if files is None else files) + [root / INFO_PATH, root / EPISODES_PATH]:
        name = os.fspath(p)  # strings, not Path.relative_to: half the time for 432 files
        rel = name[len(base) :].replace(os.sep, "/") if name.startswith(base) else p.relative_to(root).as_posix()
        try:
            st = os.stat(name)
        except FileNotFoundError:
            h.update(f"{rel}:missing\n".encode())
            continue
        h.update(f"{rel}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _numeric_features(root: Path) -> dict:
    info_path = root / INFO_PATH
    info = read_info(root)
    feats = check_features(info_path, info.get("features"))
    for k in ("episode_index", "frame_index", "index"):
        if k not in feats or feats[k]["dtype"] in NON_NUMERIC_DTYPES:
            raise DatasetError(
                info_path,
                f"features.{k}",
                "default LeRobot column is missing",
                "add it (dtype int64, shape [1]) or re-download the dataset",
            )
    return {k: v for k, v in feats.items() if v["dtype"] not in NON_NUMERIC_DTYPES}


#: files up to this size are read with one ``read()`` and parsed from memory (one syscall instead
#: of a handful per column chunk); bigger ones (images stored in the parquet) are memory-mapped
#: so that only the numeric columns are touched
WHOLE_FILE_MAX_BYTES = 8 << 20


def _open_parquet(path: Path):
    """pyarrow's low-level reader on one parquet file (footer parsed, no column read yet).

    ``pq.ParquetFile`` wraps this same reader (``pyarrow._parquet.ParquetReader``, the same
    API in pyarrow 15.0.2 and 25.0.1, the ends of the pinned range) and adds Python set-up
    per file (filesystem resolution, a map of nested column paths) that this path skips.
    """
    import pyarrow as pa
    from pyarrow._parquet import ParquetReader

    name = os.fspath(path)
    try:
        if os.path.getsize(name) <= WHOLE_FILE_MAX_BYTES:
            with open(name, "rb") as fh:
                source = pa.py_buffer(fh.read())
        else:
            source = pa.memory_map(name)
        reader = ParquetReader()
        reader.open(source, pre_buffer=False)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(
            path, None, f"not a readable parquet file ({exc})", "re-write or re-download this episode file"
        ) from None
    return reader


def _check_types(path: Path, schema, types: dict, first: Path, feats: dict) -> None:
    """Every file has the column types of the first one. When they differ, the file whose type
    does not match meta/info.json's dtype is the one blamed (it may be the first file)."""
    for c, want in types.items():
        got = schema.field(c).type
        check_column_type(path, c, got, feats[c])
        if got != want:
            blame, other, theirs, ours = path, first, got, want
            dtype = numeric_dtype(feats[c]["dtype"])
            if dtype is not None:
                import pyarrow as pa

                expected = pa.from_numpy_dtype(dtype)
                if arrow_value_type(got) == expected and arrow_value_type(want) != expected:
                    blame, other, theirs, ours = first, path, want, got
            raise DatasetError(
                blame,
                c,
                f"column type {theirs} differs from {ours} in {other.name}"
                + ("" if blame == path else f" (meta/info.json says {feats[c]['dtype']})"),
                "re-write the episode with the dataset's writer",
            )


def load_columns(root: str | os.PathLike, files: list[Path] | None = None) -> dict[str, np.ndarray]:
    """Every numeric column of every parquet, concatenated in episode order, as (N, D) arrays.

    Files are read one after the other, each whole into memory, and only the numeric
    columns of meta/info.json are decoded (found by name in each file's schema; one
    ``read_all`` per file, one ``concat_tables`` at the end). ``benchmarks/bench_dataset.py``
    measures it against the pandas reference; the alternatives it was chosen over
    (``pyarrow.dataset``, ``pq.read_table`` on the list, threads, a forked process, polars) are
    recorded with their figures in the closing notes of issue 3.
    """
    import pyarrow as pa

    root = Path(root)
    feats = _numeric_features(root)
    files = data_files(root) if files is None else files
    if not files:
        raise DatasetError(
            root / "data",
            None,
            "no parquet files under data/*/",
            "point at the dataset root, or download / record the data first",
        )
    columns = list(feats)
    tables = []
    first_layout = first_leaves = types = None
    for f in files:
        reader = _open_parquet(f)
        layout = reader.metadata.schema  # the parquet schema: much cheaper to compare than the Arrow one
        if first_layout is not None and layout.equals(first_layout):
            leaves = first_leaves  # the common case: one schema for every episode
        else:
            schema = reader.schema_arrow
            missing = [c for c in columns if schema.get_field_index(c) < 0]
            if missing:
                raise DatasetError(
                    f,
                    missing[0],
                    f"column is missing (columns: {schema.names})",
                    "re-write the episode with every feature of meta/info.json",
                )
            paths = reader.column_paths  # leaf columns; a list column is one leaf, a struct several
            leaves = [i for c in columns for i, path in enumerate(paths) if path[0] == c]
            if first_layout is None:
                first_layout, first_leaves = layout, leaves
                types = {c: schema.field(c).type for c in columns}
            _check_types(f, schema, types, files[0], feats)
        tables.append(reader.read_all(column_indices=leaves, use_threads=False))  # columns in our order
    try:
        table = pa.concat_tables(tables)  # identical schemas: the cheap strict concat
    except pa.ArrowInvalid:  # another Arrow type under the same parquet layout (named), or nullability
        for f, t in zip(files, tables):
            _check_types(f, t.schema, types, files[0], feats)
        table = pa.concat_tables(tables, promote_options="default")  # unifies nullability, never a type
    if table.num_rows == 0:
        raise DatasetError(
            root / "data", None, "the parquet files hold no rows", "record or download episodes into the dataset first"
        )
    out = {}
    for k, ft in feats.items():
        try:
            arr = column_to_numpy(table, k, ft, root / "data")
        except DatasetError:  # a row of the wrong width: name the file it is in
            for f, t in zip(files, tables):
                column_to_numpy(t, k, ft, f)
            raise
        out[k] = arr.reshape(len(arr), -1)
    if "index" in out:
        order = np.argsort(out["index"][:, 0], kind="stable")
        if not np.array_equal(order, np.arange(len(order))):
            out = {k: v[order] for k, v in out.items()}
    return out


def column_stats(x: np.ndarray) -> dict:
    """mean/std/min/max/q01/q99 over axis 0 (float64 maths, lists out).

    Quantiles use linear interpolation (numpy's default), computed with one partial sort
    of each dimension laid out contiguously (faster than ``np.quantile(axis=0)``)
    in the column's own dtype: the order statistics are the same values as in float64, and
    the interpolation and the sums are done in float64.
    """
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[:, None]
    xt = np.ascontiguousarray(x.T)  # (D, N)
    n = xt.shape[1]
    lo, hi = (n - 1) * 0.01, (n - 1) * 0.99
    kth = sorted({int(np.floor(lo)), int(np.ceil(lo)), int(np.floor(hi)), int(np.ceil(hi))})
    part = np.partition(xt, kth, axis=1)

    def quantile(pos: float) -> np.ndarray:
        f, c = int(np.floor(pos)), int(np.ceil(pos))
        a, b = part[:, f].astype(np.float64), part[:, c].astype(np.float64)
        return a + (b - a) * (pos - f)

    mean = xt.mean(1, dtype=np.float64)
    dev = xt - mean[:, None]  # float64
    std = np.sqrt(np.einsum("ij,ij->i", dev, dev) / n)  # one pass, no squared temporary
    return {
        "mean": mean.tolist(),
        "std": std.tolist(),
        "min": xt.min(1).astype(np.float64).tolist(),
        "max": xt.max(1).astype(np.float64).tolist(),
        "q01": quantile(lo).tolist(),
        "q99": quantile(hi).tolist(),
    }


def max_difference(a: dict, b: dict) -> float:
    """The largest absolute difference between two stats_gr00t dicts (same columns and keys)."""
    if set(a) != set(b):
        raise ValueError(f"different columns: {sorted(set(a) ^ set(b))}")
    return max(float(np.max(np.abs(np.subtract(a[c][k], b[c][k])))) for c in a for k in STAT_KEYS)


def compute_stats_gr00t(columns: dict[str, np.ndarray]) -> dict:
    return {k: column_stats(v) for k, v in columns.items()}


def compute_step_index(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One (trajectory_id, base_index) per frame, in dataset order."""
    return {
        "trajectory_ids": columns["episode_index"][:, 0].astype(np.int64),
        "base_indices": columns["frame_index"][:, 0].astype(np.int64),
    }


def dataset_statistics(
    stats: dict,
    num_trajectories: int,
    num_transitions: int,
    embodiment: str = "franka",
    action_mask: list[bool] | None = None,
) -> dict:
    """The ``dataset_statistics.json`` block: action (with mask) and state stats for ``embodiment``."""
    action = dict(stats["action"])
    mask = list(FRANKA_ACTION_MASK if action_mask is None else action_mask)
    if len(mask) != len(action["mean"]):
        raise ValueError(f"action mask has {len(mask)} entries, the action has {len(action['mean'])} dims")
    action["mask"] = mask
    return {
        embodiment: {
            "action": action,
            "state": dict(stats["observation.state"]),
            "num_trajectories": int(num_trajectories),
            "num_transitions": int(num_transitions),
        }
    }


def statistics_of(
    action: np.ndarray,
    state: np.ndarray | None = None,
    num_trajectories: int = 1,
    embodiment: str = "franka",
    action_mask: list[bool] | None = None,
) -> dict:
    """The ``dataset_statistics.json`` block of in-memory arrays (a synthetic source, one episode
    in a chapter), computed as :func:`compute_all` computes a dataset's (:func:`column_stats`,
    :func:`dataset_statistics`); ``state`` None leaves the state block empty."""
    a = np.asarray(action)
    stats = {"action": column_stats(a), "observation.state": column_stats(state) if state is not None else {}}
    return dataset_statistics(stats, num_trajectories, a.shape[0], embodiment, action_mask)


def load_step_index(root: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read ``meta/steps_index.npz`` safely (no pickle)."""
    with np.load(Path(root) / STEP_INDEX_PATH, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with atomic_path(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)


def _write_pkl(path: Path, index: dict[str, np.ndarray], config_key: str) -> None:
    """The upstream pickle, for DiT4DiT's loader only. Written by us; never read by us."""
    steps = list(zip(index["trajectory_ids"].tolist(), index["base_indices"].tolist()))
    payload = {
        "config_key": config_key,
        "steps": steps,
        "num_trajectories": int(len(np.unique(index["trajectory_ids"]))),
        "total_steps": len(steps),
        "computed_timestamp": time.time(),
        "delete_pause_frame": False,
    }
    with atomic_path(path, suffix=".pkl") as tmp:
        tmp.write_bytes(pickle.dumps(payload, protocol=4))


def _cache_valid(root: Path, fp: str) -> dict | None:
    """The cached statistics when they are for these data files, complete and finite; else None."""
    try:
        cache = json.loads((root / CACHE_PATH).read_text(encoding="utf-8"))
        if cache.get("version") != CACHE_VERSION or cache.get("fingerprint") != fp:
            return None
        if not all(isinstance(cache.get(k), int) for k in ("num_trajectories", "num_transitions")):
            return None
        stats = json.loads((root / STATS_GR00T_PATH).read_text(encoding="utf-8"))
        if not (root / STEP_INDEX_PATH).is_file():
            return None
        if any(not isinstance(v, dict) or set(STAT_KEYS) - set(v) for v in stats.values()):
            return None
        for v in stats.values():  # statistics written before the finite check existed
            if not all(np.isfinite(np.asarray(v[k], dtype=np.float64)).all() for k in STAT_KEYS):
                return None
        return {"stats": stats, "cache": cache}
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):  # JSON and UTF-8 errors are ValueErrors
        return None


def _check_finite_columns(root: Path, files: list[Path], columns: dict[str, np.ndarray]) -> None:
    """NaN or inf anywhere: a :class:`DatasetError` naming the parquet file, the column and the
    first bad frame, before any statistics are written."""
    for key, arr in columns.items():
        if arr.dtype.kind != "f":
            continue
        bad = ~np.isfinite(arr)
        if not bad.any():
            continue
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        dim = int(np.flatnonzero(bad[row])[0])
        ep, frame = (float(columns[k][row, 0]) for k in ("episode_index", "frame_index"))
        ep, frame = (int(v) if np.isfinite(v) else -1 for v in (ep, frame))
        name = f"episode_{ep:06d}.parquet"
        path = next((f for f in files if f.name == name), root / "data" / name)
        raise DatasetError(
            path,
            key,
            f"{int(bad.sum())} non-finite value(s) in the column over the dataset; the first is {arr[row, dim]} "
            f"at frame {frame} (dim {dim}) of episode {ep}; no statistics were written",
            NON_FINITE_FIX,
        )


def compute_all(
    root: str | os.PathLike,
    run_dir: str | os.PathLike | None = None,
    *,
    write_pkl: bool = False,
    force: bool = False,
    embodiment: str = "franka",
    action_mask: list[bool] | None = None,
    config_key: str = "libero_franka",
) -> dict:
    """Stats, step index and dataset_statistics for ``root``; cached until the data changes.

    Returns ``stats_gr00t``, ``dataset_statistics``, ``num_trajectories``, ``num_transitions``,
    ``cached`` (True when nothing was recomputed), ``seconds`` and ``files``. With ``run_dir``
    also writes ``<run_dir>/dataset_statistics.json``; ``write_pkl`` adds the upstream pickle.
    """
    t0 = time.perf_counter()
    root = Path(root)
    listed = data_files(root)
    fp = fingerprint(root, listed)
    hit = None if force else _cache_valid(root, fp)
    files = {"stats_gr00t": root / STATS_GR00T_PATH, "step_index": root / STEP_INDEX_PATH}
    if hit is not None:
        stats, cache = hit["stats"], hit["cache"]
        n_traj, n_trans = cache["num_trajectories"], cache["num_transitions"]
        cached = True
        if write_pkl and not (root / STEPS_PKL_PATH).is_file():
            _write_pkl(root / STEPS_PKL_PATH, load_step_index(root), config_key)
    else:
        columns = load_columns(root, files=listed)
        _check_finite_columns(root, listed, columns)
        for key in ("action", "observation.state"):  # what dataset_statistics.json is made of
            if key not in columns:
                raise DatasetError(
                    root / INFO_PATH,
                    f"features.{key}",
                    "the numeric feature is missing",
                    "this dataset does not have the LIBERO schema (tutorial_utils.data.libero_schema)",
                )
        stats = compute_stats_gr00t(columns)
        index = compute_step_index(columns)
        n_traj = int(len(np.unique(index["trajectory_ids"])))
        n_trans = int(len(index["trajectory_ids"]))
        atomic_write_json(root / STATS_GR00T_PATH, stats, indent=4)
        _write_npz(root / STEP_INDEX_PATH, index)
        if write_pkl or (root / STEPS_PKL_PATH).is_file():  # never leave a stale pickle behind
            _write_pkl(root / STEPS_PKL_PATH, index, config_key)
        atomic_write_json(
            root / CACHE_PATH,
            {
                "version": CACHE_VERSION,
                "fingerprint": fp,
                "num_trajectories": n_traj,
                "num_transitions": n_trans,
                "computed_at": time.time(),
            },
        )
        cached = False
    if write_pkl:
        files["steps_pkl"] = root / STEPS_PKL_PATH
    ds_stats = dataset_statistics(stats, n_traj, n_trans, embodiment, action_mask)
    if run_dir is not None:
        files["dataset_statistics"] = atomic_write_json(Path(run_dir) / "dataset_statistics.json", ds_stats, indent=2)
    return {
        "stats_gr00t": stats,
        "dataset_statistics": ds_stats,
        "num_trajectories": n_traj,
        "num_transitions": n_trans,
        "cached": cached,
        "seconds": time.perf_counter() - t0,
        "files": {k: str(v) for k, v in files.items()},
    }


def reference_stats_pandas(root: str | os.PathLike) -> dict:
    """The upstream method, for comparison (GR00T-style loaders do this when the stats file is
    missing): pandas reads every parquet, concatenates them, then each column is stacked row
    by row (``np.vstack`` of ``np.asarray(row, float32)``) before the same statistics."""
    import pandas as pd

    root = Path(root)
    df = pd.concat([pd.read_parquet(p) for p in data_files(root)], axis=0)
    out = {}
    for col in df.columns:
        rows = np.vstack([np.asarray(x, dtype=np.float32) for x in df[col]]).astype(np.float64)
        out[col] = {
            "mean": np.mean(rows, axis=0).tolist(),
            "std": np.std(rows, axis=0).tolist(),
            "min": np.min(rows, axis=0).tolist(),
            "max": np.max(rows, axis=0).tolist(),
            "q01": np.quantile(rows, 0.01, axis=0).tolist(),
            "q99": np.quantile(rows, 0.99, axis=0).tolist(),
        }
    return out


__all__ = [
    "STAT_FIELDS",
    "read_stats_json",
    "feature_stats",
    "image_stats",
    "aggregate_stats",
    "STATS_GR00T_PATH",
    "STEP_INDEX_PATH",
    "STEPS_PKL_PATH",
    "CACHE_PATH",
    "FRANKA_ACTION_MASK",
    "fingerprint",
    "load_columns",
    "column_stats",
    "max_difference",
    "compute_stats_gr00t",
    "compute_step_index",
    "dataset_statistics",
    "load_step_index",
    "compute_all",
    "reference_stats_pandas",
]
