"""Hostile peers of the policy server and client: crafted ndarray maps, oversized frames, error
replies that could leak the server's files, metadata that could leak its paths, non-numeric state.

Inputs that could crash the process (an object-dtype array built from a peer's bytes is a
segfault) run in a child Python: a crash fails the test instead of killing pytest.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest

from helpers import openpi_observation

HERE = Path(__file__).resolve()


def run_isolated(func: str, timeout: float = 60) -> str:
    """Run this module's ``func()`` in a child Python; a crash or a hang fails the calling test."""
    code = (  # tests/ on the path, as pytest has it, for `helpers`
        f"import sys; sys.path.insert(0, {str(HERE.parents[1])!r}); import runpy; "
        f"runpy.run_path({str(HERE)!r}, run_name='isolated')[{func!r}]()"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{func} hung for more than {timeout} s:\n{(exc.stderr or b'')[-3000:]!r}")
    if proc.returncode < 0:
        pytest.fail(
            f"{func} crashed the process ({signal.Signals(-proc.returncode).name}): the decoder built an unsafe "
            f"array from the peer's bytes\n{proc.stderr[-3000:]}"
        )
    assert proc.returncode == 0, f"{func} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _ndmap(dtype, data: bytes = b"\x01" * 64, shape=(8,), marker=b"__ndarray__") -> dict:
    """An ndarray map in openpi's framing (bin keys), with whatever the peer cares to name."""
    return {marker: True, b"data": data, b"dtype": dtype, b"shape": list(shape)}


def _raw(msg) -> bytes:
    """msgpack bytes as openpi writes them; crafted maps go through as they are."""
    from openpi_client.msgpack_numpy import pack_array

    return msgpack.packb(msg, default=pack_array, use_bin_type=True)


#: dtypes no numeric array has: object (pointers!), void/structured, strings, datetimes, complex
UNSAFE_DTYPES = [
    "|O",
    "O",
    "<O8",
    "|V8",
    "V4",
    "(2,)<f4",
    "<f4,<f4",
    "|S8",
    "<U2",
    "<M8[ns]",
    "<m8[s]",
    "<c8",
    "|b1,|O",
]
#: dtype specs that are not strings: numpy builds structured dtypes (with object fields) from them
UNSAFE_DTYPE_SPECS = [[["a", "|O"]], {"names": ["a"], "formats": ["|O"]}, 17, None, True]


# --- crafted ndarray maps: both sides, in a child process ----------------------------------------------


def child_decoder_refuses_unsafe_dtypes() -> None:
    from tutorial_utils.errors import TutorialError
    from tutorial_utils.serve.wire import WireError, unpackb

    assert issubclass(WireError, TutorialError) and issubclass(WireError, ValueError)
    for dtype in UNSAFE_DTYPES + UNSAFE_DTYPE_SPECS:
        for marker in (b"__ndarray__", "__ndarray__"):
            try:
                got = unpackb(_raw({"observation/state": _ndmap(dtype, marker=marker)}))
            except WireError as exc:
                msg = str(exc)
                assert "observation/state" in msg and "dtype" in msg, msg
            else:
                raise AssertionError(f"dtype {dtype!r} was accepted: {type(got['observation/state'])}")
        try:
            unpackb(_raw({"s": {b"__npgeneric__": True, b"data": 5, b"dtype": dtype}}))
        except WireError as exc:
            assert "'s'" in str(exc) and "dtype" in str(exc), str(exc)
        else:
            raise AssertionError(f"numpy scalar of dtype {dtype!r} was accepted")
    print("OK")


def test_decoder_refuses_object_void_and_non_numeric_dtypes():
    assert run_isolated("child_decoder_refuses_unsafe_dtypes").strip().endswith("OK")


def child_server_survives_object_dtype_request() -> None:
    from websockets.sync.client import connect

    from tutorial_utils.policies.base import ZeroPolicy
    from tutorial_utils.serve.server import ServerThread
    from tutorial_utils.serve.wire import packb, unpackb

    with ServerThread(ZeroPolicy(image_size=32)) as srv:
        with connect(f"ws://127.0.0.1:{srv.port}", compression=None, max_size=None, proxy=None) as ws:
            unpackb(ws.recv(timeout=5))
            for dtype in ("|O", "|V8", "(2,)<f4", [["a", "|O"]]):
                ws.send(_raw({**openpi_observation(32), "observation/state": _ndmap(dtype)}))
                err = ws.recv(timeout=5)
                assert isinstance(err, str) and "WireError" in err and "observation/state" in err, err
            ws.send(packb(openpi_observation(32)))
            assert unpackb(ws.recv(timeout=5))["actions"].shape == (8, 7)  # still serving
    print("OK")


def test_server_refuses_object_dtype_request_and_keeps_serving():
    """issue 15: `dtype "|O"` with a few bytes of data killed the server with a segmentation fault."""
    assert run_isolated("child_server_survives_object_dtype_request").strip().endswith("OK")


def child_client_refuses_crafted_reply() -> None:
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.server import HandlerThread
    from tutorial_utils.serve.wire import WireError

    async def hostile(ws):
        await ws.send(_raw({"server": "hostile"}))
        async for frame in ws:
            n = len(frame) % 3
            crafted = [_ndmap("|O", b"\x10" * 56, (7,)), _ndmap("|V8", b"\x00" * 56, (7,)), _ndmap("<f4", b"\0" * 3)]
            await ws.send(_raw({"actions": crafted[n], "server_timing": {"infer_ms": 0.1}}))

    async def hostile_metadata(ws):
        await ws.send(_raw({"image_size": _ndmap("|O", b"\x20" * 8, (1,))}))
        async for _ in ws:
            pass

    with HandlerThread(hostile) as srv, PolicyClient(port=srv.port, connect_timeout=5) as client:
        for pad in range(3):
            try:
                client.infer({**openpi_observation(8), "prompt": "x" * pad})
            except WireError as exc:
                assert "actions" in str(exc), str(exc)
            else:
                raise AssertionError("a crafted reply was accepted")
    with HandlerThread(hostile_metadata) as srv:
        try:
            PolicyClient(port=srv.port, connect_timeout=5)
        except WireError as exc:
            assert "image_size" in str(exc), str(exc)
        else:
            raise AssertionError("crafted metadata was accepted")
    print("OK")


def test_client_refuses_crafted_reply_from_hostile_server():
    """issue 15: a crafted reply killed the client the same way."""
    assert run_isolated("child_client_refuses_crafted_reply").strip().endswith("OK")


# --- crafted ndarray maps with numeric dtypes: safe in-process -----------------------------------------


@pytest.mark.parametrize(
    ("ndmap", "words"),
    [
        (_ndmap("<f4", b"\0" * 36, (8,)), ["data", "36 bytes", "32"]),  # one float too many
        (_ndmap("<f4", b"\0" * 28, (8,)), ["data", "28 bytes", "32"]),  # one too few
        (_ndmap("|u1", b"", (-1,)), ["shape", "-1"]),
        (_ndmap("|u1", b"", (0, 2**62, 2**62)), ["shape"]),
        (_ndmap("|u1", b"\0" * 8, (1,) * 40), ["shape", "dimensions"]),
        (_ndmap("|u1", b"\0", ("1",)), ["shape"]),
        (_ndmap("|u1", b"\0", (True,)), ["shape"]),
        ({b"__ndarray__": True, b"data": b"\0", b"dtype": "|u1", b"shape": 1}, ["shape"]),
        ({b"__ndarray__": True, b"dtype": "|u1", b"shape": [1]}, ["data", "missing"]),
        ({b"__ndarray__": True, b"data": b"\0", b"shape": [1]}, ["dtype", "missing"]),
        ({b"__ndarray__": True, b"data": "\0", b"dtype": "|u1", b"shape": [1]}, ["data", "bytes"]),
        (_ndmap("not-a-dtype"), ["dtype", "not-a-dtype"]),
        (_ndmap("x" * 5000), ["dtype"]),
    ],
)
def test_decoder_checks_shape_and_length(ndmap, words):
    from tutorial_utils.serve.wire import WireError, unpackb

    with pytest.raises(WireError) as ei:
        unpackb(_raw({"observation/state": ndmap}))
    msg = str(ei.value)
    assert "observation/state" in msg and len(msg) < 1000, msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize(
    ("generic", "words"),
    [
        ({b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}, ["data", "300", "uint8"]),
        ({b"__npgeneric__": True, b"data": float("nan"), b"dtype": "<i8"}, ["data", "int64"]),
        ({b"__npgeneric__": True, b"data": "1.5", b"dtype": "<f4"}, ["data", "str"]),
        ({b"__npgeneric__": True, b"data": b"\0\0\0\0", b"dtype": "<f4"}, ["data", "bytes"]),
        ({b"__npgeneric__": True, b"dtype": "<f4"}, ["data", "missing"]),
    ],
)
def test_decoder_checks_numpy_scalars(generic, words):
    from tutorial_utils.serve.wire import WireError, unpackb

    with pytest.raises(WireError) as ei:
        unpackb(_raw({"s": [generic]}))
    for w in ["'s[0]'", *words]:
        assert w in str(ei.value), str(ei.value)


def test_decoder_wraps_msgpack_errors():
    from tutorial_utils.serve.wire import WireError, unpackb

    for data in (b"\xc1", b"\x92\x01", b"\x91" * 100_000 + b"\xc0", b"\xa2\xff\xfe", b"\x81\x91\x01\x01"):
        with pytest.raises(WireError, match="msgpack"):
            unpackb(data)


def test_decoder_still_reads_what_openpi_sends():
    from openpi_client import msgpack_numpy

    from tutorial_utils.serve.wire import unpackb

    msg = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.zeros((0, 3), np.uint8),
        "c": np.array(True),
        "d": np.arange(3, dtype=">i2"),
        "s": np.float16(1.5),
        "n": [np.int8(-3), {"deep": np.ones((2, 2, 2), "<f8")}],
    }
    back = unpackb(msgpack_numpy.packb(msg))
    for k in ("a", "b", "c", "d"):
        np.testing.assert_array_equal(back[k], msg[k])
        assert back[k].dtype == msg[k].dtype
    assert back["s"] == np.float16(1.5) and back["n"][0] == -3 and back["n"][1]["deep"].shape == (2, 2, 2)


