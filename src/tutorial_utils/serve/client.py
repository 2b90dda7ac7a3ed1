"""The synchronous policy client and the health-check helpers."""

from __future__ import annotations

import http
import http.client
import time
from collections.abc import Callable
from typing import Any

from tutorial_utils.serve.protocol import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    HEALTH_PATH,
    ServerDied,
    ServerError,
    ServerUnavailable,
    to_request,
)
from tutorial_utils.serve.wire import packb, unpackb


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


def wait_for_health(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    timeout: float = 60.0,
    interval: float = 0.25,
    alive: Callable[[], bool] | None = None,
) -> float:
    """Poll ``/healthz`` until it answers; returns the seconds waited.

    ``alive`` (e.g. ``lambda: proc.poll() is None``) stops the wait early when the server
    process has exited. Raises :class:`ServerUnavailable` with the reason.
    """
    t0 = time.monotonic()
    while True:
        if check_health(host, port, timeout=min(2.0, timeout)):
            return time.monotonic() - t0
        if alive is not None and not alive():
            raise ServerUnavailable(
                f"the policy server process exited before {host}:{port}{HEALTH_PATH} answered; read its log (server.log)"
            )
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
    frame raises :class:`ServerError` with the server's message (and its traceback when the server
    runs with ``--debug``). Replies and metadata are decoded with
    :func:`tutorial_utils.serve.wire.unpackb`, so a crafted reply raises
    :class:`~tutorial_utils.serve.wire.WireError` instead of building an unsafe array. Replies of
    any size are read (``max_size=None``, as openpi's client).

    ``protocol="dit4dit"`` sends each openpi-keyed observation in upstream DiT4DiT's request shape
    (:func:`tutorial_utils.serve.protocol.build_dit4dit_request`: cameras area-resized to 224 side by
    side, interleaved sin/cos state) and returns the reply as sent (``data.normalized_actions``);
    :meth:`tutorial_utils.serve.dit4dit_profile.ActionStatistics.to_env` turns it into env actions.
    """

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        connect_timeout: float = 60.0,
        retry_interval: float = 0.5,
        recv_timeout: float = 120.0,
        protocol: str = "openpi",
    ):
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
                ws = connect(
                    self.uri,
                    compression=None,
                    max_size=None,
                    proxy=None,
                    legacy=True,
                    open_timeout=max(1.0, min(10.0, timeout)),
                    close_timeout=1.0,
                )
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
                raise ServerDied(
                    f"connected to {self.uri} but the server sent no metadata ({type(exc).__name__}: {exc})"
                ) from None
            if isinstance(first, str):
                ws.close()
                raise ServerError(first)
            try:
                return ws, unpackb(first)
            except Exception:
                ws.close()
                raise
        raise ServerUnavailable(
            f"could not connect to the policy server at {self.uri} within {timeout:.0f} s "
            f"(last error: {type(last).__name__}: {last}). Start it first "
            f"(python -m tutorial_utils serve --port ...), check the port, and read server.log."
        )

    def get_server_metadata(self) -> dict:
        return self.metadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        frame = packb(to_request(obs, self.protocol))
        try:
            self._ws.send(frame)
            reply = self._ws.recv(timeout=self.recv_timeout)
        except TimeoutError:
            raise ServerDied(
                f"the policy server at {self.uri} did not answer within {self.recv_timeout:.0f} s; "
                f"it may be stuck or overloaded (read server.log)"
            ) from None
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == 1009:
                raise ServerDied(
                    f"the policy server at {self.uri} refused the request: {len(frame)} bytes is over its frame "
                    f"limit ({exc.rcvd.reason}). Send smaller images, or start the server with a larger "
                    f"--max-frame-mb (python -m tutorial_utils serve --max-frame-mb ...)."
                ) from None
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

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
