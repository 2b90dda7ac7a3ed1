"""``mlp``: a two-layer behaviour-cloning policy, the smallest family the seam accepts.

It is the worked example of :class:`~tutorial_utils.policies.trainable.TrainablePolicy` (CONTRIBUTING.md
walks through it) and a baseline for the zoo: both cameras average-pooled to a few pixels, the
8-D state and a hashed embedding of the instruction go through one hidden layer to a whole
action chunk, regressed in the normalised action space with a masked MSE. No noise, no
denoising steps: what the flow-matching DiT adds over it is what the comparison measures.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tutorial_utils.errors import ConfigError
from tutorial_utils.params import param
from tutorial_utils.policies.base import (
    BATCH_ACTION,
    BATCH_ACTION_IS_PAD,
    BATCH_CAMERAS,
    BATCH_STATE,
    BATCH_TASK,
)
from tutorial_utils.policies.normalize import ActionNormalizer, StatisticsError
from tutorial_utils.policies.trainable import TrainablePolicy


@dataclass
class MLPConfig:
    """The MLP's shape (saved in ``config.json``)."""

    image_size: int = param(32, "camera images are resized to this square size", "model")
    pool: int = param(4, "each camera is average-pooled to pool x pool pixels before the MLP", "model")
    hidden_dim: int = param(256, "width of the hidden layer", "model")
    task_buckets: int = param(64, "hashed instruction embedding: number of buckets", "model")
    state_dim: int = param(8, "raw state size", "model")
    action_dim: int = param(7, "action size", "model")
    action_horizon: int = param(8, "actions per predicted chunk", "model")

    def check(self) -> None:
        for name in ("image_size", "pool", "hidden_dim", "task_buckets", "state_dim", "action_dim", "action_horizon"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size % self.pool:
            raise ConfigError(f"image_size={self.image_size} must be a multiple of pool={self.pool}")


class MLPPolicy(nn.Module, TrainablePolicy):
    name = "mlp"
    config_class = MLPConfig

    def __init__(self, cfg: MLPConfig | None = None, statistics: Mapping[str, Any] | None = None):
        super().__init__()
        self.cfg = cfg or MLPConfig()
        self.cfg.check()
        c = self.cfg
        self.task_embedding = nn.Embedding(c.task_buckets, 16)
        inputs = len(BATCH_CAMERAS) * 3 * c.pool * c.pool + c.state_dim + 16
        self.net = nn.Sequential(
            nn.Linear(inputs, c.hidden_dim), nn.GELU(), nn.Linear(c.hidden_dim, c.action_horizon * c.action_dim)
        )
        self.statistics: dict = dict(statistics) if statistics is not None else {}
        self.normalizer = ActionNormalizer.from_statistics(statistics) if statistics is not None else None

    def _features(self, batch: Mapping[str, Any]) -> torch.Tensor:
        dev = next(self.parameters()).device
        parts = []
        for key in BATCH_CAMERAS:
            x = torch.as_tensor(np.array(batch[key]) if isinstance(batch[key], np.ndarray) else batch[key])
            if x.shape[-1] == 3:  # uint8 channels-last
                x = x.permute(0, 3, 1, 2)
            x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
            parts.append(F.adaptive_avg_pool2d(x.to(dev), self.cfg.pool).flatten(1))
        state = torch.as_tensor(np.array(batch[BATCH_STATE], dtype=np.float32)).to(dev)
        ids = torch.tensor([zlib.crc32(str(t).encode()) % self.cfg.task_buckets for t in batch[BATCH_TASK]], device=dev)
        return torch.cat(parts + [state, self.task_embedding(ids)], dim=1)

    def _chunk(self, batch: Mapping[str, Any]) -> torch.Tensor:
        c = self.cfg
        return self.net(self._features(batch)).view(-1, c.action_horizon, c.action_dim)

    def forward(self, batch: Mapping[str, Any], generator=None) -> dict:
        return self.loss(batch, generator)

    def loss(self, batch: Mapping[str, Any], generator=None) -> dict:
        if self.normalizer is None:
            raise StatisticsError("the mlp policy has no dataset statistics; build it with MLPPolicy(cfg, statistics)")
        pred = self._chunk(batch)
        target = self.normalizer.normalize(
            torch.as_tensor(np.array(batch[BATCH_ACTION], dtype=np.float32)).to(pred.device)
        )
        mask = torch.ones_like(pred)
        if batch.get(BATCH_ACTION_IS_PAD) is not None:
            mask = (
                (~torch.as_tensor(np.array(batch[BATCH_ACTION_IS_PAD], dtype=bool)))
                .to(pred.device)
                .float()[..., None]
                .expand_as(pred)
            )
        loss = ((pred - target) ** 2 * mask).sum() / mask.sum().clamp_min(1.0)
        return {"mse_loss": loss, "total_loss": loss}

    @torch.no_grad()
    def predict(self, batch: Mapping[str, Any], generator=None) -> np.ndarray:
        if self.normalizer is None:
            raise StatisticsError(
                "the mlp policy has no dataset statistics; load it with MLPPolicy.load(checkpoint_dir)"
            )
        was_training = self.training
        self.eval()
        try:
            out = self.normalizer.unnormalize(self._chunk(batch).float().cpu())
        finally:
            self.train(was_training)
        return out.numpy().astype(np.float32)
