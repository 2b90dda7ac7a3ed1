"""Glue for the training-platform chapter (``notebooks/08_training_platform.md``).

The platform itself lives in :mod:`tutorial_utils.runs` (registry, control, checkpoints, export,
compare, health) and :mod:`tutorial_utils.report.monitor`. What a chapter needs on top is a way to
run the book's CLI in a background process while the kernel watches and steers it:

- :func:`start_cli` / :func:`start_training`: ``python -m tutorial_utils ...`` in the background,
  its output in a log file;
- :func:`wait_for_step`: block until a run's heartbeat reaches a step (or say why it never will);
- :func:`finish`: wait for a background process and return its exit code;
- :func:`tampered_copy`: a copy of a bundle with one byte changed, to show ``verify`` catching it;
- :func:`openpi_observation`: one observation of a batch in the openpi LIBERO request keys;
- :func:`serving`: ``python -m tutorial_utils serve`` on a bundle, for a ``with`` block;
- :func:`breakdown_table`, :func:`breakdown_figure`, :func:`speed_findings`: what
  ``benchmarks/bench_train.py`` measured (``--breakdown`` and the loader rows), as a table, a
  figure and sentences with the numbers; :func:`compile_findings`: the same training with and
  without ``torch_compile``, from the two runs' summaries and metrics.

Everything heavy (torch, the policy) runs in the child processes; this module imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tutorial_utils import paths
from tutorial_utils.errors import TutorialError
from tutorial_utils.io import tail_text


class BackgroundError(TutorialError, RuntimeError):
    """A background process ended (or stalled) before it reached what the chapter waits for."""


def _log_tail(log: Path | None, n: int = 15) -> str:
    return tail_text(log, n) if log is not None else "(no log)"


def cli_command(args: list[str]) -> list[str]:
    """``python -m tutorial_utils <args>`` with this interpreter."""
    return [sys.executable, "-m", "tutorial_utils", *map(str, args)]


def start_cli(args: list[str], log: str | os.PathLike) -> subprocess.Popen:
    """Run ``python -m tutorial_utils <args>`` in the background, stdout and stderr into ``log``
    (the file is created; its parent must exist). Returns the process; :func:`finish` waits."""
    log = Path(log)
    if not log.parent.is_dir():
        raise BackgroundError(f"log {log}: its folder {log.parent} does not exist; create it first.")
    fh = open(log, "ab")  # noqa: SIM115 (the child owns it; closed here once it started)
    try:
        proc = subprocess.Popen(
            cli_command(args), stdout=fh, stderr=subprocess.STDOUT, cwd=paths.REPO, start_new_session=True
        )
    finally:
        fh.close()
    proc.log = log  # type: ignore[attr-defined]
    return proc


def overrides(params: Mapping[str, Any]) -> list[str]:
    """``{name: value}`` as the CLI's ``name=value`` words (bools lower-case, lists comma-joined)."""
    out = []
    for k, v in params.items():
        if isinstance(v, bool):
            v = str(v).lower()
        elif isinstance(v, (list, tuple)):
            v = ",".join(map(str, v))
        out.append(f"{k}={v}")
    return out


def start_training(
    run_dir: str | os.PathLike, dataset: str | os.PathLike, log: str | os.PathLike | None = None, **params: Any
) -> subprocess.Popen:
    """Start ``python -m tutorial_utils train --dataset D --output-dir RUN name=value ...`` in the
    background (the progress bar off); its output goes to ``log`` (default ``RUN.out`` beside the
    run, so the run directory holds only what the trainer writes)."""
    run_dir = Path(run_dir)
    log = Path(log) if log else run_dir.parent / f"{run_dir.name}.out"
    args = ["train", "--dataset", os.fspath(dataset), "--output-dir", os.fspath(run_dir)]
    return start_cli(args + overrides({"progress": False, **params}), log)


def current_step(run_dir: str | os.PathLike) -> int | None:
    """The newest step a run reports: the larger of its heartbeat's (``status.json``, refreshed
    every few seconds) and its last ``metrics.jsonl`` row's (every ``log_freq`` steps). A line
    cut short is skipped. None before the run wrote either."""
    import json

    from tutorial_utils.runs.registry import is_run, row
    from tutorial_utils.train.checkpoints import METRICS_FILE

    run_dir = Path(run_dir)
    seen: list[int] = []
    if is_run(run_dir) and isinstance(step := row(run_dir).get("step"), int):
        seen.append(step)
    with contextlib.suppress(OSError):
        for line in reversed((run_dir / METRICS_FILE).read_text(encoding="utf-8", errors="replace").splitlines()):
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                    seen.append(rec["step"])
                    break
    return max(seen) if seen else None


