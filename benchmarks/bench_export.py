"""The exported bundle against its source checkpoint: load time, inference latency, parity.

Trains a short ``mini``-policy run in this process (the ``cpu`` profile's model size, or the
``ci`` size with ``--quick``, on an in-memory synthetic dataset), or takes ``--checkpoint DIR``,
exports its checkpoint with :func:`tutorial_utils.runs.export.export`, and measures in the same
run, alternating source and bundle so that a change in the machine's load hits both alike:

- load: :func:`tutorial_utils.policies.load` of each, median of ``--loads`` (the first load of
  the session, which pays for imports, is left out);
- inference: ``model.predict`` on the same seeded batch (:func:`~tutorial_utils.runs.export.
  example_batch`, ``--batch`` observations; 1 = one served request), p50 and p90;
- parity: :func:`~tutorial_utils.runs.export.parity`, the largest absolute difference between
  the two models' actions on that batch;
- ``export`` and :func:`~tutorial_utils.runs.export.verify` (re-hash of every file) times.

    .venv/bin/python benchmarks/bench_export.py [--quick] [--checkpoint DIR]

Prints a table; the last line is a JSON object (ratios: bundle / source). A benchmark, not a
test: on a shared machine the numbers move with the other load.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    "ci": {"image_size": 32, "model_dim": 32, "num_heads": 2, "action_depth": 1, "language_layers": 0},
    "cpu": {"image_size": 64, "model_dim": 128, "action_depth": 4},
}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def train_checkpoint(out: Path, args) -> Path:
    """A short run of the mini policy; returns its ``checkpoints/last``."""
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.data import synthetic_source
    from tutorial_utils.train.loop import train

    model = MODELS[args.profile]
    cfg = TrainConfig.from_overrides(
        {
            **model,
            "policy": "mini",
            "output_dir": str(out),
            "steps": args.steps,
            "batch_size": 8,
            "num_workers": 0,
            "log_freq": max(1, args.steps // 5),
            "eval_freq": 0,
            "save_freq": args.steps,
            "num_threads": args.threads,
            "progress": False,
            "system_metrics": False,
        }
    )
    source = synthetic_source(n_episodes=8, length=20, image_size=model["image_size"])
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, source=source)
    return out / "checkpoints" / "last"


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="ci-sized model, few repeats (< 1 minute)")
    ap.add_argument("--checkpoint", default=None, help="a checkpoint directory to export (default: train one)")
    ap.add_argument("--profile", default=None, choices=sorted(MODELS), help="model size (default cpu, quick ci)")
    ap.add_argument("--steps", type=int, default=None, help="training steps of the run (default 30, quick 3)")
    ap.add_argument("--loads", type=int, default=None, help="loads per side (default 10, quick 3)")
    ap.add_argument("--infer", type=int, default=None, help="predictions per side (default 100, quick 10)")
    ap.add_argument("--batch", type=int, default=1, help="observations per prediction (1: one served request)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    args.profile = args.profile or ("ci" if args.quick else "cpu")
    args.steps = args.steps or (3 if args.quick else 30)
    args.loads = args.loads or (3 if args.quick else 10)
    args.infer = args.infer or (10 if args.quick else 100)

    import torch

    from tutorial_utils import policies
    from tutorial_utils.runs import export as ex

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_export_") as tmp:
        tmp = Path(tmp)
        if args.checkpoint:
            src = Path(args.checkpoint)
            origin = f"checkpoint {src}"
        else:
            t0 = time.perf_counter()
            src = train_checkpoint(tmp / "run", args)
            origin = (
                f"a {args.steps}-step mini run at the {args.profile} profile's size ({time.perf_counter() - t0:.1f} s)"
            )
        bundle = tmp / "bundle"
        t0 = time.perf_counter()
        manifest = ex.export(src, bundle)
        export_s = time.perf_counter() - t0
        verify_s = []
        for _ in range(3):
            t0 = time.perf_counter()
            ex.verify(bundle)
            verify_s.append(time.perf_counter() - t0)

        policies.load(src)  # the first load of the session pays for imports: not counted
        load = {"source": [], "bundle": []}
        models = {}
        for i in range(args.loads):
            for side in ("source", "bundle") if i % 2 == 0 else ("bundle", "source"):
                t0 = time.perf_counter()
                models[side] = policies.load(src if side == "source" else bundle)
                load[side].append(time.perf_counter() - t0)

        batch = ex.example_batch(models["source"], n=args.batch, seed=0)
        check = ex.parity(models["source"], models["bundle"], batch, seed=0)
        lat = {"source": [], "bundle": []}
        for side in ("source", "bundle"):  # warm up both
            ex._predict(models[side], batch, 0)
        blocks = 5
        per_block = max(1, args.infer // blocks)
        for b in range(blocks):
            for side in ("source", "bundle") if b % 2 == 0 else ("bundle", "source"):
                for _ in range(per_block):
                    t0 = time.perf_counter()
                    ex._predict(models[side], batch, 0)
                    lat[side].append(1000 * (time.perf_counter() - t0))
        sizes = {"source": _dir_bytes(src.resolve()), "bundle": _dir_bytes(bundle)}
        params = (
            sum(p.numel() for p in models["source"].parameters()) if hasattr(models["source"], "parameters") else None
        )

    res = {
        side: {
            "load_s": statistics.median(load[side]),
            "p50_ms": _pct(lat[side], 50),
            "p90_ms": _pct(lat[side], 90),
            "mb": sizes[side] / 1e6,
        }
        for side in ("source", "bundle")
    }
    print(
        f"source: {origin}; step {manifest['step']}; {params:,} parameters; batch of {args.batch} observation(s); "
        f"{args.loads} loads and {per_block * blocks} predictions per side; torch threads {torch.get_num_threads()}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared)"
    )
    print(f"{'side':<8} {'load s':>8} {'p50 ms':>8} {'p90 ms':>8} {'MB':>8}")
    for side, r in res.items():
        print(f"{side:<8} {r['load_s']:>8.3f} {r['p50_ms']:>8.2f} {r['p90_ms']:>8.2f} {r['mb']:>8.2f}")
    load_ratio = res["bundle"]["load_s"] / res["source"]["load_s"]
    p50_ratio = res["bundle"]["p50_ms"] / res["source"]["p50_ms"]
    print(f"bundle / source: load {load_ratio:.2f}, p50 {p50_ratio:.2f}")
    print(
        f"parity max abs error on actions {check['max_abs_diff']:.3g} (shape {check['shape']}); export "
        f"{export_s:.2f} s (with its own parity check); verify median {statistics.median(verify_s) * 1000:.1f} ms"
    )
    out = {
        "bench": "export",
        "profile": args.profile if not args.checkpoint else None,
        "step": manifest["step"],
        "params": params,
        "batch": args.batch,
        "loads": args.loads,
        "predictions": per_block * blocks,
        "source_load_s": round(res["source"]["load_s"], 4),
        "bundle_load_s": round(res["bundle"]["load_s"], 4),
        "load_ratio": round(load_ratio, 3),
        "source_p50_ms": round(res["source"]["p50_ms"], 3),
        "source_p90_ms": round(res["source"]["p90_ms"], 3),
        "bundle_p50_ms": round(res["bundle"]["p50_ms"], 3),
        "bundle_p90_ms": round(res["bundle"]["p90_ms"], 3),
        "p50_ratio": round(p50_ratio, 3),
        "p90_ratio": round(res["bundle"]["p90_ms"] / res["source"]["p90_ms"], 3),
        "parity_max_abs_diff": check["max_abs_diff"],
        "export_s": round(export_s, 3),
        "verify_s": round(statistics.median(verify_s), 4),
        "source_mb": round(res["source"]["mb"], 2),
        "bundle_mb": round(res["bundle"]["mb"], 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
