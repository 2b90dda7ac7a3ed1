"""The websocket policy server (openpi framing), a thread wrapper for tests and the chapter, and health checks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import http
import http.client
import logging
import re
import sys
import threading
import time
import traceback
from typing import Any

from tutorial_utils import logs as _logs
from tutorial_utils import secrets as _secrets
from tutorial_utils.data.libero_schema import (
    DATASET_GRIPPER,
    GRIPPER_CONVENTIONS,
    ROBOSUITE_GRIPPER,
    action_to_env,
)
from tutorial_utils.jobs import free_port  # noqa: F401  (re-exported: callers use it from here)
from tutorial_utils.serve.protocol import (
    DEFAULT_HOST,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_PORT,
    HEALTH_PATH,
    OPENPI_REPLAN_STEPS,
    ActionGuard,
    ObservationError,
    PortInUse,
    ServerUnavailable,
    detect_protocol,
    to_policy_observation,
    to_reply,
)
from tutorial_utils.serve.wire import packb, unpackb

logger = logging.getLogger("tutorial_utils.serve")


class _Redact(logging.Filter):
    """Mask secrets in every record of the server's logger, its traceback included (a policy's
    error text may carry a token a client sent): the traceback is formatted here, redacted,
    and kept as the record's ``exc_text``, which handlers print instead of formatting it again."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = _secrets.redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = _secrets.redact(logging.Formatter().formatException(record.exc_info))
        return True


logger.addFilter(_Redact())

#: websockets' close code for a frame over ``max_size``
CLOSE_MESSAGE_TOO_BIG = 1009
#: the key of openpi's control frames (episode_start / episode_end): see PolicyServer._control
CONTROL_KEY = "__ctrl__"
#: an absolute POSIX path's folders (``/home/me/runs/x/``), kept out of error replies: what follows
#: (the file name) stays. Not after a word, a dot, ``~``, ``:`` or ``/``, so URLs and keys such as
#: ``observation/state`` are left alone.
_ABS_DIRS = re.compile(r"(?<![\w.~:/-])/(?:[^\s/'\"`]+/)+")


#: the longest error reply (characters): a request with a 15 MB key never gets a 15 MB answer
MAX_ERROR_REPLY_CHARS = 2000
#: the longest log line about one bad request
MAX_LOG_CHARS = 300
#: failed requests in a row after which a connection is closed (1008): its bad frames cost it, not others
DEFAULT_MAX_BAD_FRAMES = 32
#: websockets' close code for a policy violation
CLOSE_POLICY_VIOLATION = 1008


def bounded(text: str, limit: int) -> str:
    """``text`` redacted and cut to ``limit`` characters (the cut says how much was left out).
    It is cut before and after redaction, so a huge text costs little and a token cut in two
    by the first cut is masked by its shape or by its environment value."""
    head = text[: limit * 2]
    out = _secrets.redact(head)
    if len(out) > limit or len(text) > len(head):
        out = f"{out[:limit]}... [{len(text) - limit:,} more characters]"
    return out


def error_reply(exc: BaseException, debug: bool = False) -> str:
    """The text frame sent for a failed request: ``ErrorType: message`` with absolute paths cut to
    their last part (``.../weights.bin``), secrets masked and at most
    :data:`MAX_ERROR_REPLY_CHARS` long; with ``debug`` the full traceback (call it inside the
    ``except`` block)."""
    if debug:
        return bounded(traceback.format_exc(), MAX_ERROR_REPLY_CHARS * 8)
    msg = str(exc)[: MAX_ERROR_REPLY_CHARS * 4]
    return bounded(f"{type(exc).__name__}: {_ABS_DIRS.sub('.../', msg)}", MAX_ERROR_REPLY_CHARS)


class _Failed:
    """A request that failed in the worker thread: the reply, the log line, and whether it was the
    client's fault (a bad frame: one short line) or the policy's (the log keeps the traceback)."""

    __slots__ = ("reply", "line", "client_fault", "exc")

    def __init__(self, exc: BaseException, debug: bool, client_fault: bool):
        self.exc = exc if not client_fault else None
        self.client_fault = client_fault
        self.reply = error_reply(exc, debug)
        self.line = bounded(f"{type(exc).__name__}: {str(exc)[: MAX_LOG_CHARS * 2]}", MAX_LOG_CHARS).replace("\n", " ")


