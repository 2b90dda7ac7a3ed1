"""Fair serving: a well-behaved client's round trip while another client floods bad frames.

The policy server serves the ``zero`` policy with a simulated inference time (``--infer-ms``,
default 5 ms, a sleep in the worker thread as a real model's GPU call would be). A good client
sends the openpi LIBERO observation (two 224x224 images + state + prompt) and waits for each
reply. Measured in the same run, in alternating blocks:

- ``alone``: the good client by itself;
- ``flood``: the same while ``--flooders`` other processes send tiny bad frames (invalid
  msgpack, a map with a wrong key) as fast as they can, reconnecting whenever the server closes
  them (it closes a connection after ``max_bad_frames`` failed requests in a row).

Target: the good client's p99 under flood within 3x its p99 alone. The server's log bytes per
bad frame are reported too (one short line each, no traceback). ``--quick`` runs in about 20 s.
Last line: JSON.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_serving_fairness.py [--quick]
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import statistics
import subprocess
import sys
import time

import numpy as np
from bench_serving import _pct  # the same percentile as the serving benchmark (benchmarks/ is on sys.path)

from tutorial_utils.policies import base as policies
from tutorial_utils.serve.client import PolicyClient
from tutorial_utils.serve.server import ServerThread
from tutorial_utils.serve.wire import packb

TARGET = 3.0
BAD_FRAMES = (b"\xc1", b"\x93\x01\x02", packb({"prompt": 1}), packb({"observation/state": "x" * 64}))


class SlowZero(policies.ZeroPolicy):
    """The zero policy with a fixed inference time (a sleep: the GIL is free, as in a GPU call)."""

    def __init__(self, infer_ms: float):
        super().__init__()
        self.infer_s = infer_ms / 1000.0

    def infer(self, obs):
        time.sleep(self.infer_s)
        return super().infer(obs)


def _obs() -> dict:
    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.normal(size=8).astype(np.float32),
        "prompt": "pick up the black bowl between the plate and the ramekin and place it on the plate",
    }


def flood(port: int, seconds: float) -> None:
    """The flooder (a child process): bad frames as fast as the socket takes them, never
    reading a reply; reconnect when closed. Prints ``{"frames", "connections"}``."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    frames = conns = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            # max_queue=None: the replies are read in the background, so a close is seen at once
            # and the flooder reconnects (the harshest flood: it never waits for an answer)
            with connect(
                f"ws://127.0.0.1:{port}", compression=None, max_size=None, proxy=None, max_queue=None, close_timeout=1
            ) as ws:
                conns += 1
                ws.recv(timeout=5)  # the metadata
                while time.monotonic() < end:
                    ws.send(BAD_FRAMES[frames % len(BAD_FRAMES)])
                    frames += 1
        except (ConnectionClosed, OSError, TimeoutError):
            continue
    print(json.dumps({"frames": frames, "connections": conns}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (about 20 s)")
    ap.add_argument("--requests", type=int, default=None, help="good requests per side (default 150 quick, 1500)")
    ap.add_argument("--infer-ms", type=float, default=5.0, help="simulated inference time per request")
    ap.add_argument("--flooders", type=int, default=1, help="flooding processes during the flood blocks")
    ap.add_argument(
        "--max-bad-frames",
        type=int,
        default=None,
        help="the server's per-connection budget (default: the server's; a huge one shows fairness without it)",
    )
    ap.add_argument("--flood", type=int, default=None, help=argparse.SUPPRESS)  # child mode: the port
    ap.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flood is not None:
        return flood(args.flood, args.seconds)
    n = args.requests or (150 if args.quick else 1500)
    blocks = 3
    per_block = max(1, n // blocks)
    obs = _obs()

    log = io.StringIO()  # the server's log, to measure what a flood writes
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    serve_log = logging.getLogger("tutorial_utils.serve")
    serve_log.addHandler(handler)
    serve_log.setLevel(logging.INFO)
    serve_log.propagate = False

    lat: dict[str, list[float]] = {"alone": [], "flood": []}
    flooded = {"frames": 0, "connections": 0}
    options = {"max_bad_frames": args.max_bad_frames} if args.max_bad_frames else {}
    with ServerThread(SlowZero(args.infer_ms), **options) as srv:
        client = PolicyClient(port=srv.port, connect_timeout=10)
        for _ in range(10):
            client.infer(obs)
        for _ in range(blocks):
            for _ in range(per_block):
                t0 = time.perf_counter()
                client.infer(obs)
                lat["alone"].append((time.perf_counter() - t0) * 1000)
            alone_s = sum(lat["alone"][-per_block:]) / 1000
            kids = [
                subprocess.Popen(
                    [sys.executable, __file__, "--flood", str(srv.port), "--seconds", f"{alone_s * 1.5 + 2:.1f}"],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(args.flooders)
            ]
            time.sleep(1.0)  # let the flood start
            for _ in range(per_block):
                t0 = time.perf_counter()
                reply = client.infer(obs)
                lat["flood"].append((time.perf_counter() - t0) * 1000)
            assert reply["actions"].shape == (8, 7)
            for k in kids:
                out, _ = k.communicate(timeout=120)
                got = json.loads(out.strip().splitlines()[-1])
                flooded["frames"] += got["frames"]
                flooded["connections"] += got["connections"]
            time.sleep(0.5)  # the server drains what the flooders left in their sockets
        client.close()
        bad_answered = srv.server.errors
    log_bytes = len(log.getvalue().encode())
    tracebacks = log.getvalue().count("Traceback")

    res = {}
    print(
        f"good client: openpi LIBERO request, {args.infer_ms:g} ms inference, {per_block * blocks} requests per side; "
        f"{args.flooders} flooding process(es)"
    )
    print(f"{'side':<8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'mean ms':>8}")
    for side in ("alone", "flood"):
        xs = lat[side]
        res[side] = {
            "p50_ms": round(_pct(xs, 50), 3),
            "p99_ms": round(_pct(xs, 99), 3),
            "max_ms": round(max(xs), 3),
            "mean_ms": round(statistics.fmean(xs), 3),
        }
        r = res[side]
        print(f"{side:<8} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['max_ms']:>8.3f} {r['mean_ms']:>8.3f}")
    ratio = res["flood"]["p99_ms"] / res["alone"]["p99_ms"]
    per_bad = log_bytes / max(1, bad_answered)
    print(
        f"flood: {flooded['frames']} bad frames sent on {flooded['connections']} connections, {bad_answered} answered "
        f"with an error; log {log_bytes} bytes ({per_bad:.0f} per answered bad frame, {tracebacks} tracebacks)"
    )
    print(f"flood p99 / alone p99 = {ratio:.2f} (target <= {TARGET:g})")
    print(
        json.dumps(
            {
                "bench": "serving_fairness",
                "requests_per_side": per_block * blocks,
                "infer_ms": args.infer_ms,
                "flooders": args.flooders,
                "max_bad_frames": srv.server.max_bad_frames,
                "alone_p50_ms": res["alone"]["p50_ms"],
                "alone_p99_ms": res["alone"]["p99_ms"],
                "flood_p50_ms": res["flood"]["p50_ms"],
                "flood_p99_ms": res["flood"]["p99_ms"],
                "flood_max_ms": res["flood"]["max_ms"],
                "p99_ratio_flood_vs_alone": round(ratio, 3),
                "target_p99_ratio": TARGET,
                "meets_target": ratio <= TARGET,
                "flood_frames_sent": flooded["frames"],
                "flood_connections": flooded["connections"],
                "bad_frames_answered": bad_answered,
                "log_bytes": log_bytes,
                "log_bytes_per_bad_frame": round(per_bad, 1),
                "log_tracebacks": tracebacks,
            }
        )
    )


if __name__ == "__main__":
    main()
