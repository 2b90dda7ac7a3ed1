"""Training throughput of the mini DiT4DiT policy per trainer setting on this machine.

Measures samples/s and the share of step time spent waiting for data when training reads a
LeRobot v2.1 dataset (video decoding in DataLoader workers), one row per setting of the
trainer's speed parameters (``num_workers``, ``pin_memory``, ``precision``, ``torch_compile``,
``grad_accum_steps``), against a reference measured in the same run: the same model trained
from frames already in memory (no data loading at all). The dataset is a synthetic
LIBERO-schema one (tutorial_utils.data.synth) written to a temp folder.

    .venv/bin/python benchmarks/bench_train.py [--quick] [--steps N] [--batch-size B] [--compile]
    .venv/bin/python benchmarks/bench_train.py --breakdown [--batch-size 32] [--steps 40] [--compile]

Prints a table; the last line is a JSON object of the figures. The first ``warmup`` steps of
each row (worker start-up, compilation, first video decodes) are left out of the steady-state
figures and reported separately. On a shared machine the numbers move with the other load:
compare rows of one run, not runs. ``--compile`` adds the compiled row (minutes of compilation
on a small CPU; on by default with ``--device cuda``).

``--breakdown`` answers where a training step's time goes, with the data already in memory: the
trainer's own set-up (``prepare``: model, fused AdamW, scheduler, EMA) stepped by hand, each phase
timed (forward, backward, gradient norm, optimiser and scheduler, EMA update), the operators'
own CPU time summed by kind (convolutions, group norms, matrix products, attention, optimiser,
the rest) from ``torch.profiler``, and one row per variant of the step measured against the
default (torch's threads) in the same run: 1 or 2 torch threads, channels-last convolutions,
bf16 autocast and, with ``--compile``, the compiled step.
"""

from __future__ import annotations

import argparse
import contextlib
import io
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


def bench_config(model: dict, run_dir: Path, steps: int, batch: int, settings: dict):
    """The TrainConfig of one measured row: ``model`` and ``settings`` on top of a run that logs
    every step and does nothing else (no validation, checkpoints, progress bar or system metrics)."""
    from tutorial_utils.train.config import TrainConfig

    return TrainConfig.from_overrides(
        {
            **model,
            "output_dir": str(run_dir),
            "steps": steps,
            "batch_size": batch,
            "log_freq": 1,
            "eval_freq": 0,
            "val_fraction": 0.0,
            "save_checkpoint": False,
            "progress": False,
            "system_metrics": False,
            "scheduler_warmup_steps": 2,
            **settings,
        }
    )


def run_row(name, source, out: Path, steps: int, batch: int, settings: dict, model: dict, warmup: int) -> dict:
    """Train ``steps`` steps with ``settings`` (TrainConfig overrides) and measure the steady state."""
    from tutorial_utils.train.loop import train
    from tutorial_utils.train.speed import steady_throughput

    run_dir = out / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
    cfg = bench_config(model, run_dir, steps, batch, settings)
    import torch

    before = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            res = train(cfg, source=source)
    finally:
        threads = torch.get_num_threads()
        torch.set_num_threads(before)  # a row's num_threads does not leak into the next row
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_samples = batch * cfg.grad_accum_steps
    got = steady_throughput(rows, step_samples, warmup)
    resolved = res.summary["resolved"]
    return {
        "row": name,
        **{k: resolved[k] for k in ("num_workers", "pin_memory", "precision", "compile", "grad_accum_steps")},
        "threads": threads,
        "batch": batch,
        "steps": steps,
        "samples_per_s": got["samples_per_s"],
        "ms_per_step": got["ms_per_step"],
        "data_wait_share": got["data_wait_share"],
        "warmup_s": got["warmup_s"],
        "wall_s": wall,
        "params": res.summary["parameters"]["total"],
    }


def settings_rows(quick: bool, compile_row: bool, device: str, threads_rows: bool = False) -> list[tuple[str, dict]]:
    """(row name, TrainConfig overrides) of each measured setting on the LeRobot dataset."""
    base = {"device": device, "precision": "fp32", "pin_memory": False, "torch_compile": False}
    rows = [
        ("0 workers", {**base, "num_workers": 0}),
        ("1 worker", {**base, "num_workers": 1}),
        ("auto workers", {**base, "num_workers": None}),
        ("auto workers, pin", {**base, "num_workers": None, "pin_memory": True}),
        ("auto workers, bf16", {**base, "num_workers": None, "precision": "bf16"}),
        ("auto workers, accum 2", {**base, "num_workers": None, "grad_accum_steps": 2}),
    ]
    if threads_rows:  # the training process's torch threads beside one loader worker (the main job's loader)
        rows += [
            (f"1 worker, {n} thread{'s' if n > 1 else ''}", {**base, "num_workers": 1, "num_threads": n})
            for n in (1, 2)
        ]
    if quick:
        rows = [r for r in rows if r[0] != "auto workers, pin"]
    if compile_row:
        rows.append(("auto workers, compile", {**base, "num_workers": None, "torch_compile": True}))
    return rows


