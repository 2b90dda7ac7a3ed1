"""A websocket policy server and client in the openpi framing (FACTS.md section 4).

The wire protocol, which openpi's ``openpi-client`` and DiT4DiT's ``server_policy.py`` share:

- websockets with ``compression=None`` and ``max_size=None``;
- on connect the server sends one binary frame: the policy's metadata;
- then request / reply, each a msgpack binary frame. numpy arrays travel as maps
  ``{"__ndarray__": True, "data": <raw bytes>, "dtype": "<f4", "shape": [..]}`` and numpy
  scalars as ``{"__npgeneric__": True, "data": <item>, "dtype": ".."}`` (the map keys are
  msgpack *bin* strings, as openpi writes them; we read str keys too);
- a reply carries ``server_timing`` (``infer_ms``, and ``prev_total_ms`` from the second
  request on);
- a *text* frame from the server is an error: it carries the server's traceback, and the
  client raises it. Our server then keeps serving the same connection;
- ``GET /healthz`` answers ``OK``.

Two request shapes are understood (see :func:`to_policy_observation`):

- openpi LIBERO: ``observation/image``, ``observation/wrist_image`` (HxWx3 uint8),
  ``observation/state`` (8,), ``prompt``; reply ``actions`` (chunk x 7);
- DiT4DiT: ``{"examples": [{"image": [primary||wrist], "lang": str, "state": (1, 16)}]}``;
  reply ``{"data": {"normalized_actions": (1, chunk, 8)}}``.

CLI: ``python -m tutorial_utils serve --policy expert --port 8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import errno
import http
import http.client
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable

from tutorial_utils import logs as _logs

logger = logging.getLogger("tutorial_utils.serving")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
HEALTH_PATH = "/healthz"

#: The openpi LIBERO request keys.
IMAGE_KEY = "observation/image"
WRIST_KEY = "observation/wrist_image"
STATE_KEY = "observation/state"
PROMPT_KEY = "prompt"
PRIVILEGED_KEY = "privileged"
OPENPI_KEYS = (IMAGE_KEY, WRIST_KEY, STATE_KEY, PROMPT_KEY)
STATE_DIM = 8


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


# --- errors --------------------------------------------------------------------------------------


class ServingError(RuntimeError):
    """Base class of the serving errors."""


class ObservationError(ServingError, ValueError):
    """A request the policy cannot use (missing key, wrong shape or dtype)."""


class ServerError(ServingError):
    """The server answered with a text frame (its traceback)."""

    def __init__(self, text: str):
        last = next((ln for ln in reversed(text.strip().splitlines()) if ln.strip()), text)
        super().__init__(f"policy server error: {last}\n--- server traceback ---\n{text.rstrip()}")
        self.server_traceback = text


class ServerUnavailable(ServingError, TimeoutError):
    """No server answered within the connect timeout."""


class ServerDied(ServingError, ConnectionError):
    """The connection closed or timed out in the middle of a request."""


class PortInUse(ServingError, OSError):
    """The port is taken by another process."""


# --- request adapters ----------------------------------------------------------------------------


def _as_image(value: Any, key: str, size: int | None):
    import numpy as np

    arr = np.asarray(value)
    if arr.ndim != 3 or arr.shape[-1] != 3:
        raise ObservationError(
            f"request key {key!r}: expected an image of shape (H, W, 3), found shape {tuple(arr.shape)}. "
            f"Send HxWx3 uint8 RGB (channels last)."
        )
    if size is not None and arr.shape[:2] != (size, size):
        raise ObservationError(
            f"request key {key!r}: expected an image of shape ({size}, {size}, 3) (the policy's input size, "
            f"metadata['image_size']), found {tuple(arr.shape)}. Resize on the client before sending."
        )
    if arr.dtype != np.uint8:
        raise ObservationError(f"request key {key!r}: expected dtype uint8, found {arr.dtype}. Send 0..255 uint8 pixels.")
    return arr


def _as_state(value: Any, key: str):
    import numpy as np

    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.shape[0] == 2 * STATE_DIM:  # DiT4DiT's sin/cos encoded state: sin(s) then cos(s)
        arr = np.arctan2(arr[:STATE_DIM], arr[STATE_DIM:])
    if arr.shape[0] != STATE_DIM:
        raise ObservationError(
            f"request key {key!r}: expected {STATE_DIM} numbers (eef pos 3 + axis-angle 3 + gripper qpos 2), "
            f"found {arr.shape[0]}."
        )
    return arr.astype(np.float32)


def detect_protocol(request: Any) -> str:
    """``"dit4dit"`` for an ``examples`` request, else ``"openpi"``."""
    if isinstance(request, dict) and "examples" in request:
        return "dit4dit"
    return "openpi"


def to_policy_observation(request: Any, image_size: int | None = None) -> dict[str, Any]:
    """A request in either protocol -> the policy observation (openpi LIBERO keys).

    Raises :class:`ObservationError` naming the key when something is missing or malformed.
    """
    if not isinstance(request, dict):
        raise ObservationError(
            f"request must be a map (dict) of observation keys, found {type(request).__name__}. "
            f"Expected keys: {', '.join(OPENPI_KEYS)}."
        )
    if "examples" in request:
        ex = request["examples"]
        if not isinstance(ex, (list, tuple)) or not ex or not isinstance(ex[0], dict):
            raise ObservationError("request key 'examples': expected a non-empty list of maps with 'image', 'lang', 'state'.")
        ex = ex[0]
        missing = [k for k in ("image", "lang", "state") if k not in ex]
        if missing:
            raise ObservationError(f"request key 'examples[0]': missing {', '.join(map(repr, missing))}; expected 'image', 'lang', 'state'.")
        images = ex["image"]
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        if len(images) == 1:  # primary || wrist side by side
            both = _as_image(images[0], "examples[0].image", None)
            h, w = both.shape[:2]
            if w != 2 * h:
                raise ObservationError(
                    f"request key 'examples[0].image': expected primary and wrist side by side (H, 2H, 3), found {both.shape}."
                )
            images = [both[:, :h], both[:, h:]]
        obs = {
            IMAGE_KEY: _as_image(images[0], "examples[0].image[0]", image_size),
            WRIST_KEY: _as_image(images[1], "examples[0].image[1]", image_size),
            STATE_KEY: _as_state(ex["state"], "examples[0].state"),
            PROMPT_KEY: str(ex["lang"]),
        }
        if PRIVILEGED_KEY in ex or PRIVILEGED_KEY in request:
            obs[PRIVILEGED_KEY] = ex.get(PRIVILEGED_KEY, request.get(PRIVILEGED_KEY))
        return obs
    missing = [k for k in OPENPI_KEYS if k not in request]
    if missing:
        raise ObservationError(
            f"request is missing key(s) {', '.join(map(repr, missing))}; found {', '.join(map(repr, request)) or 'none'}. "
            f"An openpi LIBERO request has {', '.join(OPENPI_KEYS)}."
        )
    obs = dict(request)
    obs[IMAGE_KEY] = _as_image(request[IMAGE_KEY], IMAGE_KEY, image_size)
    obs[WRIST_KEY] = _as_image(request[WRIST_KEY], WRIST_KEY, image_size)
    obs[STATE_KEY] = _as_state(request[STATE_KEY], STATE_KEY)
    if not isinstance(request[PROMPT_KEY], str):
        raise ObservationError(f"request key {PROMPT_KEY!r}: expected a string (the task language), found {type(request[PROMPT_KEY]).__name__}.")
    return obs


def to_reply(result: dict[str, Any], protocol: str) -> dict[str, Any]:
    """The policy's result -> the reply for ``protocol``.

    For ``dit4dit`` the chunk is padded to 8 action dims under ``data.normalized_actions``; the
    server normalises it first when the policy has ``normalize_actions`` (else the actions are
    in robot units, which this package's own client expects).
    """
    import numpy as np

    actions = np.asarray(result["actions"], dtype=np.float32)
    if actions.ndim == 1:
        actions = actions[None]
    if protocol == "dit4dit":
        padded = np.zeros((1, actions.shape[0], 8), np.float32)
        padded[0, :, : actions.shape[1]] = actions
        extra = {k: v for k, v in result.items() if k != "actions"}
        return {"data": {"normalized_actions": padded, **extra}}
    return {**result, "actions": actions}


def to_request(obs: dict[str, Any], protocol: str = "openpi") -> dict[str, Any]:
    """Client side: openpi-keyed observation -> a request for ``protocol``."""
    import numpy as np

    if protocol == "openpi":
        return obs
    if protocol == "dit4dit":
        both = np.concatenate([obs[IMAGE_KEY], obs[WRIST_KEY]], axis=1)
        s = np.asarray(obs[STATE_KEY], dtype=np.float32).reshape(-1)
        ex = {"image": [both], "lang": obs[PROMPT_KEY], "state": np.concatenate([np.sin(s), np.cos(s)])[None]}
        if PRIVILEGED_KEY in obs:
            ex[PRIVILEGED_KEY] = obs[PRIVILEGED_KEY]
        return {"examples": [ex]}
    raise ValueError(f"unknown protocol {protocol!r}; use 'openpi' or 'dit4dit'")


def reply_actions(reply: dict[str, Any]):
    """The (chunk, 7) float32 actions of a reply in either protocol."""
    import numpy as np

    if "actions" in reply:
        a = np.asarray(reply["actions"], dtype=np.float32)
    elif isinstance(reply.get("data"), dict) and "normalized_actions" in reply["data"]:
        a = np.asarray(reply["data"]["normalized_actions"], dtype=np.float32)[0, :, :7]
    else:
        raise ServingError(f"reply has neither 'actions' nor 'data.normalized_actions'; keys: {sorted(reply)}")
    return a.reshape(-1, 7) if a.ndim == 1 else a


# --- server --------------------------------------------------------------------------------------


def _health_check(connection, request):
    if request.path == HEALTH_PATH:
        return connection.respond(http.HTTPStatus.OK, "OK\n")
    return None


def _port_in_use_error(host: str, port: int) -> PortInUse:
    return PortInUse(
        errno.EADDRINUSE,
        f"port {port} on {host} is already in use (another policy server or program holds it). "
        f"Pick a free port (--port / the job's `port` parameter, 0 picks one) or find the holder with `ss -ltnp | grep :{port}`.",
    )


class PolicyServer:
    """Serve one :class:`tutorial_utils.policies.Policy` over the websocket protocol.

    Inference runs in the event loop, as in openpi (one client at a time is the use case, and
    a thread hop costs ~0.3 ms a request on a busy 2-core machine); ``infer_in_thread=True``
    moves it to a worker thread so ``/healthz`` and keepalive pings stay answered during a
    slow (seconds-long) inference.

    ``await server.serve()`` runs until :meth:`stop`. ``port=0`` picks a free port
    (read :attr:`port` once :attr:`ready` is set).
    """

    def __init__(self, policy, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, metadata: dict | None = None,
                 infer_in_thread: bool = False):
        self.policy = policy
        self.infer_in_thread = infer_in_thread
        self.host = host
        self.port = port
        self.metadata = dict(metadata if metadata is not None else getattr(policy, "metadata", {}) or {})
        self.ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-infer")
        self.requests = 0
        self.errors = 0

    @property
    def image_size(self) -> int | None:
        return self.metadata.get("image_size")

    def _infer(self, request: Any) -> dict[str, Any]:
        protocol = detect_protocol(request)
        obs = to_policy_observation(request, self.image_size)
        result = self.policy.infer(obs)
        if protocol == "dit4dit" and hasattr(self.policy, "normalize_actions"):
            # a DiT4DiT client un-normalises with dataset_statistics.json itself
            result = {**result, "actions": self.policy.normalize_actions(result["actions"])}
        return to_reply(result, protocol)

    async def _handler(self, ws) -> None:
        import websockets

        addr = ws.remote_address
        logger.info(_logs.SERVER_CONNECTION_FROM.format(addr=addr))
        loop = asyncio.get_running_loop()
        await ws.send(packb(self.metadata))
        prev_total = None
        while True:
            try:
                frame = await ws.recv()
            except websockets.ConnectionClosed:
                logger.info(_logs.SERVER_CONNECTION_CLOSED.format(addr=addr))
                return
            t0 = time.monotonic()
            try:
                if isinstance(frame, str):
                    raise ObservationError("expected a binary msgpack frame, received a text frame")
                try:
                    request = unpackb(frame)
                except Exception as exc:  # msgpack raises several types
                    raise ObservationError(f"request is not valid msgpack ({type(exc).__name__}: {exc})") from None
                t_inf = time.monotonic()
                if self.infer_in_thread:
                    reply = await loop.run_in_executor(self._executor, self._infer, request)
                else:
                    reply = self._infer(request)
                infer_ms = (time.monotonic() - t_inf) * 1000.0
                timing = {"infer_ms": infer_ms}
                if prev_total is not None:
                    timing["prev_total_ms"] = prev_total
                reply["server_timing"] = timing
                data = packb(reply)
            except Exception as exc:
                self.errors += 1
                logger.warning(_logs.SERVER_REQUEST_ERROR.format(addr=addr, error=f"{type(exc).__name__}: {exc}"))
                try:
                    await ws.send(traceback.format_exc())
                except websockets.ConnectionClosed:
                    logger.info(_logs.SERVER_CONNECTION_CLOSED.format(addr=addr))
                    return
                continue
            try:
                await ws.send(data)
            except websockets.ConnectionClosed:
                logger.info(_logs.SERVER_CONNECTION_CLOSED.format(addr=addr))
                return
            self.requests += 1
            prev_total = (time.monotonic() - t0) * 1000.0

    async def serve(self) -> None:
        from websockets.asyncio.server import serve

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            server = await serve(
                self._handler, self.host, self.port, compression=None, max_size=None,
                process_request=_health_check, reuse_address=True,
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise _port_in_use_error(self.host, self.port) from None
            raise
        self.port = server.sockets[0].getsockname()[1]
        logger.info(_logs.SERVER_RUNNING.format(host=self.host, port=self.port))
        self.ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            await server.wait_closed()
            self._executor.shutdown(wait=False)

    def stop(self) -> None:
        """Stop serving (thread-safe)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)