def wait_for_step(
    run_dir: str | os.PathLike, step: int, proc: subprocess.Popen | None = None, timeout: float = 300.0
) -> int:
    """Wait until the run reports ``step`` or more (:func:`current_step`); returns the step seen. A :class:`BackgroundError` when ``proc`` exits first
    (with the end of its log) or after ``timeout`` seconds."""
    run_dir = Path(run_dir)
    t0 = time.monotonic()
    while True:
        now = current_step(run_dir)
        if now is not None and now >= step:
            return now
        if proc is not None and proc.poll() is not None:
            now = current_step(run_dir)
            if now is not None and now >= step:
                return now
            raise BackgroundError(
                f"{run_dir}: the process exited (code {proc.returncode}) at step {now} before step {step}. "
                f"The end of its log ({getattr(proc, 'log', '?')}):\n{_log_tail(getattr(proc, 'log', None))}"
            )
        if time.monotonic() - t0 > timeout:
            raise BackgroundError(
                f"{run_dir}: step {step} not reached within {timeout:.0f} s (at step {now}); a busy machine? Pass a "
                "larger timeout, or fewer steps."
            )
        time.sleep(0.2)


def finish(proc: subprocess.Popen, timeout: float = 300.0) -> int:
    """Wait for a background process; returns its exit code. On timeout it is terminated and a
    :class:`BackgroundError` shows the end of its log."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        raise BackgroundError(
            f"{' '.join(map(str, proc.args))} did not end within {timeout:.0f} s and was terminated. The end of its "
            f"log:\n{_log_tail(getattr(proc, 'log', None))}"
        ) from None


def tampered_copy(bundle: str | os.PathLike, dest: str | os.PathLike, file: str = "model.safetensors") -> Path:
    """Copy ``bundle`` to ``dest`` and change one byte of ``file`` there (the middle byte,
    inverted); returns the changed file. The bundle itself is untouched."""
    src = Path(bundle)
    if not (src / file).is_file():
        raise BackgroundError(f"{src / file} does not exist; name a file of the bundle (see its manifest.json).")
    dest = Path(dest)
    if dest.exists():
        raise BackgroundError(f"{dest} exists already; pass a new folder for the tampered copy.")
    shutil.copytree(src, dest)
    target = dest / file
    data = bytearray(target.read_bytes())
    if not data:
        raise BackgroundError(f"{target} is empty; there is no byte to change.")
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


def openpi_observation(batch: Mapping[str, Any], i: int = 0) -> dict[str, Any]:
    """Item ``i`` of a batch in LeRobot key names (``observation.images.image``...) as an openpi
    LIBERO request (``observation/image``, ``observation/wrist_image``, ``observation/state``,
    ``prompt``), what :class:`tutorial_utils.serve.client.PolicyClient` sends
    (:func:`tutorial_utils.policies.base.batch_to_observation`)."""
    from tutorial_utils.policies.base import ObservationError, batch_to_observation

    try:
        return batch_to_observation(batch, i)
    except ObservationError as exc:
        raise BackgroundError(str(exc)) from None


@contextlib.contextmanager
def serving(
    checkpoint: str | os.PathLike, policy: str, log: str | os.PathLike, port: int | None = None, timeout: float = 120.0
) -> Iterator[tuple[int, subprocess.Popen]]:
    """``python -m tutorial_utils serve --policy POLICY --checkpoint CHECKPOINT`` (a checkpoint
    or an exported bundle) on 127.0.0.1 in the background; yields ``(port, process)`` once
    ``/healthz`` answers, and stops the server (SIGTERM) when the block ends."""
    from tutorial_utils.params import to_argv
    from tutorial_utils.serve.client import wait_for_health
    from tutorial_utils.serve.config import ServeConfig
    from tutorial_utils.serve.server import free_port

    port = port or free_port()
    args = ["serve", *to_argv(ServeConfig(policy=policy, checkpoint=os.fspath(checkpoint), port=port))]
    proc = start_cli(args, log)
    try:
        try:
            wait_for_health(port=port, timeout=timeout, alive=lambda: proc.poll() is None)
        except TutorialError as exc:
            raise BackgroundError(f"{exc}\nThe end of the server's log ({log}):\n{_log_tail(Path(log))}") from None
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


__all__ = [
    "BackgroundError",
    "cli_command",
    "current_step",
    "finish",
    "openpi_observation",
    "overrides",
    "serving",
    "start_cli",
    "start_training",
    "tampered_copy",
    "wait_for_step",
]


# --- where a training step's time goes (benchmarks/bench_train.py) ---------------------------------


def breakdown_table(breakdown: Mapping[str, Any]):
    """One row per variant of the step: threads, ms per step, speed against the default, the
    phases' ms (a ``bench_train.py --breakdown`` JSON)."""
    import pandas as pd

    rows = {}
    for r in breakdown["rows"]:
        rows[r["row"]] = {
            "threads": r["threads"],
            "ms per step": round(r["ms_per_step"], 1),
            "speed vs default": round(r["vs_reference"], 2),
            **{f"{k} ms": round(v, 1) for k, v in r["phases_ms"].items()},
            "first steps s": round(r["warmup_s"], 1),
        }
    return pd.DataFrame(rows).T


