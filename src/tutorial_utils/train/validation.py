"""Validation during training: the action error on fixed frames of the held-out episodes
(:class:`Validator`), the predicted-vs-true chunk of one of them for the live monitor
(:func:`write_sample`), and what each validation does (:func:`validate`): the error logged and
written to ``metrics.jsonl``, offered to :class:`~tutorial_utils.train.checkpoints.Checkpointer` as
the new ``best``, and the run's health check (:class:`~tutorial_utils.train.watch.TrainingWatch`)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tutorial_utils import logs as L
from tutorial_utils.io import atomic_write_json
from tutorial_utils.policies.base import BATCH_ACTION, BATCH_ACTION_IS_PAD, BATCH_TASK
from tutorial_utils.train.checkpoints import step_dir_name
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import WindowDataset, collate
from tutorial_utils.train.rundir import SAMPLES_DIR


class Validator:
    """The validation action error on fixed, evenly spaced frames of the held-out episodes. Each
    call also keeps :attr:`sample`: the predicted and the true action chunk of one fixed frame
    (the middle one of the picks), which :func:`write_sample` stores for the live monitor."""

    def __init__(self, source, val_idx: np.ndarray, cfg: TrainConfig, horizon: int, image_size: int):
        n = min(cfg.val_samples, len(val_idx))
        self.pick = val_idx[np.linspace(0, len(val_idx) - 1, n).round().astype(int)] if len(val_idx) else val_idx
        self.ds = WindowDataset(source, self.pick, horizon, image_size)
        self.seed = cfg.seed + 7
        self.frame_episode = getattr(source, "frame_episode", None)
        self.sample: dict | None = None

    def __len__(self) -> int:
        return len(self.pick)

    def __call__(self, model) -> dict:
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        errs, masks = [], []
        j = len(self.pick) // 2  # the fixed frame whose chunk the monitor draws
        for i in range(0, len(self.pick), 32):
            b = collate([self.ds[int(k)] for k in self.pick[i : i + 32]])
            pred = model.predict(b, generator=gen)
            # a window may start before the current frame (LeRobot's action_delta_indices, e.g. Diffusion
            # with 2 observation frames); the prediction is the chunk from the current frame: its tail
            h = pred.shape[1]
            b = {**b, BATCH_ACTION: b[BATCH_ACTION][:, -h:], BATCH_ACTION_IS_PAD: b[BATCH_ACTION_IS_PAD][:, -h:]}
            if i <= j < i + 32:
                self.sample = self._sample(b, pred, j - i, int(self.pick[j]))
            mask = (~b[BATCH_ACTION_IS_PAD]).numpy()[..., None].astype(np.float32)
            errs.append(np.abs(pred - b[BATCH_ACTION].numpy()) * mask)
            masks.append(np.broadcast_to(mask, pred.shape))
        e, w = np.concatenate(errs), np.concatenate(masks)
        per_dim = (e.sum((0, 1)) / np.maximum(w.sum((0, 1)), 1)).tolist()
        return {
            "val_action_mae": float(e.sum() / max(w.sum(), 1)),
            "val_action_mae_xyz": float(np.mean(per_dim[:3])),
            "val_gripper_mae": float(per_dim[-1]),
            "val_frames": int(len(self.pick)),
        }

    def _sample(self, b: dict, pred: np.ndarray, k: int, frame: int) -> dict:
        """Row ``k`` of a validation batch as plain JSON: predicted vs true chunk (robot units)."""
        fe = self.frame_episode
        task = b.get(BATCH_TASK)
        return {
            "frame": frame,
            "episode": int(fe[frame]) if fe is not None and frame < len(fe) else None,
            "task": task[k] if isinstance(task, (list, tuple)) else None,
            "pred": np.asarray(pred[k], np.float64).round(6).tolist(),
            "true": b[BATCH_ACTION][k].double().numpy().round(6).tolist(),
            "is_pad": b[BATCH_ACTION_IS_PAD][k].numpy().astype(bool).tolist(),
        }


def write_sample(out: Path, step: int, sample: dict) -> Path | None:
    """``<out>/samples/step_<step>.json``: one validation sample's predicted and true chunk.
    Written atomically; a failed write (full disk) is skipped, never stops training."""
    path = Path(out) / SAMPLES_DIR / f"{step_dir_name(step)}.json"
    try:
        path.parent.mkdir(exist_ok=True)
        atomic_write_json(path, {"step": step, **sample}, indent=None)
    except OSError:
        return None
    return path


def validate(s, out: Path, step: int, watch=None) -> dict | None:
    """The validation at ``step`` of the run ``s`` (a :class:`~tutorial_utils.train.prepare.Setup`):
    on the main process the held-out action error, then ``watch``'s health check (logged and put in
    status.json; never the reason a training stops). Returns the validation's row, or None where
    this process validated nothing."""
    row = _action_error(s, out, step) if s.acc.is_main_process and len(s.validator) else None
    if watch is not None:  # the run's health from its own rows: logged and put in status.json
        try:
            watch(step, s.run_log.rows)
        except Exception as exc:  # never the reason a training stops
            s.run_log(f"Health check skipped at step {step}: {exc!r}")
    return row


def _action_error(s, out: Path, step: int) -> dict:
    """The held-out action error at ``step`` (of the EMA weights when ``ema_decay`` > 0), offered as
    the new ``best``, its sample written, logged and recorded in metrics.jsonl."""
    m = s.acc.unwrap_model(s.model)
    with s.ckpt.served(m):  # the EMA weights when ema_decay > 0
        row = {**s.validator(m), "step": step}
        improved = s.ckpt.offer_best(m, step, row)
    s.model.train()
    sample = write_sample(out, step, s.validator.sample) if s.validator.sample else None
    extra = {"sample": f"{SAMPLES_DIR}/{sample.name}"} if sample else {}
    s.run_log.metrics({**row, "best": improved, "time": time.time(), **extra})
    s.run_log(
        L.TRAIN_VALIDATION.format(
            run_id=s.run_id,
            step=step,
            metrics={"val_action_mae": round(row["val_action_mae"], 6), "best": improved},
        )
    )
    return row
