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


def _area_weights(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of an area resize along one axis: output pixel ``i`` covers source
    coordinates ``[i*s, (i+1)*s)`` with ``s = n_in / n_out``; each source pixel counts by the
    length it overlaps, divided by ``s`` (so every row sums to 1)."""
    s = n_in / n_out
    lo = (np.arange(n_out, dtype=np.float64) * s)[:, None]
    hi = lo + s
    j = np.arange(n_in, dtype=np.float64)[None, :]
    return np.clip(np.minimum(hi, j + 1.0) - np.maximum(lo, j), 0.0, None) / s


def _area_enlarge_weights(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of OpenCV's ``INTER_AREA`` when enlarging: output pixel ``i`` takes
    source pixel ``floor(i * n_in / n_out)`` and, where its footprint crosses into the next source
    pixel, that one by the crossed fraction (OpenCV's double-precision steps, so ties match)."""
    inv = n_out / n_in
    scale = 1.0 / inv
    w = np.zeros((n_out, n_in), dtype=np.float64)
    for i in range(n_out):
        sx = int(np.floor(i * scale))
        fx = (i + 1) - (sx + 1) * inv
        fx = 0.0 if fx <= 0 else float(np.float32(fx - np.floor(fx)))
        w[i, min(max(sx, 0), n_in - 1)] += 1.0 - fx
        w[i, min(max(sx + 1, 0), n_in - 1)] += fx
    return w


def resize_area(img, size: int | tuple[int, int]) -> np.ndarray:
    """Resize an (H, W, C) uint8 image with area interpolation (OpenCV's ``INTER_AREA``, which
    DiT4DiT's LIBERO client uses): each output pixel is the mean of the source area it covers,
    partly covered source pixels weighted by the covered fraction. A 2x shrink is the mean of
    2x2 blocks. ``size`` is one side (square) or ``(height, width)``. Plain numpy: no cv2."""
    arr = np.asarray(img)
    h_out, w_out = (int(size), int(size)) if np.isscalar(size) else (int(size[0]), int(size[1]))
    if arr.ndim != 3 or arr.dtype != np.uint8 or min(arr.shape[:2]) < 1:
        raise ValueError(f"resize_area expects an (H, W, C) uint8 image, got shape {arr.shape} dtype {arr.dtype}")
    if h_out < 1 or w_out < 1:
        raise ValueError(f"resize_area: the target size must be >= 1, got {(h_out, w_out)}")
    if arr.shape[:2] == (h_out, w_out):
        return np.ascontiguousarray(arr)
    if h_out <= arr.shape[0] and w_out <= arr.shape[1]:
        wy, wx = _area_weights(arr.shape[0], h_out), _area_weights(arr.shape[1], w_out)
    else:  # enlarging: OpenCV's INTER_AREA is then a 2-tap interpolation (its arithmetic kept)
        wy, wx = _area_enlarge_weights(arr.shape[0], h_out), _area_enlarge_weights(arr.shape[1], w_out)
    h, w, c = arr.shape
    rows = (wy @ arr.astype(np.float64).reshape(h, w * c)).reshape(h_out, w, c)  # two matmuls: fast
    out = (wx @ rows.transpose(1, 0, 2).reshape(w, h_out * c)).reshape(w_out, h_out, c).transpose(1, 0, 2)
    return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)
