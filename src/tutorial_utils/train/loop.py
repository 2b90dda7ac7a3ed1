"""The training loop, for any policy family of the registry.

:func:`train` builds the family named by ``cfg.policy`` (:func:`tutorial_utils.policies.make`),
feeds it batches in LeRobot's key names and calls only the seam (``loss``, ``predict``,
checkpoints): it knows no family. Its parts are named: :class:`RunLog` (train.log, metrics.jsonl,
the progress bar), :class:`Checkpointer` (``step_*``, ``last``, ``best``, resume),
:class:`Validator` (the held-out action error), :class:`StopSignals` (SIGINT/SIGTERM/SIGUSR1),
:class:`ControlFile` (``control.json``: stop or pause from a notebook or another shell) and
:class:`TrainingStatus` (the ``training`` heartbeat in ``status.json``).

A run directory (``output_dir``) is self-describing::

    train_config.json          every parameter as resolved, plus the policy config, and the run's
                               history: `changes` (parameters changed on resume: step, old, new),
                               `resumes`, `copied_from` / `forked_from`
    status.json                `training`: state, step/total, ETA, a heartbeat (pid, host, updated)
    control.json               a command for the running loop: {"command": "stop" | "pause"}
    dataset_statistics.json    the normalisation the policy uses (DiT4DiT's name and place)
    train.log                  the DiT4DiT-format log lines (tutorial_utils.logs constants)
    metrics.jsonl              one row per log step (loss, lr, grad norm, samples/s, data wait)
                               and per eval step (validation action error on held-out episodes)
    checkpoints/step_000100/   policy files + training_state.pt/json (optimizer, scheduler, RNG)
    checkpoints/last ->        relative symlink to the newest step_* (replaced atomically)
    checkpoints/best/          the policy with the lowest validation action error
    summary.json               what happened: steps, losses, throughput, sizes, stop reason
    tensorboard/, wandb/       the trackers' files, when tensorboard=true / wandb=true
                               (tutorial_utils.train.trackers)

Resume (``resume=true``) restores model, optimizer, scheduler, RNG and step; the data order and
the flow-matching noise are pure functions of (seed, step), so a resumed run's losses equal the
uninterrupted run's. ``resume_from`` resumes from another checkpoint than ``last`` (the run's
later checkpoints are discarded). On resume only :data:`RESUME_CHANGEABLE` parameters may differ
from ``train_config.json`` (each change is recorded); any other is a :class:`ConfigError`.

SIGINT/SIGTERM/SIGUSR1 (a cluster's pre-emption notice) and a ``stop`` in ``control.json`` stop
after the current step with a checkpoint (``stopped_by``: the signal's name or ``control:stop``);
``pause`` does the same and records the run as paused (``control:pause``). The loop polls the
control file once per step (one ``stat``). Runs as plain Python or under ``accelerate launch
--num_processes N`` (DDP; each rank reads its own slice of every global batch; the stop decision
is shared by all ranks in the same step).

One training process per run directory: the main process holds an exclusive lock on
``output_dir/.train.lock`` for the whole run (a second process fails at once, naming the
holder), and while holding it removes the temporary folders a killed checkpoint save left.
The first non-finite loss stops the run with :class:`NonFiniteLoss` (step, loss parts, likely
causes); the last good checkpoint stays as it was.

Speed (:mod:`tutorial_utils.train.speed`): ``precision`` (bf16 autocast on CUDA by default),
``torch_compile``, ``pin_memory`` and ``num_workers`` (chosen from the cores by default) change how
fast a step runs, not what it computes, and may differ on resume; ``grad_accum_steps`` (N batches
per optimisation step, read as micro-steps of the same seeded data order) and ``ema_decay`` (the
averaged weights are validated, saved as ``best`` and served from every checkpoint; the raw weights
and the average are in ``training_state.pt``) are part of the run and resume exactly.

CLI: ``python -m tutorial_utils train --dataset DIR --output-dir DIR key=value ...``."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils import logs as L
from tutorial_utils.errors import ConfigError, TutorialError
from tutorial_utils.io import (
    atomic_dir,
    atomic_write_json,
    atomic_write_text,
    dir_size,
    human_bytes,
    read_json_or_empty,
    read_jsonl,
    read_small,
)
from tutorial_utils.policies.base import BATCH_ACTION, BATCH_ACTION_IS_PAD, BATCH_TASK
from tutorial_utils.policies.normalize import STATS_FILE
from tutorial_utils.train import speed
from tutorial_utils.train.checkpoints import (
    CONFIG_FILE,
    LOCK_FILE,
    METRICS_FILE,
    TRAIN_STATE_FILE,
    TRAIN_STATE_JSON,
    OutputDirInUse,
    discard_after,
    drop_optimizer_states,
    find_last,
    has_optimizer_state,
    load_train_state,
    lock_output_dir,
    marked_by_hand,
    optimizer_state_missing,
    point_last,
    prune,
    remove_stale_temps,
    resolve_checkpoint,
    slow_save_hook,
    step_dir_name,
    train_state_meta,
)
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import (
    StepBatchSampler,
    WindowDataset,
    collate,
    open_dataset,
    random_shift,
    split_episodes,
)
from tutorial_utils.train.watch import TrainingWatch

LOG_FILE = "train.log"
SUMMARY_FILE = "summary.json"
CONTROL_FILE = "control.json"
#: the sample predictions of each validation: ``samples/step_000100.json`` (predicted vs true chunk)
SAMPLES_DIR = "samples"
#: What ``control.json`` may ask of a running loop.
CONTROL_COMMANDS = ("stop", "pause")
#: ``stopped_by`` of a run stopped through ``control.json``.
CONTROL_STOP, CONTROL_PAUSE = "control:stop", "control:pause"
#: The parameters a resume may change (each change is recorded in train_config.json's ``changes``).
RESUME_CHANGEABLE = ("optimizer_lr", "steps", "eval_freq", "log_freq", "save_freq", "time_limit_min")
#: Parameters that say how or where a process runs, not what it trains: free to differ on resume.
RESUME_FREE = (
    "resume",
    "resume_from",
    "output_dir",
    "run_id",
    "progress",
    "system_metrics",
    "num_workers",
    "num_threads",
    "device",
    "data_cache_mb",
    "keep_final_model",
    "keep_last",
    "keep_optimizer",
    "pretrained_checkpoint",
    "precision",
    "torch_compile",
    "compile_backend",
    "pin_memory",
    "tensorboard",
    "wandb",
    "wandb_project",
)


class NonFiniteLoss(TutorialError, FloatingPointError):
    """A training step gave a NaN or infinite loss: the run stops there, with a diagnosis."""


# --- learning-rate schedule --------------------------------------------------------------------


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of optimizer_lr at ``step``: linear warm-up, cosine decay, then hold."""
    w = cfg.scheduler_warmup_steps
    if w and step < w:
        return (step + 1) / w
    decay = cfg.scheduler_decay_steps or max(1, cfg.steps - w)
    floor = min(1.0, cfg.scheduler_decay_lr / cfg.optimizer_lr)
    p = min(1.0, (step - w) / decay)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


