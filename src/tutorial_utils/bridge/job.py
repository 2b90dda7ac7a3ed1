"""The job notebooks' ``backend="dit4dit"``: their parameters mapped onto the bridge.

``notebooks/jobs/train.md`` and ``evaluate.md`` collect one set of parameters (their config
class plus :class:`~tutorial_utils.bridge.commands.BackendParams`); ``train/job.py`` and
``evaluate/chain.py`` hand them here when ``backend == "dit4dit"``. Upstream runs inside the job's
own run directory (``run_root_dir`` = its parent, ``run_id`` = its name), so both backends leave
the same files there: ``train.log`` or ``server.log`` + ``eval_<suite>.log``, ``status.json``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from tutorial_utils.bridge.commands import OFFICIAL_FREEZE, BridgeConfig
from tutorial_utils.errors import ConfigError


def _base(run_dir: str | os.PathLike, params: dict[str, Any]) -> dict[str, Any]:
    rd = Path(run_dir).resolve()
    return {
        "checkout": params.get("checkout") or "",
        "models_dir": params.get("models_dir") or "",
        "data_dir": params.get("data_dir") or "",
        "runs_dir": os.fspath(rd.parent),
        "run_id": rd.name,
        "model_python": params.get("model_python") or "python",
        "accelerate": params.get("accelerate") or "",
        "libero_home": params.get("libero_home") or "",
        "num_processes": int(params.get("num_processes") or 1),
    }


def _dataset(dataset: str, kw: dict[str, Any], smoke: bool) -> str:
    """The upstream dataset folder for the train job's ``dataset``. The smoke test needs none
    named: the book's own datasets (``synthetic``, the profile's recordings) are not upstream's
    LeRobot downloads, so a name that is not a folder under ``data_dir`` means the bridge's default."""
    default = BridgeConfig.__dataclass_fields__["dataset"].default
    data_dir = Path(kw["data_dir"]).expanduser() if kw["data_dir"] else None
    named = bool(dataset) and dataset != "synthetic"
    if named and (os.sep in dataset or (data_dir is not None and (data_dir / dataset).is_dir())):
        return dataset
    if smoke:
        if named:
            print(
                f"dataset {dataset!r} is not a folder under data_dir={kw['data_dir']!r}: the smoke test uses {default}"
            )
        return default
    raise ConfigError(
        f"dataset={dataset!r}: the dit4dit backend trains on a downloaded LeRobot dataset, and "
        f"{dataset!r} is not a folder under data_dir={kw['data_dir']!r}. Pass its folder name under data_dir "
        f"(-p dataset {default}) or its path; -p smoke True runs the 2-step smoke test on {default}."
    )


def train_config(run_dir: str | os.PathLike, params: dict[str, Any]) -> tuple[BridgeConfig, bool]:
    """(the bridge config, smoke?) for the train job's parameters (TrainConfig names). ``smoke``
    (or ``steps`` <= 2) is the 2-step smoke test at batch 1 whatever the profile's sizes."""
    from tutorial_utils import params as P

    kw = _base(run_dir, params)
    smoke = bool(params.get("smoke")) or int(params.get("steps") or 2) <= 2
    dataset = _dataset(str(params.get("dataset") or ""), kw, smoke)
    if os.sep in dataset:
        p = Path(dataset).expanduser().resolve()
        kw["data_dir"], dataset = os.fspath(p.parent), p.name
    steps = 2 if smoke else int(params.get("steps") or 2)
    freeze = str(params.get("freeze_modules") or "")
    freeze = {"": OFFICIAL_FREEZE, "backbone": "backbone_interface"}.get(freeze, freeze)
    save = int(params.get("save_freq") or 0)
    kw.update(
        dataset=dataset,
        steps=steps,
        batch_size=1 if smoke else int(params.get("batch_size") or 1),
        logging_frequency=1 if smoke else max(1, int(params.get("log_freq") or 1)),
        save_interval=save or None,
        freeze_modules=freeze,
        pretrained_checkpoint=str(params.get("pretrained_checkpoint") or ""),
    )
    cfg = P.from_mapping(BridgeConfig, kw, "`python -m tutorial_utils bridge commands --help`")
    return cfg, smoke


def train_job(run_dir: str | os.PathLike, **params: Any) -> dict[str, Any]:
    """Run the upstream training step in ``run_dir``; returns the step's record plus the parsed
    loss lines (``steps``: ``[{step, losses}]``)."""
    from tutorial_utils import logs
    from tutorial_utils.bridge import run
    from tutorial_utils.bridge.commands import TRAIN_LOG

    cfg, smoke = train_config(run_dir, params)
    out = run.train(cfg, smoke=smoke, echo=True)
    parsed = logs.parse_train_log(Path(run_dir) / TRAIN_LOG)
    out["steps"] = parsed["steps"]
    out["batch_size"] = cfg.batch_size
    return out


def eval_config(run_dir: str | os.PathLike, params: dict[str, Any]) -> tuple[BridgeConfig, str]:
    """(the bridge config, client) for the evaluate job's parameters (EvalConfig names). The
    client is upstream's ``eval_libero.py`` when ``libero_python`` is given, else this project's."""
    from tutorial_utils import params as P
    from tutorial_utils.bridge import run
    from tutorial_utils.bridge.commands import RELEASED_CHECKPOINT

    kw = _base(run_dir, params)
    libero_python = str(params.get("libero_python") or "")
    ckpt = str(params.get("checkpoint") or "")
    if ckpt and Path(ckpt).expanduser().is_dir():  # a run directory: its final model
        ckpt = os.fspath(Path(ckpt).expanduser() / "final_model" / "pytorch_model.pt")
    if not ckpt and kw["models_dir"]:
        ckpt = os.fspath(Path(kw["models_dir"]).expanduser() / RELEASED_CHECKPOINT)
    kw.update(
        libero_python=libero_python or "python",
        checkpoint=ckpt,
        suite=str(params.get("suite") or "libero_spatial"),
        trials=1 if params.get("smoke") else int(params.get("trials_per_task") or 1),
        task_ids=str(params.get("task_ids") or "all"),
        port=int(params.get("port") or 0) or run.free_port(),
    )
    cfg = P.from_mapping(BridgeConfig, kw, "`python -m tutorial_utils bridge commands --help`")
    return cfg, ("upstream" if libero_python else "ours")


def eval_job(run_dir: str | os.PathLike, **params: Any) -> dict[str, Any]:
    """Upstream's server and a LIBERO client in ``run_dir``; returns the step's record with
    ``results`` (``results.json`` from this project's client, else the totals of upstream's log)."""
    import json

    from tutorial_utils import logs
    from tutorial_utils.bridge import run
    from tutorial_utils.bridge.commands import eval_log_name

    cfg, client = eval_config(run_dir, params)
    out = run.evaluate(cfg, client=client, echo=True, client_python=sys.executable)
    results_json = Path(run_dir) / "results.json"
    if results_json.is_file():
        out["results"] = json.loads(results_json.read_text())
        return out
    ev = logs.parse_eval_log(Path(run_dir) / eval_log_name(cfg.suite))
    n, wins = int(ev.get("episodes") or 0), int(ev.get("successes") or 0)
    per_task = max(1, cfg.trials)
    out["results"] = {
        "client": "upstream eval_libero.py",
        "finished": ev.get("total_rate") is not None,
        "total_episodes": n,
        "total_successes": wins,
        "success_rate": ev.get("total_rate"),
        "tasks": [],
        # upstream runs every task of the suite in order, trials_per_task episodes each
        "pairs": [[t, k] for t in range(n // per_task) for k in range(per_task)],
    }
    return out
