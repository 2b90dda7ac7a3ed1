"""The end of a training run: a checkpoint for a stopped run; for a finished one the final
checkpoint, ``final_model`` and the disk-usage lines (:func:`finish`); then ``summary.json``, what
happened (:func:`write_summary`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tutorial_utils import logs as L
from tutorial_utils.io import atomic_write_json, dir_size, human_bytes
from tutorial_utils.train.checkpoints import find_last
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.rundir import SUMMARY_FILE

if TYPE_CHECKING:
    from tutorial_utils.train.prepare import Setup


def finish(
    cfg: TrainConfig, s: Setup, out: Path, step: int, stopped_by, time_limited: bool, last_val: dict, validate
) -> dict:
    """After the loop: a checkpoint for a stopped run; for a finished one the final checkpoint,
    ``final_model`` and the disk-usage lines (``final_model`` removed unless kept)."""
    acc, main, log = s.acc, s.acc.is_main_process, s.run_log
    model = acc.unwrap_model(s.model)
    result: dict[str, Any] = {}
    if stopped_by:
        acc.wait_for_everyone()
        path = s.ckpt.save(step, stopped_by, model, s.optimizer, s.scheduler, force=True)
        acc.wait_for_everyone()
        log(L.TRAIN_STOPPED.format(signal=stopped_by, step=step, path=path))
        result["checkpoint"] = str(path) if path else None
        return result
    if time_limited and last_val.get("step") != step:
        validate(step)
    acc.wait_for_everyone()
    if main:
        if cfg.save_checkpoint and step > s.start_step:
            s.ckpt.save(step, "final", model, s.optimizer, s.scheduler)
        final = out / "final_model"
        with s.ckpt.served(model):
            model.save(final, {"dataset": s.ckpt.dataset_meta, "step": step})
        log(L.TRAIN_COMPLETE.format(path=final))
        keep = cfg.keep_final_model or os.environ.get("KEEP_FINAL_MODEL", "") == "1"
        size_final, size_before = dir_size(final), dir_size(out)
        log(L.TRAIN_DISK_USAGE.format(final=human_bytes(size_final), run_dir=human_bytes(size_before)))
        if keep:
            log(L.TRAIN_FINAL_KEPT.format(final=final))
            size_after = size_before
        else:
            shutil.rmtree(final)
            size_after = dir_size(out)
            log(L.TRAIN_FINAL_REMOVED.format(run_dir=human_bytes(size_after)))
        result.update(
            final_model=str(final) if keep else None,
            final_model_bytes=size_final,
            run_dir_bytes_before=size_before,
            run_dir_bytes_after=size_after,
        )
    acc.wait_for_everyone()
    return result


def write_summary(
    cfg: TrainConfig,
    s: Setup,
    out: Path,
    step: int,
    stopped_by: str | None,
    time_limited: bool,
    last_val: dict,
    wall: float,
    run_state: str,
    paths_out: dict,
) -> dict:
    """``summary.json`` (written by the main process): steps, losses, throughput, the best and last
    checkpoints, the sizes of :func:`finish` (``paths_out``), the stop reason. Returns it."""
    acc, rl = s.acc, s.run_log
    summary = {
        "run_id": s.run_id,
        "policy": cfg.policy,
        "steps": cfg.steps,
        "start_step": s.start_step,
        "steps_done": step,
        "stopped_by": stopped_by,
        "time_limited": time_limited,
        "world_size": acc.num_processes,
        "batch_size": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum_steps,
        "resolved": s.fast.to_dict(),
        "parameters": s.counts,
        "frozen_modules": s.frozen,
        "first_loss": rl.losses[0][1] if rl.losses else None,
        "last_loss": rl.losses[-1][1] if rl.losses else None,
        "wall_s": round(wall, 3),
        "wall_s_total": round(s.wall_before + wall, 3),
        "state": run_state,
        "samples_per_s": (step - s.start_step) * rl.step_samples / max(rl.total_time, 1e-9),
        "data_wait_share": rl.total_wait / max(rl.total_time, 1e-9),
        "best": s.ckpt.best,
        "last_val": last_val,
        "last_checkpoint": str(find_last(s.ckpt.root)) if s.ckpt.root.exists() and find_last(s.ckpt.root) else None,
        "best_checkpoint": str(s.ckpt.root / "best") if (s.ckpt.root / "best").is_dir() else None,
        "len_dataloader": s.len_loader,
        **paths_out,
    }
    if acc.is_main_process:
        atomic_write_json(out / SUMMARY_FILE, summary)
    return summary