def announced_metadata(policy_metadata: dict) -> dict:
    """The metadata the server sends on connect: the policy's, with ``gripper`` the convention of
    the openpi replies (always ``"robosuite"``) and ``policy_gripper`` the policy's own.

    Raises ValueError for a convention other than ``"robosuite"`` / ``"dataset"``.
    """
    meta = dict(policy_metadata)
    if "gripper" in meta:
        own = meta["gripper"]
        if own not in GRIPPER_CONVENTIONS:
            raise ValueError(
                f"policy metadata['gripper'] is {own!r}: use {ROBOSUITE_GRIPPER!r} (-1 open, +1 close) or "
                f"{DATASET_GRIPPER!r} (+1 open, -1 close, the LIBERO datasets'), the convention of the actions "
                f"the policy returns"
            )
        meta.update(gripper=ROBOSUITE_GRIPPER, policy_gripper=own)
    return meta


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

    Decoding, checking and inference run in one worker thread, never in the event loop, so one
    client's frames (a flood of bad ones, a slow inference) never hold up another's, nor
    ``/healthz`` and keepalive pings; each connection has at most one request in the worker's
    queue, so clients take turns (``benchmarks/bench_serving_fairness.py``). ``infer_in_thread``
    is kept for callers; it is always on. A connection whose last ``max_bad_frames`` requests
    all failed is closed with code 1008 (its bad frames cost it, not others); each failed request
    logs one short line (the policy's own failures also log their traceback).

    ``await server.serve()`` runs until :meth:`stop`. ``port=0`` picks a free port
    (read :attr:`port` once :attr:`ready` is set).

    A frame larger than ``max_frame_bytes`` (default
    :data:`~tutorial_utils.serve.protocol.DEFAULT_MAX_FRAME_BYTES`, 16 MiB) is refused from its
    header, before it is buffered: that connection is closed with code 1009 and the server goes on.
    A failed request is answered with a text frame ``ErrorType: message`` (paths cut to their last
    part, at most :data:`MAX_ERROR_REPLY_CHARS`); ``debug=True`` sends the traceback instead.

    Requests may carry images of any size: they are resized to the policy's ``image_size``
    (see :func:`~tutorial_utils.serve.protocol.to_policy_observation`). openpi-shaped requests are
    answered in robosuite's gripper convention, as openpi's LIBERO example passes ``actions``
    straight to ``env.step``: a ``"dataset"``-convention policy's chunk goes through
    :func:`tutorial_utils.data.libero_schema.dataset_action_to_env`. So the metadata sent on
    connect (:attr:`metadata`) says ``gripper: "robosuite"`` and keeps the policy's own convention
    under ``policy_gripper`` (:attr:`policy_metadata` is the policy's metadata unchanged).

    Every chunk goes through :attr:`guard` (:class:`~tutorial_utils.serve.protocol.ActionGuard`):
    clipped to the env's action range ([-1, 1]), each clipped number counted and logged (openpi
    replies carry the reply's count under ``clipped_values``), and fitted to the client's length:
    openpi replies hold at least ``min_chunk`` actions (openpi's LIBERO loop asserts
    ``replan_steps``, default 5; a shorter chunk is padded by repeating its last action, which the
    metadata's ``chunk_padding`` says), DiT4DiT replies exactly upstream's 8.

    DiT4DiT requests (:mod:`tutorial_utils.serve.dit4dit_profile`) get upstream's reply: the chunk
    normalised to [-1, 1] with :attr:`dit4dit_statistics` (``statistics``: a
    ``dataset_statistics.json`` path or map; else the served checkpoint's; else the action space's,
    which changes nothing), the gripper +1 open / -1 close, so a client un-normalising with the same
    file gets the policy's actions back. The metadata announces those statistics under
    ``dit4dit_statistics`` (upstream's server announces none; its client reads the file).
    """

    def __init__(
        self,
        policy,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        metadata: dict | None = None,
        infer_in_thread: bool = False,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        debug: bool = False,
        statistics: Any = None,
        max_bad_frames: int = DEFAULT_MAX_BAD_FRAMES,
        min_chunk: int = OPENPI_REPLAN_STEPS,
    ):
        from tutorial_utils.errors import ConfigError
        from tutorial_utils.serve.dit4dit_profile import METADATA_KEY, server_statistics

        if isinstance(max_frame_bytes, bool) or not isinstance(max_frame_bytes, int) or max_frame_bytes <= 0:
            raise ConfigError(
                f"max_frame_bytes must be a positive number of bytes, found {max_frame_bytes!r}; "
                f"the default {DEFAULT_MAX_FRAME_BYTES} (16 MiB) fits openpi's LIBERO requests 50 times"
            )
        if isinstance(max_bad_frames, bool) or not isinstance(max_bad_frames, int) or max_bad_frames <= 0:
            raise ConfigError(f"max_bad_frames must be a positive whole number, found {max_bad_frames!r}")
        self.policy = policy
        self.infer_in_thread = True  # always: decoding and inference never block the event loop
        self.max_bad_frames = max_bad_frames
        self.max_frame_bytes = max_frame_bytes
        self.debug = debug
        self.host = host
        self.port = port
        self.policy_metadata = dict(metadata if metadata is not None else getattr(policy, "metadata", {}) or {})
        self.metadata = announced_metadata(self.policy_metadata)
        self.dit4dit_statistics = server_statistics(policy, statistics)
        self.metadata[METADATA_KEY] = self.dit4dit_statistics.to_dict()
        # every chunk is clipped to the env's range and fitted to the client's length (counted, logged)
        self.guard = ActionGuard.for_policy(self.policy_metadata, min_chunk, logger)
        self.metadata.update(self.guard.metadata())
        self.ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-infer")
        self.requests = 0
        self.errors = 0

    @property
    def image_size(self) -> int | None:
        return self.metadata.get("image_size")

    @property
    def policy_gripper(self) -> str:
        return self.metadata.get("policy_gripper", ROBOSUITE_GRIPPER)

    def _work(self, frame: Any, prev_total: float | None) -> bytes | _Failed:
        """One request, in the worker thread: decode and check it (a failure is the client's
        fault), infer (a failure is the policy's), pack the reply."""
        try:
            if isinstance(frame, str):
                raise ObservationError("expected a binary msgpack frame, received a text frame")
            request = unpackb(frame)  # WireError names the key of a bad ndarray map
            if not isinstance(request, dict):
                raise ObservationError(f"a request is a map of observation keys, received {type(request).__name__}")
            if CONTROL_KEY in request:  # openpi's episode_start / episode_end
                return packb(self._control(request))
            protocol = detect_protocol(request)
            obs = to_policy_observation(request, self.image_size)
        except Exception as exc:
            return _Failed(exc, self.debug, client_fault=True)
        try:
            t_inf = time.monotonic()
            result = self.policy.infer(obs)
            reply = self._reply(result, protocol, request)
            timing = {"infer_ms": (time.monotonic() - t_inf) * 1000.0}
            if prev_total is not None:
                timing["prev_total_ms"] = prev_total
            if "examples" not in request:  # DiT4DiT replies keep upstream's keys only
                reply["server_timing"] = timing
            return packb(reply)
        except Exception as exc:
            return _Failed(exc, self.debug, client_fault=isinstance(exc, ObservationError))

    def _reply(self, result: dict, protocol: str, request: dict) -> dict[str, Any]:
        if protocol == "dit4dit":
            # upstream's 8-action chunk, in the env's range; a DiT4DiT client un-normalises with
            # dataset_statistics.json itself
            actions = self.guard(result["actions"], protocol)
            normalized = self.dit4dit_statistics.normalize(actions, self.policy_gripper)
            return to_reply({"actions": normalized}, protocol, request.get("request_id", "default"))
        actions = result["actions"]
        if self.policy_gripper != ROBOSUITE_GRIPPER:
            # openpi's client passes the actions straight to env.step: answer in robosuite's convention
            actions = action_to_env(actions, self.policy_gripper)
        result = {**result, "actions": self.guard(actions, protocol), "clipped_values": self.guard.last_clipped}
        return to_reply(result, protocol)

    def _control(self, request: dict) -> dict:
        """openpi's control frames (``{"__ctrl__": "episode_start" | "episode_end", ...}``, sent by
        current openpi's ``WebsocketClientPolicy.episode_start`` / ``episode_end`` around each LIBERO
        episode), answered as openpi's server does (``{"__ack__": ...}``). ``episode_start`` resets
        the policy's per-episode state (the observation history of ``n_obs_steps`` > 1 families)."""
        ctrl = request.get(CONTROL_KEY)
        if ctrl == "episode_start":
            reset = getattr(self.policy, "reset", None)
            if callable(reset):
                reset()
            logger.info(
                "episode start (openpi control frame): task %r, episode %s",
                request.get("__task__", ""),
                request.get("__episode_id__", -1),
            )
            return {"__ack__": "episode_start"}
        if ctrl == "episode_end":
            return {"__ack__": "episode_end"}
        return {"__ack__": "ignored"}

    async def _handler(self, ws) -> None:
        import websockets

        addr = ws.remote_address
        logger.info(_logs.SERVER_CONNECTION_FROM.format(addr=addr))
        loop = asyncio.get_running_loop()
        await ws.send(packb(self.metadata))
        # a new client starts a new episode: a policy that keeps observation history forgets it
        reset = getattr(self.policy, "reset", None)
        if callable(reset):
            reset()
        prev_total, bad_in_a_row = None, 0
        while True:
            try:
                frame = await ws.recv()
            except websockets.ConnectionClosed as exc:
                if exc.sent is not None and exc.sent.code == CLOSE_MESSAGE_TOO_BIG:
                    self.errors += 1
                    logger.warning(
                        _logs.SERVER_REQUEST_ERROR.format(
                            addr=addr,
                            error=f"frame over the {self.max_frame_bytes} byte limit, connection closed "
                            f"(1009 {exc.sent.reason}); raise it with --max-frame-mb",
                        )
                    )
                logger.info(_logs.SERVER_CONNECTION_CLOSED.format(addr=addr))
                return
            t0 = time.monotonic()
            out = await loop.run_in_executor(self._executor, self._work, frame, prev_total)
            if isinstance(out, _Failed):
                self.errors += 1
                bad_in_a_row += 1
                logger.warning(
                    _logs.SERVER_REQUEST_ERROR.format(addr=addr, error=out.line),
                    exc_info=(type(out.exc), out.exc, out.exc.__traceback__) if out.exc is not None else None,
                )
                try:
                    await ws.send(out.reply)
                    if bad_in_a_row >= self.max_bad_frames:
                        logger.warning(
                            _logs.SERVER_REQUEST_ERROR.format(
                                addr=addr,
                                error=f"{bad_in_a_row} failed requests in a row, connection closed (1008)",
                            )
                        )
                        await ws.close(CLOSE_POLICY_VIOLATION, f"{bad_in_a_row} failed requests in a row")
                        logger.info(_logs.SERVER_CONNECTION_CLOSED.format(addr=addr))
                        return
                except websockets.ConnectionClosed:
                    logger.info(_logs.SERVER_CONNECTION_CLOSED.format(addr=addr))
                    return
                continue
            bad_in_a_row = 0
            try:
                await ws.send(out)
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
                self._handler,
                self.host,
                self.port,
                compression=None,
                max_size=self.max_frame_bytes,
                process_request=_health_check,
                reuse_address=True,
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

    def __enter__(self) -> HandlerThread:
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

    def __init__(self, policy, host: str = DEFAULT_HOST, port: int = 0, metadata: dict | None = None, **server_options):
        """``server_options``: :class:`PolicyServer`'s ``infer_in_thread``, ``max_frame_bytes``, ``debug``,
        ``statistics``, ``min_chunk``."""
        self.server = PolicyServer(policy, host, port, metadata, **server_options)
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

    def start(self, timeout: float = 10.0) -> ServerThread:
        self._thread.start()
        if not self.server.ready.wait(timeout):
            raise ServerUnavailable(f"policy server thread did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.server.stop()
        self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- client --------------------------------------------------------------------------------------


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