class HandlerThread:
    """Any async websocket ``handler(ws)`` served from a background thread on 127.0.0.1
    (a bare echo for the benchmark, an openpi-style peer for the interop tests).

    ``with HandlerThread(handler) as srv: ... srv.port``.
    """

    def __init__(self, handler, host: str = DEFAULT_HOST, port: int = 0):
        self.handler, self.host, self.port = handler, host, port
        self.ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="ws-handler", daemon=True)

    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self.handler, self.host, self.port, compression=None, max_size=None) as srv:
            self.port = srv.sockets[0].getsockname()[1]
            self.ready.set()
            await self._stop.wait()

    def __enter__(self) -> "HandlerThread":
        self._thread.start()
        if not self.ready.wait(10):
            raise ServerUnavailable("websocket handler thread did not start within 10 s")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


class ServerThread:
    """Run a :class:`PolicyServer` in a background thread (tests, benchmarks, the chapter).

    ``with ServerThread(policy) as srv: client = PolicyClient(port=srv.port)``.
    """

    def __init__(self, policy, host: str = DEFAULT_HOST, port: int = 0, metadata: dict | None = None):
        self.server = PolicyServer(policy, host, port, metadata)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="policy-server", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self.server.ready.set()

    @property
    def port(self) -> int:
        return self.server.port

    def start(self, timeout: float = 10.0) -> "ServerThread":
        self._thread.start()
        if not self.server.ready.wait(timeout):
            raise ServerUnavailable(f"policy server thread did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.server.stop()
        self._thread.join(timeout)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- client --------------------------------------------------------------------------------------


def check_health(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout: float = 2.0) -> bool:
    """True when ``GET /healthz`` answers 200 (no proxy is involved)."""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request("GET", HEALTH_PATH)
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def wait_for_health(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout: float = 60.0,
                    interval: float = 0.25, alive: Callable[[], bool] | None = None) -> float:
    """Poll ``/healthz`` until it answers; returns the seconds waited.

    ``alive`` (e.g. ``lambda: proc.poll() is None``) stops the wait early when the server
    process has exited. Raises :class:`ServerUnavailable` with the reason.
    """
    t0 = time.monotonic()
    while True:
        if check_health(host, port, timeout=min(2.0, timeout)):
            return time.monotonic() - t0
        if alive is not None and not alive():
            raise ServerUnavailable(f"the policy server process exited before {host}:{port}{HEALTH_PATH} answered; read its log (server.log)")
        if time.monotonic() - t0 > timeout:
            raise ServerUnavailable(
                f"no policy server answered http://{host}:{port}{HEALTH_PATH} within {timeout:.0f} s. "
                f"Is it started (python -m tutorial_utils serve --port {port}), on this port, and did it log 'server listening'?"
            )
        time.sleep(interval)


class PolicyClient:
    """Synchronous client: ``PolicyClient(port=8000).infer(obs) -> reply``.

    Retries the connection every ``retry_interval`` s for up to ``connect_timeout`` s while the
    server starts, then raises :class:`ServerUnavailable`. Each reply is awaited at most
    ``recv_timeout`` s; a closed connection or a timeout raises :class:`ServerDied`, a text
    frame raises :class:`ServerError` with the server's traceback.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, connect_timeout: float = 60.0,
                 retry_interval: float = 0.5, recv_timeout: float = 120.0, protocol: str = "openpi"):
        self.uri = host if host.startswith("ws") else f"ws://{host}:{port}"
        self.recv_timeout = recv_timeout
        self.protocol = protocol
        self._ws, self.metadata = self._connect(connect_timeout, retry_interval)

    def _connect(self, timeout: float, interval: float):
        from websockets.exceptions import InvalidHandshake, InvalidURI
        from websockets.sync.client import connect

        t0 = time.monotonic()
        last: BaseException | None = None
        while time.monotonic() - t0 <= timeout:
            try:
                ws = connect(self.uri, compression=None, max_size=None, proxy=None, legacy=True,
                             open_timeout=max(1.0, min(10.0, timeout)), close_timeout=1.0)
            except InvalidURI:
                raise
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                last = exc
                time.sleep(interval)
                continue
            try:
                first = ws.recv(timeout=self.recv_timeout)
            except Exception as exc:
                ws.close()
                raise ServerDied(f"connected to {self.uri} but the server sent no metadata ({type(exc).__name__}: {exc})") from None
            if isinstance(first, str):
                ws.close()
                raise ServerError(first)
            return ws, unpackb(first)
        raise ServerUnavailable(
            f"could not connect to the policy server at {self.uri} within {timeout:.0f} s "
            f"(last error: {type(last).__name__}: {last}). Start it first "
            f"(python -m tutorial_utils serve --port ...), check the port, and read server.log."
        )

    def get_server_metadata(self) -> dict:
        return self.metadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(packb(to_request(obs, self.protocol)))
            reply = self._ws.recv(timeout=self.recv_timeout)
        except TimeoutError:
            raise ServerDied(
                f"the policy server at {self.uri} did not answer within {self.recv_timeout:.0f} s; "
                f"it may be stuck or overloaded (read server.log)"
            ) from None
        except ConnectionClosed as exc:
            raise ServerDied(
                f"the policy server at {self.uri} closed the connection in the middle of a request "
                f"({exc}); did the server process die? Read server.log."
            ) from None
        if isinstance(reply, str):
            raise ServerError(reply)
        return unpackb(reply)

    def reset(self) -> None:
        pass

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> "PolicyClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --- CLI -----------------------------------------------------------------------------------------


def configure_logging(level: int = logging.INFO) -> None:
    """One plain format for our lines and the websockets library's (``server listening``...)."""
    root = logging.getLogger()
    if not any(getattr(h, "_tutorial_serving", False) for h in root.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        h._tutorial_serving = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(level)
    logging.getLogger("websockets").setLevel(logging.INFO)


def main(argv: list[str]) -> int:
    from tutorial_utils import policies

    ap = argparse.ArgumentParser(prog="python -m tutorial_utils serve", description="Serve a policy over the websocket policy protocol.")
    ap.add_argument("--policy", default="expert", help=f"policy name ({', '.join(policies.available())})")
    ap.add_argument("--checkpoint", default="", help="checkpoint path for learned policies")
    ap.add_argument("--host", default=DEFAULT_HOST, help="bind address (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (0 picks a free one)")
    ap.add_argument("--infer-in-thread", action="store_true", help="run inference in a worker thread (slow policies: keeps /healthz and pings answered)")
    args = ap.parse_args(argv)
    configure_logging()
    try:
        policy = policies.make_policy(args.policy, checkpoint=args.checkpoint or None)
    except policies.PolicyUnavailable as exc:
        logger.error(_logs.SERVER_POLICY_UNAVAILABLE.format(policy=args.policy, reason=exc))
        return 3
    server = PolicyServer(policy, args.host, args.port, infer_in_thread=args.infer_in_thread)

    async def _run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.stop)
        await server.serve()

    try:
        asyncio.run(_run())
    except PortInUse as exc:
        logger.error(str(exc))
        return 2
    logger.info(_logs.SERVER_STOPPED.format(requests=server.requests, errors=server.errors))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
