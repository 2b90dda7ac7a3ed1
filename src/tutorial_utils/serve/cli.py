"""``python -m tutorial_utils serve``: run a websocket policy server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from tutorial_utils import logs as _logs
from tutorial_utils.errors import TutorialError
from tutorial_utils.serve.protocol import (
    DEFAULT_HOST,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_PORT,
    OPENPI_REPLAN_STEPS,
    PortInUse,
)
from tutorial_utils.serve.server import PolicyServer, configure_logging

logger = logging.getLogger("tutorial_utils.serve")
MIB = 2**20


def _megabytes(text: str) -> float:
    try:
        mb = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB, found {text!r}") from None
    if not mb > 0 or mb * MIB < 1 or mb == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of MiB, found {text!r}")
    return mb


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


def _threads(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of threads, found {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 0 (half the cores) or a positive number of threads, found {n}")
    return n


def _chunk(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of actions, found {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of actions >= 0, found {n}")
    return n


def main(argv: list[str]) -> int:
    from tutorial_utils import policies

    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils serve", description="Serve a policy over the websocket policy protocol."
    )
    ap.add_argument("--policy", default="expert", help=f"policy name ({', '.join(policies.available())})")
    ap.add_argument("--checkpoint", default="", help="checkpoint path for learned policies")
    ap.add_argument(
        "--host", default=DEFAULT_HOST, help="bind address (default 127.0.0.1; 0.0.0.0 exposes it to the network)"
    )
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (0 picks a free one)")
    ap.add_argument(
        "--infer-in-thread",
        action="store_true",
        help="run inference in a worker thread (slow policies: keeps /healthz and pings answered)",
    )
    ap.add_argument(
        "--max-frame-mb",
        type=_megabytes,
        default=DEFAULT_MAX_FRAME_BYTES / MIB,
        help=f"largest request frame in MiB (default {DEFAULT_MAX_FRAME_BYTES / MIB:g}: an openpi LIBERO request, "
        "two 224x224 images + state + prompt, is ~0.3 MB); a bigger frame closes its connection with code 1009",
    )
    ap.add_argument(
        "--debug",
        action="store_true",
        help="send the full traceback in error replies (default: only 'ErrorType: message'; the log has it anyway)",
    )
    ap.add_argument(
        "--threads",
        type=_threads,
        default=0,
        help=f"torch CPU threads of the server process (default 0: half the cores, here {default_threads()}), so "
        "inference keeps its latency while a training or the simulator shares the machine",
    )
    ap.add_argument(
        "--min-chunk",
        type=_chunk,
        default=OPENPI_REPLAN_STEPS,
        help=f"openpi replies hold at least this many actions (default {OPENPI_REPLAN_STEPS}: openpi's LIBERO loop "
        "asserts a chunk of at least its replan_steps); a shorter chunk is padded by repeating its last action, "
        "as the metadata says. 0: send the policy's own chunk",
    )
    args = ap.parse_args(argv)
    configure_logging()
    threads = set_threads(args.threads)
    logger.info(f"torch uses {threads} CPU thread(s) (--threads; this machine has {os.cpu_count()} cores)")
    try:
        policy = policies.make_policy(args.policy, checkpoint=args.checkpoint or None)
    except TutorialError as exc:  # unknown policy, missing or corrupt checkpoint, bad statistics
        logger.error(_logs.SERVER_POLICY_UNAVAILABLE.format(policy=args.policy, reason=exc))
        return 3
    server = PolicyServer(
        policy,
        args.host,
        args.port,
        infer_in_thread=args.infer_in_thread,
        max_frame_bytes=int(args.max_frame_mb * MIB),
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