#: operator name fragments -> kind, first match wins (torch.profiler's aten names)
OP_KINDS = (
    ("convolution", ("conv", "mkldnn_convolution", "convolution")),
    ("group norm", ("group_norm",)),
    ("attention", ("scaled_dot_product", "attention", "softmax")),
    ("matrix products", ("addmm", "mm", "bmm", "matmul", "linear")),
    ("optimiser", ("_foreach", "adam", "_fused")),
)


def op_kind(name: str) -> str:
    low = name.lower()
    for kind, frags in OP_KINDS:
        if any(f in low for f in frags):
            return kind
    return "other"


def breakdown_row(name, source, out: Path, steps: int, batch: int, model: dict, warmup: int, variant: dict) -> dict:
    """``steps`` optimisation steps of the trainer's own set-up, phase by phase, on in-memory data;
    ``variant``: threads, channels_last, precision, torch_compile."""
    import torch

    from tutorial_utils.train import speed
    from tutorial_utils.train.data import random_shift
    from tutorial_utils.train.loop import _grad_norm
    from tutorial_utils.train.prepare import prepare

    threads = variant.get("threads") or 0
    cfg = bench_config(
        model,
        out / name.replace(" ", "_").replace(",", ""),
        steps,
        batch,
        {
            "num_workers": 0,
            "device": "cpu",
            "ema_decay": 0.999,
            "augment_shift": 4,
            "optimizer_grad_clip_norm": 1.0,
            "num_threads": threads,
            "precision": variant.get("precision", "fp32"),
            "torch_compile": bool(variant.get("torch_compile")),
        },
    )
    before = torch.get_num_threads()
    phases = {"augment": 0.0, "forward": 0.0, "backward": 0.0, "grad norm": 0.0, "optimiser": 0.0, "ema": 0.0}
    kinds: dict[str, float] = {}
    top: dict[str, float] = {}
    first_s = 0.0
    try:
        with contextlib.ExitStack() as held, contextlib.redirect_stdout(io.StringIO()):
            s = prepare(cfg, source, held)
            if variant.get("channels_last"):
                s.model.to(memory_format=torch.channels_last)
            s.model.train()
            it = iter(s.loader)
            batches = [next(it) for _ in range(min(steps, len(s.loader)))]
            prof = None
            for step in range(warmup + steps + 5):  # then five more steps through the profiler, not timed
                b = batches[step % len(batches)]
                gen = torch.Generator().manual_seed(step)
                if step == warmup + steps:
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                    prof.__enter__()
                t = [time.perf_counter()]
                s.optimizer.zero_grad(set_to_none=True)
                b = random_shift(b, cfg.augment_shift, gen)
                t.append(time.perf_counter())
                with speed.autocast("cpu", s.fast.precision):
                    parts = s.model(b, gen)
                t.append(time.perf_counter())
                parts["total_loss"].backward()
                t.append(time.perf_counter())
                float(_grad_norm(cfg, s))
                t.append(time.perf_counter())
                s.optimizer.step()
                s.scheduler.step()
                t.append(time.perf_counter())
                s.ckpt.ema.update(s.model)
                t.append(time.perf_counter())
                if step < warmup:
                    first_s += t[-1] - t[0]
                elif step < warmup + steps:
                    for k, (a, z) in zip(phases, zip(t[:-1], t[1:])):
                        phases[k] += z - a
            prof.__exit__(None, None, None)
            for ev in prof.key_averages():
                ms = ev.self_cpu_time_total / 1e3 / 5
                kind = op_kind(ev.key)
                kinds[kind] = kinds.get(kind, 0.0) + ms
                top[ev.key] = ms
            threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    total = sum(phases.values())
    return {
        "row": name,
        "threads": threads_used,
        "ms_per_step": 1000 * total / steps,
        "samples_per_s": batch * steps / total,
        "phases_ms": {k: 1000 * v / steps for k, v in phases.items()},
        "op_kinds_ms": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "top_ops_ms": dict(sorted(top.items(), key=lambda kv: -kv[1])[:10]),
        "warmup_s": first_s,
    }