# --- modules --------------------------------------------------------------------------------------


def apply_freeze(policy, names: Sequence[str]) -> list[str]:
    """Freeze the named modules (dotted names); a clear error for unknown ones."""
    modules = dict(policy.named_modules())
    unknown = [n for n in names if n not in modules or not n]
    if unknown:
        known = [n for n in modules if n and n.count(".") < 2]
        raise ConfigError(
            f"freeze_modules: unknown module(s) {unknown}. The policy's modules are: {', '.join(known)} "
            "(deeper dotted names work too, e.g. action_model.blocks.0). DiT4DiT's "
            "`backbone_interface` is called `backbone` here."
        )
    for n in names:
        for p in modules[n].parameters():
            p.requires_grad_(False)
    if not any(p.requires_grad for p in policy.parameters()):
        raise ConfigError(
            f"freeze_modules={','.join(names)!r} freezes every parameter: nothing would train. "
            "Leave at least action_model trainable."
        )
    return list(names)


@dataclass
class TrainResult:
    output_dir: Path
    steps_done: int
    losses: list[tuple[int, float]]
    stopped_by: str | None
    summary: dict


#: The signals that stop the loop after the current step with a checkpoint (SIGUSR1: a cluster's
#: pre-emption notice, e.g. Slurm's ``--signal=USR1@120``).
STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)) if s is not None)


