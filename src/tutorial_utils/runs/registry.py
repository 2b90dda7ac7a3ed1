"""The run registry: list, show, copy, start and delete runs.

A run's state is read from its files, never from a process table alone::

    running    the job runner's or the training loop's heartbeat in status.json is fresh
    paused     training stopped by a ``pause`` command (``control.json``), resumable
    stopped    training stopped by ``stop``, a signal (SIGTERM, SIGINT, SIGUSR1), resumable
    finished   training reached ``steps`` (or its time limit); a job that succeeded
    failed     the job or the training loop raised (status.json says what)
    stale      status.json says running, but the process is gone or its heartbeat is older
               than :data:`tutorial_utils.jobs.STALE_AFTER_S`: resume it, or delete it
    created    a copy or a fork that was never started
    unknown    a status.json without a state (a job's logic called outside the job runner)
               whose success signs are not all recorded

:func:`list_runs` builds on :func:`tutorial_utils.jobs.list_runs` (the job runs) and adds the
training runs that no job started, and what the training files say (step/total, best metric,
wall time, size on disk).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

from tutorial_utils import jobs, paths
from tutorial_utils.errors import ConfigError, TutorialError
from tutorial_utils.io import atomic_write_json, dir_size, human_bytes, read_json_or_empty
from tutorial_utils.train.checkpoints import (
    BEST,
    CHECKPOINTS_DIR,
    LOCK_FILE,
    METRICS_FILE,
    TRAIN_STATE_JSON,
    find_last,
    last_target,
    step_dirs,
)
from tutorial_utils.train.checkpoints import CONFIG_FILE as TRAIN_CONFIG_FILE
from tutorial_utils.train.control import CONTROL_PAUSE
from tutorial_utils.train.rundir import CONTROL_FILE, SUMMARY_FILE

#: what :func:`copy` writes into a new run that is not started yet
COPY_FILE = "copy.json"
STATES = ("running", "paused", "stopped", "finished", "failed", "stale", "created", "unknown")
#: the run ids :func:`tutorial_utils.jobs.new_run_id` gives: ``<date>-<time>-<job>-<6 hex>``
_RUN_ID = re.compile(r"^\d{8}-\d{6}-(?P<job>.+)-[0-9a-f]{6}$")


class RunNotFound(TutorialError, LookupError):
    """No run directory by that id or path."""


class RunBusy(TutorialError, RuntimeError):
    """The run is running (or not in the state the action needs)."""


# --- finding runs ---------------------------------------------------------------------------------


def is_run(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run directory (a job run, a training run or a copy not started)."""
    p = Path(path)
    return p.is_dir() and any((p / f).is_file() for f in (jobs.STATUS_FILE, TRAIN_CONFIG_FILE, COPY_FILE))


def resolve(run: str | os.PathLike, runs_dir: str | os.PathLike | None = None) -> Path:
    """The run directory ``run`` names: a path, or a run id under ``runs_dir`` (default runs/)."""
    root = Path(runs_dir) if runs_dir else paths.RUNS
    for cand in (Path(run), root / os.fspath(run)):
        if is_run(cand):
            return cand.resolve()
    known = [r["run_id"] for r in list_runs(root)][-8:] if root.is_dir() else []
    raise RunNotFound(
        f"no run {os.fspath(run)!r} (looked at {Path(run)} and {root / os.fspath(run)}; a run directory holds "
        f"{jobs.STATUS_FILE}, {TRAIN_CONFIG_FILE} or {COPY_FILE}). Recent runs: {', '.join(known) or 'none'} "
        "(`python -m tutorial_utils runs list`)."
    )


def resolve_owned(run: str | os.PathLike, runs_dir: str | os.PathLike | None, action: str) -> Path:
    """:func:`resolve` for an action that changes the run (delete, resume, prune): a run named
    through a symbolic link is refused (nothing follows a link out of the runs folder), with
    the link and its target in the message. Checked before anything is changed."""
    root = Path(runs_dir) if runs_dir else paths.RUNS
    for cand in (Path(run), root / os.fspath(run)):
        if cand.is_symlink() and is_run(cand):
            raise RunBusy(
                f"{cand} is a symbolic link (to {os.readlink(cand)}); {action} refused and nothing was changed: the "
                f"runs platform never follows a link out of {root}. Fix: remove the link (`rm {cand}`), or {action} "
                "the run by its real path if you mean it."
            )
    return resolve(run, runs_dir)


