"""Job notebooks run by papermill: run ids, run directories, parameters, status.

A job is a MyST notebook under ``notebooks/jobs/``. ``run_notebook`` reads it with jupytext in
memory (no ``.ipynb`` twin needed), checks the parameters against its ``parameters`` cell,
gives the run an id and a directory under ``runs/``, and leaves the run self-describing::

    runs/<run_id>/
      params.yaml      the parameters the job ran with (profile included)
      <job>.ipynb      the executed notebook (kept on failure, with the error in it)
      job.log          the cells' output as it ran
      status.json      state, wall time, error, a heartbeat (pid, host, updated); success
                       signs added by the job itself

Every file the runner writes is redacted as it is written (:func:`tutorial_utils.secrets.redact`):
papermill saves the executed notebook through a redacting I/O handler, so even a runner killed
mid-cell leaves no token on disk. Parameters are checked against the types of the
``parameters`` cell's defaults; a ``--run-dir`` that already holds a run is refused. While a job
runs, a thread refreshes the heartbeat every :data:`HEARTBEAT_S` seconds, so ``job list`` shows a
run whose runner is gone (killed, machine rebooted) as ``stale`` instead of ``running`` forever.

CLI: ``python -m tutorial_utils job run notebooks/jobs/X.md -p key value ...`` and
``python -m tutorial_utils job list``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import secrets as _secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import paths, profiles
from tutorial_utils.errors import ConfigError, DiskFull, TutorialError, error_text, is_disk_full
from tutorial_utils.io import atomic_write_text, read_json_or_empty
from tutorial_utils.secrets import redact, redact_data

RUN_DIR_PARAM = "run_dir"
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


class JobParameterError(JobError, ConfigError):
    """A job parameter whose type differs from the type of its default in the ``parameters`` cell."""


class JobFailed(RuntimeError):
    """A job's notebook raised. ``run_dir`` and ``executed`` point at what was kept."""

    def __init__(self, message: str, run_dir: Path, executed: Path, ename: str = "", evalue: str = ""):
        super().__init__(message)
        self.run_dir, self.executed, self.ename, self.evalue = run_dir, executed, ename, evalue


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    executed: Path
    parameters: dict[str, Any]
    wall_s: float
    reused: bool = False


# --- run ids and directories ------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the policy servers, the lab, the upstream server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_process(proc, timeout: float = 10.0) -> int | None:
    """Stop a child process the way Ctrl-C would (SIGINT), then kill it after ``timeout`` seconds;
    returns its exit code (servers and clients of the chains shut down cleanly on SIGINT)."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


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


def _claim_run_dir(path: Path) -> None:
    """Create ``params.yaml`` exclusively: of two runners started on one directory, one wins."""
    try:
        fd = os.open(path / PARAMS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise JobError(_already_a_run(path, holds_a_run(path) or [PARAMS_FILE])) from None
    os.close(fd)


# --- notebooks and their parameters -------------------------------------------------------------


def resolve_notebook(path: str | os.PathLike) -> Path:
    p = Path(path)
    candidates = [p, paths.REPO / p, paths.JOBS / p, paths.JOBS / f"{p}.md"]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    known = sorted(x.relative_to(paths.REPO).as_posix() for x in paths.JOBS.glob("*.md"))
    raise JobError(
        f"job notebook {os.fspath(path)!r} not found (looked in ., {paths.REPO}, {paths.JOBS}). "
        f"Known jobs: {', '.join(known) or 'none yet'}."
    )


def read_notebook(path: Path):
    """The notebook as an nbformat node, from a MyST/percent source (jupytext) or an .ipynb."""
    import jupytext

    return jupytext.read(path)


def parameters_cell(nb) -> tuple[int, str]:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return i, cell.source
    raise JobError("notebook has no code cell tagged `parameters`: add `:tags: [parameters]` to its first code cell")


def declared_parameters(nb) -> list[str]:
    """Names assigned at top level in the ``parameters`` cell, in order."""
    _, src = parameters_cell(nb)
    names: list[str] = []
    for node in ast.parse(src).body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Name) and t.id not in names:
                names.append(t.id)
    return names


def default_parameters(nb, profile: str | None = None) -> dict[str, Any]:
    """Evaluate the ``parameters`` cell (optionally under another profile) and return its values."""
    _, src = parameters_cell(nb)
    old = os.environ.get(profiles.ENV_VAR)
    try:
        if profile is not None:
            os.environ[profiles.ENV_VAR] = profile
        ns: dict[str, Any] = {}
        exec(compile(src, "<parameters>", "exec"), ns)  # the project's own notebook source
    finally:
        if profile is not None:
            if old is None:
                os.environ.pop(profiles.ENV_VAR, None)
            else:
                os.environ[profiles.ENV_VAR] = old
    names = declared_parameters(nb)
    return {k: ns[k] for k in names}


#: the notebook front matter key of a job's extra parameters: ``tutorial_job: {extra_parameters:
#: "module:function"}`` names a function that, given the job's parameters (defaults and overrides
#: merged), returns ``{name: default}`` of the parameters the job takes beyond its ``parameters``
#: cell (the train job: the chosen family's own). A function may carry ``explain(unknown, params)``
#: for the error about a name it does not take.
JOB_METADATA = "tutorial_job"


def extra_parameters(nb, parameters: dict[str, Any], defaults: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``({name: default}, function)`` of the extra parameters ``nb`` declares in its front matter
    for these ``parameters`` (``({}, None)`` for a job without any)."""
    import importlib

    ref = (nb.metadata.get(JOB_METADATA) or {}).get("extra_parameters")
    if not ref:
        return {}, None
    module, _, name = str(ref).partition(":")
    fn = getattr(importlib.import_module(module), name)
    try:
        return dict(fn({**defaults, **parameters})), fn
    except (TutorialError, LookupError, ValueError) as exc:  # an unknown family, a bad value
        raise JobParameterError(f"{exc}") from None


