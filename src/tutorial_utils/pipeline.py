"""The main job: the CPU chain end to end, record -> train -> evaluate -> promote.

``python -m tutorial_utils pipeline`` (``make main-job``; part of ``make book``) runs each stage
as a job notebook through :func:`tutorial_utils.jobs.run_notebook` with ``reuse=True``: a stage
whose run already finished with the same parameters is not run again, so a second
``make book`` only rebuilds what changed. The stages' outputs are promoted into ``logs/`` and
``assets/`` for the chapters to embed.

The profile is ``TUTORIAL_PROFILE`` (``make book`` runs the chain in ``cpu`` by default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import jobs, paths, profiles


@dataclass
class Stage:
    name: str
    notebook: str
    #: parameters from the outputs of earlier stages (``ctx``) and the profile
    params: Callable[[dict[str, Any]], dict[str, Any]]
    #: what the next stages need, read from the finished run
    outputs: Callable[[Path, dict[str, Any]], dict[str, Any]]


def _record_outputs(run_dir: Path, status: dict) -> dict:
    signs = status.get("success_signs") or {}
    if not signs.get("dataset"):
        raise RuntimeError(f"{run_dir}/status.json names no dataset: the recording job did not finish its check cell")
    return {"dataset": signs["dataset"]}


def _train_outputs(run_dir: Path, status: dict) -> dict:
    tr = status.get("train") or {}
    ckpt = tr.get("best_checkpoint") or tr.get("last_checkpoint")
    if not ckpt or not Path(ckpt).is_dir():
        raise RuntimeError(f"{run_dir}: the training run left no checkpoint (status.json train.best_checkpoint)")
    return {"checkpoint": ckpt, "policy": tr.get("policy") or "mini", "train_run": os.fspath(run_dir)}


def _eval_outputs(run_dir: Path, status: dict) -> dict:
    return {"eval_run": os.fspath(run_dir)}


STAGES: list[Stage] = [
    Stage("record", "record_demos.md", lambda ctx: {}, _record_outputs),
    Stage("train", "train.md", lambda ctx: {"dataset": ctx["dataset"]}, _train_outputs),
    Stage(
        "evaluate",
        "evaluate.md",
        lambda ctx: {
            "policy": ctx["policy"],
            "checkpoint": ctx["checkpoint"],
            "trials_per_task": profiles.pick(ci=1, cpu=2, gpu=50),
        },
        _eval_outputs,
    ),
]


def run(stages: list[Stage] | None = None, until: str | None = None, echo: bool = True) -> dict[str, Any]:
    """Run the chain; returns the context (dataset, checkpoint, run dirs) and a timing table."""
    ctx: dict[str, Any] = {"profile": profiles.current(), "timings": []}
    for stage in stages or STAGES:
        params = stage.params(ctx)
        t0 = time.time()
        print(f"[pipeline] {stage.name}: {stage.notebook} {params or ''}", flush=True)
        res = jobs.run_notebook(paths.JOBS / stage.notebook, params, reuse=True, echo=echo)
        status = jobs.read_status(res.run_dir)
        ctx.update(stage.outputs(res.run_dir, status))
        ctx[f"{stage.name}_run"] = os.fspath(res.run_dir)
        ctx["timings"].append(
            {"stage": stage.name, "reused": res.reused, "run_s": res.wall_s, "this_call_s": round(time.time() - t0, 1)}
        )
        print(
            f"[pipeline] {stage.name}: {'reused' if res.reused else 'ran'} {res.run_dir.name} ({res.wall_s:.0f} s)",
            flush=True,
        )
        if until == stage.name:
            break
    return ctx


#: where each profile's chain is promoted (the chapters read the ``cpu`` files); a ``ci`` chain
#: is a smoke run of the machinery and is not promoted.
PROMOTE_PREFIXES = {
    "cpu": {"record": "record_", "train": "train_cpu_", "evaluate": "eval_mini_"},
    "gpu": {"record": "record_gpu_", "train": "train_gpu_", "evaluate": "eval_mini_gpu_"},
}


def promote(ctx: dict[str, Any]) -> list[Path]:
    """Copy the chain's small real outputs into logs/ and assets/ (the stage modules do it):
    the recorded dataset's card and its first episode's two videos, the training run's logs,
    the evaluation's results, logs and a rollout video."""
    from tutorial_utils.report import promote as P

    prefixes = PROMOTE_PREFIXES.get(ctx["profile"])
    if prefixes is None:
        print(f"[pipeline] profile {ctx['profile']!r}: smoke-sized runs are not promoted into logs/ and assets/")
        return []
    out: list[Path] = []
    if ctx.get("dataset"):
        wall = next((t["run_s"] for t in ctx.get("timings", []) if t["stage"] == "record"), None)
        card = paths.LOGS / f"{prefixes['record']}dataset.json"
        P.dataset_card(ctx["dataset"], out=card, wall_s=wall)
        clip = P.recording_episode(ctx["dataset"], 0, prefix=f"{prefixes['record']}episode")
        out += [card, paths.ASSETS / f"{prefixes['record']}episode.json"]
        out += [paths.ASSETS / clip[k] for k in ("primary", "wrist")]
    if ctx.get("train_run"):
        out += list(P.training(ctx["train_run"], prefix=prefixes["train"]).values())
    if ctx.get("eval_run"):
        out += list(P.evaluation(ctx["eval_run"], prefix=prefixes["evaluate"]).values())
    return [Path(p) for p in out]


def recorded_dataset() -> tuple[Path | None, str | None]:
    """(folder, the file that named it) of the demonstrations the main job recorded, or
    (None, None) when there is none: first the promoted dataset card in ``logs/``, then the
    chain's ``runs/pipeline.json``; a folder counts only while it still holds a dataset."""
    import json

    found = []
    if (card := paths.LOGS / "record_dataset.json").is_file():
        found.append((json.loads(card.read_text())["summary"]["output_dir"], card))
    if (chain := paths.RUNS / "pipeline.json").is_file():
        found.append((json.loads(chain.read_text()).get("dataset") or "", chain))
    for where, source in found:
        folder = paths.from_book(where) if where else None
        if folder is not None and (folder / "meta" / "info.json").is_file():
            return folder, paths.for_book(str(source))
    return None, None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tutorial_utils pipeline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--until", choices=[s.name for s in STAGES], help="stop after this stage")
    ap.add_argument("--no-promote", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        ctx = run(until=args.until, echo=not args.quiet)
    except (jobs.JobError, jobs.JobFailed, RuntimeError) as exc:
        print(f"pipeline failed: {exc}", file=sys.stderr)
        return 1
    if not args.no_promote and args.until in (None, STAGES[-1].name):
        for p in promote(ctx):
            print(f"[pipeline] promoted {p.relative_to(paths.REPO) if p.is_relative_to(paths.REPO) else p}")
    summary = paths.RUNS / "pipeline.json"
    from tutorial_utils.io import atomic_write_json

    atomic_write_json(summary, ctx)
    print(json.dumps(ctx["timings"]))
    return 0
