"""``meta/modality.json``: GR00T-style names for slices of a LeRobot dataset's columns.

DiT4DiT's loader (GR00T style) does not read ``observation.state`` as a whole: it reads
named slices (``state.x``, ``state.gripper``, ``action.yaw``...) that ``meta/modality.json``
maps onto parquet columns, cameras (``video.primary_image``) onto video features and the
language instruction (``annotation.human.action.task_description``) onto ``task_index``.

- :func:`build_modality` makes the file from ``meta/info.json``: the ``libero`` preset is
  DiT4DiT's LIBERO mapping (docs/FACTS.md section 2); ``generic`` names one slice per run of
  equal names in each feature's ``names``.
- :func:`validate_modality` checks any modality file against its dataset and raises a
  :class:`ModalityError` that names the entry and the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tutorial_utils.data.schema import INFO_PATH, check_features, read_info
from tutorial_utils.errors import DatasetError
from tutorial_utils.io import atomic_write_json

MODALITY_PATH = "meta/modality.json"
GROUPS = ("state", "action", "video", "annotation")
#: Default column of each low-dim group when an entry has no ``original_key``.
DEFAULT_ORIGINAL_KEY = {"state": "observation.state", "action": "action"}
ENTRY_FIELDS = {"start", "end", "rotation_type", "absolute", "dtype", "range", "original_key"}
ROTATION_TYPES = {
    None,
    "axis_angle",
    "quaternion",
    "rotation_6d",
    "matrix",
    "euler_angles",
    "euler_angles_rpy",
    "euler_angles_ryp",
    "euler_angles_pry",
    "euler_angles_pyr",
    "euler_angles_yrp",
    "euler_angles_ypr",
}
NUMERIC_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


def _libero_preset() -> dict:
    dims = ["x", "y", "z", "roll", "pitch", "yaw"]
    state = {name: {"start": i, "end": i + 1} for i, name in enumerate(dims)}
    state["pad"] = {"start": 6, "end": 7}
    state["gripper"] = {"start": 7, "end": 8}
    action = {name: {"start": i, "end": i + 1} for i, name in enumerate(dims)}
    action["gripper"] = {"start": 6, "end": 7}
    return {
        "state": state,
        "action": action,
        "video": {
            "primary_image": {"original_key": "observation.images.image"},
            "wrist_image": {"original_key": "observation.images.wrist_image"},
        },
        "annotation": {"human.action.task_description": {"original_key": "task_index"}},
    }


#: DiT4DiT's ``examples/LIBERO/train_files/modality.json`` mapping (docs/FACTS.md section 2).
LIBERO_MODALITY: dict = _libero_preset()


class ModalityError(DatasetError):
    """A modality.json problem: names the file, the entry (``group.name``) and the fix."""


def _generic(info: dict) -> dict:
    out: dict[str, dict] = {"state": {}, "action": {}, "video": {}, "annotation": {}}
    for key, ft in info["features"].items():
        if ft["dtype"] == "video":
            out["video"][key.split(".")[-1]] = {"original_key": key}
            continue
        group = "state" if key == "observation.state" else "action" if key == "action" else None
        if group is None:
            continue
        names = ft.get("names")
        if isinstance(names, dict):
            names = next(iter(names.values()), None)
        size = int(ft["shape"][0])
        if not isinstance(names, list) or len(names) != size:
            names = [f"{group}_{i}" for i in range(size)]
        i = 0
        while i < size:
            j = i
            while j + 1 < size and names[j + 1] == names[i]:
                j += 1
            name = names[i] if names[i] not in out[group] else f"{names[i]}_{i}"
            out[group][name] = {"start": i, "end": j + 1}
            i = j + 1
    if "task_index" in info["features"]:
        out["annotation"]["human.action.task_description"] = {"original_key": "task_index"}
    return {k: v for k, v in out.items() if v}


def _features(root: Path) -> dict:
    """The checked ``features`` of ``meta/info.json`` (each an object with dtype and shape)."""
    return check_features(root / INFO_PATH, read_info(root).get("features"))


def build_modality(root: str | os.PathLike, preset: str = "libero", write: bool = True) -> dict:
    """Build (and by default write, atomically) ``meta/modality.json`` for the dataset at ``root``.

    The result is validated against ``meta/info.json`` before anything is written.
    """
    root = Path(root)
    info = read_info(root)
    info["features"] = _features(root)
    if preset == "libero":
        modality = json.loads(json.dumps(LIBERO_MODALITY))
    elif preset == "generic":
        modality = _generic(info)
    else:
        raise ValueError(f"unknown modality preset {preset!r}; use 'libero' or 'generic'")
    validate_modality(root, modality)
    if write:
        atomic_write_json(root / MODALITY_PATH, modality, indent=4)
    return modality


def validate_modality(root: str | os.PathLike, modality: dict | None = None) -> dict:
    """Check a modality mapping (default: ``root/meta/modality.json``) against ``meta/info.json``.

    Returns a summary ``{group: {name: (original_key, start, end) or original_key}}`` plus
    ``uncovered`` dims per column. Raises :class:`ModalityError` naming the entry and the fix.
    """
    root = Path(root)
    file = root / MODALITY_PATH
    if modality is None:
        if not file.is_file():
            raise ModalityError(
                file,
                None,
                "meta/modality.json is missing",
                "build it: `tutorial_utils.modality.build_modality(root)` (LIBERO preset)",
            )
        fix = "rebuild it with build_modality(root)"
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ModalityError(file, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})", fix) from None
        except OSError as exc:
            raise ModalityError(file, None, f"cannot be read ({exc.strerror or exc})", fix) from None
        try:
            modality = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModalityError(file, None, f"not valid JSON ({exc.msg} at line {exc.lineno})", fix) from None
        except (ValueError, RecursionError) as exc:
            raise ModalityError(file, None, f"not valid JSON ({type(exc).__name__})", fix) from None
    features = _features(root)
    if not isinstance(modality, dict):
        raise ModalityError(file, None, "must be a JSON object of groups", f"use groups {list(GROUPS)}")
    for group in modality:
        if group not in GROUPS:
            raise ModalityError(file, group, f"unknown group (allowed: {list(GROUPS)})", "rename or remove the group")
        if modality[group] and not isinstance(modality[group], dict):
            raise ModalityError(
                file,
                group,
                f"a group must be an object of named entries, found {modality[group]!r:.60}",
                "see the LIBERO preset",
            )
    for group in ("state", "action"):
        if group not in modality or not modality[group]:
            raise ModalityError(
                file, group, "group is missing or empty", f"add the {group} slices (see the LIBERO preset)"
            )
    summary: dict[str, Any] = {}
    used: dict[str, list[tuple[int, int, str]]] = {}
    for group in ("state", "action"):
        summary[group] = {}
        for name, entry in modality[group].items():
            where = f"{group}.{name}"
            if not isinstance(entry, dict):
                raise ModalityError(
                    file, where, "entry must be an object with start and end", 'e.g. {"start": 0, "end": 1}'
                )
            extra = set(entry) - ENTRY_FIELDS
            if extra:
                raise ModalityError(
                    file,
                    where,
                    f"unknown fields {sorted(extra)} (allowed: {sorted(ENTRY_FIELDS)})",
                    "remove or rename them",
                )
            col = entry.get("original_key", DEFAULT_ORIGINAL_KEY[group])
            if not isinstance(col, str) or col not in features:
                raise ModalityError(
                    file,
                    where,
                    f"original_key {col!r} is not a feature of meta/info.json (features: {sorted(features)})",
                    "point original_key at an existing column",
                )
            ft = features[col]
            if ft["dtype"] in ("video", "image", "string"):
                raise ModalityError(
                    file,
                    where,
                    f"original_key {col!r} is a {ft['dtype']} feature, not numbers",
                    "state/action entries must slice a numeric column",
                )
            for k in ("start", "end"):
                if not isinstance(entry.get(k), int) or isinstance(entry.get(k), bool):
                    raise ModalityError(
                        file,
                        where,
                        f"'{k}' must be an integer, found {entry.get(k)!r}",
                        f'set "{k}" to a dim index of {col}',
                    )
            start, end, size = entry["start"], entry["end"], int(ft["shape"][0])
            if not 0 <= start < end <= size:
                raise ModalityError(
                    file,
                    where,
                    f"slice [{start}:{end}] is outside {col} (shape [{size}]) or empty",
                    f"use 0 <= start < end <= {size}",
                )
            for s0, e0, other in used.get(col, []):
                if start < e0 and s0 < end:
                    raise ModalityError(
                        file,
                        where,
                        f"slice [{start}:{end}] of {col} overlaps {other} [{s0}:{e0}]",
                        "make the slices disjoint (each dim belongs to one entry)",
                    )
            used.setdefault(col, []).append((start, end, where))
            if "dtype" in entry and (not isinstance(entry["dtype"], str) or entry["dtype"] not in NUMERIC_DTYPES):
                raise ModalityError(
                    file,
                    where,
                    f"dtype {entry['dtype']!r} is not a numeric dtype",
                    f"use one of {sorted(NUMERIC_DTYPES)} (default float64)",
                )
            if "absolute" in entry and not isinstance(entry["absolute"], bool):
                raise ModalityError(
                    file, where, f"absolute must be true or false, found {entry['absolute']!r}", "use a JSON boolean"
                )
            rotation = entry.get("rotation_type")
            if rotation is not None and (not isinstance(rotation, str) or rotation not in ROTATION_TYPES):
                raise ModalityError(
                    file,
                    where,
                    f"rotation_type {entry.get('rotation_type')!r} is unknown",
                    f"use one of {sorted(r for r in ROTATION_TYPES if r)} or leave it out",
                )
            rng = entry.get("range")
            if rng is not None and not (isinstance(rng, list) and len(rng) == 2):
                raise ModalityError(file, where, f"range must be [low, high], found {rng!r}", "fix or remove range")
            summary[group][name] = (col, start, end)
    for group, kind in (("video", ("video", "image")), ("annotation", None)):
        summary[group] = {}
        for name, entry in (modality.get(group) or {}).items():
            where = f"{group}.{name}"
            col = entry.get("original_key", name) if isinstance(entry, dict) else None
            if not isinstance(col, str) or col not in features:
                raise ModalityError(
                    file,
                    where,
                    f"original_key {col!r} is not a feature of meta/info.json (features: {sorted(features)})",
                    "point original_key at an existing feature",
                )
            if kind and features[col]["dtype"] not in kind:
                raise ModalityError(
                    file,
                    where,
                    f"original_key {col!r} is a {features[col]['dtype']} feature, not a video",
                    "video entries must name a video feature (observation.images.*)",
                )
            summary[group][name] = col
    uncovered = {}
    for col, spans in used.items():
        covered = set()
        for s0, e0, _ in spans:
            covered.update(range(s0, e0))
        missing = sorted(set(range(int(features[col]["shape"][0]))) - covered)
        if missing:
            uncovered[col] = missing
    summary["uncovered"] = uncovered
    return summary


def modality_table(modality: dict) -> list[dict]:
    """Rows (group, name, original_key, start, end) for a readable table in the book."""
    rows = []
    for group in GROUPS:
        for name, entry in (modality.get(group) or {}).items():
            rows.append(
                {
                    "group": group,
                    "name": name,
                    "original_key": entry.get("original_key", DEFAULT_ORIGINAL_KEY.get(group, name)),
                    "start": entry.get("start"),
                    "end": entry.get("end"),
                }
            )
    return rows


__all__ = ["LIBERO_MODALITY", "MODALITY_PATH", "ModalityError", "build_modality", "validate_modality", "modality_table"]
