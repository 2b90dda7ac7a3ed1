"""Control latency: from ``runs.stop`` (the control file) to the training process exiting with a
loadable checkpoint, against SIGTERM (the signal path) measured in the same run.

Each repeat starts ``python -m tutorial_utils train`` (the ``mini`` policy at the ``cpu``
profile's model size, or the ``ci`` size with ``--quick``) in a subprocess on a small synthetic
LeRobot dataset written once, waits until ``metrics.jsonl`` has ``--warm-rows`` rows, then stops
it. The repeats alternate the two paths so that a change in the machine's load hits both alike:

- ``control``: :func:`tutorial_utils.runs.control.stop` writes ``control.json`` (what the CLI and
  the notebook's button do); the loop reads it at the end of the step, saves and exits;
- ``sigterm``: ``SIGTERM`` to the process (a cluster's pre-emption, ``kill``): the reference.

Measured per repeat: seconds from the command to the process exiting, the step of the last
metrics row when the command was sent, seconds until ``checkpoints/last`` was on disk (``saved``)
and until ``summary.json`` was (``done``: ``train`` returned; the rest is the interpreter's exit),
the step of ``checkpoints/last`` and whether it loads (:func:`tutorial_utils.policies.load`) with
its load time. The latency includes finishing the step
in flight and writing the checkpoint, so it grows with the step time and the model size.

    .venv/bin/python benchmarks/bench_control.py [--quick] [--repeats N]

Prints a table; the last line is a JSON object (``ratio``: control median / sigterm median). A
benchmark, not a test: on a shared machine the numbers move with the other load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    "ci": {"image_size": 32, "model_dim": 32, "num_heads": 2, "action_depth": 1, "language_layers": 0},
    "cpu": {"image_size": 64, "model_dim": 128, "action_depth": 4},
}


def _rows(metrics: Path) -> list[dict]:
    if not metrics.is_file():
        return []
    out = []
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def _median_or_none(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def one(path: str, run_dir: Path, dataset: Path, args, model: dict) -> dict:
    """Start a training subprocess, stop it by ``path`` once it has logged, and measure."""
    from tutorial_utils import policies
    from tutorial_utils.runs import control

    kv = {
        **model,
        "policy": "mini",
        "steps": 1_000_000,
        "batch_size": args.batch_size,
        "num_workers": 0,
        "log_freq": 1,
        "eval_freq": 0,
        "save_freq": 0,  # no periodic checkpoint: the one measured is the stop's
        "num_threads": args.threads,
        "progress": False,
        "system_metrics": False,
    }
    cmd = [sys.executable, "-m", "tutorial_utils", "train", "--dataset", str(dataset), "--output-dir", str(run_dir)]
    cmd += [f"{k}={v}" for k, v in kv.items()]
    log = open(run_dir.parent / f"{run_dir.name}.out", "w")  # noqa: SIM115 - closed below
    t_start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    try:
        while len(_rows(metrics)) < args.warm_rows:
            if proc.poll() is not None:
                log.close()
                tail = (run_dir.parent / f"{run_dir.name}.out").read_text()[-2000:]
                raise SystemExit(f"training exited with {proc.returncode} before logging:\n{tail}")
            if time.perf_counter() - t_start > args.timeout:
                raise SystemExit(f"no {args.warm_rows} metrics rows within {args.timeout} s")
            time.sleep(0.05)
        startup = time.perf_counter() - t_start
        rows = _rows(metrics)
        sent_step = rows[-1]["step"]
        step_ms = (
            1000
            * statistics.median((b["time"] - a["time"]) / max(1, b["step"] - a["step"]) for a, b in zip(rows, rows[1:]))
            if len(rows) > 1 and "time" in rows[0]
            else None
        )
        t_wall = time.time()
        t0 = time.perf_counter()
        if path == "control":
            control.stop(run_dir)
        else:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=args.timeout)
        exit_s = time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    last = run_dir / "checkpoints" / "last"
    state, saved_s = {}, None
    if (last / "training_state.json").is_file():
        state = json.loads((last / "training_state.json").read_text(encoding="utf-8"))
        saved_s = (last / "training_state.json").stat().st_mtime - t_wall  # the checkpoint on disk
    summary = run_dir / "summary.json"  # written last by train(): the rest until exit is the interpreter's
    done_s = summary.stat().st_mtime - t_wall if summary.is_file() else None
    t0 = time.perf_counter()
    try:
        policies.load(last)
        loads, load_err = True, None
    except Exception as exc:  # a benchmark reports it; the tests check it
        loads, load_err = False, f"{type(exc).__name__}: {exc}"
    load_s = time.perf_counter() - t0
    return {
        "path": path,
        "rc": rc,
        "startup_s": startup,
        "sent_at_step": sent_step,
        "checkpoint_step": state.get("step"),
        "reason": state.get("reason"),
        "exit_s": exit_s,
        "saved_s": saved_s,
        "done_s": done_s,
        "loads": loads,
        "load_error": load_err,
        "load_s": load_s,
        "step_ms": step_ms,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="ci-sized model, 1 repeat per path (< 1 minute)")
    ap.add_argument("--repeats", type=int, default=None, help="stops per path (default 5, quick 1)")
    ap.add_argument("--profile", default=None, choices=sorted(MODELS), help="model size (default cpu, quick ci)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--warm-rows", type=int, default=5, help="metrics rows before the stop is sent")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the training (0: torch's default)")
    ap.add_argument("--timeout", type=float, default=300.0, help="s, per wait")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.profile = args.profile or ("ci" if args.quick else "cpu")
    model = MODELS[args.profile]

    import torch  # noqa: F401 - imported before the first load, so that no load pays for it

    from tutorial_utils import policies  # noqa: F401
    from tutorial_utils.train.job import resolve_dataset

    results = []
    with tempfile.TemporaryDirectory(prefix="bench_control_") as tmp:
        tmp = Path(tmp)
        dataset = resolve_dataset("synthetic", tmp)  # written once: 4 episodes, 64x64 images
        for i in range(args.repeats):
            for path in ("control", "sigterm") if i % 2 == 0 else ("sigterm", "control"):
                run_dir = tmp / f"{path}-{i + 1}"
                results.append(one(path, run_dir, dataset, args, model))

    print(
        f"model: mini policy at the {args.profile} profile's size {model}; batch {args.batch_size}; stop sent after "
        f"{args.warm_rows} metrics rows; {args.repeats} stop(s) per path; torch threads {args.threads or 'default'}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared)"
    )
    print(
        f"{'path':<8} {'rc':>4} {'start s':>8} {'sent@':>6} {'ckpt@':>6} {'reason':<14} {'saved s':>7} {'done s':>7} {'exit s':>7} "
        f"{'step ms':>8} {'loads':>6} {'load s':>7}"
    )
    for r in results:
        step_ms = f"{r['step_ms']:.0f}" if r["step_ms"] is not None else "-"
        saved = f"{r['saved_s']:.2f}" if r["saved_s"] is not None else "-"
        done = f"{r['done_s']:.2f}" if r["done_s"] is not None else "-"
        print(
            f"{r['path']:<8} {r['rc']:>4} {r['startup_s']:>8.1f} {r['sent_at_step']:>6} {r['checkpoint_step']!s:>6} "
            f"{r['reason']!s:<14} {saved:>7} {done:>7} {r['exit_s']:>7.2f} {step_ms:>8} {r['loads']!s:>6} {r['load_s']:>7.2f}"
        )
        if r["load_error"]:
            print(f"  checkpoint did not load: {r['load_error']}")
    summary = {}
    for path in ("control", "sigterm"):
        xs = [r["exit_s"] for r in results if r["path"] == path]
        summary[path] = {"median": statistics.median(xs), "max": max(xs)}
        print(f"{path:<8} stop -> exit: median {summary[path]['median']:.2f} s, max {summary[path]['max']:.2f} s")
    ratio = summary["control"]["median"] / summary["sigterm"]["median"]
    print(f"control median / sigterm median = {ratio:.2f}")
    out = {
        "bench": "control",
        "profile": args.profile,
        "repeats": args.repeats,
        "batch_size": args.batch_size,
        "control_exit_s": [round(r["exit_s"], 3) for r in results if r["path"] == "control"],
        "sigterm_exit_s": [round(r["exit_s"], 3) for r in results if r["path"] == "sigterm"],
        "control_median_s": round(summary["control"]["median"], 3),
        "control_max_s": round(summary["control"]["max"], 3),
        "sigterm_median_s": round(summary["sigterm"]["median"], 3),
        "sigterm_max_s": round(summary["sigterm"]["max"], 3),
        "ratio": round(ratio, 3),
        "control_saved_median_s": _median_or_none(r["saved_s"] for r in results if r["path"] == "control"),
        "sigterm_saved_median_s": _median_or_none(r["saved_s"] for r in results if r["path"] == "sigterm"),
        "control_done_median_s": _median_or_none(r["done_s"] for r in results if r["path"] == "control"),
        "sigterm_done_median_s": _median_or_none(r["done_s"] for r in results if r["path"] == "sigterm"),
        "all_loadable": all(r["loads"] for r in results),
        "checkpoint_steps": [r["checkpoint_step"] for r in results],
        "steps_after_command": [
            (r["checkpoint_step"] - r["sent_at_step"]) if r["checkpoint_step"] is not None else None for r in results
        ],
        "median_load_s": round(statistics.median(r["load_s"] for r in results), 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
