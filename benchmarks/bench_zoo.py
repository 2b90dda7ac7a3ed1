"""Training and inference cost of the model zoo's families on this machine, one CPU thread.

For each family (default: the LeRobot ones, act, diffusion and vqbet, at their CPU defaults,
plus ``mini`` as the reference measured in the same run) it builds the model from its default
config and synthetic statistics, then times training steps (forward + backward + AdamW step, batch
``--batch-size`` of ``synthetic_source`` frames at the family's image size) and ``predict`` on one
observation (one action chunk, as the policy server calls it), and the round trip of a request
through a websocket policy server serving the model (p50 of 5, as the LIBERO client sends it).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_zoo.py [--quick] [--families act,diffusion]

Prints a table; the last line is a JSON object of the figures with each family's step time as a
ratio to mini's. The thread count is set to 1 on purpose (set ``--threads``): with torch's default
threading these models ran 2-5x slower on the busy 2-core machine. Compare rows of one run: on a
shared machine the numbers move with the other load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 timed steps per family (about 2 minutes)")
    ap.add_argument("--steps", type=int, default=None, help="timed training steps per family (default 5)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--families", default="act,diffusion,vqbet", help="comma-separated; mini is always added")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from tutorial_utils.experiments import budget, catalog

    steps = args.steps or (2 if args.quick else 5)
    names = ["mini"] + [n for n in args.families.split(",") if n and n != "mini"]
    rows = []
    for name in names:
        rows.append(budget.time_family(name, steps, args.batch_size, catalog.timing_overrides(name), round_trips=True))
        r = rows[-1]
        print(f"measured {name}: {r['s_per_step']} s/step", file=sys.stderr, flush=True)
    ref = rows[0]["s_per_step"]
    cols = (
        "family",
        "params_m",
        "image_size",
        "action_horizon",
        "s_per_step",
        "samples_per_s",
        "predict_s",
        "round_trip_ms_p50",
    )
    print(" | ".join(f"{c:>14}" for c in (*cols, "x_mini")))
    for r in rows:
        r["step_ratio_vs_mini"] = round(r["s_per_step"] / ref, 2)
        print(" | ".join(f"{r[c]!s:>14}" for c in cols) + f" | {r['step_ratio_vs_mini']:>14}")
    figures = {
        "benchmark": "zoo",
        "threads": args.threads,
        "batch_size": args.batch_size,
        "timed_steps": steps,
        "reference": "mini",
        "families": {r["family"]: {k: v for k, v in r.items() if k != "family"} for r in rows},
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
