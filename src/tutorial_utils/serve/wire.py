"""msgpack with numpy arrays in the openpi framing: the bytes every request and reply travel as.

The decoder faces the network on both sides (the server reads requests, the client reads replies
and metadata), so it trusts nothing the peer names: an ndarray map is turned into an array only
when its dtype is bool or a number (never object, void/structured, string or datetime: an object
array built from a peer's bytes is a set of raw pointers, and touching it is a segfault), its shape
is a short list of non-negative integers and its data is exactly ``prod(shape) * itemsize`` bytes.
Anything else raises :class:`WireError`, naming the key that holds the bad value.
"""

from __future__ import annotations

import math
from typing import Any

from tutorial_utils.errors import TutorialError

#: numpy dtype kinds that may travel: bool, signed and unsigned integers, floats
SAFE_KINDS = "biuf"
#: numpy's own limit on dimensions (NPY_MAXDIMS of NumPy 1.x)
MAX_DIMS = 32
#: longest dtype string accepted (``"<f8"``, ``"float32"``... are a few characters)
MAX_DTYPE_LEN = 16
#: a bound on the element count of an (empty) array, so no shape overflows numpy's index type
MAX_ELEMENTS = 2**48

_KIND_NAMES = {
    "O": "object (Python pointers)",
    "V": "void/structured",
    "S": "bytes string",
    "U": "unicode string",
    "a": "bytes string",
    "M": "datetime",
    "m": "timedelta",
    "c": "complex",
}


class WireError(TutorialError, ValueError):
    """A msgpack frame that cannot be read safely: not msgpack at all, or an ndarray / numpy-scalar
    map whose dtype, shape or data is wrong. ``key`` is where in the message the bad value sits."""

    def __init__(self, key: str | None, problem: str, fix: str = ""):
        self.key, self.problem, self.fix = key, problem, fix
        where = f"wire message key {key!r}" if key is not None else "wire message"
        super().__init__(f"{where}: {problem}" + (f". Fix: {fix}" if fix else ""))


_ARRAY_FIX = (
    "send bool or numeric (int, uint, float) numpy arrays and scalars, packed as openpi's msgpack_numpy packs them"
)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- encode ---------------------------------------------------------------------------------------


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


def packb(obj: Any) -> bytes:
    """msgpack bytes of ``obj`` with numpy arrays/scalars in the openpi framing."""
    import msgpack

    return msgpack.packb(obj, default=_encode, use_bin_type=True)


# --- decode ---------------------------------------------------------------------------------------


def _field(d: dict, name: str, key: str) -> Any:
    """``d[b"name"]`` or ``d["name"]`` (openpi writes bin keys; we read str keys too)."""
    for k in (name.encode(), name):
        if k in d:
            return d[k]
    raise WireError(key, f"the {name!r} field is missing", _ARRAY_FIX)


def _dtype(d: dict, key: str):
    import numpy as np

    spec = _field(d, "dtype", key)
    if isinstance(spec, bytes):
        try:
            spec = spec.decode("ascii")
        except UnicodeDecodeError:
            raise WireError(key, f"'dtype' {_short(spec)} is not a dtype string", _ARRAY_FIX) from None
    if not isinstance(spec, str):
        # numpy would build a structured dtype (object fields included) from a list or a dict
        raise WireError(key, f"'dtype' must be a string such as '<f4', found {type(spec).__name__}", _ARRAY_FIX)
    if len(spec) > MAX_DTYPE_LEN:
        raise WireError(key, f"'dtype' {_short(spec)} is not a dtype string ({len(spec)} characters)", _ARRAY_FIX)
    try:
        dtype = np.dtype(spec)
    except Exception:  # numpy raises TypeError, ValueError, SyntaxError... for a bad string
        raise WireError(key, f"'dtype' {spec!r} is not a numpy dtype", _ARRAY_FIX) from None
    if dtype.kind not in SAFE_KINDS or dtype.fields is not None or dtype.subdtype is not None or dtype.hasobject:
        what = _KIND_NAMES.get(dtype.kind, "structured" if dtype.fields else dtype.kind)
        raise WireError(
            key,
            f"'dtype' {spec!r} is a {what} dtype; only bool and numeric dtypes may travel over the wire",
            _ARRAY_FIX,
        )
    return dtype