# --- the server: frame size, error replies, metadata, state -------------------------------------------


def test_default_frame_limit_fits_openpi_libero_requests():
    from tutorial_utils.policies.base import ZeroPolicy
    from tutorial_utils.serve.protocol import DEFAULT_MAX_FRAME_BYTES
    from tutorial_utils.serve.server import PolicyServer
    from tutorial_utils.serve.wire import packb

    libero = len(packb(openpi_observation(224)))  # 2 x 224x224x3 uint8 + state + prompt
    assert DEFAULT_MAX_FRAME_BYTES >= 16 * libero  # headroom for bigger cameras and extra keys
    assert PolicyServer(ZeroPolicy()).max_frame_bytes == DEFAULT_MAX_FRAME_BYTES
    with pytest.raises(ValueError, match="max_frame_bytes"):
        PolicyServer(ZeroPolicy(), max_frame_bytes=0)


def test_oversized_frame_is_refused_with_1009_and_server_keeps_serving():
    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    from tutorial_utils.policies.base import ZeroPolicy
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.protocol import ServerDied
    from tutorial_utils.serve.server import ServerThread
    from tutorial_utils.serve.wire import unpackb

    limit = 1 << 20
    with ServerThread(ZeroPolicy(), max_frame_bytes=limit) as srv:
        with connect(f"ws://127.0.0.1:{srv.port}", compression=None, max_size=None, proxy=None) as ws:
            unpackb(ws.recv(timeout=5))
            ws.send(b"\0" * (limit + 1))
            with pytest.raises(ConnectionClosedError) as ei:
                ws.recv(timeout=5)
        close = ei.value.rcvd
        assert close is not None and close.code == 1009, ei.value
        assert "exceeds limit" in close.reason or "too big" in close.reason, close.reason
        with PolicyClient(port=srv.port, connect_timeout=5) as client:
            assert client.infer(openpi_observation(224))["actions"].shape == (8, 7)  # a LIBERO request fits in 1 MiB
            with pytest.raises(ServerDied, match="frame limit.*max-frame-mb"):
                client.infer(openpi_observation(1024))  # 6 MiB
        with PolicyClient(port=srv.port, connect_timeout=5) as client:  # the next client is served
            assert client.infer(openpi_observation(224))["actions"].shape == (8, 7)


