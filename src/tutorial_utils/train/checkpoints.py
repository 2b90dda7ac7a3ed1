"""Checkpoint directories of a run: ``step_*``, ``last`` (a relative symlink), ``best``; the
run directory's lock (one training process per ``output_dir``) and the clean-up of the
temporary folders an interrupted save leaves behind."""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

from tutorial_utils.errors import TutorialError

TRAIN_STATE_FILE = "training_state.pt"
TRAIN_STATE_JSON = "training_state.json"
METRICS_FILE = "metrics.jsonl"
LOCK_FILE = ".train.lock"
#: What :func:`tutorial_utils.io.atomic_dir` and :func:`point_last` name their work in progress:
#: ``.step_000100.tmp-XXXX``, ``.best.tmp-XXXX``, ``.last.tmp-PID``.
_STALE_TEMP = re.compile(r"^\.(?:step_\d+|best|last)\.tmp-")


class OutputDirInUse(TutorialError, RuntimeError):
    """Another training process holds the run directory's lock."""


# --- one training process per run directory -----------------------------------------------------


def lock_output_dir(out: Path) -> int:
    """Take the exclusive lock of run directory ``out`` (``fcntl.flock`` on ``.train.lock``) and
    write who holds it into the file. Returns the file descriptor: closing it (or the process
    ending, however it ends) releases the lock. A second process fails at once, naming the holder.
    """
    import fcntl

    path = Path(out) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(os.pread(fd, 4096, 0))
        os.close(fd)
        raise OutputDirInUse(
            f"{out} is in use by another training process (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}, since {holder.get('since', '?')}; lock file {path}). Two runs in one "
            f"output_dir would interleave their metrics and checkpoints. Wait for it to finish, stop it "
            f"(kill {holder.get('pid', '<pid>')}: it saves a checkpoint), or pass a new output_dir."
        ) from None
    except BaseException:
        os.close(fd)
        raise
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": _dt.datetime.now().isoformat("T", "seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    return fd


def _holder(raw: bytes) -> dict:
    try:
        info = json.loads(raw.decode("utf-8", "replace") or "{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def remove_stale_temps(ckpt_root: Path) -> list[str]:
    """Remove the temporary folders (and ``last`` links) of checkpoint saves that never finished
    (a kill -9 mid-write). Call it only while holding the run directory's lock: then no save is
    in progress. Returns the removed names."""
    removed = []
    if not Path(ckpt_root).is_dir():
        return removed
    for p in sorted(Path(ckpt_root).iterdir()):
        if not _STALE_TEMP.match(p.name):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p.name)
    return removed


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