class StopSignals:
    """SIGINT/SIGTERM/SIGUSR1 set a flag the loop reads after each step (a second Ctrl-C stops at once)."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for s in STOP_SIGNALS:
            self._old[s] = signal.getsignal(s)
            signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def _ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader workers ignore the stop signals: a Ctrl-C to the terminal's process group or a
    scheduler's signal to the whole group would otherwise kill them and break the main
    process's iterator mid-step; the main process decides when to stop (and its workers exit
    with it: the DataLoader watches its parent)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


#: the control file is a few hundred bytes; anything far bigger is not a command
CONTROL_MAX_BYTES = 64 << 10
CONTROL_SCHEMA = {"command": str, "time": (int, float), "id": str, "acknowledged": (dict, type(None))}
CONTROL_FIX = (
    'write {"command": "stop"} or {"command": "pause"} as a regular JSON file (runs.stop / runs.pause do it for you)'
)


class ControlFile:
    """``<output_dir>/control.json``, polled by the main process once per step: a ``stat`` (one
    system call) and a read only when the file changed. ``{"command": "stop"}`` or ``"pause"``
    ends the run after the current step with a checkpoint; the loop acknowledges it in the file
    (``acknowledged``: step, time, pid). A file that is not such JSON is ignored with a warning.
    A command already in the file when training starts is acted on only if it was written after
    this process started (``time``), so an old ``pause`` never stops the resumed run."""

    def __init__(self, out: Path, main: bool, started: float, warn: Callable[[str], None]):
        self.path, self.main, self.warn = Path(out) / CONTROL_FILE, main, warn
        self.seen = self._stamp() if main else None
        if self.seen is not None:
            data = self._read(quiet=True)
            fresh = isinstance(data, dict) and not data.get("acknowledged")
            if fresh and isinstance(data.get("time"), (int, float)) and data["time"] >= started:
                self.seen = None  # written while this process was starting: act on it
            elif fresh and data.get("command") in CONTROL_COMMANDS:
                warn(
                    f"warning: {self.path} asks to {data['command']!r} but was written before this training "
                    "process started; ignored (write it again to act on this run)."
                )

    def _stamp(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _read(self, quiet: bool = False) -> Any:
        try:  # bounded and typed: a FIFO, a huge or deeply nested file is "no command", never a hang or a crash
            return read_small(self.path, schema=CONTROL_SCHEMA, max_bytes=CONTROL_MAX_BYTES, fix=CONTROL_FIX)
        except (OSError, ValueError) as exc:
            if not quiet:
                self.warn(f"warning: {str(exc)[:300]}; ignored.")
            return None

    def poll(self) -> str | None:
        """The new command (``stop``, ``pause``) since the last poll, or None."""
        if not self.main:
            return None
        stamp = self._stamp()
        if stamp is None or stamp == self.seen:
            return None
        self.seen = stamp
        data = self._read()
        if data is None:
            return None
        cmd = data.get("command") if isinstance(data, dict) else None
        if isinstance(data, dict) and data.get("acknowledged"):
            return None
        if cmd not in CONTROL_COMMANDS:
            shown = repr(cmd) if len(repr(cmd)) <= 40 else f"{repr(cmd)[:40]}..."
            self.warn(f"warning: {self.path}: command {shown} is not one of {', '.join(CONTROL_COMMANDS)}; ignored.")
            return None
        return cmd

    def acknowledge(self, cmd: str, step: int) -> None:
        """Record in the file that ``cmd`` was acted on at ``step``."""
        if not self.main:
            return
        data = self._read(quiet=True)
        data = data if isinstance(data, dict) else {"command": cmd}
        data["acknowledged"] = {"command": cmd, "step": step, "time": time.time(), "pid": os.getpid()}
        with contextlib.suppress(OSError):
            atomic_write_json(self.path, data)
        self.seen = self._stamp()


class TrainingStatus:
    """The ``training`` entry of ``<output_dir>/status.json`` (merged under the job runner's lock,
    :func:`tutorial_utils.jobs.update_status`): state (running, paused, stopped, finished,
    failed), step, total, ETA, wall time and a heartbeat (pid, host, updated) refreshed every
    :data:`tutorial_utils.jobs.HEARTBEAT_S` seconds by a daemon thread, so a killed run reads as
    ``stale`` (:func:`tutorial_utils.jobs.run_state`). Main process only; a failed write (full
    disk) never stops training."""

    def __init__(self, out: Path, main: bool, total: int, start_step: int, wall_before: float):
        from tutorial_utils import jobs

        self.out, self.main, self.total, self.start_step = Path(out), main, total, start_step
        self.step, self.t0, self.wall_before = start_step, time.perf_counter(), wall_before
        self.started = _dt.datetime.now().isoformat(timespec="seconds")
        self._heart = jobs.Heartbeat(lambda: self.write("running"), name="train-heartbeat")

    def fields(self, state: str, **extra: Any) -> dict:
        from tutorial_utils import jobs

        elapsed = time.perf_counter() - self.t0
        done = self.step - self.start_step
        eta = (self.total - self.step) * elapsed / done if done > 0 and state == "running" else None
        return {
            "state": state,
            "step": self.step,
            "total": self.total,
            "eta_s": round(eta, 1) if eta is not None else None,
            "started": self.started,
            "wall_s": round(self.wall_before + elapsed, 3),
            **jobs.heartbeat_fields(),
            **extra,
        }

    def write(self, state: str, **extra: Any) -> None:
        if not self.main:
            return
        from tutorial_utils import jobs

        with contextlib.suppress(OSError):
            jobs.update_status(self.out, training=self.fields(state, **extra))

    def start(self) -> None:
        if self.main:
            self.write("running", stopped_by=None, error=None)
            self._heart.start()

    def close(self, state: str, **extra: Any) -> None:
        self._heart.stop()
        self.write(state, eta_s=None, **extra)


class RunLog:
    """``train.log`` (the DiT4DiT lines, echoed to stdout), ``metrics.jsonl`` and the progress
    bar, written by the main process only. :meth:`step` accumulates a window of steps and
    writes one loss line and one metrics row every ``log_freq`` steps."""

    def __init__(self, out: Path, cfg: TrainConfig, run_id: str, main: bool, start_step: int, world: int, n_train: int):
        self.cfg, self.run_id, self.main, self.world, self.n_train = cfg, run_id, main, world, n_train
        self.fh = open(out / LOG_FILE, "a", encoding="utf-8") if main else None
        self.metrics_fh = open(out / METRICS_FILE, "a", encoding="utf-8") if main else None
        self.sampler = None
        if main and cfg.system_metrics:
            from tutorial_utils.train.sysmetrics import SystemSampler

            self.sampler = SystemSampler(out)
        self.bar = None
        if main and cfg.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.steps,
                initial=start_step,
                desc=f"train {run_id}",
                unit="step",
                dynamic_ncols=True,
                mininterval=1.0 if sys.stderr.isatty() else 10.0,
                file=sys.stderr,
            )
        self.window: dict = {"wait": 0.0, "total": 0.0, "samples": 0, "loss": []}
        #: samples one optimisation step consumes over all processes
        self.step_samples = cfg.batch_size * cfg.grad_accum_steps * world
        self.trackers = None  # tutorial_utils.train.trackers.Trackers, set by _prepare on the main process
        self.total_wait = self.total_time = 0.0
        self.losses: list[tuple[int, float]] = []
        self.rows: list[dict] = []  # the training rows of this process's metrics.jsonl (the health check reads them)

    def __call__(self, line: str) -> None:
        if self.main:
            print(line, flush=True)
            self.fh.write(line + "\n")
            self.fh.flush()

    def metrics(self, row: dict) -> None:
        if self.metrics_fh:
            self.metrics_fh.write(json.dumps(row) + "\n")
            self.metrics_fh.flush()
        if self.trackers is not None:
            self.trackers.log(row)

    def header(self, counts: dict, frozen: list[str], len_loader: int, start_step: int, resume_from) -> None:
        self(L.TRAIN_TOTAL_PARAMS.format(n=counts["total"], m=counts["total"] / 1e6))
        self(L.TRAIN_TRAINABLE_PARAMS.format(n=counts["trainable"], m=counts["trainable"] / 1e6))
        self(L.TRAIN_FROZEN_PARAMS.format(n=counts["frozen"], m=counts["frozen"] / 1e6))
        self(L.TRAIN_RATIO.format(pct=100.0 * counts["trainable"] / max(1, counts["total"])))
        if frozen:
            self(L.TRAIN_FROZEN_MODULES.format(modules=", ".join(frozen)))
        self(L.TRAIN_RUNNING)
        self(L.TRAIN_TOTAL_STEPS.format(n=self.cfg.steps))
        self(L.TRAIN_PER_DEVICE_BATCH.format(n=self.cfg.batch_size))
        self(L.TRAIN_DATALOADER_LEN.format(n=len_loader))
        if start_step:
            self(L.TRAIN_RESUMED.format(path=resume_from, step=start_step))

    def step(self, step: int, parts: dict[str, float], lr: float, grad_norm: float, wait: float, total: float) -> None:
        cfg, w = self.cfg, self.window
        loss = parts["total_loss"]
        w["wait"] += wait
        w["total"] += total
        w["samples"] += self.step_samples
        w["loss"].append(loss)
        self.total_wait += wait
        self.total_time += total
        self.losses.append((step, loss))
        if self.bar:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        if cfg.log_freq and (step % cfg.log_freq == 0 or step == cfg.steps):
            shown = {k: round(v, 6) for k, v in parts.items()}
            self(
                L.TRAIN_STEP_LOSS.format(
                    run_id=self.run_id,
                    step=step,
                    losses={**shown, "learning_rate": lr, "grad_norm": round(grad_norm, 6)},
                )
            )
            row = {
                "step": step,
                "loss": loss,
                "loss_mean": float(np.mean(w["loss"])),
                "lr": lr,
                "grad_norm": grad_norm,
                "samples_per_s": w["samples"] / max(w["total"], 1e-9),
                "data_wait_share": w["wait"] / max(w["total"], 1e-9),
                "epoch": step * self.step_samples / self.n_train,
                "time": time.time(),
                **(self.sampler.sample() if self.sampler else {}),
            }
            self.metrics(row)
            if self.main:
                self.rows.append(row)
            self.window = {"wait": 0.0, "total": 0.0, "samples": 0, "loss": []}

    def close_bar(self) -> None:
        if self.bar:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        self.close_bar()
        for fh in (self.fh, self.metrics_fh):
            if fh:
                fh.close()
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None


class Checkpointer:
    """``checkpoints/step_*`` (policy files + optimizer, scheduler and RNG state), ``last`` (a
    relative symlink to the newest) and ``best`` (the lowest validation action error, unless
    chosen by hand with ``runs.mark_best``); ``keep_last`` prunes older ``step_*`` after a save."""

    def __init__(self, out: Path, cfg: TrainConfig, run_id: str, main: bool, world: int, dataset_meta: dict):
        self.root, self.cfg, self.run_id, self.main, self.world = out / "checkpoints", cfg, run_id, main, world
        self.dataset_meta = dataset_meta
        self.best: dict = {"val_action_mae": None, "step": None}
        self.ema = None  # tutorial_utils.train.speed.EMA when ema_decay > 0
        self.restored: dict = {}  # the training_state.pt read by restore (the EMA continues from it)

    def served(self, model):
        """A context in which ``model`` holds the weights to validate and serve: the EMA's when on."""
        return self.ema.applied(model) if self.ema is not None else contextlib.nullcontext(model)

    def resume_point(self) -> Path | None:
        """The checkpoint to resume from; refuses to start a fresh run over an old one, and a
        checkpoint whose optimizer state ``keep_optimizer=last`` dropped."""
        found = None
        if self.cfg.resume_from:
            found = resolve_checkpoint(self.root, self.cfg.resume_from)
            if found.resolve().parent != self.root.resolve():  # a resume continues only the run's own checkpoints
                raise ConfigError(
                    f"resume_from={self.cfg.resume_from!r} ({found}) is not a checkpoint of {self.root.parent}. Fork a "
                    f"new run from it (`python -m tutorial_utils runs resume RUN --from {found}` does), or start a "
                    "new run with pretrained_checkpoint=<it>."
                )
        elif self.cfg.resume:
            found = find_last(self.root)
            if found is None:
                raise ConfigError(
                    f"resume=true but {self.root} holds no complete checkpoint; start without resume "
                    "(or point output_dir at the run to continue)."
                )
        if found is not None:
            if not has_optimizer_state(found):
                raise optimizer_state_missing(found, self.root)
            return found
        if (self.root / "last").exists() or list(self.root.glob("step_*")):
            raise ConfigError(
                f"{self.root.parent} already holds checkpoints of a run; pass resume=true to continue it, "
                "or a new output_dir (runs never overwrite another run)."
            )
        return None

    def restore(self, path: Path, model, optimizer, scheduler) -> int:
        """Load weights, optimizer, scheduler and RNG from ``path``; returns the step."""
        import torch

        from tutorial_utils.policies.checkpoint import load_weights_into

        load_weights_into(model, path)
        state = load_train_state(path)  # a teaching error for a corrupt file, not torch's advice
        self.restored = state
        if "optimizer" not in state:
            raise optimizer_state_missing(path, self.root)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        meta = train_state_meta(path)
        self.best = meta.get("best", self.best)
        if (
            meta.get("world_size", self.world) != self.world
            or meta.get("batch_size", self.cfg.batch_size) != self.cfg.batch_size
        ):
            print(
                f"warning: resuming with batch_size={self.cfg.batch_size} x {self.world} processes; the checkpoint used "
                f"{meta.get('batch_size')} x {meta.get('world_size')}, so the data order differs from the original run.",
                file=sys.stderr,
            )
        return int(meta["step"])

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


