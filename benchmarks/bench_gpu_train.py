"""The ``gpu`` profile's training throughput and GPU utilisation, before and after the trainer's
speed settings, on one GPU.

Trains the mini policy at the train job's ``gpu`` sizes (batch 64, 128-pixel images, model_dim
256, 6 DiT blocks) twice, on the same data and model:

- ``before``: the old trainer settings (fp32, 1 loader worker, no pinned memory, no compile);
- ``after``: the new defaults of the ``gpu`` profile (bf16 autocast, loader workers chosen from
  the cores, pinned memory with asynchronous copies, the compiled step).

and by default the row between them, ``bf16+workers`` (everything but the compiled step), so the
share of each change shows (``--rows`` picks others: ``bf16`` alone). A row that fails (for
example a compiler missing on the machine) is reported with its error and the others still run.
Each row's first steps
(worker start-up, compilation) are left out; samples/s, ms/step and the data-wait share come
from the run's own ``metrics.jsonl``, the GPU utilisation from ``nvidia-smi`` sampled every
200 ms over the same steady window. The data is in memory: a synthetic LIBERO-like source with
256-pixel camera frames (the recorded ``expert_256`` datasets' size), resized to 128 in the
loader workers as the real pipeline does after its decoded-video cache is warm; it needs neither
PyAV nor a dataset on disk.

    PYTHONPATH=src python3 benchmarks/bench_gpu_train.py                # on the GPU machine, ~2-3 min
    PYTHONPATH=src python3 benchmarks/bench_gpu_train.py --device cpu --tiny --compile-backend aot_eager

Prints a table; the last line is a JSON object of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: the train job's gpu profile (notebooks/jobs/train.md; tests/test_benchmarks_smoke.py checks them)
GPU_PROFILE = {"batch_size": 64, "image_size": 128, "model_dim": 256, "action_depth": 6, "optimizer_lr": 3e-4}
#: the run this measures against: 400 steps of the gpu profile on an H200 before the speed settings
BASELINE = {"samples_per_s": 1127.0, "gpu_util_pct": 24.0}
#: the rows: the trainer settings each one measures
ROWS = {
    "before": {"precision": "fp32", "num_workers": 1, "pin_memory": False, "torch_compile": False},
    "bf16": {"precision": "bf16", "num_workers": 1, "pin_memory": False, "torch_compile": False},
    "bf16+workers": {"precision": "bf16", "num_workers": None, "pin_memory": None, "torch_compile": False},
    "after": {"precision": "auto", "num_workers": None, "pin_memory": None, "torch_compile": True},
}


class GpuSampler:
    """``nvidia-smi`` utilisation and memory samples with their wall-clock times (none without it)."""

    def __init__(self, interval_ms: int = 200):
        self.samples: list[tuple[float, float, float]] = []  # (time, util %, memory MiB)
        self.proc = None
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return
        self.proc = subprocess.Popen(
            [
                exe,
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
                f"--loop-ms={interval_ms}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            with contextlib.suppress(ValueError, IndexError):
                self.samples.append((time.time(), float(parts[0]), float(parts[1])))

    def window(self, t0: float | None, t1: float | None) -> dict:
        got = [s for s in self.samples if t0 is not None and t1 is not None and t0 <= s[0] <= t1]
        if not got:
            return {"gpu_util_pct": None, "gpu_mem_mib": None, "gpu_samples": 0}
        utils = sorted(s[1] for s in got)
        return {
            "gpu_util_pct": sum(utils) / len(utils),
            "gpu_util_median_pct": utils[len(utils) // 2],
            "gpu_mem_mib": max(s[2] for s in got),
            "gpu_samples": len(got),
        }

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)


def run_row(name: str, source, out: Path, args, sampler: GpuSampler) -> dict:
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.loop import train
    from tutorial_utils.train.speed import steady_throughput

    sizes = TINY if args.tiny else GPU_PROFILE
    steps = args.steps or (12 if args.tiny else (300 if name in ("before", "bf16") else 900))
    warmup = args.warmup or (4 if args.tiny else (100 if ROWS[name]["torch_compile"] else 30))
    cfg = TrainConfig.from_overrides(
        {
            **sizes,
            **ROWS[name],
            "compile_backend": args.compile_backend,
            "device": args.device,
            "output_dir": str(out / name),
            "steps": steps,
            "log_freq": 1 if args.tiny else 10,
            "eval_freq": 0,
            "val_fraction": 0.0,  # no validation: its other batch shapes would recompile the compiled step
            "save_checkpoint": False,
            "progress": False,
            "system_metrics": False,
            "scheduler_warmup_steps": 10,
            "seed": 42,
        }
    )
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        res = train(cfg, source=source)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    got = steady_throughput(rows, cfg.batch_size * cfg.grad_accum_steps, warmup)
    return {
        "row": name,
        **res.summary["resolved"],
        "batch": cfg.batch_size,
        "steps": steps,
        "warmup_steps": warmup,
        "samples_per_s": got["samples_per_s"],
        "ms_per_step": got["ms_per_step"],
        "data_wait_share": got["data_wait_share"],
        "warmup_s": got["warmup_s"],
        "wall_s": wall,
        **sampler.window(*got["window"]),
        "params": res.summary["parameters"]["total"],
    }


#: --tiny: the same rows at smoke-test sizes (checks the script end to end on a CPU)
TINY = {"batch_size": 4, "image_size": 32, "model_dim": 32, "num_heads": 2, "action_depth": 1, "language_layers": 0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu", "auto"])
    ap.add_argument("--rows", default="before,bf16+workers,after", help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--steps", type=int, default=None, help="steps per row (default: 300 before, 900 after)")
    ap.add_argument("--warmup", type=int, default=None, help="steps left out per row (default: 30, 100 compiled)")
    ap.add_argument("--episodes", type=int, default=None, help="episodes of 100 frames in memory (default 24)")
    ap.add_argument("--frame-size", type=int, default=None, help="camera frame size in memory (default 256)")
    ap.add_argument("--compile-backend", default="inductor", choices=["inductor", "aot_eager"])
    ap.add_argument("--tiny", action="store_true", help="smoke-test sizes (with --device cpu: a check of the script)")
    args = ap.parse_args(argv)
    names = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in names if r not in ROWS]
    if unknown:
        ap.error(f"--rows: unknown {unknown}; use {', '.join(ROWS)}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "error: --device cuda but torch sees no CUDA device; pass --device cpu --tiny for a check", file=sys.stderr
        )
        return 2
    from tutorial_utils.train.data import synthetic_source
    from tutorial_utils.train.speed import auto_workers, usable_cores

    episodes = args.episodes or (3 if args.tiny else 24)
    frame = args.frame_size or (64 if args.tiny else 256)
    t0 = time.perf_counter()
    source = synthetic_source(n_episodes=episodes, length=20 if args.tiny else 100, image_size=frame, n_tasks=4)
    gen_s = time.perf_counter() - t0
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() and args.device != "cpu" else "none"
    sampler = GpuSampler()
    rows: list[dict] = []
    failed: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench_gpu_train_") as tmp:
            for name in names:
                try:
                    r = run_row(name, source, Path(tmp), args, sampler)
                except Exception as exc:  # one failed row (a missing compiler...) must not lose the others
                    import traceback

                    traceback.print_exc()
                    failed.append({"row": name, "error": f"{type(exc).__name__}: {str(exc)[:800]}"})
                    print(f"{name}: FAILED {failed[-1]['error']}", file=sys.stderr, flush=True)
                    continue
                rows.append(r)
                print(
                    f"{name}: {r['samples_per_s']:.0f} samples/s, GPU {r['gpu_util_pct']}% ({r['wall_s']:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        sampler.close()
    print(
        f"data: {len(source)} frames in memory, {frame}x{frame} x2 cameras (made in {gen_s:.1f} s); device {args.device} "
        f"({gpu}); torch {torch.__version__}; {usable_cores()} usable cores, auto workers {auto_workers()}"
    )
    print(
        f"model: mini, {rows[0]['params'] if rows else 0:,} parameters; "
        + ", ".join(f"{k}={v}" for k, v in (TINY if args.tiny else GPU_PROFILE).items())
    )
    head = f"{'row':<13} {'prec':>5} {'workers':>7} {'pin':>4} {'compile':>7}"
    print(f"{head} {'samples/s':>10} {'ms/step':>8} {'data wait':>10} {'GPU util':>9} {'GPU MiB':>8} {'warm-up s':>10}")
    for r in rows:
        util = "-" if r["gpu_util_pct"] is None else f"{r['gpu_util_pct']:.0f}%"
        mem = "-" if r["gpu_mem_mib"] is None else f"{r['gpu_mem_mib']:.0f}"
        print(
            f"{r['row']:<13} {r['precision']:>5} {r['num_workers']:>7} {'yes' if r['pin_memory'] else 'no':>4} "
            f"{'yes' if r['compile'] else 'no':>7} {r['samples_per_s']:>10.0f} {r['ms_per_step']:>8.1f} "
            f"{100 * r['data_wait_share']:>9.1f}% {util:>9} {mem:>8} {r['warmup_s']:>10.1f}"
        )
    by = {r["row"]: r for r in rows}
    after, before = by.get("after"), by.get("before")
    figures = {
        "bench": "gpu_train",
        "device": args.device,
        "gpu": gpu,
        "torch": torch.__version__,
        "tiny": args.tiny,
        "sizes": TINY if args.tiny else GPU_PROFILE,
        "baseline": BASELINE,
        "rows": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
        "failed": failed,
    }
    if after and before:
        figures["speedup"] = round(after["samples_per_s"] / before["samples_per_s"], 3)
    if after:
        figures["after_vs_baseline"] = round(after["samples_per_s"] / BASELINE["samples_per_s"], 3)
        util = after["gpu_util_pct"]
        figures["target_met"] = bool(
            after["samples_per_s"] >= 3 * BASELINE["samples_per_s"] or (util is not None and util >= 70)
        )
    for f in failed:
        print(f"{f['row']:<13} FAILED: {f['error'][:200]}")
    print(json.dumps(figures))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
