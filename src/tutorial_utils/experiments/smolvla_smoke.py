"""LeRobot's SmolVLA, end to end through this project, on a local stand-in VLM (``zoo smolvla-smoke``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tutorial_utils import jobs, paths
from tutorial_utils.experiments.budget import server_round_trips
from tutorial_utils.io import atomic_write_json
from tutorial_utils.params import at_least_one
from tutorial_utils.policies.base import PolicyUnavailable

SMOLVLA_FILE = "smolvla_smoke.json"


def smolvla_smoke(
    run_dir: str | os.PathLike, dataset: str = "synthetic", steps: int = 4, batch_size: int = 2, chunk_size: int = 8
) -> dict[str, Any]:
    """LeRobot's SmolVLA, end to end through this project, on a stand-in VLM (random weights, toy
    size: :mod:`tutorial_utils.policies.smolvla`): write the stand-in with ``dataset``'s task
    instructions, train ``steps`` steps with the project's trainer on ``dataset``, load the last
    checkpoint, predict one chunk twice with the same seed (the reload must repeat it exactly),
    and serve it through the websocket policy server. Runs in the SmolVLA environment (the CLI
    ``zoo smolvla-smoke`` starts one). Writes and returns ``smolvla_smoke.json``."""
    import importlib.metadata

    import numpy as np
    import torch

    from tutorial_utils import policies
    from tutorial_utils.io import read_jsonl
    from tutorial_utils.policies import smolvla
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.data import WindowDataset, collate, open_dataset
    from tutorial_utils.train.job import prepare_metadata, resolve_dataset
    from tutorial_utils.train.loop import train

    at_least_one(steps=steps, batch_size=batch_size, chunk_size=chunk_size)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    root = resolve_dataset(dataset, run_dir)
    prepare_metadata(root)
    source = open_dataset(root, run_dir)
    size = int(source.image_shape[0])
    tasks = [r["task"] for r in read_jsonl(root / "meta" / "tasks.jsonl")]
    t0 = time.perf_counter()
    vlm = smolvla.write_standin(run_dir / "standin_vlm", tasks, image_size=size)
    model_cfg = {
        "policy": "smolvla",
        "policy.vlm_model_name": str(vlm),
        "policy.image_size": size,
        "policy.chunk_size": chunk_size,
        "policy.n_action_steps": chunk_size,
        "policy.num_steps": 4,
    }
    cfg = TrainConfig.from_overrides(
        {
            **model_cfg,
            "dataset": str(root),
            "output_dir": str(run_dir / "train"),
            "steps": steps,
            "batch_size": batch_size,
            "log_freq": 1,
            "eval_freq": 0,
            "save_freq": steps,
            "num_workers": 0,
            "seed": 0,
            "scheduler_warmup_steps": 0,  # a few steps: the learning rate LeRobot's SmolVLA recipe uses from the first
            "optimizer_lr": 1e-4,
        }
    )
    res = train(cfg)
    ckpt = res.summary.get("last_checkpoint")
    model = policies.load(ckpt)
    ds = WindowDataset(source, np.arange(len(source)), model.action_horizon, model.image_size)
    one = collate([ds[0]])
    first = model.predict(one, generator=torch.Generator().manual_seed(0))
    again = policies.load(ckpt).predict(one, generator=torch.Generator().manual_seed(0))
    rt = server_round_trips(model, one)
    counts = model.parameter_counts()
    out = {
        "kind": "smolvla_smoke",
        "stand_in": json.loads((vlm / smolvla.STANDIN_FILE).read_text()),
        "versions": {p: importlib.metadata.version(p) for p in ("lerobot", "transformers", "huggingface_hub", "torch")},
        "dataset": paths.for_book(os.fspath(root)),
        "params": counts,
        "steps_done": res.steps_done,
        "losses": [round(float(v), 5) for _, v in res.losses],
        "samples_per_s": res.summary.get("samples_per_s"),
        "checkpoint": paths.for_book(os.fspath(ckpt)),
        "chunk_shape": list(first.shape),
        "chunk_finite": bool(np.isfinite(first).all()),
        "reload_repeats": bool(np.array_equal(first, again)),
        "round_trip_ms_p50": round(float(np.median(rt)), 1),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    atomic_write_json(run_dir / SMOLVLA_FILE, out)
    return out


def run_smolvla_smoke(
    run_dir: str | os.PathLike, dataset: str = "synthetic", steps: int = 4, batch_size: int = 2
) -> dict[str, Any]:
    """:func:`smolvla_smoke` in this process when it can import SmolVLA, else in a child process
    with the SmolVLA environment (``.smolvla`` first on PYTHONPATH, the Hub offline), whose output
    streams through; returns ``smolvla_smoke.json``'s content."""
    import subprocess

    from tutorial_utils.policies import smolvla

    run_dir = Path(run_dir)
    problem = smolvla.transformers_problem()
    if problem is None:
        return smolvla_smoke(run_dir, dataset, steps, batch_size)
    if os.environ.get("TUTORIAL_SMOLVLA_CHILD"):  # the child could not import it either: say why, no loop
        raise PolicyUnavailable(problem)
    env = smolvla.environment() | {"TUTORIAL_SMOLVLA_CHILD": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "tutorial_utils",
        "zoo",
        "smolvla-smoke",
        "--run-dir",
        str(run_dir),
        "--dataset",
        dataset,
        "--steps",
        str(steps),
        "--batch-size",
        str(batch_size),
    ]
    print(
        f"[smolvla] in the SmolVLA environment (PYTHONPATH={smolvla.ENV_DIR.name}): {paths.for_book(str(run_dir))}",
        flush=True,
    )
    # its output passes through here, with this machine's folders written portably (a page shows it)
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        for line in proc.stdout:
            print(paths.for_book(line), end="", flush=True)
    rc = proc.returncode
    if rc != 0 or not (run_dir / SMOLVLA_FILE).is_file():
        raise PolicyUnavailable(f"the SmolVLA smoke test failed (exit status {rc}); its output is above")
    return json.loads((run_dir / SMOLVLA_FILE).read_text())


def smolvla_main(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir or jobs.ensure_run_dir("", "smolvla_smoke"))
    out = run_smolvla_smoke(run_dir, args.dataset, args.steps, args.batch_size)
    if not os.environ.get("TUTORIAL_SMOLVLA_CHILD"):
        print(json.dumps({k: v for k, v in out.items() if k not in ("stand_in", "losses")}))
    return 0 if out["chunk_finite"] and out["reload_repeats"] else 1
