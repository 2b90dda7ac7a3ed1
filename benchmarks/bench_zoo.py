"""Training and inference cost of the model zoo's families on this machine, one CPU thread.

For each family (default: the LeRobot ones, act, diffusion and vqbet, at their CPU defaults,
plus ``mini`` as the reference measured in the same run) it builds the model from its default
config and synthetic statistics, then times training steps (forward + backward + AdamW step, batch
``--batch-size`` of ``synthetic_source`` frames at the family's image size) and ``predict`` on one
observation (one action chunk, as the policy server calls it; without the websocket round trip).

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
import time

#: measurement-only overrides: VQ-BeT's first n_vqvae_training_steps fit only the VQ-VAE on actions
#: (milliseconds, no images); time its GPT phase, what most of its steps cost
MEASURE = {"vqbet": {"n_vqvae_training_steps": 1}}


def measure(name: str, steps: int, batch_size: int, overrides: dict) -> dict:
    import numpy as np
    import torch

    from tutorial_utils import policies
    from tutorial_utils.train.data import WindowDataset, collate, synthetic_source

    t0 = time.perf_counter()
    cfg = policies.family(name).config_class
    size = int(overrides.get("image_size", cfg().image_size))
    # (VQ-BeT: step 0, the warm-up, is its one VQ-VAE step; the timed steps train the GPT)
    src = synthetic_source(n_episodes=4, length=24, image_size=size)
    model = policies.make(name, overrides or None, src.statistics)
    build_s = time.perf_counter() - t0
    ds = WindowDataset(src, np.arange(len(src)), model.action_horizon, model.image_size)
    rng = np.random.default_rng(0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    times = []
    for step in range(steps + 1):  # step 0 is the warm-up (allocations, lazy set-up), not counted
        batch = collate([ds[int(i)] for i in rng.choice(len(src), batch_size)])
        t = time.perf_counter()
        out = model(batch, torch.Generator().manual_seed(step))
        opt.zero_grad(set_to_none=True)
        out["total_loss"].backward()
        opt.step()
        if step:
            times.append(time.perf_counter() - t)
    one = collate([ds[0]])
    model.predict(one, generator=torch.Generator().manual_seed(0))  # warm-up
    lat = []
    for k in range(3):
        t = time.perf_counter()
        model.predict(one, generator=torch.Generator().manual_seed(k))
        lat.append(time.perf_counter() - t)
    counts = model.parameter_counts()
    step_s = float(np.median(times))
    return {
        "family": name,
        "params_m": round(counts["total"] / 1e6, 2),
        "image_size": model.image_size,
        "action_horizon": model.action_horizon,
        "s_per_step": round(step_s, 3),
        "samples_per_s": round(batch_size / step_s, 2),
        "predict_s": round(float(np.median(lat)), 3),
        "build_s": round(build_s, 1),
    }


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
    steps = args.steps or (2 if args.quick else 5)
    names = ["mini"] + [n for n in args.families.split(",") if n and n != "mini"]
    rows = []
    for name in names:
        rows.append(measure(name, steps, args.batch_size, MEASURE.get(name, {})))
        r = rows[-1]
        print(f"measured {name}: {r['s_per_step']} s/step", file=sys.stderr, flush=True)
    ref = rows[0]["s_per_step"]
    cols = ("family", "params_m", "image_size", "action_horizon", "s_per_step", "samples_per_s", "predict_s")
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
