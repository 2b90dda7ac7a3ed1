"""The one image resize of the package: training windows, the policy server and the LIBERO
client all call :func:`resize`, so a policy sees the same pixels in training and in evaluation."""

from __future__ import annotations

import numpy as np


def resize(img, size: int | None) -> np.ndarray:
    """Square-resize an (H, W, 3) uint8 image to ``size`` x ``size``: bilinear with antialiasing
    (torch ``interpolate``), rounded back to uint8. Unchanged (as a contiguous array) when it
    already has that size or ``size`` is None."""
    arr = np.asarray(img)
    if size is None or arr.shape[:2] == (size, size):
        return np.ascontiguousarray(arr)
    if arr.ndim != 3 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"resize expects an (H, W, 3) uint8 image, got shape {arr.shape} dtype {arr.dtype}")
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(int(size), int(size)), mode="bilinear", antialias=True, align_corners=False)
    return x[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()