class Validator:
    """The validation action error on fixed, evenly spaced frames of the held-out episodes. Each
    call also keeps :attr:`sample`: the predicted and the true action chunk of one fixed frame
    (the middle one of the picks), which :func:`write_sample` stores for the live monitor."""

    def __init__(self, source, val_idx: np.ndarray, cfg: TrainConfig, horizon: int, image_size: int):
        n = min(cfg.val_samples, len(val_idx))
        self.pick = val_idx[np.linspace(0, len(val_idx) - 1, n).round().astype(int)] if len(val_idx) else val_idx
        self.ds = WindowDataset(source, self.pick, horizon, image_size)
        self.seed = cfg.seed + 7
        self.frame_episode = getattr(source, "frame_episode", None)
        self.sample: dict | None = None

    def __len__(self) -> int:
        return len(self.pick)

    def __call__(self, model) -> dict:
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        errs, masks = [], []
        j = len(self.pick) // 2  # the fixed frame whose chunk the monitor draws
        for i in range(0, len(self.pick), 32):
            b = collate([self.ds[int(k)] for k in self.pick[i : i + 32]])
            pred = model.predict(b, generator=gen)
            # a window may start before the current frame (LeRobot's action_delta_indices, e.g. Diffusion
            # with 2 observation frames); the prediction is the chunk from the current frame: its tail
            h = pred.shape[1]
            b = {**b, BATCH_ACTION: b[BATCH_ACTION][:, -h:], BATCH_ACTION_IS_PAD: b[BATCH_ACTION_IS_PAD][:, -h:]}
            if i <= j < i + 32:
                self.sample = self._sample(b, pred, j - i, int(self.pick[j]))
            mask = (~b[BATCH_ACTION_IS_PAD]).numpy()[..., None].astype(np.float32)
            errs.append(np.abs(pred - b[BATCH_ACTION].numpy()) * mask)
            masks.append(np.broadcast_to(mask, pred.shape))
        e, w = np.concatenate(errs), np.concatenate(masks)
        per_dim = (e.sum((0, 1)) / np.maximum(w.sum((0, 1)), 1)).tolist()
        return {
            "val_action_mae": float(e.sum() / max(w.sum(), 1)),
            "val_action_mae_xyz": float(np.mean(per_dim[:3])),
            "val_gripper_mae": float(per_dim[-1]),
            "val_frames": int(len(self.pick)),
        }

    def _sample(self, b: dict, pred: np.ndarray, k: int, frame: int) -> dict:
        """Row ``k`` of a validation batch as plain JSON: predicted vs true chunk (robot units)."""
        fe = self.frame_episode
        task = b.get(BATCH_TASK)
        return {
            "frame": frame,
            "episode": int(fe[frame]) if fe is not None and frame < len(fe) else None,
            "task": task[k] if isinstance(task, (list, tuple)) else None,
            "pred": np.asarray(pred[k], np.float64).round(6).tolist(),
            "true": b[BATCH_ACTION][k].double().numpy().round(6).tolist(),
            "is_pad": b[BATCH_ACTION_IS_PAD][k].numpy().astype(bool).tolist(),
        }


def write_sample(out: Path, step: int, sample: dict) -> Path | None:
    """``<out>/samples/step_<step>.json``: one validation sample's predicted and true chunk.
    Written atomically; a failed write (full disk) is skipped, never stops training."""
    path = Path(out) / SAMPLES_DIR / f"{step_dir_name(step)}.json"
    try:
        path.parent.mkdir(exist_ok=True)
        atomic_write_json(path, {"step": step, **sample}, indent=None)
    except OSError:
        return None
    return path


@dataclass
class _Setup:
    """What :func:`_prepare` builds for the loop."""

    acc: Any
    model: Any
    optimizer: Any
    scheduler: Any
    params: list
    loader: Any
    source: Any
    run_log: RunLog
    ckpt: Checkpointer
    validator: Validator
    start_step: int
    counts: dict
    frozen: list
    len_loader: int
    run_id: str
    wall_before: float = 0.0
    fast: Any = None  # tutorial_utils.train.speed.Resolved


