"""Everything a training run needs before its first step, built by :func:`prepare` in named steps:
the checks of the parameters (:func:`_check`), Accelerate (:func:`_accelerator`), the run directory
and its lock (:func:`tutorial_utils.train.rundir.hold_lock`), the data and its held-out episodes
(:func:`_open_source`, :func:`_split`), the resume point and the run's history
(:mod:`tutorial_utils.train.resume`), the model (:func:`_policy`, :func:`apply_freeze`), the
optimiser and its schedule (:mod:`tutorial_utils.train.schedule`), a restore, the speed settings
(:func:`_speed`), the EMA (:func:`_ema`), ``train_config.json`` and the statistics
(:func:`_write_run_files`), the data loader (:func:`_loader`) and the log (:func:`_run_log`). What it
built is a :class:`Setup`, which the loop (:mod:`tutorial_utils.train.loop`) reads."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.errors import ConfigError
from tutorial_utils.io import atomic_write_json
from tutorial_utils.policies.normalize import STATS_FILE
from tutorial_utils.train import resume, schedule, speed
from tutorial_utils.train.checkpoints import CONFIG_FILE, TRAIN_STATE_FILE, Checkpointer
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.control import ignore_stop_signals
from tutorial_utils.train.data import StepBatchSampler, WindowDataset, collate, open_dataset, split_episodes
from tutorial_utils.train.rundir import hold_lock
from tutorial_utils.train.runlog import RunLog
from tutorial_utils.train.validation import Validator


@dataclass
class Setup:
    """What :func:`prepare` builds for the loop."""

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


def prepare(cfg: TrainConfig, source, held: contextlib.ExitStack) -> Setup:
    """Accelerate, the run directory and its lock, the data, the model, the optimiser, and a resume."""
    _check(cfg)
    out = Path(cfg.output_dir)
    acc = _accelerator(cfg)
    rank, world, main = acc.process_index, acc.num_processes, acc.is_main_process
    if main:
        out.mkdir(parents=True, exist_ok=True)
    hold_lock(out, acc, main, held)
    run_id = cfg.run_id or out.name

    # data
    source = _open_source(cfg, source, acc, out)
    train_idx, val_idx, val_eps = _split(cfg, source)
    ckpt = Checkpointer(out, cfg, run_id, main, world, _dataset_meta(source))
    resume_from = resume.resume_point(ckpt.root, cfg)
    history, changed = resume.run_history(out, cfg, resume_from)  # every rank reads before the main one writes
    wall_before = resume.wall_before(out) if resume_from is not None else 0.0
    acc.wait_for_everyone()

    # model
    policy, source, frozen = _policy(cfg, source, resume_from)
    counts = policy.parameter_counts()
    optimizer = policy.optimizer(cfg)  # the family's choice; by default fused AdamW over its parameter groups
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scheduler = schedule.scheduler(optimizer, cfg)
    start_step = resume.restore(ckpt, resume_from, policy, optimizer, scheduler) if resume_from is not None else 0
    if main and cfg.resume_from and resume_from is not None:  # checked (model, weights, state): now change the disk
        resume.rewind(ckpt.root, resume_from)
    resume.apply_changes(changed, cfg, optimizer, scheduler)
    fast, compiled = _speed(cfg, acc, policy)
    model, optimizer = acc.prepare(policy, optimizer)
    ckpt.ema = _ema(cfg, acc.unwrap_model(model), ckpt.restored, resume_from)

    if main:
        resolved = {**fast.to_dict(), "compiled": compiled}
        _write_run_files(cfg, out, run_id, world, resolved, source, (train_idx, val_idx, val_eps), history)
        if start_step:  # drop the rows and samples past the checkpoint we resume from
            resume.trim_after(out, start_step)

    loader, len_loader = _loader(cfg, source, train_idx, policy, fast, start_step, rank, world)
    run_log = _run_log(cfg, out, run_id, main, start_step, world, len(train_idx))
    run_log.header(counts, frozen, len_loader, start_step, resume_from)
    if main:
        run_log(_speed_line(cfg, fast, compiled))
    validator = Validator(source, val_idx, cfg, policy.action_horizon, policy.image_size)
    return Setup(
        acc,
        model,
        optimizer,
        scheduler,
        params,
        loader,
        source,
        run_log,
        ckpt,
        validator,
        start_step,
        counts,
        frozen,
        len_loader,
        run_id,
        wall_before,
        fast,
    )


def _check(cfg: TrainConfig) -> None:
    """The parameters, before anything is touched: a family the trainer trains, a run directory,
    the trackers' packages."""
    from tutorial_utils import policies

    cfg.check()
    if refusal := policies.trainer_refusal(cfg.policy):  # a family trained by other means (SAC)
        raise ConfigError(refusal)
    if not cfg.output_dir:
        raise ConfigError("output_dir is empty: pass --output-dir DIR (a job's run_dir) so the run has a home.")
    if cfg.tensorboard or cfg.wandb:
        from tutorial_utils.train.trackers import check_available

        check_available(cfg)  # a missing package fails here, before the run directory is touched


