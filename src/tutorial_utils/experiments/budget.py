"""A family's CPU budget turned into training steps: time a minute of it through the real trainer
(:func:`calibrate`) on a quiet machine (:func:`settle`) and pay its slow start (:func:`budget_minutes`), or time a family at its default size on
synthetic frames (:func:`time_family`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tutorial_utils.experiments.catalog import timing_overrides


def time_family(
    name: str, steps: int = 3, batch_size: int = 8, overrides: dict | None = None, round_trips: bool = False
) -> dict[str, Any]:
    """Time ``steps`` training steps (forward, backward, AdamW) of family ``name`` at its default
    config (plus ``overrides``) on synthetic frames of its image size, and ``predict`` on one
    observation. The first step is a warm-up and not counted. Returns parameters (M), image
    size, action horizon, seconds per step, samples/s, predict seconds, build seconds and, with
    ``round_trips``, the p50 of requests through a websocket policy server serving the model."""
    import numpy as np
    import torch

    from tutorial_utils import policies
    from tutorial_utils.train.data import WindowDataset, collate, synthetic_source

    t0 = time.perf_counter()
    overrides = dict(overrides or {})
    cfg = policies.family(name).config_class
    size = int(overrides.get("image_size", cfg().image_size))
    src = synthetic_source(n_episodes=4, length=24, image_size=size)
    model = policies.make(name, overrides or None, src.statistics)
    build_s = time.perf_counter() - t0
    windows = model.training_source(src) if hasattr(model, "training_source") else src  # the family's own windows
    ds = WindowDataset(windows, np.arange(len(src)), model.action_horizon, model.image_size)
    rng = np.random.default_rng(0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    times = []
    for step in range(steps + 1):
        batch = collate([ds[int(i)] for i in rng.choice(len(src), batch_size)])
        t = time.perf_counter()
        out = model(batch, torch.Generator().manual_seed(step))
        opt.zero_grad(set_to_none=True)
        out["total_loss"].backward()
        opt.step()
        if step:
            times.append(time.perf_counter() - t)
    one = collate([ds[0]])
    model.predict(one, generator=torch.Generator().manual_seed(0))  # warm-up
    lat = []
    for k in range(3):
        t = time.perf_counter()
        model.predict(one, generator=torch.Generator().manual_seed(k))
        lat.append(time.perf_counter() - t)
    rt = server_round_trips(model, one) if round_trips else []
    step_s = float(np.median(times))
    return {
        "family": name,
        "params_m": round(model.parameter_counts()["total"] / 1e6, 2),
        "image_size": model.image_size,
        "action_horizon": model.action_horizon,
        "s_per_step": round(step_s, 4),
        "samples_per_s": round(batch_size / step_s, 2),
        "predict_s": round(float(np.median(lat)), 4),
        "build_s": round(build_s, 1),
        "round_trip_ms_p50": round(float(np.median(rt)), 1) if rt else None,
    }


def server_round_trips(model, batch, n: int = 5) -> list[float]:
    """Milliseconds of ``n`` requests (after one warm-up) to a policy server serving ``model``,
    sent as the LIBERO client sends them (openpi keys, the policy's image size)."""
    from tutorial_utils.report.platform import openpi_observation
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.server import ServerThread

    obs = openpi_observation(batch, 0)
    out = []
    with ServerThread(model.serving_policy()) as srv, PolicyClient(port=srv.port, connect_timeout=30) as client:
        client.infer(obs)
        for _ in range(n):
            t = time.perf_counter()
            client.infer(obs)
            out.append((time.perf_counter() - t) * 1000.0)
    return out


#: how long :func:`calibrate` trains a family before it reads the rate: a first stretch of 30 steps
#: timed the start, not the training (the zoo of 2026-12-05 gave mini 4310 steps for 10 minutes at the
#: 30-step rate of 115 samples/s; its steps then ran at about 200 and ended after 6.4 minutes, while
#: the slower families, whose start is a smaller share of a step, used 86 to 94% of theirs)
CALIBRATE_S = 60.0


def calibrate(
    name: str,
    dataset: str,
    batch_size: int,
    num_workers: int,
    seconds: float = CALIBRATE_S,
    log_freq: int = 5,
    max_steps: int = 100_000,
) -> dict[str, Any]:
    """Seconds per training step of family ``name`` on ``dataset`` as the train job will run it
    (the real trainer, data loader and workers, on this machine now), from ``seconds`` of training
    (the trainer's own time limit) in a temporary folder. The start of a training is slow (threads,
    allocator, the first decoding of each episode's video): the rate is the median of the logged
    windows of the second half of the steps, and ``start_s`` is what the whole run took beyond
    its steps at that rate, which a budget pays once (:func:`budget_minutes`). Also returns the
    load average before it started."""
    import statistics
    import tempfile

    from tutorial_utils.io import read_jsonl
    from tutorial_utils.train.checkpoints import METRICS_FILE
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.job import resolve_dataset
    from tutorial_utils.train.loop import train

    load = load_average()
    with tempfile.TemporaryDirectory(prefix=f"zoo-calibrate-{name}-") as tmp:
        root = resolve_dataset(dataset, tmp)
        cfg = TrainConfig.from_overrides(
            {
                "policy": name,
                "dataset": str(root),
                "output_dir": str(Path(tmp) / "run"),
                "steps": max_steps,
                "time_limit_min": seconds / 60.0,
                "batch_size": batch_size,
                "num_workers": num_workers,
                "eval_freq": 0,
                "log_freq": log_freq,
                "save_checkpoint": False,
                "progress": False,
                **{f"policy.{k}": v for k, v in timing_overrides(name).items()},
            }
        )
        t0 = time.perf_counter()
        train(cfg)
        wall = time.perf_counter() - t0
        windows = [
            (r["step"], r["samples_per_s"])
            for r in read_jsonl(Path(tmp) / "run" / METRICS_FILE)
            if "samples_per_s" in r
        ]
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text(encoding="utf-8"))
    if len(windows) < 4:
        raise RuntimeError(
            f"calibrating {name}: {len(windows)} metrics windows in {seconds:g} s; "
            "give it more seconds or a smaller log_freq (the rate is read from the second half of at least 4 windows)"
        )
    steps, train_s = int(summary["steps_done"]), float(summary["wall_s"])  # the loop's own clock, as a budget's
    s_per_step = batch_size / statistics.median(rate for _, rate in windows[len(windows) // 2 :])
    return {
        "s_per_step": round(s_per_step, 4),
        "steps": steps,
        "wall_s": round(wall, 1),
        "start_s": round(max(0.0, train_s - steps * s_per_step), 1),
        "load": load,
    }


def budget_minutes(timing: dict[str, Any], minutes: float) -> float:
    """The minutes of a budget left for steps at the calibrated rate once a training's slow start
    (``timing["start_s"]`` from :func:`calibrate`) is paid; at least a tenth of the budget."""
    return max(0.1 * minutes, minutes - float(timing.get("start_s") or 0.0) / 60.0)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


#: the zoo times a family only once the 1-minute load is below this share of the cores, or after
#: :data:`SETTLE_MAX_S`: on 2 cores, steps timed while the previous family's evaluation was still
#: ending ran up to four times slower than the same steps a minute later (TD-MPC: 1.09 against 0.27 s)
SETTLE_LOAD_SHARE = 0.5
SETTLE_MAX_S = 120.0


def settle(max_s: float = SETTLE_MAX_S, share: float = SETTLE_LOAD_SHARE, poll_s: float = 5.0, sleep=time.sleep):
    """Wait until the machine is quiet enough to time steps (the 1-minute load below ``share`` of
    the cores) or ``max_s`` passed. Returns ``(load before, load after, seconds waited)``."""
    before = load_average()
    waited = 0.0
    limit = share * (os.cpu_count() or 1)
    while waited < max_s and (load_average() or 0.0) >= limit:
        sleep(poll_s)
        waited += poll_s
    return before, load_average(), waited