def train(cfg: TrainConfig, source=None, on_step: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train the policy family ``cfg.policy`` as ``cfg`` says. ``source`` (an ``ArraySource``)
    replaces ``cfg.dataset`` (tests, benchmarks). Returns what happened; writes the run directory.
    Holds the run directory's lock until it returns or raises."""
    started = time.time()
    with contextlib.ExitStack() as held:
        return _train(cfg, source, on_step, held, started)


def _train(cfg: TrainConfig, source, on_step, held: contextlib.ExitStack, started: float) -> TrainResult:
    s = _prepare(cfg, source, held)
    out, acc, main = Path(cfg.output_dir), s.acc, s.acc.is_main_process
    step, stopped_by, time_limited, last_val = s.start_step, None, False, {}

    watch = TrainingWatch(out, {**cfg.to_dict(), "num_workers": s.fast.num_workers}, s.run_log) if main else None

    def validate(step: int) -> None:
        if main and len(s.validator):
            _validate(step)
        if watch is not None:  # the run's health from its own rows: logged and put in status.json
            try:
                watch(step, s.run_log.rows)
            except Exception as exc:  # never the reason a training stops
                s.run_log(f"Health check skipped at step {step}: {exc!r}")

    def _validate(step: int) -> None:
        nonlocal last_val
        m = acc.unwrap_model(s.model)
        with s.ckpt.served(m):  # the EMA weights when ema_decay > 0
            last_val = {**s.validator(m), "step": step}
            improved = s.ckpt.offer_best(m, step, last_val)
        s.model.train()
        sample = write_sample(out, step, s.validator.sample) if s.validator.sample else None
        extra = {"sample": f"{SAMPLES_DIR}/{sample.name}"} if sample else {}
        s.run_log.metrics({**last_val, "best": improved, "time": time.time(), **extra})
        s.run_log(
            L.TRAIN_VALIDATION.format(
                run_id=s.run_id,
                step=step,
                metrics={"val_action_mae": round(last_val["val_action_mae"], 6), "best": improved},
            )
        )

    control = ControlFile(out, main, started, s.run_log)
    status = TrainingStatus(out, main, cfg.steps, s.start_step, s.wall_before)
    stop = StopSignals()
    stop.install()
    status.start()
    t_start = time.perf_counter()
    try:
        try:
            try:
                for state in _steps(cfg, s, t_start, stop, on_step, validate, control, status):
                    step, stopped_by, time_limited = state
            finally:
                stop.restore()
                s.run_log.close_bar()
            wall = time.perf_counter() - t_start
            paths_out = _finish(cfg, s, out, step, stopped_by, time_limited, last_val, validate)
        finally:
            s.run_log.close()
    except KeyboardInterrupt:
        status.close(
            "stopped",
            stopped_by="SIGINT",
            error="KeyboardInterrupt: stopped at once, without a checkpoint of this step",
        )
        raise
    except BaseException as exc:
        status.close("failed", error=f"{type(exc).__name__}: {str(exc)[:500]}")
        raise
    if stopped_by in (CONTROL_STOP, CONTROL_PAUSE):
        control.acknowledge(stopped_by.split(":", 1)[1], step)
    run_state = "paused" if stopped_by == CONTROL_PAUSE else "stopped" if stopped_by else "finished"
    rl = s.run_log
    summary = {
        "run_id": s.run_id,
        "policy": cfg.policy,
        "steps": cfg.steps,
        "start_step": s.start_step,
        "steps_done": step,
        "stopped_by": stopped_by,
        "time_limited": time_limited,
        "world_size": acc.num_processes,
        "batch_size": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum_steps,
        "resolved": s.fast.to_dict(),
        "parameters": s.counts,
        "frozen_modules": s.frozen,
        "first_loss": rl.losses[0][1] if rl.losses else None,
        "last_loss": rl.losses[-1][1] if rl.losses else None,
        "wall_s": round(wall, 3),
        "wall_s_total": round(s.wall_before + wall, 3),
        "state": run_state,
        "samples_per_s": (step - s.start_step) * rl.step_samples / max(rl.total_time, 1e-9),
        "data_wait_share": rl.total_wait / max(rl.total_time, 1e-9),
        "best": s.ckpt.best,
        "last_val": last_val,
        "last_checkpoint": str(find_last(s.ckpt.root)) if s.ckpt.root.exists() and find_last(s.ckpt.root) else None,
        "best_checkpoint": str(s.ckpt.root / "best") if (s.ckpt.root / "best").is_dir() else None,
        "len_dataloader": s.len_loader,
        **paths_out,
    }
    if main:
        atomic_write_json(out / SUMMARY_FILE, summary)
    status.step = step
    status.close(run_state, stopped_by=stopped_by, error=None)
    return TrainResult(out, step, rl.losses, stopped_by, summary)


#: ``control.json`` commands as numbers, so ranks can share them in one tensor.
_CONTROL_CODES = {None: 0, "stop": 1, "pause": 2}
_CONTROL_STOPPED_BY = {"stop": CONTROL_STOP, "pause": CONTROL_PAUSE}


def _steps(
    cfg: TrainConfig,
    s: _Setup,
    t_start: float,
    stop: StopSignals,
    on_step,
    validate,
    control: ControlFile,
    status: TrainingStatus,
):
    """The optimisation steps; yields ``(step, stopped_by, time_limited)`` after each one."""
    import torch

    acc, world, rank = s.acc, s.acc.num_processes, s.acc.process_index
    fast, accum = s.fast, cfg.grad_accum_steps
    unwrapped = acc.unwrap_model(s.model)
    # families whose loss takes tensors on any device get the batch there, copied from pinned memory
    # without blocking; the others move what they need themselves
    device_batch = bool(getattr(unwrapped, "accepts_device_batch", False)) and acc.device.type != "cpu"
    step = s.start_step
    s.model.train()
    it = iter(s.loader)
    while step < cfg.steps:
        t0 = time.perf_counter()
        wait = 0.0
        sums: dict[str, Any] = {}
        s.optimizer.zero_grad(set_to_none=True)
        for k in range(accum):  # micro-batches of this optimisation step
            tw = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            except RuntimeError:
                if stop.signum is None:
                    raise
                # a worker killed outright (SIGKILL; they ignore the stop signals) while we were asked to stop
                yield step, signal.Signals(stop.signum).name, False
                return
            wait += time.perf_counter() - tw
            micro = step * accum + k
            gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + micro * 101 + rank)
            if device_batch:
                batch = speed.to_device(batch, acc.device, non_blocking=fast.pin_memory)
            if cfg.augment_shift:
                batch = random_shift(batch, cfg.augment_shift, gen)
            # DDP: only the last micro-batch all-reduces the summed gradients
            sync = acc.no_sync(s.model) if world > 1 and k < accum - 1 else contextlib.nullcontext()
            with sync:
                with speed.autocast(acc.device.type, fast.precision):
                    parts = s.model(batch, gen)
                acc.backward(parts["total_loss"] / accum if accum > 1 else parts["total_loss"])
            for name, v in parts.items():
                sums[name] = sums[name] + v.detach().float() if name in sums else v.detach().float()
        parts = {name: v / accum for name, v in sums.items()} if accum > 1 else sums
        if cfg.optimizer_grad_clip_norm > 0:
            gn = acc.clip_grad_norm_(s.params, cfg.optimizer_grad_clip_norm)
        else:
            gn = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in s.params if p.grad is not None))
        lr = s.optimizer.param_groups[0]["lr"]
        s.optimizer.step()
        s.scheduler.step()
        if s.ckpt.ema is not None:
            s.ckpt.ema.update(unwrapped)
        step += 1
        values = {
            k: float(acc.reduce(v.detach(), reduction="mean").item()) if world > 1 else float(v.item())
            for k, v in parts.items()
        }
        if not all(math.isfinite(v) for v in values.values()):  # the same reduced values on every rank
            _non_finite(cfg, s, step, values)
        s.run_log.step(step, values, lr, float(gn), wait, time.perf_counter() - t0)
        if on_step:
            on_step(step, values["total_loss"])
        if (cfg.eval_freq and step % cfg.eval_freq == 0) or step == cfg.steps:
            validate(step)
        status.step = step
        sig = stop.signum
        cmd = control.poll()  # the main process reads the file; the others learn it below
        over = bool(cfg.time_limit_min) and time.perf_counter() - t_start > 60.0 * cfg.time_limit_min
        if world > 1:  # every rank must take the same decision in the same step
            mine = [float(sig or 0), 1.0 if over else 0.0, float(_CONTROL_CODES[cmd])]
            flags = acc.gather(torch.tensor([mine], device=acc.device)).reshape(world, -1).amax(0)
            # the gathered flags only: a signal that lands on one rank during the gather is read
            # by every rank at the next step's gather, never by that rank alone (it would stop
            # here while the others go on into the next step's all-reduce and wait forever)
            sig = int(flags[0]) or None
            over = float(flags[1]) > 0
            cmd = {v: k for k, v in _CONTROL_CODES.items()}[int(flags[2])]
        if sig:
            yield step, signal.Signals(sig).name, False
            return
        if cmd:
            yield step, _CONTROL_STOPPED_BY[cmd], False
            return
        if over:
            s.run_log(L.TRAIN_TIME_LIMIT.format(minutes=cfg.time_limit_min, step=step))
            yield step, None, True
            return
        if cfg.save_freq and step % cfg.save_freq == 0 and step < cfg.steps:
            s.ckpt.save(step, "periodic", acc.unwrap_model(s.model), s.optimizer, s.scheduler)
            acc.wait_for_everyone()
        yield step, None, False