def read_metrics(run: str | os.PathLike) -> list[dict]:
    """The rows of ``metrics.jsonl``. A line that is not JSON (a truncated write, a disk that
    filled up) is skipped with a warning that names the line, never an exception."""
    path = Path(run) / METRICS_FILE
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    rows, bad = [], []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad.append(i)
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        else:
            bad.append(i)
    if bad:
        warnings.warn(
            f"{path}: skipped {len(bad)} line(s) that are not metrics rows (line {', '.join(map(str, bad[:5]))}"
            f"{'...' if len(bad) > 5 else ''}): a write cut short",
            stacklevel=2,
        )
    return rows


# --- state ----------------------------------------------------------------------------------------


def run_state(run_dir: str | os.PathLike, status: dict | None = None, summary: dict | None = None) -> str:
    """The state of a run (one of :data:`STATES`), from status.json (the job's state and the
    training loop's ``training`` entry, both through :func:`tutorial_utils.jobs.run_state`, so
    a dead process reads ``stale``) and summary.json."""
    d = Path(run_dir)
    status = jobs.read_status(d) if status is None else status
    summary = read_json_or_empty(d / SUMMARY_FILE) if summary is None else summary
    job = jobs.run_state(status) if status.get("state") else None
    training = status.get("training")
    tr = jobs.run_state(training) if isinstance(training, dict) and training.get("state") else None
    if "running" in (job, tr):
        return "running"
    if "failed" in (job, tr):
        return "failed"
    if "stale" in (job, tr):
        return "stale"
    if tr in ("paused", "stopped", "finished"):
        return tr
    if summary:
        if summary.get("state") in STATES:
            return summary["state"]
        by = summary.get("stopped_by")
        return "paused" if by == CONTROL_PAUSE else "stopped" if by else "finished"
    if job == "succeeded":
        return "finished"
    if job:
        return job
    if (d / COPY_FILE).is_file() or read_json_or_empty(d / TRAIN_CONFIG_FILE).get("forked_from"):
        return "created"
    signs = status.get("success_signs")
    if isinstance(signs, dict) and signs:  # a job's logic run outside the runner: its signs say it
        return "finished" if all(signs.values()) else "failed"
    if (d / TRAIN_CONFIG_FILE).is_file():
        return "stale"  # training files, but no heartbeat and no summary: a process that died early
    return "unknown"


def training_lock_held(run_dir: str | os.PathLike) -> bool:
    """Whether a training process on this machine holds the run's lock right now."""
    import fcntl

    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the lock if we got it
    return False


def _best(d: Path, summary: dict, state: str) -> dict:
    """The best validation record: the newest checkpoint's while running, else the summary's."""
    rec = summary.get("best") if isinstance(summary.get("best"), dict) else None
    if state == "running" or rec is None:
        last = find_last(d / CHECKPOINTS_DIR) if (d / CHECKPOINTS_DIR).is_dir() else None
        if last is not None:
            rec = read_json_or_empty(last / TRAIN_STATE_JSON).get("best") or rec
    return rec or {}


def row(run: str | os.PathLike, job_row: dict | None = None) -> dict[str, Any]:
    """One registry row: run_id, path, job, state, step, total, best (validation action error)
    and best_step, success_rate (an evaluation job), wall_s, bytes (size on disk), updated."""
    d = Path(run)
    status = jobs.read_status(d)
    summary = read_json_or_empty(d / SUMMARY_FILE)
    cfg = read_json_or_empty(d / TRAIN_CONFIG_FILE)
    copy_ = read_json_or_empty(d / COPY_FILE)
    state = run_state(d, status, summary)
    training = status.get("training") if isinstance(status.get("training"), dict) else {}
    total = training.get("total") or summary.get("steps") or (cfg.get("train") or {}).get("steps")
    step = training.get("step") if training else summary.get("steps_done")
    if step is None and (d / CHECKPOINTS_DIR).is_dir() and (last := find_last(d / CHECKPOINTS_DIR)) is not None:
        step = read_json_or_empty(last / TRAIN_STATE_JSON).get("step")
    best = _best(d, summary, state)
    wall = training.get("wall_s") or summary.get("wall_s_total") or summary.get("wall_s") or status.get("wall_s")
    job = (job_row or {}).get("job") or status.get("job") or copy_.get("job")
    if job is None and (cfg or copy_.get("kind") == "train"):
        job = "train"
    if job is None and (m := _RUN_ID.match(d.name)):
        job = m["job"]
    return {
        "run_id": d.name,
        "path": str(d),
        "job": job,
        "state": state,
        "step": step,
        "total": total,
        "best": best.get("val_action_mae"),
        "best_step": best.get("step"),
        "success_rate": (status.get("eval") or {}).get("success_rate")
        if isinstance(status.get("eval"), dict)
        else None,
        "wall_s": wall,
        "bytes": dir_size(d),
        "stopped_by": training.get("stopped_by", summary.get("stopped_by")),
        "updated": training.get("updated") or status.get("updated"),
        "profile": status.get("profile"),
    }


