"""The job runner: a job notebook run by papermill into a self-describing run directory.

``run_notebook`` reads a MyST notebook under ``notebooks/jobs/`` with jupytext in memory (no
``.ipynb`` twin needed), checks the parameters against its ``parameters`` cell
(:mod:`tutorial_utils.jobs.parameters`), gives the run an id and a directory
(:mod:`tutorial_utils.jobs.records`) and keeps its status and heartbeat up to date while it runs.

Every file the runner writes is redacted as it is written (:func:`tutorial_utils.secrets.redact`):
papermill saves the executed notebook through a redacting I/O handler, so even a runner killed
mid-cell leaves no token on disk.

CLI: ``python -m tutorial_utils job run notebooks/jobs/X.md -p key value ...``,
``python -m tutorial_utils job list`` and ``python -m tutorial_utils job params``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import paths, profiles
from tutorial_utils.errors import error_text
from tutorial_utils.io import atomic_write_text
from tutorial_utils.jobs.parameters import (
    RUN_DIR_PARAM,
    check_parameter_types,
    cli_parameters,
    declared_parameters,
    default_parameters,
    extra_parameters,
    nullable_parameters,
    read_notebook,
    resolve_notebook,
    write_parameters,
)
from tutorial_utils.jobs.records import (
    CLAIMED_ENV,
    PARAMS_FILE,
    STALE_AFTER_S,
    Heartbeat,
    JobError,
    claim_run_dir,
    ensure_run_dir,
    find_finished,
    heartbeat_fields,
    list_runs,
    params_hash,
    read_status,
    update_status,
)
from tutorial_utils.secrets import redact, redact_data

__all__ = ["JobFailed", "RunResult", "REDACT_SCHEME", "run_notebook"]


class JobFailed(RuntimeError):
    """A job's notebook raised. ``run_dir`` and ``executed`` point at what was kept."""

    def __init__(self, message: str, run_dir: Path, executed: Path, ename: str = "", evalue: str = ""):
        super().__init__(message)
        self.run_dir, self.executed, self.ename, self.evalue = run_dir, executed, ename, evalue


@dataclass
class RunResult:
    """What :func:`run_notebook` returns: the run, its executed notebook, its parameters and wall time
    (``reused``: a finished run with the same parameters, returned instead of running again)."""

    run_id: str
    run_dir: Path
    executed: Path
    parameters: dict[str, Any]
    wall_s: float
    reused: bool = False


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
    claim_run_dir(rd)
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
