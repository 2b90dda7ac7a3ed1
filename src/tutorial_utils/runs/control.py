"""Steer a training run: stop, pause, resume (from any checkpoint, with allowed parameter
changes), rollback.

``stop`` and ``pause`` write a command into ``<run>/control.json`` (atomically, so two
controllers never leave half a file: the last one wins). The training loop polls the file once
per step (one ``stat``); on every process of a DDP launch the stop happens at the same step. It
finishes the step, saves a checkpoint, records the command as acknowledged and exits with
``stopped_by`` ``control:stop`` or ``control:pause``. Signals do the same from a shell or a
cluster: SIGTERM, SIGINT, SIGUSR1.

``resume`` is a new training invocation with ``resume=true``: exact (same losses as an
uninterrupted run), from ``last`` or any ``step_*`` (``resume_from``; the run's later
checkpoints are discarded). Only :data:`~tutorial_utils.train.resume.RESUME_CHANGEABLE` parameters
may change on resume; each change is recorded in ``train_config.json`` (``changes``: step, name,
old, new). ``rollback`` keeps the old run as it is and forks a new run directory from a chosen
checkpoint, ready to resume.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from tutorial_utils.errors import ConfigError
from tutorial_utils.io import atomic_dir, atomic_write_json, atomic_write_text, read_json_or_empty
from tutorial_utils.policies.normalize import STATS_FILE
from tutorial_utils.runs.registry import (
    TRAIN_CONFIG_FILE,
    RunBusy,
    _new_dir,
    read_metrics,
    resolve,
    resolve_owned,
    run_state,
    train_config,
)
from tutorial_utils.train import checkpoints as ck
from tutorial_utils.train.checkpoints import METRICS_FILE
from tutorial_utils.train.control import CONTROL_COMMANDS
from tutorial_utils.train.resume import run_history
from tutorial_utils.train.rundir import CONTROL_FILE

#: states in which a run has a training process to receive a command
_LIVE = ("running",)


def send(run: str | os.PathLike, command: str, runs_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Write ``command`` (``stop`` or ``pause``) into the run's ``control.json`` for the running
    loop; returns what was written. Refuses a run that is not running (nothing would read it)."""
    if command not in CONTROL_COMMANDS:
        raise ValueError(f"command {command!r}: use one of {', '.join(CONTROL_COMMANDS)}")
    d = resolve(run, runs_dir)
    state = run_state(d)
    if state not in _LIVE:
        hint = {
            "paused": "it is paused already; resume it with runs.resume",
            "stale": "its process is gone; resume it (runs.resume) or delete it",
            "created": "it was never started; start it with runs.start",
        }.get(state, "there is no training process to stop")
        raise RunBusy(f"run {d.name} is {state}, not running: {hint}.")
    record = {
        "command": command,
        "time": time.time(),
        "id": secrets.token_hex(4),
        "by": {"pid": os.getpid(), "host": socket.gethostname()},
    }
    atomic_write_json(d / CONTROL_FILE, record)
    return record


def _wait(d: Path, record: dict, timeout: float) -> dict:
    """Wait until the loop acknowledged ``record`` and its process let go of the run."""
    from tutorial_utils.runs.registry import row, training_lock_held

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        ack = read_json_or_empty(d / CONTROL_FILE)
        done = ack.get("id") == record["id"] and ack.get("acknowledged")
        if (done or run_state(d) not in _LIVE) and not training_lock_held(d):
            return row(d)
        time.sleep(0.1)
    raise TimeoutError(
        f"run {d.name} did not act on {record['command']!r} within {timeout:.0f} s (a step longer than that, or a "
        f"loop that does not read {CONTROL_FILE}). Its process gets the command at the end of the current step."
    )


