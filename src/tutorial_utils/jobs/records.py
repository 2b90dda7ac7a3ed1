"""Run ids, run directories and their status records.

A run is a directory, ``runs/<run_id>`` unless one is named, that describes itself::

    runs/<run_id>/
      params.yaml      the parameters the job ran with (profile included)
      <job>.ipynb      the executed notebook (kept on failure, with the error in it)
      job.log          the cells' output as it ran
      status.json      state, wall time, error, a heartbeat (pid, host, updated); success
                       signs added by the job itself

A run directory is never reused: one that already holds a run is refused. ``status.json`` is
merged under a lock (:func:`update_status`), secrets redacted. While a job runs, a
:class:`Heartbeat` thread refreshes its heartbeat every :data:`HEARTBEAT_S` seconds, so ``job list``
shows a run whose runner is gone (killed, machine rebooted) as ``stale`` instead of ``running``
forever (:func:`run_state`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import secrets as _secrets
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tutorial_utils import paths
from tutorial_utils.errors import DiskFull, is_disk_full
from tutorial_utils.io import atomic_write_text, read_json_or_empty
from tutorial_utils.jobs.process import pid_alive
from tutorial_utils.secrets import redact_data

__all__ = [
    "STATUS_FILE",
    "PARAMS_FILE",
    "STATUS_LOCK",
    "HEARTBEAT_S",
    "WRITE_PROBE_BYTES",
    "STALE_AFTER_S",
    "CLAIMED_ENV",
    "JobError",
    "new_run_id",
    "holds_a_run",
    "ensure_run_dir",
    "claim_run_dir",
    "read_status",
    "update_status",
    "heartbeat_fields",
    "run_state",
    "Heartbeat",
    "params_hash",
    "find_finished",
    "list_runs",
]

STATUS_FILE = "status.json"
PARAMS_FILE = "params.yaml"
STATUS_LOCK = ".status.lock"
#: Seconds between two heartbeats of a running job (``pid``, ``host``, ``updated`` in status.json).
HEARTBEAT_S = 5.0
#: bytes the writability check writes and fsyncs (an empty file would succeed on a full disk)
WRITE_PROBE_BYTES = 64 * 1024
#: A ``running`` job whose heartbeat is older than this (or whose runner process is gone) is ``stale``.
STALE_AFTER_S = 60.0
#: set by the job runner for its kernel: the run directory it claimed, which the notebook's own
#: ``ensure_run_dir(run_dir, ...)`` must accept (it already holds the runner's params.yaml)
CLAIMED_ENV = "TUTORIAL_CLAIMED_RUN_DIR"


class JobError(RuntimeError):
    """A job could not start (bad notebook, parameters or run directory)."""


# --- run ids and directories ------------------------------------------------------------------


def new_run_id(name: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{name}-{_secrets.token_hex(3)}"


def holds_a_run(path: Path) -> list[str]:
    """The run files (``params.yaml``, ``status.json``) already in ``path``."""
    return [f for f in (PARAMS_FILE, STATUS_FILE) if (path / f).exists()]


def ensure_run_dir(run_dir: str | os.PathLike | None, name: str) -> Path:
    """The run directory to use: ``run_dir`` if given, else a fresh ``runs/<run_id>``.

    Fails clearly when the directory cannot be created or written, or when it already holds a
    run (a run is never overwritten, nor merged with another).
    """
    path = Path(run_dir) if run_dir else paths.RUNS / new_run_id(name)
    claimed = os.environ.get(CLAIMED_ENV)
    if claimed and run_dir and path.resolve() == Path(claimed).resolve():
        return path.resolve()  # the job runner claimed it for this notebook
    if held := holds_a_run(path):
        raise JobError(_already_a_run(path, held))
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        try:  # a real write, flushed to disk: an empty file would succeed on a full disk
            with open(probe, "wb") as fh:
                fh.write(b"\0" * WRITE_PROBE_BYTES)
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            with contextlib.suppress(FileNotFoundError):
                probe.unlink()
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(path, "the run directory has no room for a job's notebook and logs") from None
        raise JobError(
            f"run directory {path} is not writable ({exc.strerror or exc}). Pass a writable "
            f"--run-dir, or set TUTORIAL_RUNS_DIR to a folder on a disk you can write to."
        ) from None
    return path.resolve()


def _already_a_run(path: Path, held: list[str]) -> str:
    return (
        f"run directory {path} already holds a run ({', '.join(held)}): a run directory is never reused, so "
        f"the old run is neither overwritten nor mixed with a new one. Pass a new --run-dir, leave it out "
        f"for a fresh runs/<run_id>, or use --reuse to get a finished run with the same parameters."
    )


def claim_run_dir(path: Path) -> None:
    """Create ``params.yaml`` exclusively: of two runners started on one directory, one wins."""
    try:
        fd = os.open(path / PARAMS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise JobError(_already_a_run(path, holds_a_run(path) or [PARAMS_FILE])) from None
    os.close(fd)


# --- status -------------------------------------------------------------------------------------


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run's status.json ({} when it is missing, half-written or not a small JSON object:
    bounded and regular files only, :func:`tutorial_utils.io.read_json_or_empty`)."""
    return read_json_or_empty(Path(run_dir) / STATUS_FILE)