def _accelerator(cfg: TrainConfig):
    """Accelerate's ``Accelerator`` on the device ``cfg`` asks for (the CPU without CUDA), with a
    warning for an ``accelerate launch`` that started one process where several were meant."""
    import torch
    from accelerate import Accelerator

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    acc = Accelerator(cpu=cpu)
    if (
        acc.num_processes == 1
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
    return acc


def _open_source(cfg: TrainConfig, source, acc, out: Path):
    """``source`` when given (tests, benchmarks), else ``cfg.dataset`` opened: first by the main
    process (it may compute the statistics into the run directory), then by the others."""
    if source is not None:
        return source
    if not cfg.dataset:
        raise ConfigError("dataset is empty: pass --dataset DIR (alias data_mix) with a LeRobot v2.1 dataset.")
    main = acc.is_main_process
    if main:
        source = open_dataset(cfg.dataset, run_dir=out, cache_mb=cfg.data_cache_mb)
    acc.wait_for_everyone()
    if not main:
        source = open_dataset(cfg.dataset, run_dir=None, cache_mb=cfg.data_cache_mb)
    return source


def _split(cfg: TrainConfig, source) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The training frames, the held-out frames and the held-out episodes (``val_fraction``)."""
    train_idx, val_idx, val_eps = split_episodes(source.frame_episode, cfg.val_fraction)
    if len(train_idx) == 0:
        raise ConfigError("no training frames left after holding out validation episodes; lower val_fraction.")
    return train_idx, val_idx, val_eps


def _dataset_meta(source) -> dict:
    """What a checkpoint says of its data."""
    return {
        "name": getattr(source, "name", ""),
        "image_size": (getattr(source, "image_shape", None) or [None])[0],
        "gripper": "dataset",
    }  # LIBERO LeRobot data (IPEC, our recordings): 1 open, -1 close


def _policy(cfg: TrainConfig, source, resume_from: Path | None) -> tuple[Any, Any, list[str]]:
    """The family ``cfg.policy`` built from the seed (pretrained weights unless it resumes), the data
    it learns from (the dataset, or a family's own windows: TD-MPC) and its frozen modules."""
    import torch

    from tutorial_utils import policies
    from tutorial_utils.policies.checkpoint import load_weights_into

    torch.manual_seed(cfg.seed)
    policy = policies.make(cfg.policy, cfg.policy_config, source.statistics)
    source = policy.training_source(source)  # the dataset, or a family's own windows (TD-MPC)
    if cfg.pretrained_checkpoint and resume_from is None:
        load_weights_into(policy, cfg.pretrained_checkpoint)
    frozen = apply_freeze(policy, cfg.freeze_list)
    return policy, source, frozen


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


def _speed(cfg: TrainConfig, acc, policy) -> tuple[speed.Resolved, list[str]]:
    """How fast a step runs (:func:`tutorial_utils.train.speed.resolve`) and the modules compiled."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or acc.num_processes)  # training processes on this machine
    fast = speed.resolve(cfg, acc.device.type, local_world)
    compiled = speed.compile_policy(policy, cfg.compile_backend) if fast.compile else []
    return fast, compiled


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


def _write_run_files(
    cfg: TrainConfig, out: Path, run_id: str, world: int, resolved: dict, source, split: tuple, history: dict
) -> None:
    """``train_config.json`` (every parameter as resolved, the data and its split, the run's
    history) and the statistics the policy normalises with."""
    train_idx, val_idx, val_eps = split
    atomic_write_json(
        out / CONFIG_FILE,
        {
            "train": cfg.to_dict(),
            "policy": cfg.policy,
            "policy_config": cfg.to_dict()["policy_config"],
            "run_id": run_id,
            "world_size": world,
            "resolved": resolved,
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


def _loader(cfg: TrainConfig, source, train_idx: np.ndarray, policy, fast, start_step: int, rank: int, world: int):
    """The data loader of this process from ``start_step`` on, and its length in batches."""
    import torch

    # one batch per micro-step: optimisation step s reads micro-batches s*N .. s*N+N-1, so the data
    # order stays a pure function of (seed, step) and a resumed run reads the same batches
    accum = cfg.grad_accum_steps
    sampler = StepBatchSampler(train_idx, cfg.batch_size, cfg.steps * accum, cfg.seed, start_step * accum, rank, world)
    loader = torch.utils.data.DataLoader(
        WindowDataset(source, train_idx, policy.action_horizon, policy.image_size),
        batch_sampler=sampler,
        num_workers=fast.num_workers,
        collate_fn=collate,
        worker_init_fn=ignore_stop_signals,
        pin_memory=fast.pin_memory,
        persistent_workers=fast.num_workers > 0,
        prefetch_factor=4 if fast.num_workers else None,
    )
    return loader, math.ceil(len(train_idx) / (cfg.batch_size * world))


def _run_log(cfg: TrainConfig, out: Path, run_id: str, main: bool, start_step: int, world: int, n_train: int) -> RunLog:
    """The run's log (train.log, metrics.jsonl, the progress bar) and, on the main process, its trackers."""
    run_log = RunLog(out, cfg, run_id, main, start_step, world, n_train)
    if main and (cfg.tensorboard or cfg.wandb):
        from tutorial_utils.train.trackers import Trackers

        run_log.trackers = Trackers(out, cfg, run_id, start_step)
    return run_log


def _speed_line(cfg: TrainConfig, fast, compiled: list[str]) -> str:
    """The log line that says how fast the steps are made to run."""
    accum = cfg.grad_accum_steps
    return (
        f"Speed: device {fast.device}, {fast.precision}, {fast.num_workers} loader workers"
        f"{' (pinned memory)' if fast.pin_memory else ''}"
        f"{', compiled ' + ', '.join(compiled) if compiled else ''}"
        f"{f', {accum} batches per step' if accum > 1 else ''}"
        f"{f', EMA {cfg.ema_decay}' if cfg.ema_decay else ''}"
    )
