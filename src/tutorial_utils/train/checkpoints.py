"""Checkpoint directories of a run: ``step_*``, ``last`` (a relative symlink), ``best``."""

from __future__ import annotations

import os
import time
from pathlib import Path

TRAIN_STATE_FILE = "training_state.pt"
TRAIN_STATE_JSON = "training_state.json"
METRICS_FILE = "metrics.jsonl"


# --- checkpoints ----------------------------------------------------------------------------------


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def find_last(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint: ``last`` if it resolves, else the newest complete step_*."""
    last = ckpt_root / "last"
    if last.exists() and (last / TRAIN_STATE_JSON).is_file():
        return last.resolve()
    steps = sorted(p for p in ckpt_root.glob("step_*") if (p / TRAIN_STATE_JSON).is_file())
    return steps[-1] if steps else None


def point_last(ckpt_root: Path, target: Path) -> None:
    """Atomically make ``checkpoints/last`` a relative symlink to ``target``."""
    tmp = ckpt_root / f".last.tmp-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target.name, tmp)
    os.replace(tmp, ckpt_root / "last")


def slow_save_hook() -> None:
    # Test hook: TUTORIAL_TRAIN_SAVE_DELAY=seconds stalls inside a checkpoint write, so a test can
    # kill -9 the process mid-write. Unset in normal runs.
    delay = float(os.environ.get("TUTORIAL_TRAIN_SAVE_DELAY", "0") or 0)
    if delay > 0:
        time.sleep(delay)
