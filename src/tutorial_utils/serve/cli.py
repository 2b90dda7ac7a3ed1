"""``python -m tutorial_utils serve``: run a websocket policy server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from tutorial_utils import logs as _logs
from tutorial_utils.errors import TutorialError
from tutorial_utils.serve.config import ServeConfig
from tutorial_utils.serve.protocol import PortInUse
from tutorial_utils.serve.server import PolicyServer, configure_logging

logger = logging.getLogger("tutorial_utils.serve")


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when set, else half the CPU cores (at least 1): a served policy keeps its latency while a training or a
    simulator uses the other half (a round trip went from 26 ms to 2,253 ms when a training and the
    server each took every core)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:  # the caller chose already
        return int(env)
    return max(1, (os.cpu_count() or 2) // 2)


def set_threads(n: int | None) -> int:
    """``torch.set_num_threads`` for this server process (``None``/0: :func:`default_threads`);
    returns the count torch now uses."""
    import torch

    torch.set_num_threads(int(n) if n else default_threads())
    return torch.get_num_threads()


def main(argv: list[str]) -> int:
    from tutorial_utils import params, policies

    args = params.parse_cli(
        ServeConfig, argv, "python -m tutorial_utils serve", "Serve a policy over the websocket policy protocol."
    )
    if args is None:  # --list-params
        return 0
    configure_logging()
    threads = set_threads(args.threads)
    logger.info(f"torch uses {threads} CPU thread(s) (--threads; this machine has {os.cpu_count()} cores)")
    try:
        ensemble = {} if args.temporal_ensemble_coeff is None else {"temporal_ensemble": args.temporal_ensemble_coeff}
        policy = policies.make_policy(args.policy, checkpoint=args.checkpoint, **ensemble)
    except TutorialError as exc:  # unknown policy, missing or corrupt checkpoint, bad statistics
        logger.error(_logs.SERVER_POLICY_UNAVAILABLE.format(policy=args.policy, reason=exc))
        return 3
    server = PolicyServer(
        policy,
        args.host,
        args.port,
        infer_in_thread=args.infer_in_thread,
        max_frame_bytes=args.max_frame_bytes,
        debug=args.debug,
        min_chunk=args.min_chunk,
    )

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
    if (guard := getattr(server, "guard", None)) is not None:  # clipped values, padded and cut chunks
        logger.info(guard.summary())
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
