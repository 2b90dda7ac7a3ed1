"""Evaluation throughput: episodes per hour with 2 LIBERO client processes against 1, same episodes.

Runs the evaluation job's chain (``tutorial_utils.evaluate.chain.run_job``: a policy server
process, then the client side) twice on the same (task, trial) episodes of real LIBERO, first
with ``workers=1``, then with ``workers=2`` (``--repeats N``: N pairs, in alternating order), and
times the client side (environment creation, rendering, requests to the server, merge). The policy is ``zero`` by default: stateless and
instant, so the figure is the client's throughput. The two runs must print the same episode log
lines (checked).

Target (issue 16): 2 workers >= 1.7x the episodes/hour of 1 on a 2-core machine. The result
depends on what else runs on the machine: the load average and the cores the job's processes
really got (their CPU seconds over wall seconds) are printed with the figures.
``--quick`` runs in about 2 minutes. Last line: JSON.

    .venv/bin/python benchmarks/bench_eval_workers.py [--quick] [--max-steps N] [--tasks 0-1] [--trials 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from tutorial_utils import logs
from tutorial_utils.evaluate.chain import run_job


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short episodes (about 2 minutes in all)")
    ap.add_argument("--policy", default="zero", help="policy to serve (a stateless one: zero, mini, mlp...)")
    ap.add_argument("--checkpoint", default="", help="checkpoint of a trained policy")
    ap.add_argument("--tasks", default="0-1", help="task_ids (default 0-1)")
    ap.add_argument("--trials", type=int, default=2, help="trials per task (default 2)")
    ap.add_argument("--max-steps", type=int, default=None, help="steps per episode (default 100, quick 30)")
    ap.add_argument(
        "--repeats", type=int, default=1, help="pairs of runs, ordered 1,2 then 2,1 ... (load drifts cancel out)"
    )
    ap.add_argument("--keep", default="", help="keep the run directories under this folder")
    args = ap.parse_args()
    max_steps = args.max_steps or (30 if args.quick else 100)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_eval_workers_"))
    kw = dict(
        policy=args.policy,
        checkpoint=args.checkpoint,
        task_ids=args.tasks,
        trials_per_task=args.trials,
        max_steps=max_steps,
        videos=False,
        server_timeout=120,
        client_timeout=1800,
    )
    rows = {w: {"episodes": 0, "client_s": 0.0, "steps": 0, "cpu_s": 0.0, "wall_s": 0.0} for w in (1, 2)}
    logs_seen: dict[int, list[str]] = {}
    load_before = os.getloadavg()
    try:
        for rep in range(max(1, args.repeats)):
            for workers in (1, 2) if rep % 2 == 0 else (2, 1):
                t0, c0 = time.monotonic(), os.times()
                res = run_job(root / f"rep{rep}_workers{workers}", workers=workers, **kw)
                c1 = os.times()
                r = rows[workers]
                # CPU time of the server, the client and its workers (children the job waited for)
                r["cpu_s"] += (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
                r["wall_s"] += time.monotonic() - t0
                r["cores_used"] = round(r["cpu_s"] / r["wall_s"], 2)
                r["episodes"] += res.results["total_episodes"]
                r["client_s"] = round(r["client_s"] + res.stages["client_s"], 1)
                r["steps"] += sum(e["steps"] for t in res.results["tasks"] for e in t["episodes"])
                r["episodes_per_hour"] = round(r["episodes"] / r["client_s"] * 3600, 1)
                logs_seen.setdefault(workers, logs.documented_eval_lines(res.eval_log))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()
    print(
        f"policy {args.policy}, tasks {args.tasks} x {args.trials} trials, {max_steps} steps per episode, "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(f"{'workers':>7} {'episodes':>8} {'steps':>6} {'client s':>9} {'episodes/h':>11} {'cores used':>10}")
    for w, r in rows.items():
        print(
            f"{w:>7} {r['episodes']:>8} {r['steps']:>6} {r['client_s']:>9.1f} {r['episodes_per_hour']:>11.1f}"
            f" {r['cores_used']:>10.2f}"
        )
    ratio = rows[2]["episodes_per_hour"] / rows[1]["episodes_per_hour"]
    same = logs_seen[1] == logs_seen[2]
    print(f"2 workers / 1 worker = {ratio:.2f}x (target >= 1.7); same episode log lines: {same}")
    print(
        json.dumps(
            {
                "bench": "eval_workers",
                "policy": args.policy,
                "tasks": args.tasks,
                "trials_per_task": args.trials,
                "max_steps": max_steps,
                "cpus": os.cpu_count(),
                "load_before": round(load_before[0], 2),
                "load_after": round(load_after[0], 2),
                "repeats": max(1, args.repeats),
                "episodes": rows[1]["episodes"],
                "workers1_client_s": rows[1]["client_s"],
                "workers2_client_s": rows[2]["client_s"],
                "workers1_episodes_per_hour": rows[1]["episodes_per_hour"],
                "workers2_episodes_per_hour": rows[2]["episodes_per_hour"],
                "workers1_cores_used": rows[1]["cores_used"],
                "workers2_cores_used": rows[2]["cores_used"],
                "ratio_2_vs_1": round(ratio, 3),
                "target_ratio": 1.7,
                "meets_target": ratio >= 1.7,
                "same_log_lines": same,
            }
        )
    )


if __name__ == "__main__":
    main()
