"""The learning-rate schedule of the trainer: linear warm-up, cosine decay to ``scheduler_decay_lr``,
then hold (:func:`lr_factor`), as a torch ``LambdaLR`` over the run's optimiser (:func:`scheduler`).
A resume that changes ``optimizer_lr`` or ``steps`` re-targets the restored scheduler
(:func:`tutorial_utils.train.resume.apply_changes`)."""

from __future__ import annotations

import math

from tutorial_utils.train.config import TrainConfig


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of optimizer_lr at ``step``: linear warm-up, cosine decay, then hold."""
    w = cfg.scheduler_warmup_steps
    if w and step < w:
        return (step + 1) / w
    decay = cfg.scheduler_decay_steps or max(1, cfg.steps - w)
    floor = min(1.0, cfg.scheduler_decay_lr / cfg.optimizer_lr)
    p = min(1.0, (step - w) / decay)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


def scheduler(optimizer, cfg: TrainConfig):
    """The run's scheduler: ``optimizer``'s learning rates times :func:`lr_factor` of the step."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
