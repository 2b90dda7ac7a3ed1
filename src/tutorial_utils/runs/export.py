"""Export a checkpoint as a self-contained bundle for offline deployment, and verify one.

A bundle is a folder::

    model.safetensors          the weights
    config.json                the checkpoint's config (family, policy config, weights sha256)
    dataset_statistics.json    the normalisation statistics
    manifest.json              family, step, metrics, sha256 + size of every other file, package
                               versions, the input/output schema, and the parity check

It is also a checkpoint directory, so everything that loads a checkpoint loads a bundle:
``tutorial_utils.policies.load(BUNDLE)``, ``python -m tutorial_utils serve --policy <family>
--checkpoint BUNDLE``, the evaluation job's ``checkpoint`` parameter.

:func:`export` refuses a non-empty destination, builds the bundle under a temporary name and
renames it into place (a crash or a full disk leaves nothing half-written), re-loads it and
compares its predicted actions with the source checkpoint's on a seeded batch (parity, recorded
in the manifest; over ``tolerance`` nothing is written). :func:`verify` re-hashes every file and
names the ones that changed.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
from pathlib import Path
from typing import Any

from tutorial_utils.errors import TutorialError
from tutorial_utils.io import atomic_dir, atomic_write_json, read_json_or_empty
from tutorial_utils.policies.checkpoint import (  # noqa: F401  (re-exported: runs.export is where users look)
    BUNDLE_FORMAT,
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    BundleError,
    scan_files,
    verify_bundle,
)
from tutorial_utils.runs.registry import read_metrics
from tutorial_utils.train import checkpoints as ck

BUNDLE_VERSION = 1
#: the checkpoint files a bundle carries (the training state stays behind)
BUNDLE_FILES = ("model.safetensors", "config.json", "dataset_statistics.json")
PACKAGES = ("tutorial_utils", "torch", "numpy", "safetensors", "accelerate")


class ExportError(TutorialError, RuntimeError):
    """An export that was refused (destination not empty) or failed its parity check."""


def _files(folder: Path) -> dict[str, dict]:
    """``{relative path: {bytes, sha256}}`` of every regular file under ``folder`` but the manifest."""
    return scan_files(folder)[0]


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def example_batch(model, n: int = 4, seed: int = 0) -> dict[str, Any]:
    """A seeded batch of ``n`` observations in the model's input schema (LeRobot key names):
    two uint8 cameras at its image size, an 8-D state, a task string."""
    import numpy as np

    from tutorial_utils.policies.base import BATCH_IMAGE, BATCH_STATE, BATCH_TASK, BATCH_WRIST, STATE_DIM

    rng = np.random.default_rng(seed)
    s = int(model.image_size)
    return {
        BATCH_IMAGE: rng.integers(0, 256, (n, s, s, 3), dtype=np.uint8),
        BATCH_WRIST: rng.integers(0, 256, (n, s, s, 3), dtype=np.uint8),
        BATCH_STATE: rng.normal(size=(n, STATE_DIM)).astype(np.float32),
        BATCH_TASK: ["pick up the black bowl and place it on the plate"] * n,
    }


def validation_batch(checkpoint: str | os.PathLike, model, n: int = 8) -> tuple[dict, str] | None:
    """``(batch, description)``: ``n`` evenly spaced frames of the held-out validation episodes
    of the dataset ``checkpoint``'s run trained on (split as the trainer splits it, windows as
    its validation reads them), in ``model``'s input schema; None when the checkpoint is not in
    a run or the run's dataset is not on this machine (a bundle exported elsewhere)."""
    import numpy as np

    from tutorial_utils.train.checkpoints import CONFIG_FILE
    from tutorial_utils.train.data import WindowDataset, collate, open_dataset, split_episodes

    src = Path(checkpoint)
    src = src.resolve() if src.is_symlink() else src
    run = src.parent.parent if src.parent.name == ck.CHECKPOINTS_DIR else None
    train = (read_json_or_empty(run / CONFIG_FILE).get("train") or {}) if run else {}
    dataset = train.get("dataset")
    if not dataset or not (Path(dataset) / "meta" / "info.json").is_file():
        return None
    source = open_dataset(dataset, run_dir=None)
    if hasattr(model, "training_source"):  # the windows the family validates on (TD-MPC)
        source = model.training_source(source)
    _, val_idx, val_eps = split_episodes(source.frame_episode, float(train.get("val_fraction", 0.1)))
    if len(val_idx) == 0:
        return None
    pick = val_idx[np.linspace(0, len(val_idx) - 1, min(n, len(val_idx))).round().astype(int)]
    ds = WindowDataset(source, pick, model.action_horizon, model.image_size)
    what = f"{len(pick)} frames of the {len(val_eps)} validation episodes of {Path(dataset).name}"
    return collate([ds[int(i)] for i in pick]), what


def _predict(model, batch: dict, seed: int):
    import numpy as np
    import torch

    with torch.no_grad():
        return np.asarray(model.predict(batch, generator=torch.Generator().manual_seed(seed)), dtype=np.float32)


def parity(source, bundle, batch: dict | None = None, seed: int = 0) -> dict[str, Any]:
    """The largest absolute difference between the actions two models predict on the same
    seeded batch (``batch``, else :func:`example_batch`)."""
    import numpy as np

    batch = batch if batch is not None else example_batch(source, seed=seed)
    a, b = _predict(source, batch, seed), _predict(bundle, batch, seed)
    if a.shape != b.shape:
        return {"max_abs_diff": float("inf"), "batch": len(batch.get("task", [])), "seed": seed, "shape": list(b.shape)}
    return {
        "max_abs_diff": float(np.max(np.abs(a - b))) if a.size else 0.0,
        "batch": int(a.shape[0]),
        "seed": seed,
        "shape": list(a.shape),
    }