def _non_finite(cfg: TrainConfig, s: _Setup, step: int, values: dict[str, float]) -> None:
    """Log the ``TRAIN_NONFINITE_LOSS`` line and raise :class:`NonFiniteLoss` with a diagnosis.
    Nothing of this step is saved: ``checkpoints/last`` stays the last good checkpoint."""
    last = find_last(s.ckpt.root) if s.ckpt.root.is_dir() else None
    shown = {k: round(v, 6) if math.isfinite(v) else v for k, v in values.items()}
    s.run_log(L.TRAIN_NONFINITE_LOSS.format(step=step, losses=shown, path=last or "none"))
    bad = ", ".join(k for k, v in values.items() if not math.isfinite(v))
    dataset = cfg.dataset or "DATASET"
    raise NonFiniteLoss(
        f"{cfg.output_dir}: the loss became non-finite at step {step} ({bad}; loss parts {shown}). Training "
        f"stopped; nothing of this step was saved, and the last good checkpoint is "
        f"{last or 'none (no checkpoint was saved before this step)'}. Likely causes: NaN or inf in the data "
        f"(check it with `python -m tutorial_utils dataset validate --deep {dataset}`, and recompute its "
        f"statistics), or a learning rate too high (optimizer_lr={cfg.optimizer_lr}: lower it, lengthen "
        f"scheduler_warmup_steps={cfg.scheduler_warmup_steps}, keep optimizer_grad_clip_norm="
        f"{cfg.optimizer_grad_clip_norm} above 0). After the fix, continue from the last checkpoint with "
        f"resume=true, or start again in a new output_dir."
    )


def _lock(out: Path, acc, main: bool, held: contextlib.ExitStack) -> None:
    """The main process takes the run directory's lock (held until ``held`` closes); every rank
    learns whether it got it, so a refused launch stops on all ranks instead of hanging."""
    import torch

    refused: OutputDirInUse | None = None
    if main:
        try:
            held.callback(os.close, lock_output_dir(out))
        except OutputDirInUse as exc:
            refused = exc
    if acc.num_processes > 1:
        flag = acc.reduce(torch.tensor([1.0 if refused else 0.0], device=acc.device), reduction="sum")
        if refused is None and float(flag[0]) > 0:
            raise OutputDirInUse(
                f"{out} is in use by another training process (the main process of this launch could not take "
                f"its lock, {out / LOCK_FILE}; its error names the holder)."
            )
    if refused is not None:
        raise refused
    if main:
        stale = remove_stale_temps(out / "checkpoints")
        if stale:
            print(
                f"removed {len(stale)} unfinished checkpoint folder(s) left by an interrupted save: {', '.join(stale)}",
                file=sys.stderr,
            )


def config_changes(saved: dict, cfg: TrainConfig) -> list[dict]:
    """The parameters of ``cfg`` that differ from a run's ``train_config.json`` (``saved``), as
    ``{"name", "old", "new"}``; parameters in :data:`RESUME_FREE` do not count, nor a parameter
    the saved run did not have yet. Family parameters are named ``policy.<name>``."""
    new = json.loads(json.dumps(cfg.to_dict(), default=str))
    old = saved.get("train") or {}
    old_policy = saved.get("policy_config") or old.get("policy_config") or {}
    out = []
    for name, value in new.items():
        if name in RESUME_FREE or name == "policy_config" or name not in old:
            continue
        before = old[name]
        if name == "dataset" and before and value and Path(before).resolve() == Path(value).resolve():
            continue
        if before != value:
            out.append({"name": name, "old": before, "new": value})
    for name, value in (new.get("policy_config") or {}).items():
        if name in old_policy and old_policy[name] != value:
            out.append({"name": f"policy.{name}", "old": old_policy[name], "new": value})
    return out


