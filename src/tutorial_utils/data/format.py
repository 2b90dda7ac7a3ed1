"""LeRobot dataset format v2.1: a writer, a validating reader and a small CLI.

The on-disk layout is the one ``IPEC-COMMUNITY/libero_*_lerobot`` uses and LeRobot 0.3.x
reads (docs/FACTS.md section 3)::

    meta/info.json               codebase_version "v2.1", fps, features, paths, totals
    meta/episodes.jsonl          {"episode_index", "tasks": [str], "length"} per episode
    meta/tasks.jsonl             {"task_index", "task"}
    meta/episodes_stats.jsonl    {"episode_index", "stats": {feature: {min,max,mean,std,count}}}
    meta/stats.json              the same statistics aggregated over all episodes
    data/chunk-000/episode_000000.parquet                        one row per frame
    videos/chunk-000/<video_key>/episode_000000.mp4              one h264 mp4 per camera

Every file is written through :mod:`tutorial_utils.io` (temporary file + rename), so a crash
leaves either the old file or the new one, never half of one. Every problem found when
opening a dataset raises :class:`DatasetError`, which names the file, the key and the fix.

``pyarrow`` and ``av`` (PyAV) are imported inside the functions that need them."""

from __future__ import annotations

import bisect
import collections
import json
import os
import re
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.data.video import (
    _INHERITED,
    VIDEO_CODEC_NAME,
    VIDEO_PIX_FMT,
    _EpisodeVideo,
    decode_all_frames,
    encode_video,
    probe_video,
)
from tutorial_utils.errors import DatasetError
from tutorial_utils.io import SmallFileError, atomic_path, atomic_write_json, atomic_write_text, read_bounded_bytes

# --------------------------------------------------------------------------------------
# Constants: the format and the LIBERO schema live here and nowhere else.
# --------------------------------------------------------------------------------------

CODEBASE_VERSION = "v2.1"
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
INFO_PATH = "meta/info.json"
EPISODES_PATH = "meta/episodes.jsonl"
TASKS_PATH = "meta/tasks.jsonl"
EPISODES_STATS_PATH = "meta/episodes_stats.jsonl"
STATS_PATH = "meta/stats.json"

#: The five columns every LeRobot v2.1 parquet has; the writer fills them.
DEFAULT_FEATURES: dict[str, dict] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}

#: Keys ``meta/info.json`` must have for this reader (LeRobot 0.3.x needs the same ones).
REQUIRED_INFO_KEYS = (
    "codebase_version",
    "robot_type",
    "total_episodes",
    "total_frames",
    "total_tasks",
    "total_videos",
    "total_chunks",
    "chunks_size",
    "fps",
    "splits",
    "data_path",
    "features",
)


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` of a value found in a file, cut to ``limit`` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: the largest metadata file read (info.json, episodes.jsonl of many thousand episodes, stats)
METADATA_MAX_BYTES = 256 << 20


def _read_text(path: Path, fix: str) -> str:
    """A metadata file as text; non-UTF-8 bytes or an unreadable file raise :class:`DatasetError`."""
    try:  # a regular file of bounded size: a FIFO or a symlink to /dev/zero never hangs or fills memory
        return read_bounded_bytes(path, METADATA_MAX_BYTES, fix).decode("utf-8")
    except SmallFileError as exc:
        raise DatasetError(path, None, exc.problem, fix) from None
    except UnicodeDecodeError as exc:
        raise DatasetError(path, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})", fix) from None
    except OSError as exc:
        raise DatasetError(path, None, f"cannot be read ({exc.strerror or exc})", fix) from None


def _parse_json(text: str, path: Path, key: str | None, fix: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f" at line {exc.lineno}" if key is None else ""
        raise DatasetError(path, key, f"not valid JSON ({exc.msg}{where})", fix) from None
    except (ValueError, RecursionError) as exc:  # e.g. a 5,000-digit number, nesting too deep
        raise DatasetError(path, key, f"not valid JSON ({type(exc).__name__}: {_short(str(exc))})", fix) from None


def read_json_object(path: str | os.PathLike, fix: str) -> dict:
    """A JSON metadata file that must hold one object (``stats.json``, ``modality.json``...).

    Not UTF-8, not JSON or not an object: :class:`DatasetError` naming the file, with ``fix``."""
    path = Path(path)
    obj = _parse_json(_read_text(path, fix), path, None, fix)
    if not isinstance(obj, dict):
        raise DatasetError(path, None, f"expected a JSON object, found {type(obj).__name__}", fix)
    return obj


def read_info(root: str | os.PathLike) -> dict:
    """``meta/info.json`` of a dataset as a dict: the one reader every stage uses. A missing
    file, invalid JSON or UTF-8, or a non-object raises :class:`DatasetError` with the fix."""
    path = Path(root) / INFO_PATH
    if not path.is_file():
        raise DatasetError(
            path,
            None,
            "meta/info.json is missing",
            "point at the dataset root (the folder holding meta/, data/ and videos/); "
            "for a download, fetch the whole repository (e.g. `huggingface-cli download "
            "--repo-type dataset REPO --local-dir DIR`)",
        )
    return read_json_object(path, "re-download meta/info.json")


def _whole(value: Any, file: Path, key: str, fix: str, minimum: int = 0, maximum: int = 1 << 62) -> int:
    """``value`` as an int: a JSON whole number (``20`` or ``20.0``, not ``"20"`` or ``true``) in
    ``[minimum, maximum]``, else :class:`DatasetError` naming the file and the key."""
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if not ok:
        raise DatasetError(file, key, f"must be a whole number, found {_short(value)}", fix)
    v = int(value)
    if not minimum <= v <= maximum:
        raise DatasetError(file, key, f"must be between {minimum} and {maximum}, found {v}", fix)
    return v


#: dtypes of features that are not numbers in the parquet (videos live in mp4 files)
NON_NUMERIC_DTYPES = ("video", "image", "string")


def _numeric_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of a feature's ``dtype`` name when it names numbers (bool, ints, floats)."""
    try:
        dt = np.dtype(name)
    except (TypeError, ValueError, SyntaxError):
        return None
    return dt if dt.kind in "biuf" else None


def check_features(info_path: Path, feats: Any, fix: str = "re-download meta/info.json") -> dict:
    """Check the ``features`` object of ``meta/info.json``: every feature an object with a known
    ``dtype`` and a ``shape`` of whole numbers ([H, W, C] for videos). Returns ``feats``."""
    if not isinstance(feats, dict) or not feats:
        raise DatasetError(info_path, "features", f"must be a non-empty object, found {_short(feats)}", fix)
    for k, ft in feats.items():
        where = f"features.{k}"
        if not isinstance(ft, dict):
            raise DatasetError(info_path, where, f"must be an object with dtype and shape, found {_short(ft)}", fix)
        for sub in ("dtype", "shape"):
            if sub not in ft:
                raise DatasetError(info_path, f"{where}.{sub}", "required key is missing", fix)
        dtype, shape = ft["dtype"], ft["shape"]
        if not isinstance(dtype, str) or (dtype not in NON_NUMERIC_DTYPES and _numeric_dtype(dtype) is None):
            raise DatasetError(
                info_path,
                f"{where}.dtype",
                f"unknown dtype {_short(dtype)}",
                f"use a numeric dtype (float32, int64, bool...) or one of {list(NON_NUMERIC_DTYPES)}",
            )
        if not isinstance(shape, list) or not shape:
            raise DatasetError(info_path, f"{where}.shape", f"must be a list such as [7], found {_short(shape)}", fix)
        for d in shape:
            _whole(d, info_path, f"{where}.shape", fix, minimum=1, maximum=1 << 31)
        if dtype in ("video", "image") and len(shape) != 3:
            raise DatasetError(
                info_path, f"{where}.shape", f"a {dtype} feature needs [height, width, channels], found {shape}", fix
            )
    return feats


