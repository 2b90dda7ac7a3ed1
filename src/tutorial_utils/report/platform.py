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
- :func:`serving`: ``python -m tutorial_utils serve`` on a bundle, for a ``with`` block.

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