#: the front matter key (under ``tutorial_job``) naming a job's config classes, ``"module:Class"``
#: strings in order: its ``parameters`` cell is generated from them (:func:`generated_parameters`)
CONFIGS_KEY = "configs"


def config_classes(nb) -> list[type]:
    """The config classes ``nb``'s front matter names (``tutorial_job: {configs: [...]}``)."""
    import importlib

    refs = (nb.metadata.get(JOB_METADATA) or {}).get(CONFIGS_KEY) or []
    out = []
    for ref in refs:
        module, _, name = str(ref).partition(":")
        out.append(getattr(importlib.import_module(module), name))
    return out


def nullable_parameters(nb) -> set[str]:
    """The parameters whose config field takes None (``float | None``: "None: ..." in its help),
    even where a profile's default is a number: ``-p train_minutes null`` is a value, not a type error."""
    import dataclasses
    import typing

    out: set[str] = set()
    for cls in config_classes(nb):
        hints = typing.get_type_hints(cls)
        out |= {f.name for f in dataclasses.fields(cls) if type(None) in typing.get_args(hints.get(f.name))}
    return out


def generated_parameters(nb) -> str | None:
    """The ``parameters`` cell ``nb`` should hold: generated from its config classes plus
    ``run_dir = ""`` (None for a notebook that names no config classes)."""
    from tutorial_utils import params

    classes = config_classes(nb)
    if not classes:
        return None
    return params.parameters_cell(*classes, extra=[f'{RUN_DIR_PARAM} = ""'])


def write_parameters(notebooks: list[Path], write: bool) -> list[Path]:
    """The job notebooks whose ``parameters`` cell differs from :func:`generated_parameters`;
    with ``write`` the cell is rewritten in place (the rest of the file kept byte for byte)."""
    stale = []
    for path in notebooks:
        text = path.read_text(encoding="utf-8")
        want = generated_parameters(read_notebook(path))
        if want is None:
            continue
        _, have = parameters_cell(read_notebook(path))
        if have.strip() == want.strip():
            continue
        stale.append(path)
        if write:
            marker = ":tags: [parameters]\n\n"
            i = text.index(marker) + len(marker)
            j = text.index("\n```", i)
            atomic_write_text(path, text[:i] + want + text[j:])
    return stale


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _type_ok(value: Any, default: Any, nullable: bool = False) -> bool:
    """Whether ``value`` may replace ``default``: the same type; an int for a float; anything
    for a ``None`` default ("no override"); ``None`` only where the default is ``None`` or the
    parameter is ``nullable`` (its config field takes None)."""
    if default is None:
        return True
    if value is None:
        return nullable
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def check_parameter_types(
    notebook: str, parameters: dict[str, Any], defaults: dict[str, Any], nullable: set[str] | frozenset = frozenset()
) -> None:
    """Raise :class:`JobParameterError` naming every parameter whose value has the wrong type
    (``nullable``: the parameters that also take None, :func:`nullable_parameters`)."""
    bad = []
    for name, value in parameters.items():
        if name in defaults and not _type_ok(value, defaults[name], name in nullable):
            default = defaults[name]
            want = "int or float" if isinstance(default, float) else _type_name(default)
            bad.append(f"{name}={redact(repr(value))} is {_type_name(value)}, but its default {default!r} is {want}")
    if bad:
        raise JobParameterError(
            f"{notebook}: wrong parameter type(s): {'; '.join(bad)}. Fix: pass a value of the default's type "
            "(a whole number for an int, a number for a float, true/false for a bool, comma-separated items for a "
            "tuple such as 0.9,0.999); only a parameter whose "
            "default is None, or whose help says what None means, takes None."
        )


