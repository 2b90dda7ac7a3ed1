"""Temporal ensembling of action chunks (ACT, Zhao et al. 2023, section 3.3; LeRobot's
``temporal_ensemble_coeff``): the policy predicts a whole chunk at every step, and the action
executed at step t is the weighted average of every prediction made so far for step t.

The prediction made ``i`` chunks ago for this step weighs ``exp(-coeff * i)`` relative to the
oldest one, i.e. with ``coeff`` > 0 older predictions weigh more (the ACT paper's 0.01 makes the
weights almost equal: a plain average that smooths the motion). The running average is kept per
future step, so each update costs one chunk's worth of arithmetic, not a history of chunks.
"""

from __future__ import annotations

import math

import numpy as np


class TemporalEnsembler:
    """One episode's running average over overlapping chunks; :meth:`reset` between episodes."""

    def __init__(self, coeff: float, chunk_size: int):
        if not math.isfinite(coeff):
            raise ValueError(f"temporal_ensemble_coeff={coeff!r} must be a finite number (ACT's paper: 0.01)")
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")
        self.coeff, self.chunk_size = float(coeff), int(chunk_size)
        weights = np.exp(-self.coeff * np.arange(self.chunk_size, dtype=np.float64))
        self._weights = weights
        self._cumulative = np.cumsum(weights)
        self.reset()

    def reset(self) -> None:
        self._avg: np.ndarray | None = None  # (k, A): the running average for each of the next k steps
        self._count: np.ndarray | None = None  # (k,): how many predictions each average holds

    def update(self, chunk) -> np.ndarray:
        """Fold in the chunk predicted at this step (``(H, A)``, H = ``chunk_size``) and return the
        action to execute now (``(A,)``)."""
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.ndim != 2 or chunk.shape[0] != self.chunk_size:
            raise ValueError(f"expected a chunk of shape ({self.chunk_size}, action_dim), got {chunk.shape}")
        if self._avg is None:
            avg, count = chunk.copy(), np.ones(self.chunk_size, dtype=np.int64)
        else:
            k = len(self._avg)  # chunk_size - 1 steps overlap with the new chunk
            seen = self._count
            avg = self._avg * self._cumulative[seen - 1, None] + chunk[:k] * self._weights[seen, None]
            avg /= self._cumulative[seen, None]
            count = np.minimum(seen + 1, self.chunk_size)
            avg = np.concatenate([avg, chunk[k:]])
            count = np.concatenate([count, np.ones(self.chunk_size - k, dtype=np.int64)])
        action, self._avg, self._count = avg[0], avg[1:], count[1:]
        return action.astype(np.float32)