class _LeakyPolicy:
    """A policy whose failure names a file on the server."""

    name = "leaky"
    metadata = {"policy": "leaky", "image_size": 32, "action_horizon": 1}

    def __init__(self, secret_path: str):
        self.secret_path = secret_path

    def infer(self, obs):
        raise RuntimeError(f"could not read {self.secret_path}/weights.bin")


def test_error_reply_has_no_traceback_and_no_paths(tmp_path, caplog):
    from websockets.sync.client import connect

    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.protocol import ServerError
    from tutorial_utils.serve.server import ServerThread
    from tutorial_utils.serve.wire import packb, unpackb

    secret = str(tmp_path / "private" / "ckpt")
    caplog.set_level(logging.WARNING, logger="tutorial_utils.serve")
    with ServerThread(_LeakyPolicy(secret)) as srv:
        with connect(f"ws://127.0.0.1:{srv.port}", compression=None, max_size=None, proxy=None) as ws:
            unpackb(ws.recv(timeout=5))
            ws.send(packb({"prompt": "x"}))
            bad = ws.recv(timeout=5)
            ws.send(packb(openpi_observation(32)))
            leaky = ws.recv(timeout=5)
        for text in (bad, leaky):
            assert isinstance(text, str)
            assert "Traceback" not in text and ".py" not in text and str(tmp_path) not in text, text
            assert "site-packages" not in text and "tutorial_utils/" not in text, text
        assert bad.startswith("ObservationError: ") and "observation/image" in bad, bad
        assert leaky.startswith("RuntimeError: could not read ") and "weights.bin" in leaky, leaky
        with PolicyClient(port=srv.port, connect_timeout=5) as client:
            with pytest.raises(ServerError, match="RuntimeError: could not read") as ei:
                client.infer(openpi_observation(32))
            assert ei.value.server_traceback is None and "Traceback" not in str(ei.value)
    logged = [r for r in caplog.records if r.exc_info]
    assert logged, "the server log keeps the full traceback"
    assert any(secret in logging.Formatter().format(r) and "Traceback" in logging.Formatter().format(r) for r in logged)