def cli_parameters(raw: list[tuple[str, str]], defaults: dict[str, Any]) -> dict[str, Any]:
    """``-p NAME VALUE`` pairs as values: YAML (``2``, ``2.5``, ``true``, ``null``, ``[1, 2]``),
    except that a parameter whose default is a string keeps the text as written (``-p task_ids 0``
    is the string ``"0"``), and one whose default is a tuple or list also takes its items
    comma-separated (``-p optimizer_betas 0.9,0.999``)."""

    def value(k: str, v: str) -> Any:
        d = defaults.get(k)
        if isinstance(d, str):
            return v
        if isinstance(d, (list, tuple)) and "," in v and not v.lstrip().startswith("["):
            return _parse_value(f"[{v}]")
        return _parse_value(v)

    return {k: value(k, v) for k, v in raw}


def params_hash(job: str, parameters: dict[str, Any]) -> str:
    blob = json.dumps({"job": job, "parameters": parameters}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: gone all the same
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def run_state(status: dict[str, Any]) -> str | None:
    """The state to show: ``status["state"]``, except a ``running`` job whose runner process is
    gone (same host) or whose heartbeat is older than :data:`STALE_AFTER_S` is ``stale``."""
    state = status.get("state")
    if state != "running":
        return state
    pid = status.get("pid")
    if status.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
        return "stale"
    try:
        updated = _dt.datetime.fromisoformat(str(status["updated"]))
    except (KeyError, ValueError):
        return state
    age = (_dt.datetime.now(updated.tzinfo) - updated).total_seconds()
    return "stale" if age > STALE_AFTER_S else state


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


# --- running --------------------------------------------------------------------------------------


def _papermill_noise(declared) -> logging.Filter:
    """Drop papermill's parameter-inference warnings about parameters this runner already checks
    (:func:`declared_parameters`, :func:`extra_parameters`): papermill's parser reads one ``=`` per
    line, so it cannot read ``x = pick(ci=..., cpu=...)`` and calls the parameter unknown."""
    known = set(declared)

    class _Noise(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            msg = record.getMessage()
            if msg.startswith("Unable to parse line") and "pick(" in msg:
                return False
            return not (msg.startswith("Passed unknown parameter: ") and msg.split(": ", 1)[1].strip() in known)

    return _Noise()


class _RedactingHandler(logging.Handler):
    def __init__(self, log_path: Path, echo: bool):
        super().__init__(logging.INFO)
        self.fh = open(log_path, "a", encoding="utf-8")
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        msg = redact(record.getMessage())
        self.fh.write(msg + ("" if msg.endswith("\n") else "\n"))
        self.fh.flush()
        if self.echo:
            sys.stdout.write(msg + ("" if msg.endswith("\n") else "\n"))
            sys.stdout.flush()

    def close(self) -> None:
        self.fh.close()
        super().close()


def _redact_file(path: Path) -> None:
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        clean = redact(text)
        if clean != text:
            atomic_write_text(path, clean)


#: papermill output paths with this prefix are saved through :class:`_RedactingNotebookIO`.
REDACT_SCHEME = "tutorial-redact:"


class _RedactingNotebookIO:
    """A papermill I/O handler: every save of the executed notebook (papermill saves after each
    cell and during long ones) is redacted before it reaches the disk, and written atomically.
    The on-disk notebook never holds a secret, even when the runner is killed mid-cell."""

    @staticmethod
    def _path(path: str) -> str:
        return path[len(REDACT_SCHEME) :] if path.startswith(REDACT_SCHEME) else path

    def read(self, path: str) -> str:
        return Path(self._path(path)).read_text(encoding="utf-8")

    def write(self, buf: str, path: str) -> None:
        real = self._path(path)
        try:
            nb = json.loads(buf)
        except ValueError:
            text = redact(buf)
        else:
            nb = redact_data(nb)
            meta = nb.get("metadata", {}).get("papermill")
            if isinstance(meta, dict) and isinstance(meta.get("output_path"), str):
                meta["output_path"] = self._path(meta["output_path"])
            text = json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
        atomic_write_text(real, text)

    def listdir(self, path: str) -> list[str]:
        return [os.path.join(self._path(path), x) for x in os.listdir(self._path(path))]

    def pretty_path(self, path: str) -> str:
        return self._path(path)


def _redacting_output(executed: Path) -> str:
    """``executed`` as a papermill output path that saves through :class:`_RedactingNotebookIO`."""
    from papermill.iorw import papermill_io

    target = REDACT_SCHEME + os.fspath(executed)
    if not isinstance(papermill_io.get_handler(target), _RedactingNotebookIO):
        papermill_io.register(REDACT_SCHEME, _RedactingNotebookIO())
    return target


def run_notebook(
    path: str | os.PathLike,
    parameters: dict[str, Any] | None = None,
    run_dir: str | os.PathLike | None = None,
    *,
    reuse: bool = False,
    echo: bool = False,
    kernel_name: str = "python3",
    cwd: str | os.PathLike | None = None,
) -> RunResult:
    """Run a job notebook with papermill and leave a self-describing run directory.

    ``parameters`` must be names declared in the notebook's ``parameters`` cell, with values of
    their defaults' types (:func:`check_parameter_types`). With ``reuse=True`` a finished
    successful run with the same parameters is returned instead of running again. ``run_dir``
    must not hold a run already. On failure raises :class:`JobFailed` naming the failing cell's
    error; the executed notebook stays in the run directory for inspection.
    """
    import papermill as pm
    import yaml

    nb_path = resolve_notebook(path)
    job = nb_path.stem
    nb = read_notebook(nb_path)
    declared = declared_parameters(nb)
    parameters = dict(parameters or {})
    try:
        defaults = default_parameters(nb)
    except Exception:  # a parameters cell that cannot run here: papermill will say so
        defaults = {}
    extras, extras_fn = extra_parameters(nb, parameters, defaults) if set(parameters) - set(declared) else ({}, None)
    unknown = sorted(set(parameters) - set(declared) - set(extras))
    if unknown:
        explain = getattr(extras_fn, "explain", None)
        hint = explain(unknown, {**defaults, **parameters}) if explain else ""
        more = f" With these parameters it also takes: {', '.join(extras)}." if extras else ""
        raise JobError(
            f"{nb_path.name}: unknown parameter(s) {', '.join(unknown)}. "
            f"This job's parameters are: {', '.join(declared)}.{more}" + (f" {hint}." if hint else "")
        )
    check_parameter_types(nb_path.name, parameters, {**extras, **defaults}, nullable_parameters(nb))
    profile = profiles.current()
    key_params = {"profile": profile, **parameters}
    if reuse:
        done = find_finished(job, key_params)
        if done is not None:
            st = read_status(done)
            return RunResult(
                done.name, done, done / f"{job}.ipynb", parameters, float(st.get("wall_s", 0.0)), reused=True
            )

    rd = ensure_run_dir(run_dir, job)
    _claim_run_dir(rd)
    run_id = rd.name
    if RUN_DIR_PARAM in declared:
        parameters[RUN_DIR_PARAM] = os.fspath(rd)
    executed = rd / f"{job}.ipynb"
    atomic_write_text(
        rd / PARAMS_FILE,
        yaml.safe_dump(
            redact_data({"job": job, "notebook": os.fspath(nb_path), "profile": profile, "parameters": parameters}),
            sort_keys=False,
        ),
    )
    started = time.time()
    update_status(
        rd,
        job=job,
        run_id=run_id,
        notebook=os.fspath(nb_path),
        profile=profile,
        parameters=parameters,
        params_hash=params_hash(job, key_params),
        state="running",
        started=_dt.datetime.now().isoformat(timespec="seconds"),
        **heartbeat_fields(),
    )

    handler = _RedactingHandler(rd / "job.log", echo)
    handler.addFilter(_papermill_noise(declared))
    pm_logger = logging.getLogger("papermill")
    old_level = pm_logger.level
    pm_logger.addHandler(handler)
    pm_logger.setLevel(logging.INFO)
    old_claim = os.environ.get(CLAIMED_ENV)
    os.environ[CLAIMED_ENV] = os.fspath(rd)  # inherited by the kernel
    try:
        with Heartbeat(lambda: update_status(rd, **heartbeat_fields()), name="job-heartbeat"):
            pm.execute_notebook(
                nb,
                _redacting_output(executed),
                parameters=parameters,
                kernel_name=kernel_name,
                progress_bar=False,
                log_output=True,
                cwd=os.fspath(cwd or paths.REPO),
            )
    except pm.PapermillExecutionError as exc:
        wall = time.time() - started
        _redact_file(executed)
        error = {"cell": exc.exec_count, "ename": exc.ename, "evalue": redact(str(exc.evalue))}
        update_status(
            rd,
            state="failed",
            wall_s=round(wall, 2),
            error=error,
            finished=_dt.datetime.now().isoformat(timespec="seconds"),
        )
        raise JobFailed(
            f"job {job} failed in cell [{exc.exec_count}]: {exc.ename}: {redact(str(exc.evalue))}\n"
            f"The executed notebook with the traceback is kept at {executed}",
            rd,
            executed,
            exc.ename,
            redact(str(exc.evalue)),
        ) from None
    except BaseException as exc:
        wall = time.time() - started
        _redact_file(executed)
        update_status(
            rd,
            state="failed",
            wall_s=round(wall, 2),
            error={"ename": type(exc).__name__, "evalue": redact(str(exc))},
            finished=_dt.datetime.now().isoformat(timespec="seconds"),
        )
        raise
    finally:
        if old_claim is None:
            os.environ.pop(CLAIMED_ENV, None)
        else:
            os.environ[CLAIMED_ENV] = old_claim
        pm_logger.removeHandler(handler)
        pm_logger.setLevel(old_level)
        handler.close()
    wall = time.time() - started
    _redact_file(executed)
    update_status(
        rd, state="succeeded", wall_s=round(wall, 2), finished=_dt.datetime.now().isoformat(timespec="seconds")
    )
    return RunResult(run_id, rd, executed, parameters, wall)


# --- CLI ----------------------------------------------------------------------------------------


def _parse_value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tutorial_utils job", description="Run job notebooks with papermill.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a job notebook")
    r.add_argument("notebook")
    r.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    r.add_argument("--run-dir", default=None, help="run directory (default: a new one under runs/)")
    r.add_argument(
        "--reuse", action="store_true", help="return a finished run with the same parameters instead of rerunning"
    )
    r.add_argument("--quiet", action="store_true", help="do not echo the cells' output")
    sub.add_parser("list", help="list runs and their state")
    sp = sub.add_parser(
        "params",
        help="show a job's parameters and their defaults in the active profile; --write regenerates the "
        "job notebooks' parameters cells from their config classes, --check fails if one is out of date",
    )
    sp.add_argument("notebook", nargs="?", help="a job notebook (default with --write/--check: every job)")
    mode = sp.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite each stale parameters cell from its config")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each stale parameters cell")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "list":
            rows = list_runs()
            for row in rows:
                print(f"{row['run_id']:<50} {row['job'] or '?':<20} {row['state'] or '?':<10} {row['wall_s'] or '':>8}")
            if any(r["state"] == "stale" for r in rows):
                print(
                    f"stale: the run's process is gone (killed, or the machine restarted) or its heartbeat is older "
                    f"than {STALE_AFTER_S:.0f} s; its outputs are incomplete. Rerun the job into a new run directory."
                )
            return 0
        if args.cmd == "params" and (args.write or args.check):
            targets = [resolve_notebook(args.notebook)] if args.notebook else sorted(paths.JOBS.glob("*.md"))
            stale = write_parameters(targets, write=args.write)
            for p in stale:
                print(f"{'rewrote' if args.write else 'stale'}: {p} (its parameters cell != its config classes)")
            if args.check and stale:
                print("fix: python -m tutorial_utils job params --write", file=sys.stderr)
                return 1
            return 0
        if args.cmd == "params":
            if not args.notebook:
                ap.error("job params: name a notebook (or use --write / --check)")
            nb = read_notebook(resolve_notebook(args.notebook))
            for k, v in default_parameters(nb).items():
                print(f"{k} = {v!r}")
            return 0
        defaults: dict[str, Any] = {}
        if args.parameter:
            with contextlib.suppress(Exception):  # run_notebook reports a notebook it cannot read
                defaults = default_parameters(read_notebook(resolve_notebook(args.notebook)))
        params = cli_parameters(args.parameter, defaults)
        res = run_notebook(args.notebook, params, args.run_dir, reuse=args.reuse, echo=not args.quiet)
    except (JobError, JobFailed) as exc:
        print(error_text(exc), file=sys.stderr)
        return 1
    verb = "reused" if res.reused else "finished"
    print(f"job {verb}: {res.run_dir} ({res.wall_s:.1f} s)")
    return 0
