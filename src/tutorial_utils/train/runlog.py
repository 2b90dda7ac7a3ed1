"""What a running training loop says about itself: :class:`RunLog` (``train.log``, the DiT4DiT-format
lines echoed to stdout; ``metrics.jsonl``, one row per log step; the progress bar; the trackers of
:mod:`tutorial_utils.train.trackers`) and :class:`TrainingStatus` (the ``training`` entry of
``status.json``: state, step, ETA and a heartbeat)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils import logs as L
from tutorial_utils.train.checkpoints import METRICS_FILE
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.rundir import LOG_FILE


class TrainingStatus:
    """The ``training`` entry of ``<output_dir>/status.json`` (merged under the job runner's lock,
    :func:`tutorial_utils.jobs.update_status`): state (running, paused, stopped, finished,
    failed), step, total, ETA, wall time and a heartbeat (pid, host, updated) refreshed every
    :data:`tutorial_utils.jobs.HEARTBEAT_S` seconds by a daemon thread, so a killed run reads as
    ``stale`` (:func:`tutorial_utils.jobs.run_state`). Main process only; a failed write (full
    disk) never stops training."""

    def __init__(self, out: Path, main: bool, total: int, start_step: int, wall_before: float):
        from tutorial_utils import jobs

        self.out, self.main, self.total, self.start_step = Path(out), main, total, start_step
        self.step, self.t0, self.wall_before = start_step, time.perf_counter(), wall_before
        self.started = _dt.datetime.now().isoformat(timespec="seconds")
        self._heart = jobs.Heartbeat(lambda: self.write("running"), name="train-heartbeat")

    def fields(self, state: str, **extra: Any) -> dict:
        from tutorial_utils import jobs

        elapsed = time.perf_counter() - self.t0
        done = self.step - self.start_step
        eta = (self.total - self.step) * elapsed / done if done > 0 and state == "running" else None
        return {
            "state": state,
            "step": self.step,
            "total": self.total,
            "eta_s": round(eta, 1) if eta is not None else None,
            "started": self.started,
            "wall_s": round(self.wall_before + elapsed, 3),
            **jobs.heartbeat_fields(),
            **extra,
        }

    def write(self, state: str, **extra: Any) -> None:
        if not self.main:
            return
        from tutorial_utils import jobs

        with contextlib.suppress(OSError):
            jobs.update_status(self.out, training=self.fields(state, **extra))

    def start(self) -> None:
        if self.main:
            self.write("running", stopped_by=None, error=None)
            self._heart.start()

    def close(self, state: str, **extra: Any) -> None:
        self._heart.stop()
        self.write(state, eta_s=None, **extra)


class RunLog:
    """``train.log`` (the DiT4DiT lines, echoed to stdout), ``metrics.jsonl`` and the progress
    bar, written by the main process only. :meth:`step` accumulates a window of steps and
    writes one loss line and one metrics row every ``log_freq`` steps."""

    def __init__(self, out: Path, cfg: TrainConfig, run_id: str, main: bool, start_step: int, world: int, n_train: int):
        self.cfg, self.run_id, self.main, self.world, self.n_train = cfg, run_id, main, world, n_train
        self.fh = open(out / LOG_FILE, "a", encoding="utf-8") if main else None
        self.metrics_fh = open(out / METRICS_FILE, "a", encoding="utf-8") if main else None
        self.sampler = None
        if main and cfg.system_metrics:
            from tutorial_utils.train.sysmetrics import SystemSampler

            self.sampler = SystemSampler(out)
        self.bar = None
        if main and cfg.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.steps,
                initial=start_step,
                desc=f"train {run_id}",
                unit="step",
                dynamic_ncols=True,
                mininterval=1.0 if sys.stderr.isatty() else 10.0,
                file=sys.stderr,
            )
        self.window: dict = {"wait": 0.0, "total": 0.0, "samples": 0, "loss": []}
        #: samples one optimisation step consumes over all processes
        self.step_samples = cfg.batch_size * cfg.grad_accum_steps * world
        self.trackers = None  # tutorial_utils.train.trackers.Trackers, set by train.prepare on the main process
        self.total_wait = self.total_time = 0.0
        self.losses: list[tuple[int, float]] = []
        self.rows: list[dict] = []  # the training rows of this process's metrics.jsonl (the health check reads them)

    def __call__(self, line: str) -> None:
        if self.main:
            print(line, flush=True)
            self.fh.write(line + "\n")
            self.fh.flush()

    def metrics(self, row: dict) -> None:
        if self.metrics_fh:
            self.metrics_fh.write(json.dumps(row) + "\n")
            self.metrics_fh.flush()
        if self.trackers is not None:
            self.trackers.log(row)

    def header(self, counts: dict, frozen: list[str], len_loader: int, start_step: int, resume_from) -> None:
        self(L.TRAIN_TOTAL_PARAMS.format(n=counts["total"], m=counts["total"] / 1e6))
        self(L.TRAIN_TRAINABLE_PARAMS.format(n=counts["trainable"], m=counts["trainable"] / 1e6))
        self(L.TRAIN_FROZEN_PARAMS.format(n=counts["frozen"], m=counts["frozen"] / 1e6))
        self(L.TRAIN_RATIO.format(pct=100.0 * counts["trainable"] / max(1, counts["total"])))
        if frozen:
            self(L.TRAIN_FROZEN_MODULES.format(modules=", ".join(frozen)))
        self(L.TRAIN_RUNNING)
        self(L.TRAIN_TOTAL_STEPS.format(n=self.cfg.steps))
        self(L.TRAIN_PER_DEVICE_BATCH.format(n=self.cfg.batch_size))
        self(L.TRAIN_DATALOADER_LEN.format(n=len_loader))
        if start_step:
            self(L.TRAIN_RESUMED.format(path=resume_from, step=start_step))

    def step(self, step: int, parts: dict[str, float], lr: float, grad_norm: float, wait: float, total: float) -> None:
        cfg, w = self.cfg, self.window
        loss = parts["total_loss"]
        w["wait"] += wait
        w["total"] += total
        w["samples"] += self.step_samples
        w["loss"].append(loss)
        self.total_wait += wait
        self.total_time += total
        self.losses.append((step, loss))
        if self.bar:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        if cfg.log_freq and (step % cfg.log_freq == 0 or step == cfg.steps):
            shown = {k: round(v, 6) for k, v in parts.items()}
            self(
                L.TRAIN_STEP_LOSS.format(
                    run_id=self.run_id,
                    step=step,
                    losses={**shown, "learning_rate": lr, "grad_norm": round(grad_norm, 6)},
                )
            )
            row = {
                "step": step,
                "loss": loss,
                "loss_mean": float(np.mean(w["loss"])),
                "lr": lr,
                "grad_norm": grad_norm,
                "samples_per_s": w["samples"] / max(w["total"], 1e-9),
                "data_wait_share": w["wait"] / max(w["total"], 1e-9),
                "epoch": step * self.step_samples / self.n_train,
                "time": time.time(),
                **(self.sampler.sample() if self.sampler else {}),
            }
            self.metrics(row)
            if self.main:
                self.rows.append(row)
            self.window = {"wait": 0.0, "total": 0.0, "samples": 0, "loss": []}

    def close_bar(self) -> None:
        if self.bar:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        self.close_bar()
        for fh in (self.fh, self.metrics_fh):
            if fh:
                fh.close()
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None