#: The fields each path template of ``meta/info.json`` may use.
TEMPLATE_FIELDS = {
    "data_path": ("episode_chunk", "episode_index"),
    "video_path": ("episode_chunk", "episode_index", "video_key"),
}
_NUMBER_SPEC = re.compile(r"0?\d{0,2}d?")


def check_path_template(info_path: Path, key: str, template: Any, video_keys: Sequence[str] = ()) -> str:
    """Check ``data_path`` / ``video_path`` of ``meta/info.json``: a relative path inside the
    dataset root (no ``..``, not absolute) using only the fields LeRobot fills in (number fields
    with an optional width such as ``:06d``). Returns the template; raises :class:`DatasetError`."""
    default = DATA_PATH if key == "data_path" else VIDEO_PATH
    fix = f'use the LeRobot v2.1 template "{default}" (paths stay inside the dataset folder)'
    if not isinstance(template, str) or not template.strip():
        raise DatasetError(info_path, key, f"must be a path template string, found {_short(template)}", fix)
    if "\x00" in template:
        raise DatasetError(info_path, key, "the template holds a NUL character", fix)
    allowed = TEMPLATE_FIELDS[key]
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise DatasetError(info_path, key, f"not a valid path template ({exc})", fix) from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in allowed:
            raise DatasetError(
                info_path,
                key,
                f"unknown field {{{name}}} in {_short(template)} (allowed: {', '.join('{' + a + '}' for a in allowed)})",
                fix,
            )
        number = name != "video_key"
        if conversion is not None or (spec and not (number and _NUMBER_SPEC.fullmatch(spec))):
            raise DatasetError(
                info_path,
                key,
                f"field {{{name}}} has an unsupported format {_short(spec or '!' + str(conversion))} "
                "(only a width such as :06d is allowed)",
                fix,
            )
    # the template with a plain camera name first (its own fault), then each video feature's name
    samples = [("camera", False)] + ([(vk, True) for vk in video_keys] if key == "video_path" else [])
    for vk, blame_feature in samples:
        rel = template.format(episode_chunk=0, episode_index=0, video_key=vk)
        where, how = (
            (f"{key} / features.{vk}", "rename the video feature (a plain name such as observation.images.image)")
            if blame_feature
            else (key, fix)
        )
        if rel.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", rel) or os.path.isabs(rel):
            raise DatasetError(info_path, where, f"the path {_short(rel)} is an absolute path", how)
        if ".." in rel.replace("\\", "/").split("/") or not rel.strip("/\\."):
            raise DatasetError(info_path, where, f"the path {_short(rel)} leaves the dataset folder", how)
    return template


def _norm_features(features: dict) -> dict:
    """Features with lists for shapes (JSON round trip) and the default columns added."""
    if not isinstance(features, dict):
        raise ValueError(f"features must be a dict of feature name -> {{dtype, shape}}, got {_short(features)}")
    out = json.loads(json.dumps(features))
    for key, ft in DEFAULT_FEATURES.items():
        out.setdefault(key, json.loads(json.dumps(ft)))
    for key, ft in out.items():
        if not isinstance(ft, dict) or "dtype" not in ft or "shape" not in ft:
            raise ValueError(f"feature {key!r} needs 'dtype' and 'shape' (got {_short(ft)})")
        ft["shape"] = [int(x) for x in ft["shape"]]
        ft.setdefault("names", None)
    return out


def _schema_view(features: dict) -> dict:
    """What must match for two datasets to be the same kind: names, dtypes, shapes."""
    return {k: (v["dtype"], list(v["shape"])) for k, v in features.items()}


def video_keys_of(features: dict) -> list[str]:
    return [k for k, v in features.items() if v.get("dtype") == "video"]


