"""Resuming a run (``resume=true``, ``resume_from``): which checkpoint (:func:`resume_point`), what a
resume may change (:data:`RESUME_CHANGEABLE`, checked and recorded in ``train_config.json`` by
:func:`run_history`), the restore of the weights, optimiser, scheduler and RNG (:func:`restore`), the
changed parameters applied to the restored scheduler (:func:`apply_changes`), and the run directory
brought back to the checkpoint's step (:func:`rewind`, :func:`trim_after`). The data order and the
noise are pure functions of (seed, step), so a resumed run's losses equal the uninterrupted run's."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import sys
from pathlib import Path

from tutorial_utils.errors import ConfigError
from tutorial_utils.io import atomic_write_text, read_json_or_empty, read_jsonl
from tutorial_utils.train.checkpoints import (
    CONFIG_FILE,
    METRICS_FILE,
    TRAIN_STATE_JSON,
    Checkpointer,
    discard_after,
    find_last,
    has_optimizer_state,
    load_train_state,
    optimizer_state_missing,
    point_last,
    resolve_checkpoint,
    train_state_meta,
)
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.rundir import SAMPLES_DIR, SUMMARY_FILE
from tutorial_utils.train.schedule import lr_factor

#: The parameters a resume may change (each change is recorded in train_config.json's ``changes``).
RESUME_CHANGEABLE = ("optimizer_lr", "steps", "eval_freq", "log_freq", "save_freq", "time_limit_min")
#: Parameters that say how or where a process runs, not what it trains: free to differ on resume.
RESUME_FREE = (
    "resume",
    "resume_from",
    "output_dir",
    "run_id",
    "progress",
    "system_metrics",
    "num_workers",
    "num_threads",
    "device",
    "data_cache_mb",
    "keep_final_model",
    "keep_last",
    "keep_optimizer",
    "pretrained_checkpoint",
    "precision",
    "torch_compile",
    "compile_backend",
    "pin_memory",
    "tensorboard",
    "wandb",
    "wandb_project",
)


def resume_point(root: Path, cfg: TrainConfig) -> Path | None:
    """The checkpoint of ``root`` (a run's ``checkpoints/``) that ``cfg`` resumes from, or None;
    refuses to start a fresh run over an old one, and a checkpoint whose optimizer state
    ``keep_optimizer=last`` dropped."""
    found = None
    if cfg.resume_from:
        found = resolve_checkpoint(root, cfg.resume_from)
        if found.resolve().parent != root.resolve():  # a resume continues only the run's own checkpoints
            raise ConfigError(
                f"resume_from={cfg.resume_from!r} ({found}) is not a checkpoint of {root.parent}. Fork a "
                f"new run from it (`python -m tutorial_utils runs resume RUN --from {found}` does), or start a "
                "new run with pretrained_checkpoint=<it>."
            )
    elif cfg.resume:
        found = find_last(root)
        if found is None:
            raise ConfigError(
                f"resume=true but {root} holds no complete checkpoint; start without resume "
                "(or point output_dir at the run to continue)."
            )
    if found is not None:
        if not has_optimizer_state(found):
            raise optimizer_state_missing(found, root)
        return found
    if (root / "last").exists() or list(root.glob("step_*")):
        raise ConfigError(
            f"{root.parent} already holds checkpoints of a run; pass resume=true to continue it, "
            "or a new output_dir (runs never overwrite another run)."
        )
    return None


def restore(ckpt: Checkpointer, path: Path, model, optimizer, scheduler) -> int:
    """Load weights, optimizer, scheduler and RNG from ``path``; returns the step. ``ckpt`` keeps the
    training state read (:attr:`Checkpointer.restored`) and the run's best validation so far."""
    import torch

    from tutorial_utils.policies.checkpoint import load_weights_into

    load_weights_into(model, path)
    state = load_train_state(path)  # a teaching error for a corrupt file, not torch's advice
    ckpt.restored = state
    if "optimizer" not in state:
        raise optimizer_state_missing(path, ckpt.root)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    meta = train_state_meta(path)
    ckpt.best = meta.get("best", ckpt.best)
    if (
        meta.get("world_size", ckpt.world) != ckpt.world
        or meta.get("batch_size", ckpt.cfg.batch_size) != ckpt.cfg.batch_size
    ):
        print(
            f"warning: resuming with batch_size={ckpt.cfg.batch_size} x {ckpt.world} processes; the checkpoint used "
            f"{meta.get('batch_size')} x {meta.get('world_size')}, so the data order differs from the original run.",
            file=sys.stderr,
        )
    return int(meta["step"])


def apply_changes(changed: set[str], cfg: TrainConfig, optimizer, scheduler) -> None:
    """A resume that changed ``optimizer_lr`` or ``steps``: the restored scheduler still holds the
    old peak and length, so its base rates, and the optimiser's current ones, follow ``cfg``."""
    if not changed & {"optimizer_lr", "steps"}:
        return
    # a group with a rate of its own (VQ-BeT's VQ-VAE, marked ``own_lr``) keeps it
    scheduler.base_lrs = [
        base if group.get("own_lr") else cfg.optimizer_lr
        for base, group in zip(scheduler.base_lrs, optimizer.param_groups)
    ]
    for base, group in zip(scheduler.base_lrs, optimizer.param_groups):
        group["initial_lr"] = base
        group["lr"] = base * lr_factor(scheduler.last_epoch, cfg)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def config_changes(saved: dict, cfg: TrainConfig) -> list[dict]:
    """The parameters of ``cfg`` that differ from a run's ``train_config.json`` (``saved``), as
    ``{"name", "old", "new"}``; parameters in :data:`RESUME_FREE` do not count, nor a parameter
    the saved run did not have yet. Family parameters are named ``policy.<name>``."""
    new = json.loads(json.dumps(cfg.to_dict(), default=str))
    old = saved.get("train") or {}
    old_policy = saved.get("policy_config") or old.get("policy_config") or {}
    out = []
    for name, value in new.items():
        if name in RESUME_FREE or name == "policy_config" or name not in old:
            continue
        before = old[name]
        if name == "dataset" and before and value and Path(before).resolve() == Path(value).resolve():
            continue
        if before != value:
            out.append({"name": name, "old": before, "new": value})
    for name, value in (new.get("policy_config") or {}).items():
        if name in old_policy and old_policy[name] != value:
            out.append({"name": f"policy.{name}", "old": old_policy[name], "new": value})
    return out


def run_history(out: Path, cfg: TrainConfig, resume_from: Path | None) -> tuple[dict, set[str]]:
    """What train_config.json carries over from the run's earlier invocations (``copied_from``,
    ``forked_from``, ``changes``, ``resumes``) and the names changed by this resume. A resume that
    changes a parameter outside :data:`RESUME_CHANGEABLE` is a :class:`ConfigError` naming it."""
    saved = read_json_or_empty(out / CONFIG_FILE)
    history = {k: saved[k] for k in ("copied_from", "forked_from") if k in saved}
    if resume_from is None:
        return history, set()
    step = int(read_json_or_empty(resume_from / TRAIN_STATE_JSON).get("step", 0))
    diffs = config_changes(saved, cfg) if saved.get("train") else []
    bad = [d for d in diffs if d["name"] not in RESUME_CHANGEABLE]
    if bad:
        shown = "; ".join(f"{d['name']}: {d['old']!r} -> {d['new']!r}" for d in bad)
        raise ConfigError(
            f"resume of {out} changes {', '.join(d['name'] for d in bad)} ({shown}), which a resume cannot change "
            f"(the checkpoint was trained with the old value; see {out / CONFIG_FILE}). Only "
            f"{', '.join(RESUME_CHANGEABLE)} may change on resume. Put it back, or start a new run with it: "
            "runs.copy(run, name=value) (`python -m tutorial_utils runs copy RUN name=value`)."
        )
    if cfg.steps < step:
        raise ConfigError(
            f"steps={cfg.steps} is below the step of the checkpoint to resume ({resume_from.name}, step {step}); "
            f"pass steps >= {step}."
        )
    now = _dt.datetime.now().isoformat(timespec="seconds")
    changes = list(saved.get("changes", [])) + [{"step": step, **d, "time": now} for d in diffs]
    resumes = list(saved.get("resumes", [])) + [{"step": step, "from": resume_from.name, "time": now}]
    return {**history, "changes": changes, "resumes": resumes}, {d["name"] for d in diffs}


def wall_before(out: Path) -> float:
    """Training seconds the run spent before this resume: the last heartbeat's (a killed run
    too), else the summary's."""
    from tutorial_utils.jobs import read_status

    training = read_status(out).get("training") or {}
    summary = read_json_or_empty(out / SUMMARY_FILE)
    for v in (training.get("wall_s"), summary.get("wall_s_total"), summary.get("wall_s")):
        if isinstance(v, (int, float)):
            return float(v)
    return 0.0


def rewind(root: Path, resume_from: Path) -> None:
    """Resume in place from an earlier checkpoint: its later checkpoints go, ``last`` points at it."""
    step = int(read_json_or_empty(resume_from / TRAIN_STATE_JSON).get("step", 0))
    gone = discard_after(root, step)
    if resume_from.parent.resolve() == root.resolve():
        point_last(root, resume_from)
    if gone:
        print(
            f"resume_from={resume_from.name}: removed the later checkpoint(s) {', '.join(gone)} "
            "(runs.rollback keeps the old run and forks a new one instead)",
            file=sys.stderr,
        )


def trim_after(out: Path, step: int) -> None:
    """The run's ``metrics.jsonl`` rows and validation samples past ``step`` (the checkpoint resumed
    from) go: the resumed run writes them again."""
    if (out / METRICS_FILE).is_file():
        rows = [r for r in read_jsonl(out / METRICS_FILE) if int(r.get("step", 0)) <= step]
        atomic_write_text(out / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    for f in (out / SAMPLES_DIR).glob("step_*.json"):
        with contextlib.suppress(ValueError, OSError):
            if int(f.stem.split("_")[1]) > step:
                f.unlink()
