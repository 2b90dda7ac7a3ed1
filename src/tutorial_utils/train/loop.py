"""The training loop, for any policy family of the registry.

:func:`train` builds the family named by ``cfg.policy`` (:func:`tutorial_utils.policies.make`),
feeds it batches in LeRobot's key names and calls only the seam (``loss``, ``predict``,
checkpoints): it knows no family. This module is the loop proper (the optimisation steps, the stop
decision all ranks share, a non-finite loss); its parts are modules of their own:

- :mod:`~tutorial_utils.train.prepare`: what is built before the first step (a ``Setup``): Accelerate,
  the data and its held-out episodes, the model, the optimiser, a resume, the data loader;
- :mod:`~tutorial_utils.train.rundir`: the run directory's file names and its lock;
- :mod:`~tutorial_utils.train.schedule`: the learning-rate schedule (``lr_factor``);
- :mod:`~tutorial_utils.train.resume`: the checkpoint to resume from, what a resume may change
  (``RESUME_CHANGEABLE``), the restore, the changed parameters applied to the restored scheduler;
- :mod:`~tutorial_utils.train.checkpoints`: ``Checkpointer`` (``step_*``, ``last``, ``best``) and the
  checkpoint directories;
- :mod:`~tutorial_utils.train.validation`: ``Validator`` (the held-out action error) and what each
  validation does (``best``, the sample, the health check);
- :mod:`~tutorial_utils.train.runlog`: ``RunLog`` (train.log, metrics.jsonl, the progress bar) and
  ``TrainingStatus`` (the ``training`` heartbeat in ``status.json``);
- :mod:`~tutorial_utils.train.control`: ``StopSignals`` (SIGINT/SIGTERM/SIGUSR1) and ``ControlFile``
  (``control.json``: stop or pause from a notebook or another shell);
- :mod:`~tutorial_utils.train.finish`: the end of a run (the final checkpoint, ``final_model``, the disk
  usage lines, ``summary.json``).

A run directory (``output_dir``) is self-describing (in brackets, the module that writes the file)::

    train_config.json          every parameter as resolved, plus the policy config, and the run's
                               history: `changes` (parameters changed on resume: step, old, new),
                               `resumes`, `copied_from` / `forked_from` (prepare, resume)
    status.json                `training`: state, step/total, ETA, a heartbeat (pid, host, updated) (runlog)
    control.json               a command for the running loop: {"command": "stop" | "pause"} (read by control)
    dataset_statistics.json    the normalisation the policy uses (DiT4DiT's name and place) (prepare)
    train.log                  the DiT4DiT-format log lines (tutorial_utils.logs constants) (runlog)
    metrics.jsonl              one row per log step (loss, lr, grad norm, samples/s, data wait) (runlog)
                               and per eval step (validation action error on held-out episodes) (validation)
    samples/step_000100.json   one validation sample: the predicted and the true chunk (validation)
    checkpoints/step_000100/   policy files + training_state.pt/json (optimizer, scheduler, RNG) (checkpoints)
    checkpoints/last ->        relative symlink to the newest step_* (replaced atomically) (checkpoints)
    checkpoints/best/          the policy with the lowest validation action error (checkpoints)
    .train.lock                the main process's lock on the run directory (rundir)
    summary.json               what happened: steps, losses, throughput, sizes, stop reason (finish)
    tensorboard/, wandb/       the trackers' files, when tensorboard=true / wandb=true
                               (tutorial_utils.train.trackers)

Resume (``resume=true``) restores model, optimizer, scheduler, RNG and step; the data order and
the flow-matching noise are pure functions of (seed, step), so a resumed run's losses equal the
uninterrupted run's. ``resume_from`` resumes from another checkpoint than ``last`` (the run's
later checkpoints are discarded). On resume only
:data:`~tutorial_utils.train.resume.RESUME_CHANGEABLE` parameters may differ from
``train_config.json`` (each change is recorded); any other is a :class:`ConfigError`.

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
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import logs as L
from tutorial_utils.errors import TutorialError
from tutorial_utils.train import speed, validation
from tutorial_utils.train.checkpoints import find_last
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.control import (
    CONTROL_CODES,
    CONTROL_PAUSE,
    CONTROL_STOP,
    STOPPED_BY,
    ControlFile,
    StopSignals,
)
from tutorial_utils.train.data import random_shift
from tutorial_utils.train.finish import finish, write_summary
from tutorial_utils.train.prepare import Setup, prepare
from tutorial_utils.train.runlog import TrainingStatus
from tutorial_utils.train.watch import TrainingWatch


class NonFiniteLoss(TutorialError, FloatingPointError):
    """A training step gave a NaN or infinite loss: the run stops there, with a diagnosis."""


@dataclass
class TrainResult:
    output_dir: Path
    steps_done: int
    losses: list[tuple[int, float]]
    stopped_by: str | None
    summary: dict


def train(cfg: TrainConfig, source=None, on_step: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train the policy family ``cfg.policy`` as ``cfg`` says. ``source`` (an ``ArraySource``)
    replaces ``cfg.dataset`` (tests, benchmarks). Returns what happened; writes the run directory.
    Holds the run directory's lock until it returns or raises."""
    started = time.time()
    with contextlib.ExitStack() as held:
        return _train(cfg, source, on_step, held, started)


