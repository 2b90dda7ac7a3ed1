"""Training throughput of the mini DiT4DiT policy on this machine.

Measures samples/s and the share of step time spent waiting for data when training reads a
LeRobot v2.1 dataset (video decoding in DataLoader workers), against a reference measured in
the same run: the same model trained from frames already in memory (no data loading at all).
The dataset is a synthetic LIBERO-schema one (tutorial_utils.data.synth) written to a temp folder.

    .venv/bin/python benchmarks/bench_train.py [--quick] [--steps N] [--batch-size B]

Prints a table; the last line is a JSON object of the figures. The first ``warmup`` steps of
each row (worker start-up, first video decodes) are left out of the steady-state figures and
reported separately. On a shared machine the numbers move with the other load: compare rows
of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def lerobot_statistics(ds) -> dict:
    """dataset_statistics.json's franka block from the dataset's meta/stats.json (the bench
    does not depend on tutorial_utils.data.stats)."""
    a = ds.stats["action"]
    dim = len(a["min"])
    return {
        "franka": {
            "action": {"min": a["min"], "max": a["max"], "mask": [True] * (dim - 1) + [False]},
            "state": ds.stats["observation.state"],
            "num_trajectories": ds.num_episodes,
            "num_transitions": ds.num_frames,
        }
    }


def run_row(name, source, out: Path, steps: int, batch: int, workers: int, model: dict, warmup: int) -> dict:
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.loop import train

    cfg = TrainConfig.from_overrides(
        {
            **model,
            "output_dir": str(out / name),
            "steps": steps,
            "batch_size": batch,
            "num_workers": workers,
            "log_freq": 1,
            "eval_freq": 0,
            "save_checkpoint": False,
            "progress": False,
            "scheduler_warmup_steps": 2,
        }
    )
    import contextlib
    import io

    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        res = train(cfg, source=source)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    steady = rows[warmup:]
    # each row is one step (log_freq=1): samples/s and wait share of that step
    step_s = np.array([batch / r["samples_per_s"] for r in steady])
    wait_s = np.array([r["data_wait_share"] * batch / r["samples_per_s"] for r in steady])
    first = rows[:warmup]
    first_s = sum(batch / r["samples_per_s"] for r in first)
    return {
        "row": name,
        "workers": workers,
        "batch": batch,
        "steps": steps,
        "samples_per_s": float(batch * len(steady) / step_s.sum()),
        "ms_per_step": float(1000 * step_s.mean()),
        "data_wait_share": float(wait_s.sum() / step_s.sum()),
        "warmup_s": float(first_s),
        "wall_s": wall,
        "params": res.summary["parameters"]["total"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="< 1 minute")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    ap.add_argument("--profile", default="cpu", choices=["ci", "cpu"], help="model size of that profile")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from tutorial_utils.data.format import LeRobotDataset
    from tutorial_utils.data.synth import generate_dataset
    from tutorial_utils.train.data import ArraySource, LeRobotSource, WindowDataset

    steps = args.steps or (15 if args.quick else 60)
    warmup = 3 if args.quick else 5
    model = (
        {"image_size": 64, "model_dim": 128, "action_depth": 4}
        if args.profile == "cpu"
        else {"image_size": 32, "model_dim": 32, "num_heads": 2, "action_depth": 1, "language_layers": 0}
    )
    n_eps, length, img = (6, 40, 128) if args.quick else (20, 80, 128)
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        root = generate_dataset(tmp / "ds", n_episodes=n_eps, mean_length=length, image_size=img, n_tasks=4, seed=0)
        gen_s = time.perf_counter() - t0
        ds = LeRobotDataset(root)
        stats = lerobot_statistics(ds)
        src = LeRobotSource(root, stats)
        # the reference: the same windows, decoded up front into memory
        win = WindowDataset(src, np.arange(len(src)), 8, img)
        t0 = time.perf_counter()
        frames = [win[i] for i in range(len(src))]
        decode_s = time.perf_counter() - t0
        mem = ArraySource(
            np.stack([f["primary"] for f in frames]),
            np.stack([f["wrist"] for f in frames]),
            np.stack([f["state"] for f in frames]),
            ds_actions(ds),
            src.frame_episode,
            [f["instruction"] for f in frames],
            stats,
            name="memory",
        )
        rows = [
            run_row("memory (reference)", mem, tmp, steps, args.batch_size, 0, model, warmup),
            run_row("lerobot, 0 workers", src, tmp, steps, args.batch_size, 0, model, warmup),
            run_row("lerobot, 1 worker", src, tmp, steps, args.batch_size, 1, model, warmup),
        ]
        if not args.quick:
            rows.append(run_row("lerobot, 2 workers", src, tmp, steps, args.batch_size, 2, model, warmup))
    ref = rows[0]["samples_per_s"]
    print(
        f"dataset: {n_eps} episodes, {len(src)} frames, {img}x{img} x2 cameras (written in {gen_s:.1f} s; "
        f"sequential decode of all windows {decode_s:.1f} s = {1000 * decode_s / len(src):.1f} ms/frame)"
    )
    print(
        f"model: {args.profile} profile, {rows[0]['params']:,} parameters; batch {args.batch_size}; {steps} steps "
        f"({warmup} warm-up steps left out); torch threads {args.threads}; load average {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} CPUs (shared)"
    )
    print(f"{'row':<22} {'samples/s':>10} {'ms/step':>8} {'data wait':>10} {'vs ref':>7} {'warm-up s':>10}")
    for r in rows:
        r["vs_reference"] = r["samples_per_s"] / ref
        print(
            f"{r['row']:<22} {r['samples_per_s']:>10.1f} {r['ms_per_step']:>8.1f} {100 * r['data_wait_share']:>9.1f}% "
            f"{r['vs_reference']:>7.2f} {r['warmup_s']:>10.2f}"
        )
    best = max(rows[1:], key=lambda r: r["samples_per_s"])
    figures = {
        "profile": args.profile,
        "batch_size": args.batch_size,
        "steps": steps,
        "params": rows[0]["params"],
        "reference_samples_per_s": round(ref, 2),
        **{
            f"{r['row'].split(' (')[0].replace(', ', '_').replace(' ', '_')}_samples_per_s": round(
                r["samples_per_s"], 2
            )
            for r in rows[1:]
        },
        **{
            f"{r['row'].replace(', ', '_').replace(' ', '_')}_data_wait_share": round(r["data_wait_share"], 4)
            for r in rows[1:]
        },
        "best_row": best["row"],
        "best_samples_per_s": round(best["samples_per_s"], 2),
        "best_data_wait_share": round(best["data_wait_share"], 4),
        "best_vs_reference": round(best["vs_reference"], 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(figures))
    return 0


def ds_actions(ds) -> np.ndarray:
    return np.concatenate([ds.episode(i).action for i in range(ds.num_episodes)]).astype(np.float32)


if __name__ == "__main__":
    sys.exit(main())
