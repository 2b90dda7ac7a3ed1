"""Fuzz the wire decoder (``tutorial_utils.serve.wire.unpackb``) and the request adapter behind it
(``serve.protocol.to_policy_observation``) with hypothesis: raw bytes, arbitrary msgpack
structures, crafted ndarray / numpy-scalar maps and mutated real requests.

No input may crash the process, hang, or raise anything but the package's own errors
(``WireError``, ``ObservationError``: both :class:`~tutorial_utils.errors.TutorialError`).

Each fuzzer runs in a child Python (a segfault fails the test instead of killing pytest), with a
fixed number of derandomised examples so CI sees the same inputs every run. Explore more with
``TUTORIAL_FUZZ_EXAMPLES=5000 pytest tests/adversarial/test_wire_fuzz.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import fuzz_settings

HERE = Path(__file__).resolve()
FUZZ = fuzz_settings(150)

# --- strategies ---------------------------------------------------------------------------------

NUMERIC_DTYPES = ["|b1", "|u1", "|i1", "<u2", ">i2", "<f2", "<i4", ">f4", "<f4", "<u8", "<i8", "<f8", "float32", "?"]
UNSAFE_DTYPES = [
    "|O",
    "O",
    "<O8",
    "|V8",
    "V0",
    "(2,)<f4",
    "(0,)u1",
    "<f4,<f4",
    "|S3",
    "<U2",
    "<M8[ns]",
    "<m8",
    "<c16",
    "a5",
    "<f16",
    "[('a','O')]",
]
KEYS = ["__ndarray__", "__npgeneric__", "data", "dtype", "shape"]

small_ints = st.integers(-3, 70)
wild_ints = st.integers(-(2**63), 2**64 - 1)
scalars = (
    st.none()
    | st.booleans()
    | wild_ints
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=16)
    | st.binary(max_size=64)
)
dtype_values = (
    st.sampled_from(NUMERIC_DTYPES + UNSAFE_DTYPES)
    | st.from_regex(r"[<>|=]?[biufcOVSUmMa?][0-9]{0,3}", fullmatch=True)
    | st.text(max_size=12)
    | st.lists(st.tuples(st.text(max_size=3), st.sampled_from(["|O", "<f4", "V2"])), max_size=2).map(
        lambda fields: [list(f) for f in fields]
    )
    | scalars
)
shape_values = (
    st.lists(small_ints, max_size=4) | st.lists(wild_ints, max_size=40) | st.lists(scalars, max_size=3) | scalars
)
data_values = st.binary(max_size=300) | scalars | st.lists(st.integers(0, 255), max_size=8)


def _marker_key(name: str):
    return st.sampled_from([name, name.encode()])


@st.composite
def ndarray_maps(draw):
    """A map that says it is an ndarray: any dtype, shape and data, keys as bin or str, some missing."""
    m = {draw(_marker_key("__ndarray__")): draw(st.booleans() | scalars)}
    for name, values in (("data", data_values), ("dtype", dtype_values), ("shape", shape_values)):
        if draw(st.integers(0, 9)):  # mostly present
            m[draw(_marker_key(name))] = draw(values)
    return m


#: dtypes numpy can build an array of from raw bytes: the dangerous ones get exactly the bytes they claim
BUILDABLE = NUMERIC_DTYPES + ["|O", "|V8", "(2,)<f4", "<f4,<f4", "|u1,|O", "|S3", "<U2", "<M8[ns]", "<c16"]


@st.composite
def consistent_ndarray_maps(draw):
    """A well-formed map (data length = prod(shape) * itemsize, any dtype), sometimes off by a little."""
    import numpy as np

    dtype = np.dtype(draw(st.sampled_from(BUILDABLE)))
    shape = draw(st.lists(st.integers(0, 6), max_size=3))
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    n = max(0, n + draw(st.sampled_from([0, 0, 0, 1, -1, dtype.itemsize])))
    return {
        b"__ndarray__": True,
        b"data": draw(st.binary(min_size=n, max_size=n)),
        b"dtype": dtype.str,
        b"shape": shape,
    }


@st.composite
def npgeneric_maps(draw):
    m = {draw(_marker_key("__npgeneric__")): True}
    if draw(st.integers(0, 9)):
        m[draw(_marker_key("data"))] = draw(scalars)
    if draw(st.integers(0, 9)):
        m[draw(_marker_key("dtype"))] = draw(dtype_values)
    return m


crafted = ndarray_maps() | consistent_ndarray_maps() | npgeneric_maps()
map_keys = st.text(max_size=8) | st.binary(max_size=8) | st.integers(-5, 5) | st.sampled_from(KEYS)
structures = st.recursive(
    scalars | crafted,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(map_keys, children, max_size=4),
    max_leaves=12,
)


def _pack(obj) -> bytes:
    import msgpack

    return msgpack.packb(obj, use_bin_type=True)


def _allowed():
    from tutorial_utils.errors import TutorialError
    from tutorial_utils.serve.protocol import ObservationError
    from tutorial_utils.serve.wire import WireError

    return (WireError, ObservationError, TutorialError)


def _check_decoded(obj) -> None:
    """Every array or numpy scalar the decoder returns is bool or numeric; touch each element."""
    import numpy as np

    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, (np.ndarray, np.generic)):
            assert v.dtype.kind in "biuf" and not v.dtype.hasobject and v.dtype.fields is None, v.dtype
            repr(v), np.asarray(v).tobytes()  # an object array from raw bytes dies here
        elif isinstance(v, dict):
            stack.extend(v.values())
            stack.extend(v.keys())
        elif isinstance(v, list):
            stack.extend(v)


def _decode_and_adapt(data: bytes) -> None:
    """What the server does with a frame: decode, check what came out, turn it into a policy observation."""
    from tutorial_utils.serve.protocol import to_policy_observation
    from tutorial_utils.serve.wire import unpackb

    try:
        msg = unpackb(data)
    except _allowed():
        return
    _check_decoded(msg)
    try:
        to_policy_observation(msg, 4)  # the requests below carry 4x4 images: resized only when fuzzed
    except _allowed():
        pass


# --- the fuzzers (run in a child process by the tests below) -------------------------------------------


@FUZZ
@given(st.binary(max_size=512))
def fuzz_raw_bytes(data):
    _decode_and_adapt(data)


@FUZZ
@given(structures)
def fuzz_structures(obj):
    _decode_and_adapt(_pack(obj))


@FUZZ
@given(crafted, st.sampled_from(["observation/image", "observation/wrist_image", "observation/state", "prompt"]))
def fuzz_crafted_maps_in_requests(value, key):
    import msgpack
    import numpy as np
    from openpi_client.msgpack_numpy import pack_array

    request = {
        "observation/image": np.zeros((4, 4, 3), np.uint8),
        "observation/wrist_image": np.zeros((4, 4, 3), np.uint8),
        "observation/state": np.zeros(8, np.float32),
        "prompt": "x",
    }
    request[key] = value
    _decode_and_adapt(msgpack.packb(request, default=pack_array, use_bin_type=True))
    dit = {"examples": [{"image": [value, value], "lang": "x", "state": value}]}
    _decode_and_adapt(msgpack.packb(dit, default=pack_array, use_bin_type=True))


@FUZZ
@given(st.data())
def fuzz_mutated_requests(data):
    """A real openpi request with some bytes overwritten and maybe cut short."""
    import numpy as np

    from tutorial_utils.serve.wire import packb

    base = bytearray(
        packb(
            {
                "observation/image": np.arange(48, dtype=np.uint8).reshape(4, 4, 3),
                "observation/wrist_image": np.zeros((4, 4, 3), np.uint8),
                "observation/state": np.arange(8, dtype=np.float32),
                "prompt": "x",
            }
        )
    )
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(base) - 1))
        base[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(base)))
    _decode_and_adapt(bytes(base[:cut] if data.draw(st.booleans()) else base))


# --- the tests ------------------------------------------------------------------------------------


def run_isolated(func: str, tmp_path: Path, timeout: float = 120) -> None:
    """Run this module's ``func()`` in a child Python; a crash, a hang or a foreign exception fails."""
    code = (  # tests/ on the path, as pytest has it, for `helpers`
        f"import sys; sys.path.insert(0, {str(HERE.parents[1])!r}); import runpy; "
        f"runpy.run_path({str(HERE)!r}, run_name='fuzz')[{func!r}]()"
    )
    env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / ".hypothesis")}
    try:
        proc = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{func} hung for more than {timeout} s:\n{(exc.stderr or b'')[-3000:]!r}")
    if proc.returncode < 0:
        pytest.fail(f"{func} crashed the process ({signal.Signals(-proc.returncode).name}):\n{proc.stderr[-4000:]}")
    assert proc.returncode == 0, f"{func} found an input the decoder does not handle:\n{proc.stderr[-6000:]}"


@pytest.mark.parametrize(
    "fuzzer", ["fuzz_raw_bytes", "fuzz_structures", "fuzz_crafted_maps_in_requests", "fuzz_mutated_requests"]
)
@pytest.mark.slow
def test_wire_fuzz(fuzzer, tmp_path):
    run_isolated(fuzzer, tmp_path)