def run_history(out: Path, cfg: TrainConfig, resume_from: Path | None) -> tuple[dict, set[str]]:
    """What train_config.json carries over from the run's earlier invocations (``copied_from``,
    ``forked_from``, ``changes``, ``resumes``) and the names changed by this resume. A resume that
    changes a parameter outside :data:`RESUME_CHANGEABLE` is a :class:`ConfigError` naming it."""
    saved = read_json_or_empty(out / CONFIG_FILE)
    history = {k: saved[k] for k in ("copied_from", "forked_from") if k in saved}
    if resume_from is None:
        return history, set()
    step = int(read_json_or_empty(resume_from / TRAIN_STATE_JSON).get("step", 0))
    diffs = config_changes(saved, cfg) if saved.get("train") else []
    bad = [d for d in diffs if d["name"] not in RESUME_CHANGEABLE]
    if bad:
        shown = "; ".join(f"{d['name']}: {d['old']!r} -> {d['new']!r}" for d in bad)
        raise ConfigError(
            f"resume of {out} changes {', '.join(d['name'] for d in bad)} ({shown}), which a resume cannot change "
            f"(the checkpoint was trained with the old value; see {out / CONFIG_FILE}). Only "
            f"{', '.join(RESUME_CHANGEABLE)} may change on resume. Put it back, or start a new run with it: "
            "runs.copy(run, name=value) (`python -m tutorial_utils runs copy RUN name=value`)."
        )
    if cfg.steps < step:
        raise ConfigError(
            f"steps={cfg.steps} is below the step of the checkpoint to resume ({resume_from.name}, step {step}); "
            f"pass steps >= {step}."
        )
    now = _dt.datetime.now().isoformat(timespec="seconds")
    changes = list(saved.get("changes", [])) + [{"step": step, **d, "time": now} for d in diffs]
    resumes = list(saved.get("resumes", [])) + [{"step": step, "from": resume_from.name, "time": now}]
    return {**history, "changes": changes, "resumes": resumes}, {d["name"] for d in diffs}


def _wall_before(out: Path) -> float:
    """Training seconds the run spent before this resume: the last heartbeat's (a killed run
    too), else the summary's."""
    from tutorial_utils.jobs import read_status

    training = read_status(out).get("training") or {}
    summary = read_json_or_empty(out / SUMMARY_FILE)
    for v in (training.get("wall_s"), summary.get("wall_s_total"), summary.get("wall_s")):
        if isinstance(v, (int, float)):
            return float(v)
    return 0.0


def _rewind(root: Path, resume_from: Path) -> None:
    """Resume in place from an earlier checkpoint: its later checkpoints go, ``last`` points at it."""
    step = int(read_json_or_empty(resume_from / TRAIN_STATE_JSON).get("step", 0))
    gone = discard_after(root, step)
    if resume_from.parent.resolve() == root.resolve():
        point_last(root, resume_from)
    if gone:
        print(
            f"resume_from={resume_from.name}: removed the later checkpoint(s) {', '.join(gone)} "
            "(runs.rollback keeps the old run and forks a new one instead)",
            file=sys.stderr,
        )