def breakdown(args, mem, tmp: Path, steps: int, model: dict, warmup: int) -> list[dict]:
    variants = [
        ("default (torch threads)", {}),
        ("1 thread", {"threads": 1}),
        ("2 threads", {"threads": 2}),
        ("channels-last", {"channels_last": True}),
        ("bf16 autocast", {"precision": "bf16"}),
    ]
    if args.compile:
        variants.append(("compiled", {"torch_compile": True}))
    rows = [breakdown_row(n, mem, tmp, steps, args.batch_size, model, warmup, v) for n, v in variants]
    ref = rows[0]
    phase_names = list(ref["phases_ms"])
    print(f"{'variant':<26} {'thr':>3} {'ms/step':>8} {'vs ref':>7} " + " ".join(f"{p:>10}" for p in phase_names))
    for r in rows:
        r["vs_reference"] = ref["ms_per_step"] / r["ms_per_step"]
        print(
            f"{r['row']:<26} {r['threads']:>3} {r['ms_per_step']:>8.1f} {r['vs_reference']:>7.2f} "
            + " ".join(f"{r['phases_ms'][p]:>10.1f}" for p in phase_names)
        )
    print("operators' own CPU time per step, by kind (ms; profiler, last 5 steps):")
    for r in rows:
        print(f"  {r['row']:<24} " + ", ".join(f"{k} {v:.1f}" for k, v in r["op_kinds_ms"].items()))
    print(f"the ten operators with the most own CPU time, {ref['row']} (ms per step):")
    print("  " + ", ".join(f"{k} {v:.1f}" for k, v in ref["top_ops_ms"].items()))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about a minute: a smaller dataset and fewer steps")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads of the training process (1; --breakdown: torch's)"
    )
    ap.add_argument("--profile", default="cpu", choices=["ci", "cpu"], help="model size of that profile")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--compile", action="store_true", help="add the compiled row (default with --device cuda)")
    ap.add_argument("--thread-rows", action="store_true", help="add rows with 1 and 2 torch threads beside 1 worker")
    ap.add_argument("--breakdown", action="store_true", help="where a step's time goes, and variants of the step")
    args = ap.parse_args(argv)
    import torch

    if args.threads or not args.breakdown:
        torch.set_num_threads(args.threads or 1)
    from tutorial_utils.data.reader import LeRobotDataset
    from tutorial_utils.data.synth import generate_dataset
    from tutorial_utils.policies.base import BATCH_IMAGE, BATCH_STATE, BATCH_TASK, BATCH_WRIST
    from tutorial_utils.train.data import ArraySource, LeRobotSource, WindowDataset
    from tutorial_utils.train.speed import auto_workers

    steps = args.steps or (12 if args.quick else 60)
    warmup = 3 if args.quick else 5
    model = (
        {"image_size": 64, "model_dim": 128, "action_depth": 4}
        if args.profile == "cpu"
        else {"image_size": 32, "model_dim": 32, "num_heads": 2, "action_depth": 1, "language_layers": 0}
    )
    n_eps, length, img = (4, 30, 128) if args.quick else (20, 80, 128)
    compile_row = args.compile or args.device == "cuda"
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
            np.stack([f[BATCH_IMAGE] for f in frames]),
            np.stack([f[BATCH_WRIST] for f in frames]),
            np.stack([f[BATCH_STATE] for f in frames]),
            ds_actions(ds),
            src.frame_episode,
            [f[BATCH_TASK] for f in frames],
            stats,
            name="memory",
        )
        if args.breakdown:
            rows = breakdown(args, mem, tmp, steps, model, warmup)
            print(
                json.dumps(
                    {
                        "bench": "train_breakdown",
                        "profile": args.profile,
                        "batch_size": args.batch_size,
                        "steps": steps,
                        "load_avg_1m": round(os.getloadavg()[0], 2),
                        "rows": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
                    }
                )
            )
            return 0
        ref_settings = {"device": args.device, "precision": "fp32", "num_workers": 0, "pin_memory": False}
        rows = [run_row("memory (reference)", mem, tmp, steps, args.batch_size, ref_settings, model, warmup)]
        for name, settings in settings_rows(args.quick, compile_row, args.device, args.thread_rows):
            rows.append(run_row(f"lerobot, {name}", src, tmp, steps, args.batch_size, settings, model, warmup))
    ref = rows[0]["samples_per_s"]
    print(
        f"dataset: {n_eps} episodes, {len(src)} frames, {img}x{img} x2 cameras (written in {gen_s:.1f} s; "
        f"sequential decode of all windows {decode_s:.1f} s = {1000 * decode_s / len(src):.1f} ms/frame)"
    )
    print(
        f"model: {args.profile} profile, {rows[0]['params']:,} parameters; batch {args.batch_size}; {steps} steps "
        f"({warmup} warm-up steps left out); device {args.device}; torch threads {torch.get_num_threads()}; auto workers "
        f"{auto_workers()}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared)"
    )
    head = f"{'row':<34} {'workers':>7} {'thr':>3} {'pin':>4} {'prec':>5} {'comp':>5} {'accum':>5}"
    print(f"{head} {'samples/s':>10} {'ms/step':>8} {'data wait':>10} {'vs ref':>7} {'warm-up s':>10}")
    for r in rows:
        r["vs_reference"] = r["samples_per_s"] / ref
        print(
            f"{r['row']:<34} {r['num_workers']:>7} {r['threads']:>3} {'yes' if r['pin_memory'] else 'no':>4} {r['precision']:>5} "
            f"{'yes' if r['compile'] else 'no':>5} {r['grad_accum_steps']:>5} {r['samples_per_s']:>10.1f} "
            f"{r['ms_per_step']:>8.1f} {100 * r['data_wait_share']:>9.1f}% {r['vs_reference']:>7.2f} "
            f"{r['warmup_s']:>10.2f}"
        )
    best = max(rows[1:], key=lambda r: r["samples_per_s"])
    figures = {
        "bench": "train",
        "profile": args.profile,
        "device": args.device,
        "batch_size": args.batch_size,
        "steps": steps,
        "params": rows[0]["params"],
        "reference_samples_per_s": round(ref, 2),
        "rows": [
            {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "params"} for r in rows
        ],
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