def test_debug_server_sends_the_traceback(tmp_path):
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.protocol import ServerError
    from tutorial_utils.serve.server import ServerThread

    with ServerThread(_LeakyPolicy(str(tmp_path)), debug=True) as srv:
        with PolicyClient(port=srv.port, connect_timeout=5) as client:
            with pytest.raises(ServerError, match="RuntimeError: could not read") as ei:
                client.infer(openpi_observation(32))
    tb = ei.value.server_traceback
    assert tb and tb.startswith("Traceback (most recent call last)") and "server.py" in tb
    assert "--- server traceback ---" in str(ei.value)


def test_cli_max_frame_mb_and_debug(monkeypatch):
    from tutorial_utils.serve import cli

    made = {}

    class FakeServer:
        requests = errors = 0

        def __init__(self, policy, host, port, **kw):
            made.update(kw)

        async def serve(self):
            return None

        def stop(self):
            pass

    monkeypatch.setattr(cli, "PolicyServer", FakeServer)
    assert cli.main(["--policy", "zero", "--port", "0", "--max-frame-mb", "2.5", "--debug"]) == 0
    assert made["max_frame_bytes"] == int(2.5 * 2**20) and made["debug"] is True
    assert cli.main(["--policy", "zero", "--port", "0"]) == 0
    from tutorial_utils.serve.protocol import DEFAULT_MAX_FRAME_BYTES

    assert made["max_frame_bytes"] == DEFAULT_MAX_FRAME_BYTES and made["debug"] is False
    with pytest.raises(SystemExit):
        cli.main(["--policy", "zero", "--max-frame-mb", "0"])