@contextlib.contextmanager
def _status_lock(run_dir: Path) -> Iterator[None]:
    """An exclusive lock around a read-merge-write of status.json: the runner's heartbeat and
    the job's own updates (from the kernel, another process) never lose each other's fields."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / STATUS_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def update_status(run_dir: str | os.PathLike, **fields: Any) -> dict[str, Any]:
    """Merge fields into ``status.json`` (atomically, secrets redacted). Jobs use it to record
    success signs."""
    run_dir = Path(run_dir)
    with _status_lock(run_dir):
        status = read_status(run_dir)
        for k, v in fields.items():
            if isinstance(v, dict) and isinstance(status.get(k), dict):
                status[k] = {**status[k], **v}
            else:
                status[k] = v
        status = redact_data(json.loads(json.dumps(status, default=str)))
        atomic_write_text(run_dir / STATUS_FILE, json.dumps(status, indent=2) + "\n")
    return status


def heartbeat_fields() -> dict[str, Any]:
    """What a running job's heartbeat writes: who runs it and when it was last seen alive."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "updated": _dt.datetime.now().isoformat(timespec="milliseconds"),
    }


def run_state(status: dict[str, Any]) -> str | None:
    """The state to show: ``status["state"]``, except a ``running`` job whose runner process is
    gone (same host) or whose heartbeat is older than :data:`STALE_AFTER_S` is ``stale``."""
    state = status.get("state")
    if state != "running":
        return state
    pid = status.get("pid")
    if status.get("host") == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
        return "stale"
    try:
        updated = _dt.datetime.fromisoformat(str(status["updated"]))
    except (KeyError, ValueError):
        return state
    age = (_dt.datetime.now(updated.tzinfo) - updated).total_seconds()
    return "stale" if age > STALE_AFTER_S else state


# --- heartbeat and finding runs ------------------------------------------------------------------


class Heartbeat:
    """A daemon thread that calls ``beat()`` every ``interval`` seconds until stopped: the one
    heartbeat behind the job runner's status.json and the trainer's ``training`` entry. A failed
    beat (OSError: a full disk) never stops the job; the next one retries."""

    def __init__(self, beat: Callable[[], Any], interval: float | None = None, name: str = "heartbeat"):
        self.beat, self.interval = beat, HEARTBEAT_S if interval is None else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError):
                self.beat()

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def params_hash(job: str, parameters: dict[str, Any]) -> str:
    """The key of a run's job and parameters in its status.json (``params_hash``), which
    :func:`find_finished` matches."""
    blob = json.dumps({"job": job, "parameters": parameters}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def find_finished(job: str, parameters: dict[str, Any], runs_dir: Path | None = None) -> Path | None:
    """The newest successful run of ``job`` with exactly these parameters, if any."""
    want = params_hash(job, parameters)
    root = runs_dir or paths.RUNS
    best = None
    for status_file in root.glob(f"*/{STATUS_FILE}"):
        st = read_status(status_file.parent)
        if st.get("job") == job and st.get("state") == "succeeded" and st.get("params_hash") == want:
            if best is None or st.get("finished", "") > best[0]:
                best = (st.get("finished", ""), status_file.parent)
    return best[1] if best else None


def list_runs(runs_dir: Path | None = None) -> list[dict[str, Any]]:
    """One row per run: id, job, state (``stale`` for a running job whose runner is gone, see
    :func:`run_state`), wall time, profile and the last heartbeat."""
    root = runs_dir or paths.RUNS
    rows = []
    for status_file in sorted(root.glob(f"*/{STATUS_FILE}")):
        st = read_status(status_file.parent)
        rows.append(
            {
                "run_id": status_file.parent.name,
                **{k: st.get(k) for k in ("job", "state", "wall_s", "profile", "updated")},
                "state": run_state(st),
            }
        )
    return rows