def breakdown_figure(breakdown: Mapping[str, Any]):
    """Each variant's step as one bar split into its phases."""
    from tutorial_utils.report.plots import stacked_figure

    return stacked_figure(
        {r["row"]: r["phases_ms"] for r in breakdown["rows"]},
        unit="ms",
        title=f"one training step, batch {breakdown['batch_size']}, data in memory (bench_train.py --breakdown)",
    )


def _row(bench: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((r for r in bench["rows"] if r["row"] == name), None)


def speed_findings(breakdown: Mapping[str, Any], loop: Mapping[str, Any] | None = None) -> list[str]:
    """Sentences with the numbers of the two bench runs: where the default step's time goes, what
    each variant changes, and in the loader rows what one worker and the threads beside it do."""
    ref = breakdown["rows"][0]
    total = ref["ms_per_step"]
    ph = ref["phases_ms"]
    model = ph["forward"] + ph["backward"]
    kinds = ref["op_kinds_ms"]
    named = {k: v for k, v in kinds.items() if k != "other"}
    ops = sum(kinds.values()) or 1.0
    out = [
        f"default step ({ref['threads']} torch threads): {total:.0f} ms; forward and backward "
        f"{100 * model / total:.0f}% of it, augmentation, gradient norm, optimiser and EMA the other "
        f"{100 * (total - model) / total:.0f}%",
        "operators' own time: "
        + ", ".join(f"{k} {100 * v / ops:.0f}%" for k, v in named.items())
        + f", everything else (element-wise, copies, norms of the transformer) {100 * kinds.get('other', 0) / ops:.0f}%",
    ]
    for r in breakdown["rows"][1:]:
        out.append(
            f"{r['row']}: {r['ms_per_step']:.0f} ms per step, {r['vs_reference']:.2f}x the default's speed"
            + (f" after {r['warmup_s']:.0f} s of first steps (compiling)" if r["row"] == "compiled" else "")
        )
    if loop:
        ref_loop = loop["rows"][0]
        for name in ("lerobot, 0 workers", "lerobot, 1 worker"):
            r = _row(loop, name)
            if r:
                out.append(
                    f"real loader, {name.split(', ', 1)[1]} (torch threads {r['threads']}): "
                    f"{r['samples_per_s']:.0f} samples/s, waiting for data {100 * r['data_wait_share']:.0f}% "
                    f"of the step ({r['vs_reference']:.2f}x the in-memory reference's {ref_loop['samples_per_s']:.0f})"
                )
        one, two = _row(loop, "lerobot, 1 worker, 1 thread"), _row(loop, "lerobot, 1 worker, 2 threads")
        if one and two:
            out.append(
                f"beside one loader worker: 1 torch thread {one['samples_per_s']:.0f} samples/s, 2 threads "
                f"{two['samples_per_s']:.0f} ({two['samples_per_s'] / one['samples_per_s']:.2f}x)"
            )
    return out


def compile_findings(
    runs: Mapping[str, tuple[Mapping[str, Any], list[dict]]], warmup_steps: int = 100, project_steps: int = 0
) -> list[str]:
    """``{label: (summary.json, metrics.jsonl rows)}`` of trainings that differ only in
    ``torch_compile`` (the compiled one labelled ``compiled``): each run's wall time, its speed
    after ``warmup_steps`` and its best validation error; and, with ``project_steps``, what the
    measured difference comes to over that many steps (compile time included)."""
    from tutorial_utils.train.speed import steady_throughput

    got = {}
    out = []
    for label, (summary, rows) in runs.items():
        batch = int(summary["batch_size"]) * int(summary.get("grad_accum_steps") or 1)
        steady = steady_throughput(rows, batch, warmup_steps)
        got[label] = steady
        best = summary.get("best") or {}
        out.append(
            f"{label}: {summary['steps_done']} steps x {summary['batch_size']} in {summary['wall_s'] / 60:.1f} min; "
            f"{steady['samples_per_s']:.0f} samples/s after step {warmup_steps} "
            f"(the first {warmup_steps} steps: {steady['warmup_s']:.0f} s); best validation action error "
            f"{best.get('val_action_mae', float('nan')):.3f}"
        )
    if "compiled" in got and len(got) == 2:
        eager = next(v for k, v in got.items() if k != "compiled")
        comp = got["compiled"]
        out.append(
            f"compiled: {comp['samples_per_s'] / eager['samples_per_s']:.2f}x the eager speed after the first steps"
        )
        if project_steps:
            saved = (project_steps - warmup_steps) * (eager["ms_per_step"] - comp["ms_per_step"]) / 1000.0
            saved -= comp["warmup_s"] - eager["warmup_s"]
            out.append(
                f"over {project_steps} steps at these rates the compiled run would "
                f"{'save' if saved >= 0 else 'lose'} about {abs(saved) / 60:.1f} min (its compile included)"
            )
    return out