def _prepare(cfg: TrainConfig, source, held: contextlib.ExitStack) -> _Setup:
    """Accelerate, the run directory and its lock, the data, the model, the optimiser, and a resume."""
    import torch
    from accelerate import Accelerator

    from tutorial_utils import policies
    from tutorial_utils.policies.checkpoint import load_weights_into

    cfg.check()
    if refusal := policies.trainer_refusal(cfg.policy):  # a family trained by other means (SAC)
        raise ConfigError(refusal)
    if not cfg.output_dir:
        raise ConfigError("output_dir is empty: pass --output-dir DIR (a job's run_dir) so the run has a home.")
    if cfg.tensorboard or cfg.wandb:
        from tutorial_utils.train.trackers import check_available

        check_available(cfg)  # a missing package fails here, before the run directory is touched
    out = Path(cfg.output_dir)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    acc = Accelerator(cpu=cpu)
    rank, world, main = acc.process_index, acc.num_processes, acc.is_main_process
    if (
        world == 1
        and os.environ.get("MASTER_ADDR")
        and os.environ.get("ACCELERATE_USE_CPU") is not None
        and "WORLD_SIZE" not in os.environ
    ):
        print(
            "warning: accelerate launch started ONE process. Without GPUs, `accelerate launch --num_processes N` "
            "expects mpirun; add --multi_gpu (torchrun with the gloo backend on CPU) to get N processes: "
            "`accelerate launch --multi_gpu --num_processes 2 -m tutorial_utils train ...`.",
            file=sys.stderr,
        )
    if main:
        out.mkdir(parents=True, exist_ok=True)
    _lock(out, acc, main, held)
    run_id = cfg.run_id or out.name

    # data
    if source is None:
        if not cfg.dataset:
            raise ConfigError("dataset is empty: pass --dataset DIR (alias data_mix) with a LeRobot v2.1 dataset.")
        if main:
            source = open_dataset(cfg.dataset, run_dir=out, cache_mb=cfg.data_cache_mb)
        acc.wait_for_everyone()
        if not main:
            source = open_dataset(cfg.dataset, run_dir=None, cache_mb=cfg.data_cache_mb)
    train_idx, val_idx, val_eps = split_episodes(source.frame_episode, cfg.val_fraction)
    if len(train_idx) == 0:
        raise ConfigError("no training frames left after holding out validation episodes; lower val_fraction.")
    dataset_meta = {
        "name": getattr(source, "name", ""),
        "image_size": (getattr(source, "image_shape", None) or [None])[0],
        "gripper": "dataset",
    }  # LIBERO LeRobot data (IPEC, our recordings): 1 open, -1 close
    ckpt = Checkpointer(out, cfg, run_id, main, world, dataset_meta)
    resume_from = ckpt.resume_point()
    history, changed = run_history(out, cfg, resume_from)  # every rank reads before the main one writes
    wall_before = _wall_before(out) if resume_from is not None else 0.0
    acc.wait_for_everyone()

    # model
    torch.manual_seed(cfg.seed)
    policy = policies.make(cfg.policy, cfg.policy_config, source.statistics)
    source = policy.training_source(source)  # the dataset, or a family's own windows (TD-MPC)
    if cfg.pretrained_checkpoint and resume_from is None:
        load_weights_into(policy, cfg.pretrained_checkpoint)
    frozen = apply_freeze(policy, cfg.freeze_list)
    counts = policy.parameter_counts()
    optimizer = policy.optimizer(cfg)  # the family's choice; by default fused AdamW over its parameter groups
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    start_step = ckpt.restore(resume_from, policy, optimizer, scheduler) if resume_from is not None else 0
    if main and cfg.resume_from and resume_from is not None:  # checked (model, weights, state): now change the disk
        _rewind(ckpt.root, resume_from)
    if changed & {"optimizer_lr", "steps"}:  # the restored scheduler still holds the old peak and length
        scheduler.base_lrs = [cfg.optimizer_lr for _ in scheduler.base_lrs]
        for group in optimizer.param_groups:
            group["initial_lr"] = cfg.optimizer_lr
            group["lr"] = cfg.optimizer_lr * lr_factor(scheduler.last_epoch, cfg)
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or world)  # training processes on this machine
    fast = speed.resolve(cfg, acc.device.type, local_world)
    compiled = speed.compile_policy(policy, cfg.compile_backend) if fast.compile else []
    model, optimizer = acc.prepare(policy, optimizer)
    ckpt.ema = _ema(cfg, acc.unwrap_model(model), ckpt.restored, resume_from)

    if main:
        atomic_write_json(
            out / CONFIG_FILE,
            {
                "train": cfg.to_dict(),
                "policy": cfg.policy,
                "policy_config": cfg.to_dict()["policy_config"],
                "run_id": run_id,
                "world_size": world,
                "resolved": {**fast.to_dict(), "compiled": compiled},
                "val_episodes": val_eps,
                "dataset": {
                    "name": getattr(source, "name", ""),
                    "frames": len(source),
                    "train_frames": len(train_idx),
                    "val_frames": len(val_idx),
                    "image_shape": list(getattr(source, "image_shape", [])),
                },
                **history,
            },
        )
        atomic_write_json(out / STATS_FILE, source.statistics)
        if start_step and (out / METRICS_FILE).is_file():  # drop rows past the checkpoint we resume from
            rows = [r for r in read_jsonl(out / METRICS_FILE) if int(r.get("step", 0)) <= start_step]
            atomic_write_text(out / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
        for f in (out / SAMPLES_DIR).glob("step_*.json") if start_step else ():  # and their samples
            with contextlib.suppress(ValueError, OSError):
                if int(f.stem.split("_")[1]) > start_step:
                    f.unlink()

    h, size = policy.action_horizon, policy.image_size
    # one batch per micro-step: optimisation step s reads micro-batches s*N .. s*N+N-1, so the data
    # order stays a pure function of (seed, step) and a resumed run reads the same batches
    accum = cfg.grad_accum_steps
    sampler = StepBatchSampler(train_idx, cfg.batch_size, cfg.steps * accum, cfg.seed, start_step * accum, rank, world)
    loader = torch.utils.data.DataLoader(
        WindowDataset(source, train_idx, h, size),
        batch_sampler=sampler,
        num_workers=fast.num_workers,
        collate_fn=collate,
        worker_init_fn=_ignore_stop_signals,
        pin_memory=fast.pin_memory,
        persistent_workers=fast.num_workers > 0,
        prefetch_factor=4 if fast.num_workers else None,
    )
    len_loader = math.ceil(len(train_idx) / (cfg.batch_size * world))
    run_log = RunLog(out, cfg, run_id, main, start_step, world, len(train_idx))
    if main and (cfg.tensorboard or cfg.wandb):
        from tutorial_utils.train.trackers import Trackers

        run_log.trackers = Trackers(out, cfg, run_id, start_step)
    run_log.header(counts, frozen, len_loader, start_step, resume_from)
    if main:
        run_log(
            f"Speed: device {fast.device}, {fast.precision}, {fast.num_workers} loader workers"
            f"{' (pinned memory)' if fast.pin_memory else ''}"
            f"{', compiled ' + ', '.join(compiled) if compiled else ''}"
            f"{f', {accum} batches per step' if accum > 1 else ''}"
            f"{f', EMA {cfg.ema_decay}' if cfg.ema_decay else ''}"
        )
    return _Setup(
        acc,
        model,
        optimizer,
        scheduler,
        params,
        loader,
        source,
        run_log,
        ckpt,
        Validator(source, val_idx, cfg, h, size),
        start_step,
        counts,
        frozen,
        len_loader,
        run_id,
        wall_before,
        fast,
    )


def _ema(cfg: TrainConfig, model, restored: dict, resume_from: Path | None):
    """The run's :class:`~tutorial_utils.train.speed.EMA` (None when ``ema_decay`` is 0). On resume
    the average continues from the checkpoint, and the model gets back the raw weights (the
    checkpoint's policy files hold the average)."""
    if not cfg.ema_decay:
        return None
    import torch

    ema = speed.EMA(model, cfg.ema_decay)
    if resume_from is not None:
        if "ema" not in restored or "raw_weights" not in restored:
            raise ConfigError(
                f"ema_decay={cfg.ema_decay} but {resume_from / TRAIN_STATE_FILE} holds no EMA state (the run was "
                "trained without it); resume with ema_decay=0, or start a new run."
            )
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in restored["raw_weights"].items():
                params[name].copy_(value)
        ema.load_state_dict(restored["ema"], model)
    return ema


def _finish(
    cfg: TrainConfig, s: _Setup, out: Path, step: int, stopped_by, time_limited: bool, last_val: dict, validate
) -> dict:
    """After the loop: a checkpoint for a stopped run; for a finished one the final checkpoint,
    ``final_model`` and the disk-usage lines (``final_model`` removed unless kept)."""
    acc, main, log = s.acc, s.acc.is_main_process, s.run_log
    model = acc.unwrap_model(s.model)
    result: dict[str, Any] = {}
    if stopped_by:
        acc.wait_for_everyone()
        path = s.ckpt.save(step, stopped_by, model, s.optimizer, s.scheduler, force=True)
        acc.wait_for_everyone()
        log(L.TRAIN_STOPPED.format(signal=stopped_by, step=step, path=path))
        result["checkpoint"] = str(path) if path else None
        return result
    if time_limited and last_val.get("step") != step:
        validate(step)
    acc.wait_for_everyone()
    if main:
        if cfg.save_checkpoint and step > s.start_step:
            s.ckpt.save(step, "final", model, s.optimizer, s.scheduler)
        final = out / "final_model"
        with s.ckpt.served(model):
            model.save(final, {"dataset": s.ckpt.dataset_meta, "step": step})
        log(L.TRAIN_COMPLETE.format(path=final))
        keep = cfg.keep_final_model or os.environ.get("KEEP_FINAL_MODEL", "") == "1"
        size_final, size_before = dir_size(final), dir_size(out)
        log(L.TRAIN_DISK_USAGE.format(final=human_bytes(size_final), run_dir=human_bytes(size_before)))
        if keep:
            log(L.TRAIN_FINAL_KEPT.format(final=final))
            size_after = size_before
        else:
            shutil.rmtree(final)
            size_after = dir_size(out)
            log(L.TRAIN_FINAL_REMOVED.format(run_dir=human_bytes(size_after)))
        result.update(
            final_model=str(final) if keep else None,
            final_model_bytes=size_final,
            run_dir_bytes_before=size_before,
            run_dir_bytes_after=size_after,
        )
    acc.wait_for_everyone()
    return result
