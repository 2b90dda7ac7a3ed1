"""Round-trip latency of the policy server against a bare websocket echo.

One request = two 224x224 uint8 images + an 8-D state + a prompt (the openpi LIBERO
observation, ~300 kB of msgpack). Measured in the same run, alternating blocks:

- ``echo``: a websockets server that sends each binary frame straight back; the client sends
  the already-packed bytes (the floor: transport of the same payload, twice);
- ``policy``: ``PolicyClient.infer`` against ``PolicyServer`` serving the
  ``zero`` policy (pack, send, unpack and validate, infer in the worker thread, reply with
  ``server_timing``, unpack).

Target: policy p50 <= 1.3x echo p50. ``--quick`` runs under a minute. Last line: JSON.

    .venv/bin/python benchmarks/bench_serving.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from tutorial_utils.policies import base as policies
from tutorial_utils.serve.client import PolicyClient
from tutorial_utils.serve.server import HandlerThread, ServerThread
from tutorial_utils.serve.wire import packb


def _obs() -> dict:
    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.normal(size=8).astype(np.float32),
        "prompt": "pick up the black bowl between the plate and the ramekin and place it on the plate",
    }


async def _echo(ws):
    async for frame in ws:
        await ws.send(frame)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (< 1 min)")
    ap.add_argument("--requests", type=int, default=None, help="requests per side (default 300 quick, 3000 full)")
    args = ap.parse_args()
    n = args.requests or (300 if args.quick else 3000)
    blocks = 5
    per_block = max(1, n // blocks)
    obs = _obs()
    payload = packb(obs)

    from websockets.sync.client import connect

    lat = {"echo": [], "policy": []}
    wall = {"echo": 0.0, "policy": 0.0}
    with HandlerThread(_echo) as echo, ServerThread(policies.ZeroPolicy()) as srv:
        ews = connect(f"ws://127.0.0.1:{echo.port}", compression=None, max_size=None, proxy=None, legacy=True)
        client = PolicyClient(port=srv.port, connect_timeout=10)
        for _ in range(20):  # warm up both paths
            ews.send(payload)
            ews.recv()
            client.infer(obs)
        for _ in range(blocks):
            t_block = time.perf_counter()
            for _ in range(per_block):
                t0 = time.perf_counter()
                ews.send(payload)
                back = ews.recv()
                lat["echo"].append((time.perf_counter() - t0) * 1000)
            wall["echo"] += time.perf_counter() - t_block
            assert len(back) == len(payload)
            t_block = time.perf_counter()
            for _ in range(per_block):
                t0 = time.perf_counter()
                reply = client.infer(obs)
                lat["policy"].append((time.perf_counter() - t0) * 1000)
            wall["policy"] += time.perf_counter() - t_block
            assert reply["actions"].shape == (8, 7)
        ews.close()
        client.close()

    res = {}
    print(
        f"payload: {len(payload) / 1024:.1f} KiB msgpack (2 x 224x224x3 uint8 + state + prompt), {per_block * blocks} requests per side"
    )
    print(f"{'side':<8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'req/s':>8}")
    for side in ("echo", "policy"):
        xs = lat[side]
        res[side] = {
            "p50_ms": round(_pct(xs, 50), 3),
            "p99_ms": round(_pct(xs, 99), 3),
            "mean_ms": round(statistics.fmean(xs), 3),
            "req_per_s": round(len(xs) / wall[side], 1),
        }
        r = res[side]
        print(f"{side:<8} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['mean_ms']:>8.3f} {r['req_per_s']:>8.1f}")
    ratio = res["policy"]["p50_ms"] / res["echo"]["p50_ms"]
    print(f"policy p50 / echo p50 = {ratio:.2f} (target <= 1.3)")
    out = {
        "bench": "serving",
        "requests_per_side": per_block * blocks,
        "payload_bytes": len(payload),
        "echo_p50_ms": res["echo"]["p50_ms"],
        "echo_p99_ms": res["echo"]["p99_ms"],
        "echo_req_per_s": res["echo"]["req_per_s"],
        "policy_p50_ms": res["policy"]["p50_ms"],
        "policy_p99_ms": res["policy"]["p99_ms"],
        "policy_req_per_s": res["policy"]["req_per_s"],
        "p50_ratio_vs_echo": round(ratio, 3),
        "p99_ratio_vs_echo": round(res["policy"]["p99_ms"] / res["echo"]["p99_ms"], 3),
        "target_p50_ratio": 1.3,
        # judged on the ratio as printed: 1.3002 prints as 1.3 and must not read "1.3, target 1.3, missed"
        "meets_target": round(ratio, 3) <= 1.3,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
