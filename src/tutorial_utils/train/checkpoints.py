"""Checkpoint directories of a run: ``step_*``, ``last`` (a relative symlink), ``best``; the
run directory's lock (one training process per ``output_dir``) and the clean-up of the
temporary folders an interrupted save leaves behind; finding a checkpoint by name
(``resume_from``), keep-last-N pruning that spares ``last`` and ``best``, and the discarding of
a run's later checkpoints when it resumes from an earlier one. :class:`Checkpointer` is the training
loop's writer of them (a save, ``best``); the choice of the checkpoint to resume from and the
restore of its state are in :mod:`tutorial_utils.train.resume`."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tutorial_utils.errors import ConfigError, TutorialError
from tutorial_utils.io import SmallFileError, atomic_dir, atomic_write_json, read_json_or_empty, read_small

if TYPE_CHECKING:
    from tutorial_utils.train.config import TrainConfig

CHECKPOINTS_DIR = "checkpoints"
BEST = "best"
TRAIN_STATE_FILE = "training_state.pt"
TRAIN_STATE_JSON = "training_state.json"
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "train_config.json"
LOCK_FILE = ".train.lock"
#: What :func:`tutorial_utils.io.atomic_dir` and :func:`point_last` name their work in progress:
#: ``.step_000100.tmp-XXXX``, ``.best.tmp-XXXX``, ``.last.tmp-PID``.
_STALE_TEMP = re.compile(r"^\.(?:step_\d+|best|last)\.tmp-")


class OutputDirInUse(TutorialError, RuntimeError):
    """Another training process holds the run directory's lock."""


class CheckpointNotFound(ConfigError, LookupError):
    """A checkpoint named by the user (``resume_from``, rollback, mark-best) does not exist."""


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


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a resumable checkpoint (policy files and the training state)."""
    return (Path(path) / TRAIN_STATE_JSON).is_file() and (Path(path) / TRAIN_STATE_FILE).is_file()


def step_dirs(ckpt_root: Path) -> list[Path]:
    """The complete ``step_*`` checkpoints, oldest first."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not p.is_symlink() and is_complete(p))