def test_metadata_carries_no_absolute_checkpoint_path(tmp_path):
    from tutorial_utils.policies.trainable import ServedModel
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.server import ServerThread
    from tutorial_utils.serve.wire import packb

    model = SimpleNamespace(name="fake", action_horizon=4, image_size=16, gripper="dataset")
    last = tmp_path / "runs" / "20250101-abc" / "checkpoints" / "last"
    cases = {
        str(last): "checkpoints/last",
        str(tmp_path / "elsewhere" / "my_ckpt"): "my_ckpt",
        "runs/x/checkpoints/step_000100/": "checkpoints/step_000100",
        "": "",
    }
    for given, sent in cases.items():
        md = ServedModel(model, checkpoint=given).metadata
        assert md["checkpoint"] == sent, (given, md["checkpoint"])
        assert str(tmp_path).encode() not in packb(md)
    with ServerThread(ServedModel(model, checkpoint=str(last))) as srv, PolicyClient(port=srv.port) as client:
        assert client.metadata["checkpoint"] == "checkpoints/last"


@pytest.mark.parametrize(
    "state",
    ["abc", "1,2,3,4,5,6,7,8", b"\0" * 32, None, {"x": 1}, ["a"] * 8, [1, [2, 3]], [2**80] * 8, [1j] * 8],
)
def test_non_numeric_state_names_the_key(state):
    from tutorial_utils.serve.protocol import ObservationError, to_policy_observation

    with pytest.raises(ObservationError, match="observation/state"):
        to_policy_observation({**openpi_observation(16), "observation/state": state}, 16)


def test_non_finite_state_is_refused():
    from tutorial_utils.serve.protocol import ObservationError, to_policy_observation

    for bad in (np.nan, np.inf, -np.inf):
        state = np.zeros(8, np.float32)
        state[3] = bad
        with pytest.raises(ObservationError, match=r"observation/state.*finite"):
            to_policy_observation({**openpi_observation(16), "observation/state": state}, 16)


def test_string_state_over_the_wire_names_the_key():
    from tutorial_utils.policies.base import ZeroPolicy
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.protocol import ServerError
    from tutorial_utils.serve.server import ServerThread

    with ServerThread(ZeroPolicy(image_size=16)) as srv, PolicyClient(port=srv.port) as client:
        with pytest.raises(ServerError, match=r"ObservationError: request key 'observation/state'"):
            client.infer({**openpi_observation(16), "observation/state": "abc"})
        assert client.infer(openpi_observation(16))["actions"].shape == (8, 7)


def test_dit4dit_request_with_no_images_names_the_key():
    from tutorial_utils.serve.protocol import ObservationError, to_policy_observation

    req = {"examples": [{"image": [], "lang": "x", "state": np.zeros((1, 16), np.float32)}]}
    with pytest.raises(ObservationError, match=r"examples\[0\]\.image"):
        to_policy_observation(req, 16)


@pytest.mark.parametrize("case", ["missing", "corrupt"])
def test_serving_a_missing_or_corrupt_checkpoint_is_one_teaching_line(tmp_path, case):
    ck = tmp_path / "ck"
    if case == "corrupt":
        ck.mkdir()
        (ck / "config.json").write_text("{not json")
    proc = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "serve", "--policy", "mini", "--checkpoint", str(ck), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr and "cannot serve policy mini" in proc.stderr
    assert ("does not exist" if case == "missing" else "config.json is corrupted") in proc.stderr
