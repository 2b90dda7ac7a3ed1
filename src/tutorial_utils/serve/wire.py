"""msgpack with numpy arrays in the openpi framing: the bytes every request and reply travel as."""

from __future__ import annotations

from typing import Any

# --- msgpack with numpy (openpi framing) -------------------------------------------------------


def _encode(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "VOc":
            raise TypeError(f"cannot send a numpy array of dtype {obj.dtype} (object/void/complex); convert it first")
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        if obj.dtype.kind in "VOc":
            raise TypeError(f"cannot send a numpy scalar of dtype {obj.dtype}")
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    if isinstance(obj, (tuple, set)):
        return list(obj)
    raise TypeError(f"cannot send an object of type {type(obj).__name__} over the policy protocol")


def _get(d: dict, key: str) -> Any:
    if key.encode() in d:
        return d[key.encode()]
    return d[key]


def _decode(d: dict) -> Any:
    import numpy as np

    if b"__ndarray__" in d or "__ndarray__" in d:
        return np.ndarray(buffer=_get(d, "data"), dtype=np.dtype(_get(d, "dtype")), shape=tuple(_get(d, "shape")))
    if b"__npgeneric__" in d or "__npgeneric__" in d:
        return np.dtype(_get(d, "dtype")).type(_get(d, "data"))
    return d


def packb(obj: Any) -> bytes:
    """msgpack bytes of ``obj`` with numpy arrays/scalars in the openpi framing."""
    import msgpack

    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """Inverse of :func:`packb` (arrays come back read-only, zero-copy views of ``data``)."""
    import msgpack

    return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=False)