def list_runs(runs_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """Every run under ``runs_dir`` (default runs/), oldest id first: the job runs that
    :func:`tutorial_utils.jobs.list_runs` finds, plus training runs and copies without a job."""
    root = Path(runs_dir) if runs_dir else paths.RUNS
    if not root.is_dir():
        return []
    job_rows = {r["run_id"]: r for r in jobs.list_runs(root)}
    names = set(job_rows) | {p.name for p in root.iterdir() if not p.name.startswith(".") and is_run(p)}
    return [row(root / name, job_rows.get(name)) for name in sorted(names)]


def show(run: str | os.PathLike, runs_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Everything about one run: its row, status, summary, configuration and history
    (``changes``, ``resumes``, ``copied_from``, ``forked_from``), its checkpoint names (the
    full listing: :func:`tutorial_utils.runs.checkpoints.list_checkpoints`), the last metrics
    rows and the last control command."""
    d = resolve(run, runs_dir)
    root = d / CHECKPOINTS_DIR
    cfg = read_json_or_empty(d / TRAIN_CONFIG_FILE)
    copy_ = read_json_or_empty(d / COPY_FILE)
    metrics = read_metrics(d)
    return {
        **row(d),
        "status": jobs.read_status(d),
        "summary": read_json_or_empty(d / SUMMARY_FILE),
        "config": cfg.get("train") or copy_.get("train") or copy_.get("parameters") or {},
        "policy_config": cfg.get("policy_config"),
        "changes": cfg.get("changes", []),
        "resumes": cfg.get("resumes", []),
        "copied_from": copy_.get("copied_from"),
        "forked_from": cfg.get("forked_from"),
        "checkpoints": [p.name for p in step_dirs(root)] + [BEST] * (root / BEST).is_dir(),
        "last": last_target(root),
        "metrics_tail": metrics[-5:],
        "control": read_json_or_empty(d / CONTROL_FILE) or None,
    }


# --- copy and start -------------------------------------------------------------------------------


def train_config(run: str | os.PathLike, runs_dir: str | os.PathLike | None = None, **overrides: Any):
    """The :class:`~tutorial_utils.train.config.TrainConfig` a training run (or a copy of one)
    ran with, plus ``overrides`` (checked: an unknown name is a ConfigError)."""
    from tutorial_utils.train.config import TrainConfig

    d = resolve(run, runs_dir)
    saved = read_json_or_empty(d / TRAIN_CONFIG_FILE).get("train") or read_json_or_empty(d / COPY_FILE).get("train")
    if not saved:
        raise ConfigError(f"{d} is not a training run: it has no {TRAIN_CONFIG_FILE} with the training parameters.")
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"policy_config"}
    saved = dict(saved)
    policy_cfg = saved.pop("policy_config", None) or {}
    base = TrainConfig.from_overrides(
        {
            **{k: v for k, v in saved.items() if k in fields},
            **{f"policy.{k}": v for k, v in policy_cfg.items()},
        }
    )
    return TrainConfig.from_overrides(overrides, base=base) if overrides else base


def _new_dir(parent: Path, name: str) -> Path:
    path = parent / name
    n = 2
    while path.exists():
        path = parent / f"{name}-{n}"
        n += 1
    return path


def copy(
    run: str | os.PathLike,
    runs_dir: str | os.PathLike | None = None,
    dest: str | os.PathLike | None = None,
    **overrides: Any,
) -> Path:
    """A new run with the parameters of ``run`` plus ``overrides`` (the platform's "copy
    task"), not started: ``<dest>/copy.json`` records what to run; :func:`start` runs it. A job
    run is copied as the same job notebook and parameters (checked against its parameters cell);
    a training run as its :class:`TrainConfig`. ``dest`` defaults to a new directory beside
    ``run``. Returns the new run directory."""
    src = resolve(run, runs_dir)
    status = jobs.read_status(src)
    now = _dt.datetime.now().isoformat(timespec="seconds")
    record: dict[str, Any] = {
        "copied_from": {"run": src.name, "path": str(src), "time": now},
        "overrides": json.loads(json.dumps(overrides, default=str)),
    }
    if status.get("job") and status.get("notebook"):
        nb_path = jobs.resolve_notebook(status["notebook"])
        nb = jobs.read_notebook(nb_path)
        declared = jobs.declared_parameters(nb)
        unknown = sorted(set(overrides) - set(declared))
        if unknown:
            raise ConfigError(
                f"copy of {src.name}: unknown parameter(s) {', '.join(unknown)} for job {status['job']}; its "
                f"parameters are: {', '.join(declared)}."
            )
        defaults: dict[str, Any] = {}
        with contextlib.suppress(Exception):  # a parameters cell that cannot run here is checked at start
            defaults = jobs.default_parameters(nb)
        nullable: set[str] = set()
        with contextlib.suppress(Exception):
            nullable = jobs.nullable_parameters(nb)
        jobs.check_parameter_types(nb_path.name, overrides, defaults, nullable)
        params = {k: v for k, v in (status.get("parameters") or {}).items() if k != jobs.RUN_DIR_PARAM}
        record.update(kind="job", job=status["job"], notebook=str(nb_path), parameters={**params, **overrides})
        name = jobs.new_run_id(status["job"])
    else:
        cfg = train_config(src, None, **overrides)
        train = json.loads(json.dumps(cfg.to_dict(), default=str))
        train.update(output_dir=None, run_id=None, resume=False, resume_from=None)
        record.update(kind="train", job="train", train=train)
        name = jobs.new_run_id("train")
    out = Path(dest) if dest else _new_dir(src.parent, name)
    if out.exists() and any(out.iterdir()):
        raise RunBusy(f"copy destination {out} is not empty; pass a new dest (or leave it out for a fresh one).")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / COPY_FILE, record)
    return out.resolve()


def start(run: str | os.PathLike, runs_dir: str | os.PathLike | None = None, source=None, echo: bool = False):
    """Start a copy made by :func:`copy` in this process and wait for it: a training copy
    trains (``source`` replaces the dataset, as in :func:`tutorial_utils.train.loop.train`) and
    returns the ``TrainResult``; a job copy runs its notebook with the job runner and returns
    the ``RunResult``."""
    d = resolve(run, runs_dir)
    record = read_json_or_empty(d / COPY_FILE)
    if not record:
        raise RunBusy(f"{d} is not a copy made by runs.copy (no {COPY_FILE}); resume a stopped run with runs.resume.")
    if (d / jobs.STATUS_FILE).exists() or (d / TRAIN_CONFIG_FILE).exists():
        raise RunBusy(f"{d} was started already (state {run_state(d)}); copy it again for a new run.")
    if record.get("kind") == "job":
        return jobs.run_notebook(record["notebook"], record.get("parameters") or {}, run_dir=d, echo=echo)
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.loop import train

    cfg = TrainConfig.from_overrides({"output_dir": str(d)}, base=train_config(d))
    return train(cfg, source=source)


# --- delete ---------------------------------------------------------------------------------------


def delete(run: str | os.PathLike, runs_dir: str | os.PathLike | None = None) -> int:
    """Delete a run directory and return the bytes freed. Refuses a running run (a fresh
    heartbeat, or a training process holding its lock); a stale one may go."""
    d = resolve_owned(run, runs_dir, "delete")
    state = run_state(d)
    if state == "running" or training_lock_held(d):
        raise RunBusy(
            f"run {d.name} is running; it is not deleted. Stop it first (`python -m tutorial_utils runs stop "
            f"{d.name}`, or runs.stop(run, wait=True)), then delete it."
        )
    freed = dir_size(d)
    doomed = d.parent / f".{d.name}.deleting-{os.getpid()}"
    os.replace(d, doomed)  # gone from every listing at once; a crash below leaves only a hidden folder
    shutil.rmtree(doomed, ignore_errors=True)
    return freed


def describe(rows: list[dict]) -> str:
    """``list_runs`` rows as a fixed-width text table (the CLI's ``runs list``)."""
    head = f"{'run':<44} {'job':<12} {'state':<9} {'step':>13} {'best':>9} {'wall':>9} {'size':>10}"
    lines = [head]
    for r in rows:
        step = f"{r['step'] if r['step'] is not None else '-'}/{r['total'] if r['total'] is not None else '-'}"
        best = f"{r['best']:.4f}" if isinstance(r["best"], (int, float)) else "-"
        wall = f"{r['wall_s']:.0f} s" if isinstance(r["wall_s"], (int, float)) else "-"
        lines.append(
            f"{r['run_id'][:44]:<44} {str(r['job'] or '?')[:12]:<12} {r['state']:<9} {step:>13} {best:>9} "
            f"{wall:>9} {human_bytes(r['bytes']):>10}"
        )
    return "\n".join(lines)
