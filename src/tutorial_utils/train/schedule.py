"""The learning-rate schedule of the trainer: a family's first phase at the full rate (VQ-BeT's), then
linear warm-up, cosine decay to ``scheduler_decay_lr``, then hold (:func:`lr_factor`), as a torch ``LambdaLR`` over the run's optimiser (:func:`scheduler`).
A resume that changes ``optimizer_lr`` or ``steps`` re-targets the restored scheduler
(:func:`tutorial_utils.train.resume.apply_changes`)."""

from __future__ import annotations

import math

from tutorial_utils.train.config import TrainConfig


def first_phase(cfg: TrainConfig) -> int:
    """The family's first phase, run at the full rate (``first_phase_steps``; 0 for most families)."""
    from tutorial_utils import policies

    return policies.first_phase_steps(cfg.policy, cfg.policy_config)


def lr_factor(step: int, cfg: TrainConfig, first: int | None = None) -> float:
    """Multiplier of optimizer_lr at ``step``: a family's first phase at the full rate (``first``
    steps, :func:`first_phase` when None), then linear warm-up, cosine decay, then hold."""
    first = first_phase(cfg) if first is None else first
    if step < first:
        return 1.0
    step -= first
    w = cfg.scheduler_warmup_steps
    if w and step < w:
        return (step + 1) / w
    decay = cfg.scheduler_decay_steps or max(1, cfg.steps - first - w)
    floor = min(1.0, cfg.scheduler_decay_lr / cfg.optimizer_lr)
    p = min(1.0, (step - w) / decay)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


def scheduler(optimizer, cfg: TrainConfig):
    """The run's scheduler: ``optimizer``'s learning rates times :func:`lr_factor` of the step."""
    import torch

    first = first_phase(cfg)  # read once: the lambda runs at every step
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg, first))