def stop(
    run: str | os.PathLike, wait: bool = False, timeout: float = 600.0, runs_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Ask the running loop to finish its step, save a checkpoint and exit (``control:stop``).
    ``wait``: return the run's registry row once it has (else the command written)."""
    d = resolve(run, runs_dir)
    record = send(d, "stop")
    return _wait(d, record, timeout) if wait else record


def pause(
    run: str | os.PathLike, wait: bool = False, timeout: float = 600.0, runs_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Like :func:`stop`, recorded as paused (``control:pause``): the run waits for :func:`resume`."""
    d = resolve(run, runs_dir)
    record = send(d, "pause")
    return _wait(d, record, timeout) if wait else record


def _check_resumable(cfg, ckpt: Path) -> int:
    """Everything a resume from ``ckpt`` relies on, checked before anything is changed: its
    ``training_state.json`` (typed, a step no later than ``steps``), its ``training_state.pt``
    (loadable), and its weights (the family and configuration of ``cfg``, the sha256 of its
    manifest). Returns the checkpoint's step; a refusal is a teaching error."""
    from tutorial_utils.policies.checkpoint import load_state_dict_checked

    step = int(ck.train_state_meta(ckpt)["step"])
    if cfg.steps < step:
        raise ConfigError(
            f"steps={cfg.steps} is below the step of the checkpoint to resume ({ckpt.name}, step {step}); pass "
            f"steps >= {step}. Nothing was changed."
        )
    _, manifest = load_state_dict_checked(ckpt)  # a corrupt or changed weights file is a CheckpointError
    ours = dataclasses.asdict(cfg.policy_config) if dataclasses.is_dataclass(cfg.policy_config) else {}
    theirs = manifest.get("policy") if isinstance(manifest.get("policy"), dict) else {}
    diff = sorted(k for k in ours if theirs.get(k) != ours[k])
    if manifest.get("family") != cfg.policy or diff:
        shown = ", ".join(f"{k}: checkpoint {theirs.get(k)!r} vs run {ours[k]!r}" for k in diff[:4])
        raise ConfigError(
            f"{ckpt / 'config.json'} is a {manifest.get('family')!r} model{' (' + shown + ')' if shown else ''}; "
            f"the run trains {cfg.policy!r} with another configuration. Nothing was changed. Fix: resume from a "
            "checkpoint of this model, or start a new run with pretrained_checkpoint=<it> (`runs copy`)."
        )
    ck.load_train_state(ckpt)  # a corrupt training_state.pt is our teaching error, before any change
    return step


def resume(
    run: str | os.PathLike,
    resume_from: str | None = None,
    source=None,
    runs_dir: str | os.PathLike | None = None,
    on_step=None,
    **changes: Any,
):
    """Continue a stopped, paused or stale training run in this process (exact: the same
    losses as an uninterrupted run), from ``last`` or the checkpoint ``resume_from`` (a
    ``step_*`` name or a path), with ``changes`` from the allow-list
    (:data:`~tutorial_utils.train.resume.RESUME_CHANGEABLE`; another parameter is a ConfigError
    naming it). ``source`` replaces the dataset (tests). Returns the ``TrainResult``.

    Check, then act: the checkpoint and the model are checked (:func:`_check_resumable`)
    before anything on disk changes, so a refusal leaves the run as it was. A checkpoint of
    another run is never resumed in place: it forks a new run beside this one (as
    :func:`rollback` does, ``forked_from`` naming both runs) and that fork is resumed."""
    from tutorial_utils.train.loop import train

    d = resolve_owned(run, runs_dir, "resume")
    if run_state(d) in _LIVE:
        raise RunBusy(f"run {d.name} is running; stop or pause it first (runs.stop / runs.pause).")
    root = d / ck.CHECKPOINTS_DIR
    ckpt = ck.resolve_checkpoint(root, resume_from or "last")  # CheckpointNotFound lists what exists
    cfg = train_config(d, None, **{**changes, "resume": True, "resume_from": resume_from, "output_dir": str(d)})
    run_history(d, cfg, ckpt)  # a change a resume cannot make is refused here, before the run is touched
    _check_resumable(cfg, ckpt)
    if ckpt.resolve().parent != root.resolve():  # another run's checkpoint: fork, never rewrite this run
        fork = _fork(d, ckpt.resolve())
        print(f"resume_from={resume_from}: a checkpoint of another run; forked {d.name} into {fork}", file=sys.stderr)
        cfg = train_config(fork, None, **{**changes, "resume": True, "resume_from": None, "output_dir": str(fork)})
    return train(cfg, source=source, on_step=on_step)


def _lineage(run_dir: Path) -> dict[str, Any]:
    """Where a run came from: its ``copied_from``, ``forked_from``, ``resumes`` (train_config.json)."""
    saved = read_json_or_empty(run_dir / TRAIN_CONFIG_FILE)
    return {k: saved[k] for k in ("copied_from", "forked_from", "resumes") if k in saved}


def _fork(d: Path, src: Path, dest: str | os.PathLike | None = None) -> Path:
    """A new run from checkpoint ``src`` with the configuration of run ``d`` (``src`` may be a
    checkpoint of another run: ``forked_from`` then names both, with that run's own lineage).
    Checks first, then builds the fork under a temporary name; returns its directory."""
    root = d / ck.CHECKPOINTS_DIR
    step = ck.checkpoint_step(src)
    if step is None:
        raise ck.CheckpointNotFound(f"{src} has no step in {ck.TRAIN_STATE_JSON}; pick another checkpoint.")
    saved = read_json_or_empty(d / TRAIN_CONFIG_FILE)
    if not isinstance(saved.get("train"), dict):
        raise RunBusy(f"{d} has no {TRAIN_CONFIG_FILE}: it is not a training run, there is nothing to fork.")
    own = src.resolve().parent == root.resolve()
    src_run = src.resolve().parent.parent if src.resolve().parent.name == ck.CHECKPOINTS_DIR else None
    label = src.name if own else f"{src_run.name if src_run else 'ckpt'}-{src.name}"
    out = Path(dest) if dest else _new_dir(d.parent, f"{d.name}-from-{label}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunBusy(f"fork destination {out} is not empty; pass a new dest.")
    now = _dt.datetime.now().isoformat(timespec="seconds")
    saved["train"] = {**saved["train"], "output_dir": str(out.resolve()), "resume": False, "resume_from": None}
    saved["forked_from"] = {"run": d.name, "path": str(d), "checkpoint": src.name, "step": step, "time": now}
    if own:
        for key in ("changes", "resumes"):  # the history up to the fork point
            saved[key] = [c for c in saved.get(key, []) if isinstance(c, dict) and c.get("step", 0) <= step]
        metrics_from = d
    else:  # the weights' history is the other run's: name it, with its own lineage
        saved["forked_from"]["checkpoint_path"] = str(src)
        saved["forked_from"]["checkpoint_run"] = {
            "run": src_run.name if src_run else None,
            "path": str(src_run) if src_run else None,
            **(_lineage(src_run) if src_run else {}),
        }
        saved["changes"], saved["resumes"] = [], []
        metrics_from = src_run
    with atomic_dir(out) as tmp:
        atomic_write_json(tmp / TRAIN_CONFIG_FILE, saved)
        if (d / STATS_FILE).is_file():
            shutil.copy2(d / STATS_FILE, tmp / STATS_FILE)
        rows = [r for r in read_metrics(metrics_from) if r["step"] <= step] if metrics_from else []
        atomic_write_text(tmp / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
        (tmp / ck.CHECKPOINTS_DIR).mkdir()
        shutil.copytree(src, tmp / ck.CHECKPOINTS_DIR / src.name, symlinks=True)
        ck.point_last(tmp / ck.CHECKPOINTS_DIR, tmp / ck.CHECKPOINTS_DIR / src.name)
        best = ck.best_step(root)
        if own and best is not None and best <= step and (root / ck.BEST).is_dir():
            shutil.copytree(root / ck.BEST, tmp / ck.CHECKPOINTS_DIR / ck.BEST, symlinks=True)
    return out.resolve()


def rollback(
    run: str | os.PathLike,
    checkpoint: str,
    dest: str | os.PathLike | None = None,
    runs_dir: str | os.PathLike | None = None,
) -> Path:
    """Fork a new run directory from ``checkpoint`` (a ``step_*`` name, a step number or a
    path) of ``run``; the old run stays untouched. The fork holds the run's configuration
    (``forked_from``: run, checkpoint, step), its statistics, its metrics up to that step and a
    copy of the checkpoint as ``last`` (and ``best`` when it is not from a later step). Resume it
    with :func:`resume` (changes from the allow-list allowed). Returns the new directory.
    The checkpoint's training state is checked first: a refusal writes nothing."""
    d = resolve(run, runs_dir)
    src = ck.resolve_checkpoint(d / ck.CHECKPOINTS_DIR, checkpoint)  # CheckpointNotFound lists what exists
    ck.train_state_meta(src)
    ck.load_train_state(src)
    return _fork(d, src, dest)