def _jsonl(rows: Sequence[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _read_jsonl_strict(path: Path, what: str) -> list[dict]:
    """The rows of a ``.jsonl`` metadata file, each a JSON object; any problem (missing, not
    UTF-8, a line that is not JSON or not an object) raises :class:`DatasetError`."""
    fix = "re-download the file or re-run the writer's finalize()"
    if not path.is_file():
        raise DatasetError(
            path,
            None,
            f"{what} is missing",
            "copy the whole meta/ folder of the dataset, or re-run the writer's finalize()",
        )
    rows = []
    # split on "\n" only: str.splitlines() also splits on U+2028 and friends, which JSON strings
    # written with ensure_ascii=False may hold
    for i, line in enumerate(_read_text(path, fix).split("\n")):
        if not line.strip():
            continue
        row = _parse_json(line, path, f"line {i + 1}", fix)
        if not isinstance(row, dict):
            raise DatasetError(path, f"line {i + 1}", f"expected a JSON object, found {_short(row)}", fix)
        rows.append(row)
    return rows


def _chunk(ep: int, chunks_size: int) -> int:
    return ep // chunks_size


def _feature_stats(x: np.ndarray) -> dict:
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


def _image_stats(frames: np.ndarray, max_samples: int = 100, max_side: int = 64) -> dict:
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
# Writer
# --------------------------------------------------------------------------------------


class LeRobotWriter:
    """Append episodes one at a time to a LeRobot v2.1 dataset; resume an interrupted one.

    ``LeRobotWriter(root, features, fps)`` creates ``root`` or continues the dataset already
    there: episodes listed in ``meta/episodes.jsonl`` are kept, files of the half-written
    episode after them are removed. A folder holding another dataset (other features, fps or
    robot) is refused, and so is a commit log that is missing, unreadable or disagrees with the
    files on disk: then nothing is deleted and the error says how to recover. Single process:
    send episodes from workers to one writer.

    Per episode, the videos and the parquet are written first (each atomically), then the
    meta files; ``meta/episodes.jsonl`` is the commit point. ``finalize()`` rewrites every
    meta file with the final totals and may be called any number of times.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        features: dict,
        fps: int,
        robot_type: str | None = None,
        *,
        chunks_size: int = CHUNKS_SIZE,
        crf: int = 23,
        preset: str = "veryfast",
        gop: int | None = None,
        image_stats_samples: int = 100,
    ):
        self.root = Path(root)
        self.fps = int(fps)
        if self.fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.robot_type = robot_type
        self.chunks_size = int(chunks_size)
        self.crf, self.preset, self.gop = crf, preset, gop
        self.image_stats_samples = image_stats_samples
        self.features = _norm_features(features)
        self.video_keys = video_keys_of(self.features)
        for key in self.video_keys:
            shape = self.features[key]["shape"]
            if len(shape) != 3 or shape[2] != 3:
                raise ValueError(f"video feature {key!r} must have shape (H, W, 3), got {shape}")
            h, w, _ = shape
            self.features[key]["info"] = {
                "video.height": h,
                "video.width": w,
                "video.codec": VIDEO_CODEC_NAME,
                "video.pix_fmt": VIDEO_PIX_FMT,
                "video.is_depth_map": False,
                "video.fps": self.fps,
                "video.channels": 3,
                "has_audio": False,
            }
        self._data_keys = [k for k in self.features if k not in DEFAULT_FEATURES and k not in self.video_keys]
        self._episodes: list[dict] = []
        self._episode_stats: list[dict] = []
        self._episode_stats_lines: list[str] = []
        self._tasks: dict[str, int] = {}
        self._total_frames = 0
        self._lock_fd = self._take_lock()
        try:
            self._open_or_resume()
        except BaseException:  # refused: release the lock now, not when the object is collected
            self.close()
            raise

    def _take_lock(self) -> int:
        """One writer per dataset: a second one (another job resuming the same folder) fails
        clearly instead of interleaving episodes. The lock sits beside the folder, so an empty
        folder stays empty, and the OS drops it when the process dies."""
        import fcntl

        lock = self.root.parent / f".{self.root.name}.writer.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DatasetError(
                self.root,
                None,
                f"another writer (pid {holder}) is writing this dataset",
                "wait for that job to finish (or stop it) and run again: it resumes",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def close(self) -> None:
        """Release the writer lock (``finalize`` first if you want the metadata written)."""
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __del__(self) -> None:
        self.close()

    # -- opening -----------------------------------------------------------------------
    def _open_or_resume(self) -> None:
        info_path = self.root / INFO_PATH
        if info_path.is_file():
            fix = (
                f"the writer changed nothing in {self.root}: write to a new folder, or move this one aside "
                f"(`mv {self.root} {self.root}.old`) if you want to keep it, or delete it if it is disposable"
            )
            try:
                info = read_info(self.root)
                feats = check_features(info_path, info.get("features"), fix)
            except DatasetError as exc:
                raise DatasetError(exc.file, exc.key, exc.problem, fix) from None
            mismatch = []
            if info.get("codebase_version") != CODEBASE_VERSION:
                mismatch.append(f"codebase_version {_short(info.get('codebase_version'))} != {CODEBASE_VERSION!r}")
            fps = info.get("fps")
            if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps != self.fps:
                mismatch.append(f"fps {_short(fps)} != {self.fps}")
            if self.robot_type is None:  # not given: keep the dataset's own
                self.robot_type = info.get("robot_type")
            elif info.get("robot_type") != self.robot_type:
                mismatch.append(f"robot_type {_short(info.get('robot_type'))} != {self.robot_type!r}")
            theirs = _schema_view(_norm_features(feats))
            ours = _schema_view(self.features)
            if theirs != ours:
                diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
                mismatch.append(f"features differ at {diff}")
            for key, ours_t in (("data_path", DATA_PATH), ("video_path", VIDEO_PATH if self.video_keys else None)):
                if info.get(key) != ours_t:  # the writer writes (and deletes) only at its own paths
                    mismatch.append(f"{key} {_short(info.get(key))} != {ours_t!r}")
            if mismatch:
                raise DatasetError(
                    info_path,
                    None,
                    "this folder holds a different dataset: " + "; ".join(mismatch),
                    "write to a new folder, or delete this one if it is disposable",
                )
            self.chunks_size = _whole(info.get("chunks_size", self.chunks_size), info_path, "chunks_size", fix, 1)
            self._resume(info, fix)
        else:
            if self.root.exists() and any(
                p.name not in {"meta", "data", "videos"} or any(p.rglob("*")) for p in self.root.iterdir()
            ):
                raise DatasetError(
                    self.root,
                    INFO_PATH,
                    "the folder is not empty and has no meta/info.json",
                    "write to a new or empty folder (the writer never mixes its files with others)",
                )
            self.root.mkdir(parents=True, exist_ok=True)
            self._write_info()

    _EPISODE_FILE = re.compile(r"episode_(\d+)\.(parquet|mp4)$")

    def _episode_files_on_disk(self) -> tuple[dict[int, list[Path]], list[Path]]:
        """Episode files under data/ and videos/ by episode index, and temporary files (names
        starting with "." are the temporary files of interrupted atomic writes)."""
        found: dict[int, list[Path]] = {}
        temps: list[Path] = []
        for sub in ("data", "videos"):
            base = self.root / sub
            for p in sorted(base.rglob("*")) if base.is_dir() else []:
                if not p.is_file():
                    continue
                if p.name.startswith("."):
                    temps.append(p)
                    continue
                m = self._EPISODE_FILE.search(p.name)
                if m:
                    found.setdefault(int(m.group(1)), []).append(p)
        temps += [p for p in (self.root / "meta").glob(".*") if p.is_file()]
        return found, temps

    def _resume(self, info: dict, fix: str) -> None:
        """Continue the dataset on disk. ``meta/episodes.jsonl`` is the commit log: the episodes
        it lists are kept, and the files of the one episode after them (interrupted while being
        written) are removed. A commit log that is missing, unreadable or disagrees with the
        files on disk is refused with a :class:`DatasetError`, and nothing is deleted."""
        import pyarrow.parquet as pq

        ep_path = self.root / EPISODES_PATH
        info_path = self.root / INFO_PATH
        found, temps = self._episode_files_on_disk()
        n_files = sum(len(v) for v in found.values())

        def refuse(file, key, problem: str, restore: str | None = None):
            on_disk = (
                f"{n_files} episode files on disk (episodes {min(found)}..{max(found)}, e.g. "
                f"{found[min(found)][0].relative_to(self.root).as_posix()})"
                if found
                else "no episode files on disk"
            )
            restore = restore or f"restore {Path(file).relative_to(self.root).as_posix()} from a copy"
            raise DatasetError(
                file,
                key,
                f"{problem}; the writer cannot tell which episodes are complete, so it refuses to resume "
                f"and deleted nothing ({on_disk})",
                f"{restore} if you have one; otherwise move the folder aside (`mv {self.root} {self.root}.broken`) "
                "and record into a new one (`python -m tutorial_utils dataset validate` tells what the old "
                "folder still holds), or delete it if it is disposable",
            )

        try:
            total = _whole(info.get("total_episodes", 0), info_path, "total_episodes", fix)
        except DatasetError as exc:
            refuse(exc.file, exc.key, exc.problem)
        if not ep_path.is_file():
            if total != 0 or any(ep != 0 for ep in found):
                refuse(
                    ep_path,
                    None,
                    f"{EPISODES_PATH} (the commit log) is missing but meta/info.json says total_episodes {total}",
                )
            committed: list[dict] = []
        else:
            try:
                committed = _read_jsonl_strict(ep_path, EPISODES_PATH)
            except DatasetError as exc:
                refuse(exc.file, exc.key, exc.problem)
            for i, row in enumerate(committed):
                ei = row.get("episode_index")
                if isinstance(ei, bool) or not isinstance(ei, int) or ei != i:
                    refuse(
                        ep_path, f"line {i + 1}: episode_index", f"expected the whole number {i}, found {_short(ei)}"
                    )
                try:
                    _whole(row.get("length"), ep_path, f"line {i + 1}: length", fix, minimum=1)
                except DatasetError as exc:
                    refuse(exc.file, exc.key, exc.problem)
                tasks = row.get("tasks", [])
                if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
                    refuse(ep_path, f"line {i + 1}: tasks", f"must be a list of task strings, found {_short(tasks)}")
        n = len(committed)
        if total not in (n, n - 1):  # info.json is written right after the commit, so it may lag by one
            refuse(
                info_path,
                "total_episodes",
                f"says {total} but {EPISODES_PATH} lists {n} episodes",
                f"restore {EPISODES_PATH} from a copy",
            )
        # every committed episode has all its files, with as many rows as the log says
        expected = {}
        for ep in range(n):
            for p in self._episode_paths(ep):
                expected[p] = ep
                if not p.is_file() or p.stat().st_size == 0:
                    refuse(p, f"episode {ep}", f"{EPISODES_PATH} lists episode {ep} but this file is missing or empty")
            data = self.root / self._data_path(ep)
            try:
                n_rows = pq.read_metadata(data).num_rows
            except Exception as exc:  # any unreadable parquet is refused the same way
                refuse(data, f"episode {ep}", f"not a readable parquet file ({type(exc).__name__})")
            if n_rows != int(committed[ep]["length"]):
                refuse(
                    data,
                    "length",
                    f"{EPISODES_PATH} says episode {ep} has {committed[ep]['length']} frames, the parquet has {n_rows} rows",
                )
        # the only other episode files allowed are those of episode n, interrupted while being written
        in_flight = set(self._episode_paths(n))
        strays = [p for ps in found.values() for p in ps if p not in expected and p not in in_flight]
        if strays:
            refuse(
                strays[0],
                None,
                f"{len(strays)} episode file(s) that {EPISODES_PATH} ({n} episodes) does not account for, "
                f"e.g. {strays[0].relative_to(self.root).as_posix()}",
                f"restore {EPISODES_PATH} (which lists every committed episode) from a copy",
            )
        tasks_path = self.root / TASKS_PATH
        if tasks_path.is_file():
            try:
                rows = _read_jsonl_strict(tasks_path, TASKS_PATH)
            except DatasetError as exc:
                refuse(exc.file, exc.key, exc.problem)
            for i, row in enumerate(rows):
                ti, task = row.get("task_index"), row.get("task")
                if isinstance(ti, bool) or not isinstance(ti, int) or ti < 0 or not isinstance(task, str):
                    refuse(tasks_path, f"line {i + 1}", f"expected {{task_index, task}}, found {_short(row)}")
                self._tasks[task] = ti
        for ep in committed:
            for task in ep.get("tasks", []):
                self._tasks.setdefault(task, len(self._tasks))
        by_ep = self._read_episode_stats(n)  # derived data: what is missing or unreadable is recomputed
        self._episode_stats = []
        for i in range(n):
            if i not in by_ep:
                by_ep[i] = self._recompute_episode_stats(i)
            self._episode_stats.append(by_ep[i])
        self._episodes = committed
        self._total_frames = sum(int(e["length"]) for e in committed)
        # everything checked: remove the interrupted episode's files and temporary files only
        for p in sorted(in_flight) + temps:
            p.unlink(missing_ok=True)
        atomic_write_text(self.root / EPISODES_PATH, _jsonl(self._episodes))
        self._write_info()

    def _read_episode_stats(self, n: int) -> dict[int, dict]:
        path = self.root / EPISODES_STATS_PATH
        if not path.is_file():
            return {}
        try:
            rows = _read_jsonl_strict(path, EPISODES_STATS_PATH)
        except DatasetError:
            return {}
        by_ep = {}
        for r in rows:
            ei, stats = r.get("episode_index"), r.get("stats")
            if isinstance(ei, int) and not isinstance(ei, bool) and 0 <= ei < n and isinstance(stats, dict):
                by_ep[ei] = stats
        return by_ep

    def _episode_paths(self, ep: int) -> list[Path]:
        return [self.root / self._data_path(ep)] + [self.root / self._video_path(ep, k) for k in self.video_keys]

    def _recompute_episode_stats(self, ep: int) -> dict:
        import pyarrow.parquet as pq

        table = pq.read_table(self.root / self._data_path(ep))
        stats = {
            k: _feature_stats(_column_to_numpy(table, k, self.features[k], self.root / self._data_path(ep)))
            for k in table.column_names
            if k in self.features
        }
        for key in self.video_keys:
            stats[key] = _image_stats(
                decode_all_frames_checked(self.root / self._video_path(ep, key)), self.image_stats_samples
            )
        return stats

    # -- paths -------------------------------------------------------------------------
    def _data_path(self, ep: int) -> str:
        return DATA_PATH.format(episode_chunk=_chunk(ep, self.chunks_size), episode_index=ep)

    def _video_path(self, ep: int, key: str) -> str:
        return VIDEO_PATH.format(episode_chunk=_chunk(ep, self.chunks_size), video_key=key, episode_index=ep)

    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    @property
    def num_frames(self) -> int:
        return self._total_frames

    # -- writing -----------------------------------------------------------------------
    def _check_frames(self, frames: dict[str, np.ndarray]) -> tuple[int, dict[str, np.ndarray]]:
        expected = set(self._data_keys) | set(self.video_keys)
        missing = sorted(expected - set(frames))
        extra = sorted(set(frames) - expected - set(DEFAULT_FEATURES))
        if missing or extra:
            raise ValueError(
                f"add_episode: frames must have exactly the keys {sorted(expected)}; "
                f"missing {missing}, unexpected {extra}"
            )
        lengths = {k: len(frames[k]) for k in expected}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"add_episode: every array needs the same number of frames, got {lengths}")
        t = next(iter(lengths.values()))
        if t < 1:
            raise ValueError("add_episode: an episode needs at least one frame")
        out = {}
        for k in expected:
            ft = self.features[k]
            arr = np.asarray(frames[k])
            want = (t, *ft["shape"])
            if k in self.video_keys:
                if arr.dtype != np.uint8 or arr.shape != want:
                    raise ValueError(f"add_episode: {k!r} must be uint8 {want}, got {arr.dtype} {arr.shape}")
            else:
                if ft["shape"] == [1] and arr.ndim == 1:
                    arr = arr[:, None]
                if arr.shape != want:
                    raise ValueError(f"add_episode: {k!r} must have shape {want}, got {arr.shape}")
                arr = arr.astype(ft["dtype"], copy=False)
                if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    raise ValueError(f"add_episode: {k!r} has NaN or inf values")
            out[k] = arr
        return t, out

    def add_episode(self, frames: dict[str, np.ndarray], task: str) -> int:
        """Write one episode; returns its episode_index. ``frames``: every non-default feature,
        with a leading time axis (videos ``(T,H,W,3)`` uint8)."""
        if not isinstance(task, str) or not task.strip():
            raise ValueError("add_episode: task must be a non-empty string (the language instruction)")
        t, arrs = self._check_frames(frames)
        ep = self.num_episodes
        new_task = task not in self._tasks
        task_index = self._tasks.setdefault(task, len(self._tasks))
        written: list[Path] = []
        try:
            stats = self._write_episode_files(ep, t, arrs, task_index, written)
        except BaseException:
            # nothing of an uncommitted episode stays on disk
            for p in written:
                p.unlink(missing_ok=True)
            if new_task:
                del self._tasks[task]
            raise
        # 3. meta (episodes.jsonl last: the commit point)
        self._episodes.append({"episode_index": ep, "tasks": [task], "length": int(t)})
        self._episode_stats.append(stats)
        self._total_frames += t
        if new_task:
            self._write_tasks()
        self._write_episodes_stats()
        atomic_write_text(self.root / EPISODES_PATH, _jsonl(self._episodes))
        self._write_info()
        return ep

    def _write_episode_files(self, ep: int, t: int, arrs: dict, task_index: int, written: list) -> dict:
        stats: dict[str, dict] = {}
        # 1. videos (each atomic)
        for key in self.video_keys:
            written.append(self.root / self._video_path(ep, key))
            encode_video(written[-1], arrs[key], self.fps, crf=self.crf, preset=self.preset, gop=self.gop)
            stats[key] = _image_stats(arrs[key], self.image_stats_samples)
        # 2. parquet (atomic)
        cols = {
            "timestamp": (np.arange(t, dtype=np.float32) / np.float32(self.fps)).astype(np.float32),
            "frame_index": np.arange(t, dtype=np.int64),
            "episode_index": np.full(t, ep, dtype=np.int64),
            "index": np.arange(self._total_frames, self._total_frames + t, dtype=np.int64),
            "task_index": np.full(t, task_index, dtype=np.int64),
        }
        for k in self._data_keys:
            cols[k] = arrs[k]
        written.append(self.root / self._data_path(ep))
        self._write_parquet(written[-1], cols)
        for k, v in cols.items():
            stats[k] = _feature_stats(v)
        return stats

    def _write_parquet(self, path: Path, cols: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrays, names = [], []
        for k in self.features:  # the info.json order
            if k not in cols:
                continue
            v = cols[k]
            if self.features[k]["shape"] == [1]:
                arrays.append(pa.array(v.reshape(-1)))
            else:
                flat = pa.array(np.ascontiguousarray(v).reshape(-1))
                arrays.append(pa.FixedSizeListArray.from_arrays(flat, int(np.prod(v.shape[1:]))))
            names.append(k)
        table = pa.Table.from_arrays(arrays, names=names)
        with atomic_path(path, suffix=".parquet") as tmp:
            pq.write_table(table, tmp)

    def _write_tasks(self) -> None:
        rows = [{"task_index": i, "task": t} for t, i in sorted(self._tasks.items(), key=lambda kv: kv[1])]
        atomic_write_text(self.root / TASKS_PATH, _jsonl(rows))

    def _write_episodes_stats(self) -> None:
        lines = self._episode_stats_lines
        for i in range(len(lines), len(self._episode_stats)):  # serialise each episode once
            lines.append(json.dumps({"episode_index": i, "stats": self._episode_stats[i]}) + "\n")
        del lines[len(self._episode_stats) :]
        atomic_write_text(self.root / EPISODES_STATS_PATH, "".join(lines))

    def _info(self) -> dict:
        n = self.num_episodes
        return {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": n,
            "total_frames": int(self._total_frames),
            "total_tasks": len(self._tasks),
            "total_videos": n * len(self.video_keys),
            "total_chunks": (max(n - 1, 0) // self.chunks_size) + 1 if n else 0,
            "chunks_size": self.chunks_size,
            "fps": self.fps,
            "splits": {"train": f"0:{n}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.video_keys else None,
            "features": self.features,
        }

    def _write_info(self) -> None:
        atomic_write_json(self.root / INFO_PATH, self._info(), indent=4)

    def finalize(self) -> Path:
        """Write every meta file (atomically) with the final totals. Idempotent."""
        self._write_tasks()
        self._write_episodes_stats()
        atomic_write_text(self.root / EPISODES_PATH, _jsonl(self._episodes))
        if self._episode_stats:
            atomic_write_json(self.root / STATS_PATH, aggregate_stats(self._episode_stats), indent=4)
        self._write_info()
        return self.root

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.finalize()
        finally:
            self.close()


# --------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------


def _value_type(typ):
    """The element type of a (fixed-size / large) list Arrow type, else the type itself."""
    import pyarrow as pa

    while pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        typ = typ.value_type
    return typ


def check_column_type(path: Path, key: str, typ, ft: dict) -> None:
    """A parquet column of a numeric feature must hold numbers (or lists of numbers): a column of
    strings raises :class:`DatasetError` naming the file and the column."""
    import pyarrow as pa

    if ft.get("dtype") in NON_NUMERIC_DTYPES:
        return
    value = _value_type(typ)
    if not (pa.types.is_integer(value) or pa.types.is_floating(value) or pa.types.is_boolean(value)):
        raise DatasetError(
            path,
            key,
            f"the column holds {typ}, but meta/info.json says dtype {ft.get('dtype')} (numbers)",
            "re-write the episode with numeric values (the dataset's writer does), or re-download it",
        )


NON_FINITE_FIX = (
    "re-record or drop this episode (NaN/inf would poison the statistics and the training loss); "
    "check the recorder or the conversion that wrote it"
)


def check_finite(path: Path, key: str, values: np.ndarray, frames: np.ndarray | None = None) -> None:
    """NaN or inf in a numeric column raises :class:`DatasetError` naming the file, the column and
    the first bad frame (``frames``: the frame index of each row, default the row number)."""
    a = np.asarray(values)
    if a.dtype.kind not in "fc" or a.size == 0:
        return
    flat = a.reshape(len(a), -1)
    bad = ~np.isfinite(flat)
    if not bad.any():
        return
    row = int(np.flatnonzero(bad.any(axis=1))[0])
    dim = int(np.flatnonzero(bad[row])[0])
    frame = row if frames is None else np.asarray(frames).reshape(-1)[row]
    frame = int(frame) if np.isfinite(frame) else row  # a frame_index column may itself be broken
    raise DatasetError(
        path,
        key,
        f"{int(bad.sum())} non-finite value(s); the first is {flat[row, dim]} at frame {frame} (dim {dim})",
        NON_FINITE_FIX,
    )


STAT_FIELDS = ("min", "max", "mean", "std")


def read_stats_json(path: Path) -> dict:
    """``meta/stats.json``: an object of features, each with min/max/mean/std as numbers or
    nested lists of numbers. Anything else raises :class:`DatasetError`."""
    fix = "delete meta/stats.json and re-run LeRobotWriter.finalize() (it is recomputed), or re-download it"
    stats = read_json_object(path, fix)
    for key, entry in stats.items():
        if not isinstance(entry, dict):
            raise DatasetError(path, key, f"expected an object of statistics, found {_short(entry)}", fix)
        for k in STAT_FIELDS:
            if k not in entry:
                continue
            try:
                arr = np.asarray(entry[k], dtype=np.float64)
            except (TypeError, ValueError, OverflowError):
                arr = None
            if arr is None or arr.size == 0:
                raise DatasetError(path, f"{key}.{k}", f"expected numbers, found {_short(entry[k])}", fix)
    return stats


def _column_to_numpy(table, key: str, ft: dict, path: Path) -> np.ndarray:
    """A parquet column as (T, *shape) numpy; DatasetError if missing or the wrong shape."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if key not in table.column_names:
        raise DatasetError(
            path,
            key,
            f"column is missing (columns: {table.column_names})",
            "re-write the episode with every feature of meta/info.json, or remove the "
            "feature from info.json if the dataset never had it",
        )
    col = table.column(key).combine_chunks()
    check_column_type(path, key, col.type, ft)
    shape = list(ft["shape"])
    t = len(col)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        d = int(np.prod(shape))
        if t and (lengths.min() != d or lengths.max() != d):
            raise DatasetError(
                path,
                key,
                f"rows hold {int(lengths.min())}..{int(lengths.max())} values, meta/info.json says shape {shape}",
                "fix the feature's shape in meta/info.json or re-write the episode",
            )
        arr = col.flatten().to_numpy(zero_copy_only=False).reshape(t, *shape)
    else:
        if shape != [1]:
            raise DatasetError(
                path,
                key,
                f"column holds scalars but meta/info.json says shape {shape}",
                "fix the feature's shape in meta/info.json or re-write the episode",
            )
        arr = col.to_numpy(zero_copy_only=False)
    return arr


@dataclass
class Episode:
    """One episode for the book: low-dim arrays in memory, frames decoded on demand."""

    index: int
    task: str
    length: int
    data: dict[str, np.ndarray]
    video_paths: dict[str, Path] = field(default_factory=dict)
    _frames: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def state(self) -> np.ndarray:
        return self.data["observation.state"]

    @property
    def action(self) -> np.ndarray:
        return self.data["action"]

    def frames(self, key: str) -> np.ndarray:
        """All frames of camera ``key`` as (T,H,W,3) uint8 (decoded once, then kept)."""
        if key not in self._frames:
            self._frames[key] = decode_all_frames(self.video_paths[key])
        return self._frames[key]


class LeRobotDataset:
    """A LeRobot v2.1 dataset on disk, validated on open.

    ``sample(i)`` returns a training window for global frame ``i``; it is safe in torch
    DataLoader workers (decoders open lazily per process and are never pickled) and fast
    when consecutive samples come from the same episode (see :func:`episode_grouped_order`):
    each episode's video is decoded forward once and kept in a bounded cache.

    ``verify_videos``: True probes every mp4 header on open (frame count vs parquet length),
    False only checks existence and size, "auto" probes when there are at most 200 videos.
    """

    def __init__(self, root: str | os.PathLike, *, verify_videos: bool | str = "auto", cache_mb: int = 512):
        self.root = Path(root)
        self.cache_bytes = int(cache_mb) * 2**20
        self._load_meta()
        self._check_files(verify_videos)
        self._reset_caches()

    # -- meta --------------------------------------------------------------------------
    def _load_meta(self) -> None:
        info_path = self.root / INFO_PATH
        fix = "re-download meta/info.json"
        info = read_info(self.root)
        for key in REQUIRED_INFO_KEYS:
            if key not in info:
                raise DatasetError(
                    info_path,
                    key,
                    "required key is missing",
                    f'add "{key}" (see docs/FACTS.md section 3 / LeRobot v2.1), or re-download the dataset',
                )
        version = info["codebase_version"]
        if version != CODEBASE_VERSION:
            hint = (
                "LeRobot >= 0.4 wrote this v3.0 dataset; download the v2.1 revision "
                "(`--revision v2.1`) or convert it with LeRobot 0.3.x"
                if str(version).startswith("v3")
                else "convert it to v2.1 with LeRobot 0.3.x (`python -m lerobot.datasets.v21.convert_dataset_v20_to_v21`)"
            )
        else:
            hint = ""
        if hint:
            raise DatasetError(
                info_path,
                "codebase_version",
                f"unsupported version {_short(version)}, this reader reads {CODEBASE_VERSION!r}",
                hint,
            )
        self.info = info
        self.fps = _whole(info["fps"], info_path, "fps", 'set "fps" to the frame rate, e.g. 20', minimum=1)
        self.robot_type = info["robot_type"]
        self.chunks_size = _whole(
            info["chunks_size"], info_path, "chunks_size", f'set "chunks_size": {CHUNKS_SIZE} (episodes per chunk)', 1
        )
        total_episodes = _whole(info["total_episodes"], info_path, "total_episodes", fix)
        total_frames = _whole(info["total_frames"], info_path, "total_frames", fix)
        feats = check_features(info_path, info["features"])
        for k in DEFAULT_FEATURES:
            if k not in feats:
                raise DatasetError(
                    info_path,
                    f"features.{k}",
                    "default LeRobot column is missing",
                    "add it (dtype int64/float32, shape [1]) or re-download the dataset",
                )
        self.features = _norm_features(feats)
        self.video_keys = video_keys_of(self.features)
        check_path_template(info_path, "data_path", info["data_path"])
        if self.video_keys:
            if not info.get("video_path"):
                raise DatasetError(
                    info_path,
                    "video_path",
                    "the dataset has video features but no video_path",
                    f'set "video_path": "{VIDEO_PATH}"',
                )
            check_path_template(info_path, "video_path", info["video_path"], self.video_keys)
        self.data_keys = [k for k in self.features if self.features[k]["dtype"] not in ("video", "image")]

        ep_path = self.root / EPISODES_PATH
        ep_fix = "re-download meta/episodes.jsonl or re-run the writer's finalize()"
        episodes = _read_jsonl_strict(ep_path, "meta/episodes.jsonl")
        lengths = np.zeros(len(episodes), dtype=np.int64)
        for i, ep in enumerate(episodes):
            for key in ("episode_index", "length"):
                if key not in ep:
                    raise DatasetError(ep_path, f"line {i + 1}: {key}", "required key is missing", ep_fix)
            ei = ep["episode_index"]
            if isinstance(ei, bool) or not isinstance(ei, int) or ei != i:
                raise DatasetError(
                    ep_path,
                    f"line {i + 1}: episode_index",
                    f"expected {i}, found {_short(ei)} (episodes must be the whole numbers 0..N-1 in order)",
                    ep_fix,
                )
            lengths[i] = _whole(ep["length"], ep_path, f"line {i + 1}: length", ep_fix, minimum=1, maximum=1 << 40)
            tasks = ep.get("tasks", [])
            if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
                raise DatasetError(
                    ep_path, f"line {i + 1}: tasks", f"must be a list of task strings, found {_short(tasks)}", ep_fix
                )
        if len(episodes) != total_episodes:
            raise DatasetError(
                info_path,
                "total_episodes",
                f"says {total_episodes} but meta/episodes.jsonl lists {len(episodes)}",
                "finish the recording and call LeRobotWriter.finalize() (or re-download)",
            )
        if int(lengths.sum()) != total_frames:
            raise DatasetError(
                info_path,
                "total_frames",
                f"says {total_frames} but the episode lengths in meta/episodes.jsonl add up to {int(lengths.sum())}",
                "call LeRobotWriter.finalize() again (or re-download)",
            )
        self.episodes = episodes
        self.lengths = lengths
        self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths
        tasks_path = self.root / TASKS_PATH
        self.tasks = {}
        for i, r in enumerate(_read_jsonl_strict(tasks_path, "meta/tasks.jsonl")):
            for key in ("task_index", "task"):
                if key not in r:
                    raise DatasetError(
                        tasks_path,
                        f"line {i + 1}: {key}",
                        "required key is missing",
                        "each line needs task_index and task",
                    )
            if not isinstance(r["task"], str):
                raise DatasetError(
                    tasks_path,
                    f"line {i + 1}: task",
                    f"must be a string, found {_short(r['task'])}",
                    "re-download the file",
                )
            ti = _whole(r["task_index"], tasks_path, f"line {i + 1}: task_index", "re-download the file")
            self.tasks[ti] = r["task"]
        self.stats = None
        if (self.root / STATS_PATH).is_file():
            self.stats = read_stats_json(self.root / STATS_PATH)

    def _check_files(self, verify_videos: bool | str) -> None:
        import pyarrow.parquet as pq

        for ep in range(len(self.episodes)):
            path = self.data_path(ep)
            if not path.is_file():
                raise DatasetError(
                    path,
                    None,
                    f"parquet of episode {ep} is missing",
                    "re-download the data/ folder, or re-record the episode",
                )
            try:
                md = pq.read_metadata(path)
                schema = md.schema.to_arrow_schema()
            except Exception as exc:
                raise DatasetError(
                    path,
                    None,
                    f"not a readable parquet file ({type(exc).__name__}: {exc})",
                    "re-download the file, or re-record the episode",
                ) from None
            if md.num_rows != self.lengths[ep]:
                raise DatasetError(
                    path,
                    "length",
                    f"meta/episodes.jsonl says episode {ep} has "
                    f"{int(self.lengths[ep])} frames but the parquet has {md.num_rows} rows",
                    "fix the length in meta/episodes.jsonl (and total_frames in info.json), or re-download the dataset",
                )
            for key in self.data_keys:
                if key not in schema.names:
                    raise DatasetError(
                        path,
                        key,
                        f"column is missing (columns: {schema.names})",
                        "re-write the episode with every feature of meta/info.json, or remove "
                        "the feature from info.json if the dataset never had it",
                    )
                typ = schema.field(key).type
                check_column_type(path, key, typ, self.features[key])
                shape = self.features[key]["shape"]
                size = getattr(typ, "list_size", None)
                if size is not None and size != int(np.prod(shape)):
                    raise DatasetError(
                        path,
                        key,
                        f"rows hold {size} values, meta/info.json says shape {shape}",
                        "fix the feature's shape in meta/info.json or re-write the episode",
                    )
                if _value_type(typ) == typ and shape != [1] and self.features[key]["dtype"] != "string":
                    raise DatasetError(
                        path,
                        key,
                        f"column holds scalars but meta/info.json says shape {shape}",
                        "fix the feature's shape in meta/info.json or re-write the episode",
                    )
            for key in self.video_keys:
                vp = self.video_path(ep, key)
                if not vp.is_file() or vp.stat().st_size == 0:
                    raise DatasetError(
                        vp,
                        key,
                        f"video of episode {ep} is missing or empty",
                        "re-download the videos/ folder, or re-record the episode",
                    )
        n_videos = len(self.episodes) * len(self.video_keys)
        if verify_videos is True or (verify_videos == "auto" and n_videos <= 200):
            self.verify_videos()

    def verify_videos(self) -> None:
        """Probe every mp4: it opens and has at least as many frames as its parquet rows."""
        for ep in range(len(self.episodes)):
            for key in self.video_keys:
                vp = self.video_path(ep, key)
                info = probe_video(vp)
                if info["frames"] and info["frames"] < self.lengths[ep]:
                    raise DatasetError(
                        vp,
                        key,
                        f"the video has {info['frames']} frames but the parquet has {int(self.lengths[ep])} rows",
                        "re-encode or re-record this episode",
                    )
                h, w, _ = self.features[key]["shape"]
                if (info["height"], info["width"]) != (h, w):
                    raise DatasetError(
                        vp,
                        key,
                        f"frames are {info['height']}x{info['width']}, meta/info.json says {h}x{w}",
                        "fix the shape in info.json or re-encode",
                    )

    def validate(self, deep: bool = False) -> dict:
        """Full check. ``deep`` also reads every parquet (numeric columns must be finite) and
        decodes every video to the end. An empty dataset, or one whose files resolve outside
        its folder (symlinks), does not validate."""
        if not self.episodes:
            raise DatasetError(
                self.root / EPISODES_PATH,
                None,
                "the dataset has no episodes",
                "record or download episodes into it first (a recording that stopped before its first "
                "episode leaves an empty dataset: run it again)",
            )
        self.check_inside_root()
        self._check_episodes_stats()
        self.verify_videos()
        if deep:
            for ep in range(len(self.episodes)):
                low = self._lowdim(ep)
                for key in self.data_keys:
                    check_finite(self.data_path(ep), key, low[key], low.get("frame_index"))
                self._check_index_columns(ep, low)
                for key in self.video_keys:
                    frames = decode_all_frames_checked(self.video_path(ep, key))
                    if len(frames) < self.lengths[ep]:
                        raise DatasetError(
                            self.video_path(ep, key),
                            key,
                            f"decoded {len(frames)} frames, the parquet has {int(self.lengths[ep])} rows",
                            "re-encode or re-record this episode",
                        )
        return {
            "episodes": len(self.episodes),
            "frames": self.num_frames,
            "videos": len(self.episodes) * len(self.video_keys),
            "deep": deep,
            "ok": True,
        }

    def _check_index_columns(self, ep: int, low: dict[str, np.ndarray]) -> None:
        """The bookkeeping columns of episode ``ep`` against the metadata: ``episode_index`` is
        ``ep``, ``frame_index`` counts 0..length-1, ``index`` continues the previous episodes'
        (``starts``), ``timestamp`` is ``frame_index / fps`` (to 1 ms), and every ``task_index``
        names a task of meta/tasks.jsonl (else those frames would train with an empty instruction)."""
        path, n = self.data_path(ep), int(self.lengths[ep])
        fix = "re-record or re-download this episode (or re-import it): these columns are written with the frames"
        want = {
            "episode_index": np.full(n, ep, dtype=np.int64),
            "frame_index": np.arange(n, dtype=np.int64),
            "index": int(self.starts[ep]) + np.arange(n, dtype=np.int64),
        }
        for key, expected in want.items():
            if key not in low:
                continue
            got = np.asarray(low[key]).reshape(-1)
            if got.dtype.kind not in "iuf" or len(got) != n:
                raise DatasetError(path, key, f"is {got.dtype} with {len(got)} values, expected {n} whole numbers", fix)
            bad = np.flatnonzero(got != expected)
            if len(bad):
                r = int(bad[0])
                raise DatasetError(
                    path,
                    key,
                    f"{len(bad)} row(s) disagree with the metadata; row {r} has {got[r]!r}, expected {expected[r]}",
                    fix,
                )
        if "timestamp" in low:
            ts = np.asarray(low["timestamp"], dtype=np.float64).reshape(-1)
            expected_ts = np.arange(n, dtype=np.float64) / self.fps
            bad = np.flatnonzero(~(np.abs(ts - expected_ts) <= 1e-3))
            if len(bad):
                r = int(bad[0])
                raise DatasetError(
                    path,
                    "timestamp",
                    f"{len(bad)} row(s) are not frame_index / fps (fps {self.fps}); row {r} has {ts[r]!r}, "
                    f"expected {expected_ts[r]:.4f}",
                    fix,
                )
        if "task_index" in low:
            ti = np.asarray(low["task_index"]).reshape(-1)
            known = np.array(sorted(self.tasks), dtype=np.int64)
            bad = np.flatnonzero(~np.isin(ti, known))
            if len(bad):
                r = int(bad[0])
                raise DatasetError(
                    path,
                    "task_index",
                    f"{len(bad)} row(s) name no task of {TASKS_PATH} (row {r}: {ti[r]!r}; known: "
                    f"{', '.join(map(str, known[:10])) or 'none'})",
                    f"add the task to {TASKS_PATH}, or {fix}",
                )

    def _check_episodes_stats(self) -> None:
        """``meta/episodes_stats.jsonl`` (optional; LeRobot 0.3.x reads it): one object per line
        with a whole-number ``episode_index`` and a ``stats`` object."""
        path = self.root / EPISODES_STATS_PATH
        if not path.is_file():
            return
        fix = "delete it and re-run LeRobotWriter.finalize() on the dataset (it is recomputed), or re-download it"
        for i, row in enumerate(_read_jsonl_strict(path, EPISODES_STATS_PATH)):
            ei = row.get("episode_index")
            if isinstance(ei, bool) or not isinstance(ei, int) or not 0 <= ei < len(self.episodes):
                raise DatasetError(
                    path, f"line {i + 1}: episode_index", f"not an episode of the dataset: {_short(ei)}", fix
                )
            if not isinstance(row.get("stats"), dict):
                raise DatasetError(
                    path, f"line {i + 1}: stats", f"expected an object, found {_short(row.get('stats'))}", fix
                )

    def check_inside_root(self) -> None:
        """Every parquet and mp4 of the dataset resolves (symlinks followed) inside its folder."""
        top = self.root.resolve()
        for ep in range(len(self.episodes)):
            for p in [self.data_path(ep)] + [self.video_path(ep, k) for k in self.video_keys]:
                real = p.resolve()
                if real != top and top not in real.parents:
                    raise DatasetError(
                        p,
                        f"episode {ep}",
                        f"the file resolves to {real}, outside the dataset folder {top} (a symlink?)",
                        "copy the real files into the dataset folder (e.g. `cp -rL`, or `huggingface-cli download "
                        "--local-dir DIR`), then validate again",
                    )

    # -- paths and sizes ---------------------------------------------------------------
    def data_path(self, ep: int) -> Path:
        return self.root / self.info["data_path"].format(episode_chunk=_chunk(ep, self.chunks_size), episode_index=ep)

    def video_path(self, ep: int, key: str) -> Path:
        return self.root / self.info["video_path"].format(
            episode_chunk=_chunk(ep, self.chunks_size), video_key=key, episode_index=ep
        )

    @property
    def num_frames(self) -> int:
        return int(self.lengths.sum())

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def __len__(self) -> int:
        return self.num_frames

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset({str(self.root)!r}, episodes={self.num_episodes}, frames={self.num_frames}, "
            f"fps={self.fps}, cameras={self.video_keys})"
        )

    def locate(self, index: int) -> tuple[int, int]:
        """Global frame index -> (episode_index, frame_index)."""
        n = self.num_frames
        if not -n <= index < n:
            raise IndexError(f"frame index {index} out of range for {n} frames")
        index %= n
        ep = (
            bisect.bisect_right(self.starts.tolist() if not hasattr(self, "_starts_list") else self._starts_list, index)
            - 1
        )
        return ep, int(index - self.starts[ep])

    # -- caches (per process) ----------------------------------------------------------
    def _reset_caches(self) -> None:
        self._pid = os.getpid()
        self._lowdim_cache: dict[int, dict[str, np.ndarray]] = {}
        self._video_cache: collections.OrderedDict[tuple[int, str], _EpisodeVideo] = collections.OrderedDict()
        self._video_bytes = 0
        self._starts_list = self.starts.tolist()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_lowdim_cache"] = {}
        state["_video_cache"] = collections.OrderedDict()
        state["_video_bytes"] = 0
        state["_pid"] = -1
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # forked into a DataLoader worker: never share decoders
            # Decoders opened by the parent must not be closed or freed in the child (FFmpeg
            # state copied by fork can deadlock there): keep them referenced, unused.
            _INHERITED.append(self.__dict__.get("_video_cache"))
            self._reset_caches()

    def _lowdim(self, ep: int) -> dict[str, np.ndarray]:
        self._check_pid()
        got = self._lowdim_cache.get(ep)
        if got is None:
            import pyarrow.parquet as pq

            path = self.data_path(ep)
            table = pq.ParquetFile(path, memory_map=True).read(columns=self.data_keys, use_threads=False)
            got = {k: _column_to_numpy(table, k, self.features[k], path) for k in self.data_keys}
            if len(next(iter(got.values()))) != self.lengths[ep]:
                raise DatasetError(
                    path, "length", "row count changed since the dataset was opened", "re-open the dataset"
                )
            self._lowdim_cache[ep] = got
        return got

    def _video(self, ep: int, key: str) -> _EpisodeVideo:
        self._check_pid()
        k = (ep, key)
        vid = self._video_cache.get(k)
        if vid is not None:
            self._video_cache.move_to_end(k)
            return vid
        vid = _EpisodeVideo(self.video_path(ep, key), int(self.lengths[ep]), self.fps)
        self._video_cache[k] = vid
        self._evict()
        return vid

    #: Open decoders (file handles) kept per process; older ones are closed, frames stay cached.
    MAX_OPEN_DECODERS = 32

    def _evict(self) -> None:
        self._video_bytes = sum(v.nbytes for v in self._video_cache.values())
        while self._video_bytes > self.cache_bytes and len(self._video_cache) > len(self.video_keys):
            _, old = self._video_cache.popitem(last=False)
            old.close()
            self._video_bytes -= old.nbytes
        open_ = [v for v in self._video_cache.values() if v.container is not None]
        for v in open_[: max(0, len(open_) - self.MAX_OPEN_DECODERS)]:
            v.close()

    def frame(self, ep: int, key: str, frame_index: int) -> np.ndarray:
        """One camera frame (H,W,3) uint8."""
        vid = self._video(ep, key)
        before = vid.nbytes
        frame = vid.get(frame_index)
        self._video_bytes += vid.nbytes - before
        if self._video_bytes > self.cache_bytes:
            self._evict()
        return frame

    # -- the training window -----------------------------------------------------------
    def sample(self, index: int, action_horizon: int = 8, video_delta_indices: Sequence[int] = (0,)) -> dict:
        """The training window at global frame ``index``.

        Returns ``state`` (D_s,) float32, ``action`` (H, D_a) float32 (past the episode end the
        last action is repeated), ``action_mask`` (H,) bool (False where padded), one
        ``(len(deltas), H, W, 3)`` uint8 array per camera (indices clamped to the episode),
        ``task``, ``task_index``, ``episode_index``, ``frame_index``, ``index``.
        """
        ep, f = self.locate(index)
        low = self._lowdim(ep)
        t = int(self.lengths[ep])
        idx = f + np.arange(int(action_horizon))
        mask = idx < t
        idx = np.minimum(idx, t - 1)
        out: dict[str, Any] = {
            "state": low["observation.state"][f],
            "action": low["action"][idx],
            "action_mask": mask,
        }
        for key in self.video_keys:
            vi = [min(max(f + int(d), 0), t - 1) for d in video_delta_indices]
            out[key] = np.stack([self.frame(ep, key, i) for i in vi])
        task_index = int(low["task_index"][f]) if "task_index" in low else 0
        out.update(
            task=self.tasks.get(task_index, ""),
            task_index=task_index,
            episode_index=ep,
            frame_index=f,
            index=int(self.starts[ep] + f),
        )
        return out

    def __getitem__(self, index: int) -> dict:
        return self.sample(index)

    # -- episodes for the book ---------------------------------------------------------
    def episode(self, i: int) -> Episode:
        if not 0 <= i < self.num_episodes:
            raise IndexError(f"episode {i} out of range (the dataset has {self.num_episodes})")
        low = self._lowdim(i)
        tasks = self.episodes[i].get("tasks") or [self.tasks.get(int(low["task_index"][0]), "")]
        return Episode(
            index=i,
            task=tasks[0],
            length=int(self.lengths[i]),
            data=dict(low),
            video_paths={k: self.video_path(i, k) for k in self.video_keys},
        )

    def iter_episodes(self) -> Iterator[Episode]:
        for i in range(self.num_episodes):
            yield self.episode(i)

    def summary(self) -> dict:
        return {
            "root": str(self.root),
            "codebase_version": self.info["codebase_version"],
            "robot_type": self.robot_type,
            "fps": self.fps,
            "episodes": self.num_episodes,
            "frames": self.num_frames,
            "tasks": len(self.tasks),
            "cameras": self.video_keys,
            "features": {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in self.features.items()},
        }


def file_tree(root: str | os.PathLike, per_dir: int = 2) -> list[dict]:
    """Rows (path, files, bytes) describing a dataset folder: every folder with its file
    count and size, and the first ``per_dir`` files of each (for the book's anatomy table)."""
    root = Path(root)
    rows = []
    for d in sorted([root] + [p for p in root.rglob("*") if p.is_dir()]):
        files = sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            continue
        rel = d.relative_to(root).as_posix()
        rows.append(
            {
                "path": (rel if rel != "." else "") + "/",
                "files": len(files),
                "bytes": sum(p.stat().st_size for p in files),
            }
        )
        for p in files[:per_dir]:
            rows.append({"path": p.relative_to(root).as_posix(), "files": 1, "bytes": p.stat().st_size})
        if len(files) > per_dir:
            rows.append(
                {
                    "path": f"{rel}/... ({len(files) - per_dir} more)",
                    "files": len(files) - per_dir,
                    "bytes": sum(p.stat().st_size for p in files[per_dir:]),
                }
            )
    return rows


def parquet_columns(ds: LeRobotDataset, episode: int = 0) -> list[dict]:
    """One row per parquet column of an episode: arrow type, info.json dtype/shape, first value."""
    import pyarrow.parquet as pq

    table = pq.read_table(ds.data_path(episode))
    rows = []
    for name in table.column_names:
        ft = ds.features.get(name, {})
        first = table.column(name)[0].as_py()
        if isinstance(first, float):
            first = round(first, 4)
        elif isinstance(first, list):
            first = [round(x, 3) for x in first]
        rows.append(
            {
                "column": name,
                "arrow type": str(table.schema.field(name).type),
                "dtype": ft.get("dtype"),
                "shape": ft.get("shape"),
                "first row": first,
            }
        )
    return rows


def decode_all_frames_checked(path: Path) -> np.ndarray:
    try:
        return decode_all_frames(path)
    except Exception as exc:
        raise DatasetError(
            path,
            None,
            f"decoding failed ({type(exc).__name__}: {exc}); the file is probably truncated",
            "re-download the file, or re-record the episode",
        ) from None


def episode_grouped_order(lengths: Sequence[int], seed: int = 0) -> np.ndarray:
    """A shuffled order of all global frame indices that visits one episode at a time.

    Episodes come in shuffled order and the frames of each episode in shuffled order, so a
    reader decodes each episode's videos once and serves all its frames from the cache
    (random order across the whole dataset re-opens and seeks a video for almost every
    sample). Use it as a DataLoader ``sampler``; batches then mix few episodes.
    """
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    order = []
    for ep in rng.permutation(len(lengths)):
        frames = starts[ep] + rng.permutation(lengths[ep])
        order.append(frames)
    return np.concatenate(order) if order else np.zeros(0, dtype=np.int64)


# --------------------------------------------------------------------------------------
# CLI: python -m tutorial_utils dataset {info,validate,generate,stats} ...
# --------------------------------------------------------------------------------------
