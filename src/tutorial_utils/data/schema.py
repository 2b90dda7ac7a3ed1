"""LeRobot dataset format v2.1: the schema. Constants, ``meta/info.json`` and its features, the
paths of episode files, and the strict readers of the metadata files.

The on-disk layout is the one ``IPEC-COMMUNITY/libero_*_lerobot`` uses and LeRobot 0.3.x
reads (docs/FACTS.md section 3)::

    meta/info.json               codebase_version "v2.1", fps, features, paths, totals
    meta/episodes.jsonl          {"episode_index", "tasks": [str], "length"} per episode
    meta/tasks.jsonl             {"task_index", "task"}
    meta/episodes_stats.jsonl    {"episode_index", "stats": {feature: {min,max,mean,std,count}}}
    meta/stats.json              the same statistics aggregated over all episodes
    data/chunk-000/episode_000000.parquet                        one row per frame
    videos/chunk-000/<video_key>/episode_000000.mp4              one h264 mp4 per camera

The rest of the format lives beside this module: :mod:`~tutorial_utils.data.writer` writes a
dataset (and resumes one), :mod:`~tutorial_utils.data.reader` opens and validates it,
:mod:`~tutorial_utils.data.columns` types its parquet columns, and
:mod:`~tutorial_utils.data.stats` computes its statistics. Every problem found in a metadata
file raises :class:`DatasetError`, which names the file, the key and the fix."""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.errors import DatasetError
from tutorial_utils.io import SmallFileError, read_bounded_bytes

# --------------------------------------------------------------------------------------
# Constants: the format's versions, paths and columns live here and nowhere else.
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
# Paths of episode files
# --------------------------------------------------------------------------------------


def episode_file(template: str, episode_index: int, chunks_size: int, video_key: str = "") -> str:
    """A path template of ``meta/info.json`` (``data_path``, ``video_path``) filled in for one
    episode, relative to the dataset root; the episode's chunk is ``episode_index // chunks_size``."""
    return template.format(episode_chunk=episode_index // chunks_size, episode_index=episode_index, video_key=video_key)


# --------------------------------------------------------------------------------------
# Reading the metadata files
# --------------------------------------------------------------------------------------


def short_repr(value: Any, limit: int = 60) -> str:
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
        raise DatasetError(path, key, f"not valid JSON ({type(exc).__name__}: {short_repr(str(exc))})", fix) from None


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


def read_jsonl_objects(path: Path, what: str) -> list[dict]:
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
            raise DatasetError(path, f"line {i + 1}", f"expected a JSON object, found {short_repr(row)}", fix)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------
# Checking meta/info.json
# --------------------------------------------------------------------------------------


def whole_number(value: Any, file: Path, key: str, fix: str, minimum: int = 0, maximum: int = 1 << 62) -> int:
    """``value`` as an int: a JSON whole number (``20`` or ``20.0``, not ``"20"`` or ``true``) in
    ``[minimum, maximum]``, else :class:`DatasetError` naming the file and the key."""
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if not ok:
        raise DatasetError(file, key, f"must be a whole number, found {short_repr(value)}", fix)
    v = int(value)
    if not minimum <= v <= maximum:
        raise DatasetError(file, key, f"must be between {minimum} and {maximum}, found {v}", fix)
    return v


#: dtypes of features that are not numbers in the parquet (videos live in mp4 files)
NON_NUMERIC_DTYPES = ("video", "image", "string")


def numeric_dtype(name: str) -> np.dtype | None:
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
        raise DatasetError(info_path, "features", f"must be a non-empty object, found {short_repr(feats)}", fix)
    for k, ft in feats.items():
        where = f"features.{k}"
        if not isinstance(ft, dict):
            raise DatasetError(info_path, where, f"must be an object with dtype and shape, found {short_repr(ft)}", fix)
        for sub in ("dtype", "shape"):
            if sub not in ft:
                raise DatasetError(info_path, f"{where}.{sub}", "required key is missing", fix)
        dtype, shape = ft["dtype"], ft["shape"]
        if not isinstance(dtype, str) or (dtype not in NON_NUMERIC_DTYPES and numeric_dtype(dtype) is None):
            raise DatasetError(
                info_path,
                f"{where}.dtype",
                f"unknown dtype {short_repr(dtype)}",
                f"use a numeric dtype (float32, int64, bool...) or one of {list(NON_NUMERIC_DTYPES)}",
            )
        if not isinstance(shape, list) or not shape:
            raise DatasetError(
                info_path, f"{where}.shape", f"must be a list such as [7], found {short_repr(shape)}", fix
            )
        for d in shape:
            whole_number(d, info_path, f"{where}.shape", fix, minimum=1, maximum=1 << 31)
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
        raise DatasetError(info_path, key, f"must be a path template string, found {short_repr(template)}", fix)
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
                f"unknown field {{{name}}} in {short_repr(template)} (allowed: {', '.join('{' + a + '}' for a in allowed)})",
                fix,
            )
        number = name != "video_key"
        if conversion is not None or (spec and not (number and _NUMBER_SPEC.fullmatch(spec))):
            raise DatasetError(
                info_path,
                key,
                f"field {{{name}}} has an unsupported format {short_repr(spec or '!' + str(conversion))} "
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
            raise DatasetError(info_path, where, f"the path {short_repr(rel)} is an absolute path", how)
        if ".." in rel.replace("\\", "/").split("/") or not rel.strip("/\\."):
            raise DatasetError(info_path, where, f"the path {short_repr(rel)} leaves the dataset folder", how)
    return template


def normalize_features(features: dict) -> dict:
    """Features with lists for shapes (JSON round trip) and the default columns added."""
    if not isinstance(features, dict):
        raise ValueError(f"features must be a dict of feature name -> {{dtype, shape}}, got {short_repr(features)}")
    out = json.loads(json.dumps(features))
    for key, ft in DEFAULT_FEATURES.items():
        out.setdefault(key, json.loads(json.dumps(ft)))
    for key, ft in out.items():
        if not isinstance(ft, dict) or "dtype" not in ft or "shape" not in ft:
            raise ValueError(f"feature {key!r} needs 'dtype' and 'shape' (got {short_repr(ft)})")
        ft["shape"] = [int(x) for x in ft["shape"]]
        ft.setdefault("names", None)
    return out


def video_keys_of(features: dict) -> list[str]:
    return [k for k, v in features.items() if v.get("dtype") == "video"]