def last_target(ckpt_root: Path) -> str | None:
    """The name of the ``step_*`` folder ``last`` points to, or None."""
    last = Path(ckpt_root) / "last"
    return os.readlink(last) if last.is_symlink() else None


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint was saved at (training_state.json, else config.json), or None."""
    for name in (TRAIN_STATE_JSON, "config.json"):
        step = read_json_or_empty(Path(path) / name).get("step")
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    return None


#: the keys of ``training_state.json`` and their types
TRAIN_STATE_SCHEMA = {
    "step": int,
    "run_id": (str, type(None)),
    "reason": (str, type(None)),
    "best": (dict, type(None)),
    "batch_size": int,
    "world_size": int,
    "seed": int,
    "time": (int, float),
}


def train_state_meta(path: Path) -> dict:
    """A checkpoint's ``training_state.json``, checked (bounded read, ``step`` a non-negative
    int, the other keys typed): a :class:`CheckpointNotFound` naming the file and the key."""
    f = Path(path) / TRAIN_STATE_JSON
    fix = "resume from another checkpoint (runs checkpoints RUN lists them), or start a new run"
    try:
        meta = read_small(f, schema=TRAIN_STATE_SCHEMA, required=("step",), fix=fix)
    except FileNotFoundError:
        raise CheckpointNotFound(f"{f} is missing: {path} is not a complete checkpoint. Fix: {fix}.") from None
    except SmallFileError as exc:
        raise CheckpointNotFound(str(exc)) from None
    if meta["step"] < 0:
        raise CheckpointNotFound(f"{f} [step]: {meta['step']} is negative. Fix: {fix}.")
    return meta


def load_train_state(path: Path) -> dict:
    """The optimizer, scheduler and RNG state of a checkpoint (``training_state.pt``, loaded
    with ``weights_only=True``). A corrupt or foreign file is a :class:`CheckpointNotFound`
    that says which checkpoint to use instead (never torch's advice to unpickle it unsafely)."""
    import torch

    f = Path(path) / TRAIN_STATE_FILE
    fix = (
        f"resume from another checkpoint of the run (`python -m tutorial_utils runs checkpoints RUN`), or roll back "
        f"to one (`runs rollback RUN step_N`); do not load {TRAIN_STATE_FILE} with weights_only=False"
    )
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointNotFound(f"{f} is missing: the checkpoint is incomplete. Fix: {fix}.") from None
    except Exception as exc:  # UnpicklingError, RuntimeError (not a zip), EOFError, ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise CheckpointNotFound(
            f"{f} is corrupt or not a training state written by this package ({type(exc).__name__}: {first}). "
            f"Fix: {fix}."
        ) from None
    missing = [k for k in ("optimizer", "scheduler", "torch_rng") if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointNotFound(f"{f} lacks {', '.join(missing)}: not a training state of this package. Fix: {fix}.")
    return state


def resolve_checkpoint(ckpt_root: Path, ref: str | os.PathLike, resumable: bool = True) -> Path:
    """The checkpoint ``ref`` names: ``last``, ``best``, a ``step_*`` name under ``ckpt_root``, a
    step number, or a path. ``resumable`` also asks for the training state (``best`` holds only
    the weights). A :class:`CheckpointNotFound` lists what exists."""
    root = Path(ckpt_root)
    text = os.fspath(ref).strip()
    if text.isdigit():
        text = step_dir_name(int(text))
    if text == "last":
        found = find_last(root) if root.is_dir() else None
        path = found if found is not None else root / "last"
    elif os.sep in text or "/" in text:
        path = Path(text)
    else:
        path = root / text
    ok = path.is_dir() and (is_complete(path) if resumable else (path / "config.json").is_file())
    if ok:
        return path.resolve() if path.is_symlink() else path
    names = [p.name for p in step_dirs(root)] + ([BEST] if (root / BEST).is_dir() and not resumable else [])
    why = (
        "it holds only the weights, not the optimizer state a resume needs; pick a step_* checkpoint"
        if resumable and path.name == BEST and path.is_dir()
        else "it does not exist or is incomplete"
    )
    raise CheckpointNotFound(
        f"checkpoint {os.fspath(ref)!r} ({path}): {why}. Checkpoints of {root.parent.name or root}: "
        f"{', '.join(names) or 'none'}{' (and last)' if (root / 'last').exists() else ''}."
    )


def best_step(ckpt_root: Path) -> int | None:
    """The step of the model in ``best`` (the step it was validated at, or the checkpoint it was marked from)."""
    meta = read_json_or_empty(Path(ckpt_root) / BEST / "config.json")
    marked = meta.get("best") if isinstance(meta.get("best"), dict) else {}
    step = marked.get("step", meta.get("step"))
    return step if isinstance(step, int) else None


def marked_by_hand(ckpt_root: Path) -> bool:
    """Whether ``best`` was chosen by hand (``runs.mark_best``): the loop then leaves it alone."""
    meta = read_json_or_empty(Path(ckpt_root) / BEST / "config.json")
    return isinstance(meta.get("best"), dict) and meta["best"].get("by") == "hand"


def remove_checkpoint(path: Path) -> int:
    """Delete a checkpoint folder: renamed first to a temporary name (an interrupted delete is
    cleaned by :func:`remove_stale_temps`), then removed. Returns the bytes freed."""
    path = Path(path)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    doomed = path.parent / f".{path.name}.tmp-del-{os.getpid()}"
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
    return size


def prune(ckpt_root: Path, keep_last: int, protect: tuple[str, ...] = ()) -> list[str]:
    """Keep the newest ``keep_last`` ``step_*`` checkpoints and delete the older ones, never the
    one ``last`` points to, nor the one ``best`` came from, nor the names in ``protect``.
    ``keep_last=0`` keeps all. Returns the deleted names."""
    if keep_last <= 0:
        return []
    root = Path(ckpt_root)
    steps = step_dirs(root)
    keep = {p.name for p in steps[-keep_last:]} | set(protect)
    if (target := last_target(root)) is not None:
        keep.add(target)
    if (b := best_step(root)) is not None:
        keep.add(step_dir_name(b))
    gone = []
    for p in steps:
        if p.name not in keep:
            remove_checkpoint(p)
            gone.append(p.name)
    return gone


def discard_after(ckpt_root: Path, step: int) -> list[str]:
    """Resuming in place from an earlier checkpoint: delete the ``step_*`` checkpoints after
    ``step`` (a future the run no longer has) and ``best`` when it came from after ``step``.
    Returns the deleted names."""
    root = Path(ckpt_root)
    gone = []
    for p in sorted(root.glob("step_*")):
        s = checkpoint_step(p)
        if p.is_dir() and not p.is_symlink() and s is not None and s > step:
            remove_checkpoint(p)
            gone.append(p.name)
    b = best_step(root)
    if b is not None and b > step and (root / BEST).is_dir():
        remove_checkpoint(root / BEST)
        gone.append(BEST)
    return gone


# --- keep_optimizer=last: older step_* checkpoints without their optimizer state -------------------


def has_optimizer_state(path: Path) -> bool:
    """Whether checkpoint ``path`` still holds the optimizer state (``keep_optimizer=last`` drops
    it from every ``step_*`` but the newest; ``training_state.json`` then says ``"optimizer": false``)."""
    try:
        meta = json.loads((Path(path) / TRAIN_STATE_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return meta.get("optimizer", True) is not False


def drop_optimizer_states(ckpt_root: Path, keep: str) -> list[str]:
    """``keep_optimizer=last``: remove the optimizer state from every complete ``step_*`` but
    ``keep`` (the one just saved). Each keeps its weights, scheduler and RNG state (it can be
    served, evaluated, marked best, used as ``pretrained_checkpoint``), and its
    ``training_state.json`` records ``"optimizer": false`` so a resume from it is refused with the
    reason (:func:`optimizer_state_missing`). Returns the names it lightened."""
    import torch

    from tutorial_utils.io import atomic_path

    done = []
    for p in step_dirs(ckpt_root):
        if p.name == keep or not has_optimizer_state(p):
            continue
        state = torch.load(p / TRAIN_STATE_FILE, map_location="cpu", weights_only=True)
        state.pop("optimizer", None)
        with atomic_path(p / TRAIN_STATE_FILE) as tmp:
            torch.save(state, tmp)
        meta = json.loads((p / TRAIN_STATE_JSON).read_text(encoding="utf-8"))
        atomic_write_json(p / TRAIN_STATE_JSON, {**meta, "optimizer": False, "optimizer_dropped_for": keep})
        done.append(p.name)
    return done


def optimizer_state_missing(path: Path, ckpt_root: Path | None = None) -> ConfigError:
    """The error for a resume from a checkpoint whose optimizer state was dropped."""
    path = Path(path)
    root = Path(ckpt_root) if ckpt_root is not None else path.parent
    newest = last_target(root) or next((p.name for p in reversed(step_dirs(root)) if has_optimizer_state(p)), None)
    return ConfigError(
        f"checkpoint {path.name} ({path}) holds no optimizer state: the run was trained with keep_optimizer=last, "
        f"which keeps it only in the newest step_* checkpoint{f' ({newest})' if newest else ''}. Resume from that "
        "one (resume=true, or resume_from=last), or start a new run from these weights with "
        f"pretrained_checkpoint={path} (a fresh optimizer: the losses will not match the original run's)."
    )


# --- the training loop's checkpoints -----------------------------------------------------------


class Checkpointer:
    """``checkpoints/step_*`` (policy files + optimizer, scheduler and RNG state), ``last`` (a
    relative symlink to the newest) and ``best`` (the lowest validation action error, unless
    chosen by hand with ``runs.mark_best``); ``keep_last`` prunes older ``step_*`` after a save."""

    def __init__(self, out: Path, cfg: TrainConfig, run_id: str, main: bool, world: int, dataset_meta: dict):
        self.root, self.cfg, self.run_id, self.main, self.world = out / "checkpoints", cfg, run_id, main, world
        self.dataset_meta = dataset_meta
        self.best: dict = {"val_action_mae": None, "step": None}
        self.ema = None  # tutorial_utils.train.speed.EMA when ema_decay > 0
        self.restored: dict = {}  # the training_state.pt read by resume.restore (the EMA continues from it)

    def served(self, model):
        """A context in which ``model`` holds the weights to validate and serve: the EMA's when on."""
        return self.ema.applied(model) if self.ema is not None else contextlib.nullcontext(model)

    def save(self, step: int, reason: str, model, optimizer, scheduler, force: bool = False) -> Path | None:
        """A step_* checkpoint and ``last`` pointing at it. ``force`` (a stop by signal) saves
        even with save_checkpoint=false, so the run can resume."""
        if not (self.main and (self.cfg.save_checkpoint or force)):
            return None
        import torch

        from tutorial_utils.policies.checkpoint import write_policy_files

        target = self.root / step_dir_name(step)
        state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.ema is not None:  # the policy files hold the average; the raw weights resume training
            state.update(ema=self.ema.state_dict(), raw_weights=self.ema.raw_weights(model))
        with atomic_dir(target) as tmp:
            with self.served(model):
                write_policy_files(model, tmp, {"dataset": self.dataset_meta, "step": step})
            torch.save(state, tmp / TRAIN_STATE_FILE)
            slow_save_hook()
            atomic_write_json(
                tmp / TRAIN_STATE_JSON,
                {
                    "step": step,
                    "run_id": self.run_id,
                    "reason": reason,
                    "best": self.best,
                    "batch_size": self.cfg.batch_size,
                    "world_size": self.world,
                    "seed": self.cfg.seed,
                    "grad_accum_steps": self.cfg.grad_accum_steps,
                    "ema_decay": self.cfg.ema_decay,
                    "time": time.time(),
                },
            )
        point_last(self.root, target)
        if self.cfg.keep_optimizer == "last":
            drop_optimizer_states(self.root, keep=target.name)
        gone = prune(self.root, self.cfg.keep_last, protect=(target.name,))
        if gone:
            print(f"keep_last={self.cfg.keep_last}: removed {', '.join(gone)}", file=sys.stderr)
        return target

    def offer_best(self, model, step: int, val: dict) -> bool:
        """Record ``val``; a new lowest validation error is saved to ``best``. Returns whether it was."""
        improved = self.best["val_action_mae"] is None or val["val_action_mae"] < self.best["val_action_mae"]
        if improved:
            self.best = {"val_action_mae": val["val_action_mae"], "step": step}
            if self.cfg.save_checkpoint and self.main and not marked_by_hand(self.root):
                model.save(self.root / "best", {"dataset": self.dataset_meta, "step": step, "val": val})
        return improved
