"""Import LIBERO's original HDF5 demonstrations (robomimic layout) into LeRobot v2.1.

LIBERO ships its demonstrations as one HDF5 file per task (``<task words>_demo.hdf5``, written by
LIBERO's ``scripts/create_dataset.py``)::

    data/                       attrs: problem_info (JSON, with "language_instruction"),
                                       env_args (JSON), macros_image_convention ("opengl")
      demo_0/actions            (T, 7) float: delta pose (6) + gripper, robosuite convention
      demo_0/obs/agentview_rgb  (T, H, W, 3) uint8, 128 x 128 in the release
      demo_0/obs/eye_in_hand_rgb
      demo_0/obs/ee_pos         (T, 3)   end-effector position
      demo_0/obs/ee_ori         (T, 3)   axis-angle of the end-effector quaternion
      demo_0/obs/gripper_states (T, 2)   finger joint positions
      demo_0/obs/joint_states, ee_states, states, rewards, dones ...

Each demo becomes one episode of the same schema as the IPEC datasets and our own recordings
(:func:`tutorial_utils.data.libero_schema.libero_features`), written through the one writer
(:class:`tutorial_utils.data.writer.LeRobotWriter`):

- ``observation.state`` = ``ee_pos + ee_ori + gripper_states`` (8, FACTS section 5);
- ``action`` in the dataset gripper convention (+1 open, -1 close:
  :func:`~tutorial_utils.data.libero_schema.env_action_to_dataset`);
- both cameras rotated 180 degrees (robosuite renders upside down with the ``opengl`` image
  convention; FACTS section 5), optionally resized to ``image_size``;
- the task from ``problem_info["language_instruction"]``, else from the file name.

``drop_noops`` drops no-op actions as the ``no_noops`` datasets do (no arm motion and an
unchanged gripper command). An interrupted import resumes: episodes already committed are kept
and the same (file, demo) order continues; another list of sources is refused.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tutorial_utils.data.libero_schema import (
    LIBERO_CAMERAS,
    LIBERO_FPS,
    LIBERO_ROBOT_TYPE,
    env_action_to_dataset,
    libero_features,
    noop_mask,
)
from tutorial_utils.data.writer import LeRobotWriter
from tutorial_utils.errors import DatasetError
from tutorial_utils.io import atomic_write_json

#: the LIBERO HDF5 keys of the two cameras, in the order of ``LIBERO_CAMERAS``
HDF5_CAMERAS = ("obs/agentview_rgb", "obs/eye_in_hand_rgb")
#: the state pieces, concatenated in this order (8 numbers)
HDF5_STATE = ("obs/ee_pos", "obs/ee_ori", "obs/gripper_states")
IMPORT_MANIFEST = "meta/hdf5_import.json"
_SCENE_PREFIX = re.compile(r"^(?:[A-Z0-9]+_)*SCENE\d+_")


def task_from_filename(path: str | os.PathLike) -> str:
    """``KITCHEN_SCENE3_turn_on_the_stove_demo.hdf5`` -> ``turn on the stove``."""
    stem = Path(path).name.removesuffix(".hdf5").removesuffix(".h5").removesuffix("_demo")
    return _SCENE_PREFIX.sub("", stem).replace("_", " ").strip()


def task_of(path: str | os.PathLike, data_attrs) -> str:
    """The language instruction: ``problem_info`` (JSON) of the ``data`` group, else the file name."""
    raw = data_attrs.get("problem_info")
    if raw is not None:
        try:
            text = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw)).get("language_instruction")
        except (ValueError, AttributeError):
            text = None
        if isinstance(text, str) and text.strip():
            return " ".join(text.split())
    task = task_from_filename(path)
    if not task:
        raise DatasetError(
            path,
            "data.attrs[problem_info]",
            "no language instruction in the file and none in its name",
            "name the file after its task (pick_up_the_bowl_demo.hdf5) or add problem_info",
        )
    return task


def _demo_names(path: Path, data) -> list[str]:
    names = [k for k in data.keys() if k.startswith("demo_")]
    if not names:
        raise DatasetError(
            path,
            "data/demo_N",
            "no demonstrations (groups data/demo_0, data/demo_1, ...)",
            "pass a LIBERO / robomimic HDF5 file (LIBERO's datasets/<suite>/*_demo.hdf5)",
        )

    def number(name: str) -> int:
        tail = name.removeprefix("demo_")
        return int(tail) if tail.isdigit() else 1 << 30

    return sorted(names, key=lambda n: (number(n), n))


def _read(path: Path, demo, key: str, name: str) -> np.ndarray:
    if key not in demo:
        have = sorted(demo["obs"].keys()) if "obs" in demo else sorted(demo.keys())
        raise DatasetError(
            path,
            f"data/{name}/{key}",
            f"missing (obs has {', '.join(have)})",
            "export the demos with images and proprioception (LIBERO's create_dataset.py --use-camera-obs, "
            "without --no-proprio)",
        )
    return np.asarray(demo[key][()])


def read_demo(
    path: str | os.PathLike,
    demo: str,
    image_size: int | None = None,
    flip: bool | None = None,
    drop_noops: bool = False,
) -> tuple[dict[str, np.ndarray], str]:
    """One demonstration as writer frames (``observation.state``, ``action``, both cameras) and its task."""
    import h5py

    path = Path(path)
    with h5py.File(path, "r") as f:
        data = f["data"]
        g = data[demo]
        task = task_of(path, data.attrs)
        convention = data.attrs.get("macros_image_convention", "opengl")
        convention = convention.decode() if isinstance(convention, bytes) else str(convention)
        actions = _read(path, g, "actions", demo).astype(np.float32)
        state = np.concatenate([_read(path, g, k, demo).astype(np.float32) for k in HDF5_STATE], axis=1)
        images = [_read(path, g, k, demo) for k in HDF5_CAMERAS]
    t = len(actions)
    if actions.ndim != 2 or actions.shape[1] != 7:
        raise DatasetError(path, f"data/{demo}/actions", f"shape {actions.shape}, expected (T, 7)", "use LIBERO demos")
    if state.shape != (t, 8):
        raise DatasetError(
            path,
            f"data/{demo}/obs",
            f"state {state.shape} from ee_pos + ee_ori + gripper_states, expected ({t}, 8)",
            "each of ee_pos (3), ee_ori (3) and gripper_states (2) needs one row per action",
        )
    for key, img in zip(HDF5_CAMERAS, images, strict=True):
        if img.dtype != np.uint8 or img.ndim != 4 or img.shape[0] != t or img.shape[-1] != 3:
            raise DatasetError(
                path,
                f"data/{demo}/{key}",
                f"{img.dtype} {img.shape}, expected uint8 ({t}, H, W, 3)",
                "export RGB images (LIBERO's create_dataset.py --use-camera-obs)",
            )
    if flip is None:
        flip = convention != "opencv"
    frames: dict[str, np.ndarray] = {"observation.state": state, "action": env_action_to_dataset(actions)}
    for cam, img in zip(LIBERO_CAMERAS, images, strict=True):
        if flip:
            img = img[:, ::-1, ::-1]
        if image_size is not None and img.shape[1:3] != (image_size, image_size):
            from tutorial_utils.data.images import resize

            img = np.stack([resize(x, image_size) for x in img])
        frames[cam] = np.ascontiguousarray(img)
    if drop_noops:
        keep = ~noop_mask(actions)
        if not keep.any():
            raise DatasetError(path, f"data/{demo}/actions", "every action is a no-op", "import without drop_noops")
        frames = {k: v[keep] for k, v in frames.items()}
    return frames, task


def hdf5_files(sources: Sequence[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    """The HDF5 files named by ``sources`` (files, or folders searched for ``*.hdf5``), sorted."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    out: list[Path] = []
    for s in sources:
        p = Path(s)
        if p.is_dir():
            found = sorted(p.rglob("*.hdf5"))
            if not found:
                raise DatasetError(
                    p, None, "no *.hdf5 file in this folder", "point at LIBERO's datasets/<suite> folder"
                )
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise DatasetError(p, None, "no such file or folder", "check the path of the HDF5 demonstrations")
    return out


