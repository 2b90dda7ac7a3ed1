"""Job notebooks run by papermill: run ids, run directories, parameters, status.

A job is a MyST notebook under ``notebooks/jobs/``. ``run_notebook`` reads it with jupytext in
memory (no ``.ipynb`` twin needed), checks the parameters against its ``parameters`` cell,
gives the run an id and a directory under ``runs/``, and leaves the run self-describing::

    runs/<run_id>/
      params.yaml      the parameters the job ran with (profile included)
      <job>.ipynb      the executed notebook (kept on failure, with the error in it)
      job.log          the cells' output as it ran (secrets redacted)
      status.json      state, wall time, error; success signs added by the job itself

CLI: ``python -m tutorial_utils job run notebooks/jobs/X.md -p key value ...`` and
``python -m tutorial_utils job list``.
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import hashlib
import json
import logging
import os
import secrets as _secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import paths, profiles
from tutorial_utils.io import atomic_write_text
from tutorial_utils.secrets import redact

RUN_DIR_PARAM = "run_dir"
STATUS_FILE = "status.json"
PARAMS_FILE = "params.yaml"


class JobError(RuntimeError):
    """A job could not start (bad notebook, parameters or run directory)."""


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


def new_run_id(name: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{name}-{_secrets.token_hex(3)}"


def ensure_run_dir(run_dir: str | os.PathLike | None, name: str) -> Path:
    """The run directory to use: ``run_dir`` if given, else a fresh ``runs/<run_id>``.

    Fails clearly when the directory cannot be created or written.
    """
    path = Path(run_dir) if run_dir else paths.RUNS / new_run_id(name)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise JobError(
            f"run directory {path} is not writable ({exc.strerror or exc}). Pass a writable "
            f"--run-dir, or set TUTORIAL_RUNS_DIR to a folder on a disk you can write to."
        ) from None
    return path.resolve()


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


def params_hash(job: str, parameters: dict[str, Any]) -> str:
    blob = json.dumps({"job": job, "parameters": parameters}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --- status -------------------------------------------------------------------------------------


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    f = Path(run_dir) / STATUS_FILE
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError:
        return {}


def update_status(run_dir: str | os.PathLike, **fields: Any) -> dict[str, Any]:
    """Merge fields into ``status.json`` (atomically). Jobs use it to record success signs."""
    status = read_status(run_dir)
    for k, v in fields.items():
        if isinstance(v, dict) and isinstance(status.get(k), dict):
            status[k] = {**status[k], **v}
        else:
            status[k] = v
    atomic_write_text(Path(run_dir) / STATUS_FILE, redact(json.dumps(status, indent=2, default=str)) + "\n")
    return status


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
    root = runs_dir or paths.RUNS
    rows = []
    for status_file in sorted(root.glob(f"*/{STATUS_FILE}")):
        st = read_status(status_file.parent)
        rows.append(
            {"run_id": status_file.parent.name, **{k: st.get(k) for k in ("job", "state", "wall_s", "profile")}}
        )
    return rows


# --- running --------------------------------------------------------------------------------------


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

    ``parameters`` must be names declared in the notebook's ``parameters`` cell. With
    ``reuse=True`` a finished successful run with the same parameters is returned instead of
    running again. On failure raises :class:`JobFailed` naming the failing cell's error; the
    executed notebook stays in the run directory for inspection.
    """
    import papermill as pm
    import yaml

    nb_path = resolve_notebook(path)
    job = nb_path.stem
    nb = read_notebook(nb_path)
    declared = declared_parameters(nb)
    parameters = dict(parameters or {})
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise JobError(
            f"{nb_path.name}: unknown parameter(s) {', '.join(unknown)}. "
            f"This job's parameters are: {', '.join(declared)}."
        )
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
    run_id = rd.name
    if RUN_DIR_PARAM in declared:
        parameters[RUN_DIR_PARAM] = os.fspath(rd)
    executed = rd / f"{job}.ipynb"
    atomic_write_text(
        rd / PARAMS_FILE,
        yaml.safe_dump(
            {"job": job, "notebook": os.fspath(nb_path), "profile": profile, "parameters": parameters}, sort_keys=False
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
        pid=os.getpid(),
    )

    handler = _RedactingHandler(rd / "job.log", echo)
    pm_logger = logging.getLogger("papermill")
    old_level = pm_logger.level
    pm_logger.addHandler(handler)
    pm_logger.setLevel(logging.INFO)
    try:
        pm.execute_notebook(
            nb,
            os.fspath(executed),
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
    sp = sub.add_parser("params", help="show a job's parameters and their defaults in the active profile")
    sp.add_argument("notebook")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "list":
            for row in list_runs():
                print(f"{row['run_id']:<50} {row['job'] or '?':<20} {row['state'] or '?':<10} {row['wall_s'] or '':>8}")
            return 0
        if args.cmd == "params":
            nb = read_notebook(resolve_notebook(args.notebook))
            for k, v in default_parameters(nb).items():
                print(f"{k} = {v!r}")
            return 0
        params = {k: _parse_value(v) for k, v in args.parameter}
        res = run_notebook(args.notebook, params, args.run_dir, reuse=args.reuse, echo=not args.quiet)
    except (JobError, JobFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    verb = "reused" if res.reused else "finished"
    print(f"job {verb}: {res.run_dir} ({res.wall_s:.1f} s)")
    return 0
