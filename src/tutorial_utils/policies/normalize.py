"""Action normalisation with the dataset statistics (``dataset_statistics.json``, DiT4DiT's
layout): min-max to [-1, 1] where the action mask is true (x..yaw), raw where it is false (the
gripper). Shared by every family that predicts normalised actions."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.errors import TutorialError

STATS_FILE = "dataset_statistics.json"
EMBODIMENT = "franka"


class StatisticsError(TutorialError, ValueError):
    """``dataset_statistics.json`` is missing a key or has the wrong shape."""


class ActionNormalizer:
    """Min-max to [-1, 1] on the dims where ``mask`` is true, identity elsewhere (DiT4DiT's
    ``libero_franka``: x..yaw normalised, gripper raw)."""

    def __init__(self, low: np.ndarray, high: np.ndarray, mask: np.ndarray):
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        self.mask = np.asarray(mask, dtype=bool)
        if not (self.low.shape == self.high.shape == self.mask.shape) or self.low.ndim != 1:
            raise StatisticsError(
                f"action min/max/mask must be 1-D of one length, got {self.low.shape}, {self.high.shape}, {self.mask.shape}"
            )
        span = self.high - self.low
        self.span = np.where(span > 1e-8, span, 1.0).astype(np.float32)

    @classmethod
    def from_statistics(cls, stats: Mapping[str, Any], source: str = STATS_FILE) -> ActionNormalizer:
        block = stats.get(EMBODIMENT)
        if not isinstance(block, Mapping) or "action" not in block:
            raise StatisticsError(
                f"{source}: expected a {EMBODIMENT!r} block with 'action' statistics "
                f"(keys found: {sorted(stats)}). Create it with tutorial_utils.stats "
                "(`python -m tutorial_utils dataset stats DIR`)."
            )
        act = block["action"]
        missing = [k for k in ("min", "max") if k not in act]
        if missing:
            raise StatisticsError(
                f"{source}: {EMBODIMENT}.action lacks {missing}; recompute it with tutorial_utils.stats."
            )
        low = np.asarray(act["min"], dtype=np.float32)
        mask = act.get("mask")
        if mask is None:  # DiT4DiT's default for LIBERO: every dim but the last (gripper)
            mask = [True] * (len(low) - 1) + [False]
        return cls(low, np.asarray(act["max"], dtype=np.float32), np.asarray(mask, dtype=bool))

    @property
    def dim(self) -> int:
        return int(self.low.shape[0])

    def normalize(self, a):
        low, span, mask = self._like(a)
        n = 2.0 * (a - low) / span - 1.0
        return n * mask + a * (1 - mask)

    def unnormalize(self, n, clip: bool = True):
        low, span, mask = self._like(n)
        if clip:
            n = n.clamp(-1, 1) if _is_tensor(n) else np.clip(n, -1, 1)
        a = (n + 1.0) * 0.5 * span + low
        return a * mask + n * (1 - mask)

    def _like(self, x):
        if _is_tensor(x):
            import torch

            f = lambda v: torch.as_tensor(v, dtype=x.dtype, device=x.device)  # noqa: E731
        else:
            f = lambda v: np.asarray(v, dtype=np.float32)  # noqa: E731
        return f(self.low), f(self.span), f(self.mask.astype(np.float32))


def read_statistics(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise StatisticsError(
            f"{path} not found. Create the dataset statistics with tutorial_utils.stats "
            "(`python -m tutorial_utils dataset stats DATASET_DIR`)."
        )
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StatisticsError(
            f"{path} is not valid JSON ({exc}); delete it and recompute it with tutorial_utils.stats."
        ) from None
    ActionNormalizer.from_statistics(stats, source=str(path))
    return stats


def _is_tensor(x) -> bool:
    """A torch tensor, without importing torch for numpy inputs."""
    return type(x).__module__.startswith("torch")