def plan_import(files: Sequence[Path]) -> list[tuple[str, str]]:
    """(file name, demo) pairs in import order."""
    import h5py

    items = []
    for p in files:
        try:
            with h5py.File(p, "r") as f:
                if "data" not in f:
                    raise DatasetError(p, "data", "no 'data' group", "pass a LIBERO / robomimic HDF5 file")
                items += [(str(p), d) for d in _demo_names(p, f["data"])]
        except OSError as exc:
            raise DatasetError(p, None, f"not a readable HDF5 file ({exc})", "re-download the file") from None
    return items


def import_hdf5(
    sources: Sequence[str | os.PathLike] | str | os.PathLike,
    root: str | os.PathLike,
    image_size: int | None = None,
    *,
    flip: bool | None = None,
    drop_noops: bool = False,
    max_episodes: int | None = None,
    preset: str = "veryfast",
    crf: int = 23,
    progress: bool = False,
) -> dict:
    """Convert every demo of ``sources`` into the LeRobot v2.1 dataset at ``root``; returns a summary.

    ``image_size`` resizes both cameras (default: the files' own size). Resumable: a rerun keeps
    the committed episodes and continues in the same order.
    """
    import h5py

    root = Path(root)
    files = hdf5_files(sources)
    items = plan_import(files)
    if max_episodes is not None:
        items = items[: int(max_episodes)]
    if not items:
        raise DatasetError(files[0] if files else root, None, "nothing to import", "check the sources")
    if image_size is None:
        with h5py.File(items[0][0], "r") as f:
            image_size = int(f["data"][items[0][1]][HDF5_CAMERAS[0]].shape[1])
    manifest_path = root / IMPORT_MANIFEST
    order = [[Path(p).name, d] for p, d in items]
    settings = {"image_size": image_size, "flip": flip, "drop_noops": drop_noops}
    writer = LeRobotWriter(root, libero_features(image_size), LIBERO_FPS, LIBERO_ROBOT_TYPE, preset=preset, crf=crf)
    try:
        done = writer.num_episodes
        if done:
            old = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
            if old.get("order", [])[:done] != order[:done] or old.get("settings") != settings:
                raise DatasetError(
                    manifest_path,
                    "order",
                    f"{root} holds {done} episodes of another dataset, or an import of other HDF5 sources or settings",
                    "import into a new folder, or rerun with the same sources and options",
                )
        atomic_write_json(manifest_path, {"order": order, "settings": settings})
        for i, (path, demo) in enumerate(items[done:], start=done):
            frames, task = read_demo(path, demo, image_size=image_size, flip=flip, drop_noops=drop_noops)
            writer.add_episode(frames, task)
            if progress:
                print(f"  episode {i + 1}/{len(items)}: {Path(path).name} {demo} ({len(frames['action'])} frames)")
        writer.finalize()
        summary = {
            "root": str(root),
            "files": len(files),
            "episodes": writer.num_episodes,
            "frames": writer.num_frames,
            "resumed_from": done,
            "image_size": image_size,
        }
    finally:
        writer.close()
    return summary
