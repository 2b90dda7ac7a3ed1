"""The main job: the CPU chain end to end, record -> train -> evaluate -> promote.

``python -m tutorial_utils pipeline`` (``make main-job``; part of ``make book``) runs each stage
as a job notebook through :func:`tutorial_utils.jobs.run_notebook` with ``reuse=True``: a stage
whose run already finished with the same parameters is not run again, so a second
``make book`` only rebuilds what changed. The stages' outputs are promoted into this build's
copy, ``_build/promoted/{logs,assets}`` (git-ignored), which the chapters prefer to the reference
shipped in ``logs/`` and ``assets/``; ``--reference`` (maintainers) promotes into the reference.

The recording starts at init state 10 (``record_demos.md``'s ``ci`` and ``cpu`` defaults) and the
evaluation runs trial ``k`` of each task from init state ``k``: the evaluated starts are held out,
and the promoted results say how many of them a demonstration started from (none).

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
        lambda ctx: {"policy": ctx["policy"], "checkpoint": ctx["checkpoint"]},
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


def demonstrated(eval_run: str | os.PathLike, dataset: str | os.PathLike) -> dict[str, Any] | None:
    """How an evaluation's starts meet the recording: the recording's episodes and init states, the
    evaluated (task, init state) starts and how many of them a demonstration started from. None
    when the dataset has no recording manifest (synthetic data)."""
    from tutorial_utils.sim.record import read_manifest

    results_file = Path(eval_run) / "results.json"
    man = read_manifest(Path(dataset)) if (Path(dataset) / "meta").is_dir() else None
    if not man or not results_file.is_file():
        return None
    results = json.loads(results_file.read_text(encoding="utf-8"))
    starts = {(int(e["task_id"]), int(e["init_state"])) for e in man.get("episodes", [])}
    evaluated = {
        (int(t["task_id"]), int(ep["init_state"]))
        for t in results.get("tasks", [])
        for ep in t.get("episodes", [])
        if ep.get("init_state") is not None
    }
    inits = sorted({i for _, i in starts})
    return {
        "episodes": len(starts),
        "init_states": [inits[0], inits[-1]] if inits else [],
        "eval_pairs": len(evaluated),
        "eval_pairs_seen": len(evaluated & starts),
    }


def promote(ctx: dict[str, Any], reference: bool = False) -> list[Path]:
    """Copy the chain's small real outputs (the stage modules do it) into this build's copy,
    ``_build/promoted/`` (git-ignored), or with ``reference=True`` into the shipped ``logs/`` and
    ``assets/``: the recorded dataset's card and its first episode's two videos, the training
    run's logs, the evaluation's results (with how many evaluated starts were demonstrated), logs
    and a rollout video; and a provenance stamp per file (``promoted.json``)."""
    from tutorial_utils.report import promote as P
    from tutorial_utils.report import provenance

    prefixes = PROMOTE_PREFIXES.get(ctx["profile"])
    if prefixes is None:
        print(f"[pipeline] profile {ctx['profile']!r}: smoke-sized runs are not promoted")
        return []
    logs_dir, assets_dir = P.destinations(reference)
    logs_dir.mkdir(parents=True, exist_ok=True)
    assets_dir.mkdir(parents=True, exist_ok=True)
    dataset = ctx.get("dataset")
    stamped: dict[str, dict] = {}

    def _stamp(files, run, kind):
        st = provenance.stamp(run, dataset, stage=kind, profile=ctx["profile"])
        for f in files:
            f = Path(f)
            stamped[f"{'logs' if f.parent == logs_dir else 'assets'}/{f.name}"] = st
        return [Path(f) for f in files]

    out: list[Path] = []
    if dataset:
        wall = next((t["run_s"] for t in ctx.get("timings", []) if t["stage"] == "record"), None)
        card = logs_dir / f"{prefixes['record']}dataset.json"
        P.dataset_card(dataset, out=card, wall_s=wall)
        clip = P.recording_episode(dataset, 0, assets_dir=assets_dir, prefix=f"{prefixes['record']}episode")
        files = [card, assets_dir / f"{prefixes['record']}episode.json"]
        out += _stamp(files + [assets_dir / clip[k] for k in ("primary", "wrist")], ctx.get("record_run"), "record")
    if ctx.get("train_run"):
        out += _stamp(
            P.training(ctx["train_run"], prefix=prefixes["train"], logs_dir=logs_dir).values(),
            ctx["train_run"],
            "train",
        )
    if ctx.get("eval_run"):
        demos = demonstrated(ctx["eval_run"], dataset) if dataset else None
        files = P.evaluation(
            ctx["eval_run"],
            logs_dir=logs_dir,
            assets_dir=assets_dir,
            prefix=prefixes["evaluate"],
            extra={"demonstrations": demos} if demos else None,
        ).values()
        out += _stamp(files, ctx["eval_run"], "evaluate")
    if stamped:
        out.append(provenance.write_stamps(stamped, reference=reference))
    return out


def recorded_dataset() -> tuple[Path | None, str | None]:
    """(folder, the file that named it) of the demonstrations the main job recorded, or
    (None, None) when there is none: first the promoted dataset card in ``logs/``, then the
    chain's ``runs/pipeline.json``; a folder counts only while it still holds a dataset."""
    import json

    from tutorial_utils.report import provenance

    found = []
    if (card := provenance.find_optional("logs/record_dataset.json")) is not None:
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
    ap.add_argument(
        "--reference",
        action="store_true",
        help="promote into logs/ and assets/, the reference shipped with the book (maintainers; "
        "by default the chain promotes into _build/promoted/, which git ignores)",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        ctx = run(until=args.until, echo=not args.quiet)
    except (jobs.JobError, jobs.JobFailed, RuntimeError) as exc:
        print(f"pipeline failed: {exc}", file=sys.stderr)
        return 1
    if not args.no_promote and args.until in (None, STAGES[-1].name):
        for p in promote(ctx, reference=args.reference):
            print(f"[pipeline] promoted {p.relative_to(paths.REPO) if p.is_relative_to(paths.REPO) else p}")
    summary = paths.RUNS / "pipeline.json"
    from tutorial_utils.io import atomic_write_json

    atomic_write_json(summary, ctx)
    print(json.dumps(ctx["timings"]))
    return 0