def _train(cfg: TrainConfig, source, on_step, held: contextlib.ExitStack, started: float) -> TrainResult:
    s = prepare(cfg, source, held)
    out, main = Path(cfg.output_dir), s.acc.is_main_process
    step, stopped_by, time_limited, last_val = s.start_step, None, False, {}

    watch = TrainingWatch(out, {**cfg.to_dict(), "num_workers": s.fast.num_workers}, s.run_log) if main else None

    def validate(step: int) -> None:
        nonlocal last_val
        row = validation.validate(s, out, step, watch)
        if row is not None:
            last_val = row

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
            paths_out = finish(cfg, s, out, step, stopped_by, time_limited, last_val, validate)
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
    summary = write_summary(cfg, s, out, step, stopped_by, time_limited, last_val, wall, run_state, paths_out)
    status.step = step
    status.close(run_state, stopped_by=stopped_by, error=None)
    return TrainResult(out, step, s.run_log.losses, stopped_by, summary)


def _steps(
    cfg: TrainConfig,
    s: Setup,
    t_start: float,
    stop: StopSignals,
    on_step,
    validate,
    control: ControlFile,
    status: TrainingStatus,
):
    """The optimisation steps; yields ``(step, stopped_by, time_limited)`` after each one."""
    acc, world, accum = s.acc, s.acc.num_processes, cfg.grad_accum_steps
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
            parts = _micro_step(cfg, s, batch, step * accum + k, k == accum - 1, device_batch)
            for name, v in parts.items():
                sums[name] = sums[name] + v.detach().float() if name in sums else v.detach().float()
        parts = {name: v / accum for name, v in sums.items()} if accum > 1 else sums
        gn = _grad_norm(cfg, s)
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
        ended = _stop_reason(cfg, s, step, stop, control, t_start)
        if ended is not None:
            yield step, *ended
            return
        if cfg.save_freq and step % cfg.save_freq == 0 and step < cfg.steps:
            s.ckpt.save(step, "periodic", acc.unwrap_model(s.model), s.optimizer, s.scheduler)
            acc.wait_for_everyone()
        yield step, None, False


def _micro_step(cfg: TrainConfig, s: Setup, batch: dict, micro: int, last: bool, device_batch: bool) -> dict:
    """The forward and backward pass of micro-batch ``micro`` (its noise seeded by the micro-step and
    the rank); returns its loss parts. Under DDP only the last micro-batch of an optimisation step
    (``last``) all-reduces the summed gradients."""
    import torch

    acc, accum = s.acc, cfg.grad_accum_steps
    gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + micro * 101 + acc.process_index)
    if device_batch:
        batch = speed.to_device(batch, acc.device, non_blocking=s.fast.pin_memory)
    if cfg.augment_shift:
        batch = random_shift(batch, cfg.augment_shift, gen)
    # DDP: only the last micro-batch all-reduces the summed gradients
    sync = acc.no_sync(s.model) if acc.num_processes > 1 and not last else contextlib.nullcontext()
    with sync:
        with speed.autocast(acc.device.type, s.fast.precision):
            parts = s.model(batch, gen)
        acc.backward(parts["total_loss"] / accum if accum > 1 else parts["total_loss"])
    return parts


def _grad_norm(cfg: TrainConfig, s: Setup):
    """The gradients' norm, clipped to ``optimizer_grad_clip_norm`` when it is above 0."""
    import torch

    if cfg.optimizer_grad_clip_norm > 0:
        return s.acc.clip_grad_norm_(s.params, cfg.optimizer_grad_clip_norm)
    return torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in s.params if p.grad is not None))


def _stop_reason(
    cfg: TrainConfig, s: Setup, step: int, stop: StopSignals, control: ControlFile, t_start: float
) -> tuple[str | None, bool] | None:
    """Whether the loop stops after ``step`` (a signal, a ``control.json`` command, the time limit),
    decided alike on every rank: ``(stopped_by, time_limited)``, or None to go on."""
    sig = stop.signum
    cmd = control.poll()  # the main process reads the file; the others learn it below
    over = bool(cfg.time_limit_min) and time.perf_counter() - t_start > 60.0 * cfg.time_limit_min
    if s.acc.num_processes > 1:  # every rank must take the same decision in the same step
        sig, over, cmd = _decide_together(s.acc, sig, over, cmd)
    if sig:
        return signal.Signals(sig).name, False
    if cmd:
        return STOPPED_BY[cmd], False
    if over:
        s.run_log(L.TRAIN_TIME_LIMIT.format(minutes=cfg.time_limit_min, step=step))
        return None, True
    return None


def _decide_together(acc, sig: int | None, over: bool, cmd: str | None) -> tuple[int | None, bool, str | None]:
    """The stop decision of every rank, gathered: a signal, the time limit or a command on any rank
    stops all of them in the same step."""
    import torch

    mine = [float(sig or 0), 1.0 if over else 0.0, float(CONTROL_CODES[cmd])]
    flags = acc.gather(torch.tensor([mine], device=acc.device)).reshape(acc.num_processes, -1).amax(0)
    # the gathered flags only: a signal that lands on one rank during the gather is read
    # by every rank at the next step's gather, never by that rank alone (it would stop
    # here while the others go on into the next step's all-reduce and wait forever)
    return int(flags[0]) or None, float(flags[1]) > 0, {v: k for k, v in CONTROL_CODES.items()}[int(flags[2])]


def _non_finite(cfg: TrainConfig, s: Setup, step: int, values: dict[str, float]) -> None:
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