def _schema(model, conf: dict) -> dict[str, Any]:
    from tutorial_utils.policies.base import (
        BATCH_IMAGE,
        BATCH_STATE,
        BATCH_TASK,
        BATCH_WRIST,
        IMAGE_KEY,
        PROMPT_KEY,
        STATE_DIM,
        STATE_KEY,
        WRIST_KEY,
    )

    s, h = int(model.image_size), int(model.action_horizon)
    gripper = (conf.get("dataset") or {}).get("gripper") or getattr(model, "gripper", "dataset")
    image = {"dtype": "uint8", "shape": ["H", "W", 3], "resized_to": [s, s]}
    return {
        "served": {
            "input": {
                IMAGE_KEY: image,
                WRIST_KEY: image,
                STATE_KEY: {"dtype": "float32", "shape": [STATE_DIM]},
                PROMPT_KEY: {"dtype": "str"},
            },
            "output": {"actions": {"dtype": "float32", "shape": [h, 7], "units": "robot, unnormalised"}},
            "protocol": "openpi websocket (python -m tutorial_utils serve --policy FAMILY --checkpoint BUNDLE)",
        },
        "batch": {
            "input": {
                BATCH_IMAGE: {"dtype": "uint8", "shape": ["B", s, s, 3]},
                BATCH_WRIST: {"dtype": "uint8", "shape": ["B", s, s, 3]},
                BATCH_STATE: {"dtype": "float32", "shape": ["B", STATE_DIM]},
                BATCH_TASK: {"dtype": "list[str]", "shape": ["B"]},
            },
            "output": {"dtype": "float32", "shape": ["B", h, 7]},
        },
        "gripper": gripper,
    }


def _metrics(src: Path, step: int | None) -> dict[str, Any]:
    """What is known about the checkpoint's quality: its validation row in the run's metrics,
    its config's validation (``best``), the run's best record."""
    out: dict[str, Any] = {}
    conf = read_json_or_empty(src / "config.json")
    if isinstance(conf.get("val"), dict):
        out.update({k: v for k, v in conf["val"].items() if k.startswith("val_")})
    if src.parent.name == ck.CHECKPOINTS_DIR:
        for r in read_metrics(src.parent.parent):
            if "val_action_mae" in r and r["step"] == step:
                out.update({k: v for k, v in r.items() if k.startswith("val_")})
    best = read_json_or_empty(src / ck.TRAIN_STATE_JSON).get("best")
    if isinstance(best, dict):
        out["run_best"] = best
    return out


def export(
    checkpoint: str | os.PathLike,
    dest: str | os.PathLike,
    batch: dict | None = None,
    seed: int = 0,
    tolerance: float = 1e-5,
) -> dict[str, Any]:
    """Write ``checkpoint`` (a checkpoint directory: ``runs/<id>/checkpoints/last``, ``best``, a
    ``step_*``, another bundle) as a bundle at ``dest`` and return its manifest. ``batch`` is
    the parity batch in LeRobot key names; by default frames of the run's validation episodes
    (:func:`validation_batch`), else :func:`example_batch` where the run's dataset is not here.
    The manifest's ``parity.data`` says which."""
    from tutorial_utils import policies
    from tutorial_utils.policies.checkpoint import read_checkpoint_config

    src = Path(checkpoint)
    src = src.resolve() if src.is_symlink() else src
    conf = read_checkpoint_config(src)  # a clear CheckpointError for anything else
    out = Path(dest)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(
            f"export destination {out} is not empty; a bundle is never written over other files. Pass a new or "
            "empty folder."
        )
    missing = [f for f in BUNDLE_FILES if not (src / f).is_file()]
    if missing:
        raise ExportError(f"{src} lacks {', '.join(missing)}; it is not a complete checkpoint.")
    step = ck.checkpoint_step(src)
    source_model = policies.load(src)
    with atomic_dir(out) as tmp:
        for name in BUNDLE_FILES:
            shutil.copyfile(src / name, tmp / name)
        bundled = policies.load(tmp)  # the weights are checked against config.json's sha256 on load
        what = "the caller's batch"
        if batch is None:
            found = validation_batch(src, source_model)
            batch, what = found if found else (example_batch(source_model, seed=seed), "a seeded random batch")
        check = parity(source_model, bundled, batch, seed)
        check.update(tolerance=tolerance, data=what)
        if not check["max_abs_diff"] <= tolerance:
            raise ExportError(
                f"parity check failed: the bundle's actions differ from {src}'s by {check['max_abs_diff']:.3g} "
                f"(tolerance {tolerance:g}) on {what}; nothing was written to {out}."
            )
        manifest = {
            "format": BUNDLE_FORMAT,
            "version": BUNDLE_VERSION,
            "family": conf["family"],
            "step": step,
            "source": {
                "checkpoint": src.name,
                "run": src.parent.parent.name if src.parent.name == "checkpoints" else None,
            },
            "created": _dt.datetime.now().isoformat(timespec="seconds"),
            "metrics": _metrics(src, step),
            "parameters": conf.get("parameters"),
            "files": _files(tmp),
            "packages": _versions(),
            "schema": _schema(bundled, conf),
            "parity": check,
        }
        atomic_write_json(tmp / MANIFEST_FILE, manifest)
    return manifest


def verify(bundle: str | os.PathLike) -> dict[str, Any]:
    """Check every file of a bundle against its manifest (size and sha256; types checked;
    symbolic links, loops included, refused, never followed); returns the manifest. A
    :class:`BundleError` names each changed, missing, unlisted or linked file. Loading a
    bundle (``policies.load``, ``serve``) runs the same check first."""
    return verify_bundle(bundle)