def _ndarray(d: dict, key: str):
    import numpy as np

    dtype = _dtype(d, key)
    shape = _field(d, "shape", key)
    if not isinstance(shape, (list, tuple)):
        raise WireError(key, f"'shape' must be a list of integers, found {type(shape).__name__}", _ARRAY_FIX)
    if len(shape) > MAX_DIMS:
        raise WireError(key, f"'shape' has {len(shape)} dimensions; numpy allows at most {MAX_DIMS}", _ARRAY_FIX)
    for n in shape:
        if type(n) is not int:  # bool is an int subclass: refused too
            raise WireError(key, f"'shape' {_short(shape)} holds {_short(n)}, not an integer", _ARRAY_FIX)
        if n < 0:
            raise WireError(key, f"'shape' {_short(shape)} holds the negative size {n}", _ARRAY_FIX)
    if math.prod(n for n in shape if n) > MAX_ELEMENTS:
        raise WireError(key, f"'shape' {_short(shape)} is absurdly large", _ARRAY_FIX)
    data = _field(d, "data", key)
    if not isinstance(data, (bytes, bytearray)):
        raise WireError(key, f"'data' must be raw bytes (msgpack bin), found {type(data).__name__}", _ARRAY_FIX)
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise WireError(
            key,
            f"'data' holds {len(data)} bytes but 'shape' {_short(shape)} of 'dtype' {dtype.str!r} needs "
            f"{expected} (prod(shape) * {dtype.itemsize})",
            _ARRAY_FIX,
        )
    return np.ndarray(buffer=data, dtype=dtype, shape=tuple(shape))


def _npgeneric(d: dict, key: str):
    import numpy as np

    dtype = _dtype(d, key)
    data = _field(d, "data", key)
    if type(data) not in (bool, int, float):
        raise WireError(key, f"'data' of a numpy scalar must be a number, found {type(data).__name__}", _ARRAY_FIX)
    if dtype.kind in "iu" and type(data) is not bool:
        info = np.iinfo(dtype)
        if not (math.isfinite(data) and info.min <= int(data) <= info.max):
            raise WireError(key, f"'data' {_short(data)} does not fit in {dtype.name}", _ARRAY_FIX)
        data = int(data)
    with np.errstate(all="ignore"):  # a float too big for float16 becomes inf, as numpy casts it
        return dtype.type(data)


def _marker(d: dict) -> str | None:
    for name in ("__ndarray__", "__npgeneric__"):
        if name.encode() in d or name in d:
            return name
    return None


def _path(node: tuple | None) -> str:
    """``("observation/state",)``-style parent chain -> ``"observation/state"`` / ``"examples[0].image"``."""
    parts: list[str] = []
    while node is not None:
        node, k = node
        parts.append(f"[{k}]" if isinstance(k, int) and not isinstance(k, bool) else str(k))
    text = ""
    for p in reversed(parts):
        text += p if (p.startswith("[") or not text) else f".{p}"
    return text if len(text) <= 200 else "..." + text[-197:]


def _convert(obj: Any) -> Any:
    """Replace every ndarray / numpy-scalar map in ``obj`` (nested in maps and lists) by its value.

    Iterative, so no depth of nesting overflows the Python stack; errors name the path."""
    holder = [obj]
    stack: list[tuple[Any, Any, tuple | None]] = [(holder, 0, None)]
    while stack:
        container, k, parent = stack.pop()
        value = container[k]
        node = (parent, k) if container is not holder else None
        if isinstance(value, dict):
            kind = _marker(value)
            if kind is not None:
                where = _path(node) or "<message>"
                container[k] = _ndarray(value, where) if kind == "__ndarray__" else _npgeneric(value, where)
            else:
                stack.extend((value, key, node) for key in value)
        elif isinstance(value, list):
            stack.extend((value, i, node) for i in range(len(value)))
    return holder[0]


def unpackb(data: bytes) -> Any:
    """Inverse of :func:`packb` (arrays come back read-only, zero-copy views of ``data``).

    Raises :class:`WireError` for bytes that are not msgpack and for ndarray / numpy-scalar maps
    that are not plain numeric arrays of the size they claim."""
    import msgpack

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(None, f"expected msgpack bytes, found {type(data).__name__}")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises ValueError, TypeError, StackError, ExtraData, FormatError...
        raise WireError(None, f"not valid msgpack ({type(exc).__name__}: {_short(str(exc), 120)})") from None
    return _convert(obj)
