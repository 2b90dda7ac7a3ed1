"""Overhead of the live monitor: training throughput with system sampling and a polling monitor
on, against the same run with both off.

Trains the same short mini-policy run (the ``ci``-sized model, or ``--profile cpu``, on an
in-memory synthetic dataset) several times, alternating the two settings so that a change in
the machine's load hits both alike:

- ``off``: ``system_metrics=false``, no monitor;
- ``on``:  ``system_metrics=true`` (CPU, RAM, disk, network sampled into every metrics row) and
  a live :func:`tutorial_utils.report.monitor.monitor` polling the run directory every
  ``--interval`` seconds from a thread of the training process itself: the worst case, the
  monitor shares the training process's interpreter and cores (in a notebook it usually lives in
  the kernel while the job trains in another process). As it does whenever its own process
  trains, the monitor draws its figure in a helper process;
- ``here`` (with ``--draw-here``): the same, but the figure drawn by the monitor's thread in the
  training process, as before that helper existed, to show what the helper saves.

Each repeat runs off and on (and here) back to back (the order rotates); the figure is the median
of each repeat's on/off ratio, since on a shared machine the load moves between runs far more than the
monitor costs. Throughput is the loop's own figure (``summary.json``: samples over the summed
step times, so set-up and validation are left out, and a monitor thread that steals time from a
step counts).
The table also gives the direct costs: one system sample, one refresh of the panel's text, one
redraw of its figure, and the overhead they predict. The training uses one torch thread by
default (``--threads``), as ``bench_train.py`` does: with every core busy in torch, any other
load on a shared machine swamps the comparison.

    .venv/bin/python benchmarks/bench_monitor.py [--quick] [--steps N] [--repeats R] [--draw-here]

Prints a table; the last line is a JSON object of the figures (``ratio``: on / off throughput;
the target is an overhead of at most 3%). On a shared machine the numbers move with the other
load: compare the rows of one run, not runs.
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


def run_row(name: str, mode: str, source, out: Path, args, model: dict) -> dict:
    from tutorial_utils.report.monitor import monitor
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.loop import train

    run_dir = out / name
    cfg = TrainConfig.from_overrides(
        {
            **model,
            "output_dir": str(run_dir),
            "steps": args.steps,
            "batch_size": args.batch_size,
            "num_workers": 0,
            "log_freq": args.log_freq,
            "eval_freq": args.eval_freq,
            "save_freq": args.steps,  # one checkpoint, at the end
            "num_threads": args.threads,
            "progress": False,
            "scheduler_warmup_steps": 10,
            "system_metrics": mode != "off",
        }
    )
    mons = []

    def start_monitor(step: int, loss: float) -> None:
        if mode != "off" and step == 1:  # status.json says running from here on
            mons.append(
                monitor(
                    run_dir,
                    interval=args.interval,
                    figure_every=args.figure_every,
                    max_draw_share=args.max_draw_share,
                    draw_in_helper=False if mode == "here" else None,
                )
            )

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        res = train(cfg, source=source, on_step=start_monitor)
    wall = time.perf_counter() - t0
    polls = draws = helper_draws = 0
    for m in mons:
        m.stop()
        helper_draws = m.helper_draws
        polls, draws = m.polls, m.draws
        m.close()
    return {
        "row": name,
        "mode": mode,
        "helper_draws": helper_draws,
        "samples_per_s": float(res.summary["samples_per_s"]),
        "wall_s": wall,
        "polls": polls,
        "draws": draws,
        "params": res.summary["parameters"]["total"],
        "run_dir": run_dir,
    }


def direct_costs(run_dir: Path, n: int = 200) -> dict:
    """Microbenchmarks of the parts: a system sample, a text refresh, a figure redraw."""
    from tutorial_utils.report import monitor as M
    from tutorial_utils.train.sysmetrics import SystemSampler

    s = SystemSampler(run_dir)
    s.sample()
    t0 = time.perf_counter()
    for _ in range(n):
        s.sample()
    sample_us = 1e6 * (time.perf_counter() - t0) / n
    tail = M.MetricsTail(run_dir / M.METRICS)
    t0 = time.perf_counter()
    view = M.read_view(run_dir, tail)
    first_read_ms = 1000 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(20):
        view = M.read_view(run_dir, tail)
        M.progress_html(view), M.system_html(view), M.log_html(view.log)
    refresh_ms = 1000 * (time.perf_counter() - t0) / 20
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        M.figure_png(M.panel_figure(view, fast=True))
        times.append(time.perf_counter() - t0)
    return {
        "sample_us": sample_us,
        "first_read_ms": first_read_ms,
        "rows": len(view.rows),
        "refresh_ms": refresh_ms,
        "figure_ms": 1000 * statistics.median(times),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="< 1 minute")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None, help="repeats of off/on (order rotated)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--log-freq", type=int, default=10, help="the default of TrainConfig")
    ap.add_argument("--eval-freq", type=int, default=200)
    ap.add_argument("--interval", type=float, default=1.0, help="monitor poll interval, s")
    ap.add_argument("--figure-every", type=float, default=10.0, help="monitor figure redraw at most every, s")
    ap.add_argument("--max-draw-share", type=float, default=0.01, help="monitor's cap on time spent drawing")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the training (0: torch's default)")
    ap.add_argument("--profile", default="ci", choices=sorted(MODELS), help="model size of that profile")
    ap.add_argument(
        "--draw-here", action="store_true", help="also run the monitor drawing its figure in the training process"
    )
    args = ap.parse_args(argv)
    args.steps = args.steps or (300 if args.quick else 1500)
    args.repeats = args.repeats or (1 if args.quick else 3)
    import matplotlib

    matplotlib.use("Agg")
    import torch

    from tutorial_utils.train.data import synthetic_source

    source = synthetic_source(n_episodes=20, length=40, image_size=MODELS[args.profile]["image_size"])
    modes = ["off", "on"] + (["here"] if args.draw_here else [])
    rows, repeats = [], []
    with tempfile.TemporaryDirectory(prefix="bench_monitor_") as tmp:
        tmp = Path(tmp)
        # a short warm-up run (first-call costs of torch and matplotlib), not counted
        warm = argparse.Namespace(**{**vars(args), "steps": 20})
        run_row("warm-up", "on", source, tmp, warm, MODELS[args.profile])
        for i in range(args.repeats):
            order = modes[i % len(modes) :] + modes[: i % len(modes)]  # each mode goes first in turn
            got = {m: run_row(f"{m}-{i + 1}", m, source, tmp, args, MODELS[args.profile]) for m in order}
            rows += [got[m] for m in order]
            repeats.append(got)
        costs = direct_costs(next(r["run_dir"] for r in rows if r["mode"] != "off"))
    by_mode = {m: [r["samples_per_s"] for r in rows if r["mode"] == m] for m in modes}
    med = {m: statistics.median(v) for m, v in by_mode.items()}
    # the runs of one repeat ran back to back and see the same load: the median of their ratios is the figure
    ratios = {m: [g[m]["samples_per_s"] / g["off"]["samples_per_s"] for g in repeats] for m in modes[1:]}
    ratio = {m: statistics.median(v) for m, v in ratios.items()}
    step_ms = 1000 * args.batch_size / max(by_mode["off"])  # the quietest run: the costs below weigh most there
    # the overhead the direct costs predict for the monitor in the training process itself: a system
    # sample per log row and a text refresh per poll; drawn here, also the figure (capped at
    # max_draw_share of the time); drawn by the helper, the figure costs this process only the wait
    sample_share = costs["sample_us"] / 1000 / (step_ms * args.log_freq)
    refresh_share = costs["refresh_ms"] / 1000 / args.interval
    draw_share = min(
        args.max_draw_share,
        costs["figure_ms"] / 1000 / max(args.figure_every, costs["figure_ms"] / 1000 / args.max_draw_share),
    )
    estimate = sample_share + refresh_share
    helper = all(r["helper_draws"] > 0 for r in rows if r["mode"] == "on")
    print(
        f"model: {args.profile} profile, {rows[0]['params']:,} parameters; batch {args.batch_size}; {args.steps} "
        f"steps per run; log_freq {args.log_freq}; eval_freq {args.eval_freq}; torch threads "
        f"{args.threads or torch.get_num_threads()}; monitor polls every {args.interval} s, figure at most every "
        f"{args.figure_every} s ({'by a helper process' if helper else 'NOT by a helper process'} in the on runs); "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared)"
    )
    print(f"{'run':<8} {'mode':>5} {'samples/s':>10} {'wall s':>8} {'polls':>6} {'draws':>6}")
    for r in rows:
        print(
            f"{r['row']:<8} {r['mode']:>5} {r['samples_per_s']:>10.1f} {r['wall_s']:>8.1f} {r['polls']:>6} {r['draws']:>6}"
        )
    for m in modes[1:]:
        print(
            f"{m}: median {med[m]:.1f} samples/s against off {med['off']:.1f}; median of the repeats' ratios {m}/off "
            f"{ratio[m]:.3f} ({100 * (1 - ratio[m]):+.1f}% slower; repeats {', '.join(f'{p:.3f}' for p in ratios[m])})"
        )
    print(
        f"predicted from the direct costs below (monitor in the training process): on {100 * estimate:.2f}% slower "
        f"(system sample {100 * sample_share:.2f}%, text refresh {100 * refresh_share:.2f}%); drawn here "
        f"{100 * (estimate + draw_share):.2f}% (figure {100 * draw_share:.2f}%)"
    )
    print(
        f"direct costs: one system sample {costs['sample_us']:.0f} us (= {100 * sample_share:.3f}% "
        f"of the {args.log_freq} steps it covers at {step_ms:.1f} ms/step); panel text refresh {costs['refresh_ms']:.1f} ms "
        f"({costs['rows']} rows; first full read {costs['first_read_ms']:.1f} ms); figure redraw {costs['figure_ms']:.0f} ms"
    )
    figures = {
        "profile": args.profile,
        "steps": args.steps,
        "repeats": args.repeats,
        "batch_size": args.batch_size,
        "log_freq": args.log_freq,
        "params": rows[0]["params"],
        "figure_by_helper": helper,
        "off_samples_per_s": round(med["off"], 2),
        "on_samples_per_s": round(med["on"], 2),
        "off_runs": [round(x, 2) for x in by_mode["off"]],
        "on_runs": [round(x, 2) for x in by_mode["on"]],
        "ratios": [round(p, 4) for p in ratios["on"]],
        "ratio": round(ratio["on"], 4),
        "overhead_pct": round(100 * (1 - ratio["on"]), 2),
        "predicted_overhead_pct": round(100 * estimate, 2),
        "target_overhead_pct": 3.0,
        "sample_us": round(costs["sample_us"], 1),
        "refresh_ms": round(costs["refresh_ms"], 2),
        "figure_ms": round(costs["figure_ms"], 1),
        "ms_per_step_off": round(step_ms, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if "here" in ratio:
        figures.update(
            here_ratios=[round(p, 4) for p in ratios["here"]],
            here_ratio=round(ratio["here"], 4),
            here_overhead_pct=round(100 * (1 - ratio["here"]), 2),
            here_predicted_overhead_pct=round(100 * (estimate + draw_share), 2),
        )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
