"""LIBERO rendering cost on this machine: control steps/s with both 128x128 cameras for the
``reference`` and ``fast`` render profiles (and headless physics), plus episodes/hour of the
recording job with 1 and 2 workers.

    .venv/bin/python benchmarks/bench_render.py            # ~10 min on 2 cores
    .venv/bin/python benchmarks/bench_render.py --quick    # < 1 min: render profiles only

Prints a table; the last line is a JSON object (ratios against ``reference`` measured in the
same run). ``--out`` also writes it (the book reads logs/record_bench_render.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def steps_per_s(profile: str | None, steps: int, image_size: int = 128) -> dict:
    from tutorial_utils.sim import libero_env as le

    t0 = time.perf_counter()
    env = le.make_env(
        "libero_spatial", 0, image_size=image_size, render_profile=profile or "fast", cameras=profile is not None
    )
    make_s = time.perf_counter() - t0
    try:
        for _ in range(3):
            env.step(le.SETTLE_ACTION)
        t0 = time.perf_counter()
        for i in range(steps):
            a = le.SETTLE_ACTION.copy()
            a[0] = 0.3 if (i // 5) % 2 else -0.3  # move a little so the scene changes
            obs, *_ = env.step(a)
        dt = time.perf_counter() - t0
        images = env.images(obs) if profile is not None else None
    finally:
        env.close()
    return {
        "steps_per_s": steps / dt,
        "ms_per_step": 1000 * dt / steps,
        "make_s": make_s,
        "steps": steps,
        "_images": images,
    }


def episodes_per_hour(workers: int, items: list, image_size: int = 128) -> dict:
    from tutorial_utils.sim import record

    cfg = record.RecordConfig(task_ids=tuple(sorted({t for t, _ in items})), episodes_per_task=1, image_size=image_size)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        # one init state per task (item list given explicitly keeps the work identical for 1 and 2 workers)
        cfg = record.RecordConfig(
            task_ids=cfg.task_ids, episodes_per_task=len(items) // len(cfg.task_ids), image_size=image_size
        )
        s = record.record(os.path.join(tmp, "ds"), cfg, workers=workers, progress=False, log=None)
        wall = time.perf_counter() - t0
    return {
        "episodes": s["episodes"],
        "wall_s": wall,
        "episodes_per_hour": 3600 * s["episodes"] / wall,
        "frames": s["frames"],
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="render profiles only, fewer steps (< 1 min)")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--out", default="", help="also write the JSON here (e.g. logs/record_bench_render.json)")
    ap.add_argument(
        "--png",
        default="",
        help="save the last frames of both profiles side by side (e.g. assets/record_render_profiles.png)",
    )
    args = ap.parse_args(argv)
    steps = args.steps or (15 if args.quick else 40)
    load0 = os.getloadavg()
    res: dict = {"quick": args.quick, "cpus": os.cpu_count(), "image_size": 128}
    res["headless"] = steps_per_s(None, steps * 3)
    res["reference"] = steps_per_s("reference", steps)
    res["fast"] = steps_per_s("fast", steps)
    res["fast_vs_reference"] = res["fast"]["steps_per_s"] / res["reference"]["steps_per_s"]
    ref_img, fast_img = res["reference"].pop("_images"), res["fast"].pop("_images")
    res["headless"].pop("_images")
    if args.png:
        import imageio.v3 as iio
        import numpy as np

        from tutorial_utils.io import atomic_path

        grid = np.concatenate([np.concatenate(ref_img, 1), np.concatenate(fast_img, 1)], 0)  # rows: reference, fast
        with atomic_path(args.png, suffix=".png") as tmp:
            iio.imwrite(tmp, grid, extension=".png")
    if not args.quick:
        items = [(2, 0), (2, 1), (8, 0), (8, 1)]
        res["record_1_worker"] = episodes_per_hour(1, items)
        res["record_2_workers"] = episodes_per_hour(2, items)
        res["record_2_vs_1"] = (
            res["record_2_workers"]["episodes_per_hour"] / res["record_1_worker"]["episodes_per_hour"]
        )
    res["loadavg_before"] = [round(x, 2) for x in load0]
    res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    res["mujoco_gl"] = os.environ.get("MUJOCO_GL")

    print(f"{'what':<28}{'steps/s':>10}{'ms/step':>10}{'make s':>9}")
    for k in ("headless", "reference", "fast"):
        r = res[k]
        print(f"{k:<28}{r['steps_per_s']:>10.2f}{r['ms_per_step']:>10.1f}{r['make_s']:>9.1f}")
    print(f"fast vs reference: {res['fast_vs_reference']:.2f}x")
    if not args.quick:
        for k in ("record_1_worker", "record_2_workers"):
            r = res[k]
            print(
                f"{k:<28} {r['episodes']} episodes in {r['wall_s']:.0f} s: {r['episodes_per_hour']:.0f} episodes/hour"
            )
        print(f"2 workers vs 1: {res['record_2_vs_1']:.2f}x")
    print(f"load average before/after: {res['loadavg_before']} / {res['loadavg_after']} (2 cores shared)")
    flat = {
        "headless_steps_per_s": round(res["headless"]["steps_per_s"], 2),
        "reference_steps_per_s": round(res["reference"]["steps_per_s"], 2),
        "fast_steps_per_s": round(res["fast"]["steps_per_s"], 2),
        "fast_vs_reference": round(res["fast_vs_reference"], 2),
    }
    if not args.quick:
        flat.update(
            record_1_worker_episodes_per_hour=round(res["record_1_worker"]["episodes_per_hour"], 1),
            record_2_workers_episodes_per_hour=round(res["record_2_workers"]["episodes_per_hour"], 1),
            record_2_vs_1=round(res["record_2_vs_1"], 2),
        )
    res["summary"] = flat
    if args.out:
        from tutorial_utils.io import atomic_write_json

        atomic_write_json(args.out, res)
    print(json.dumps(flat))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    raise SystemExit(main(sys.argv[1:]))
