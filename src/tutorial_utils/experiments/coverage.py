"""How a recording meets an evaluation: which init states the demonstrations start from and how
many evaluated episodes start where a demonstration started (:func:`demonstrations`)."""

from __future__ import annotations

import json
from typing import Any

from tutorial_utils import paths


def demonstrations(dataset: str, suite: str, task_ids: str, trials_per_task: int) -> dict[str, Any] | None:
    """What the families learn from, and how it meets the evaluation: the dataset's episodes and,
    from its ``meta/record_manifest.json`` (datasets the record job wrote), the
    demonstrations per task, the init states they start from, and how many of the evaluated
    (task, init state) pairs a demonstration started from (trial ``k`` of a task is evaluated from
    its init state ``k``). None for the synthetic dataset."""
    if dataset == "synthetic":
        return None
    from collections import Counter

    from tutorial_utils.evaluate.loop import EvalConfig
    from tutorial_utils.evaluate.parallel import resolve_task_ids
    from tutorial_utils.sim.record import read_manifest
    from tutorial_utils.train.job import resolve_dataset

    root = resolve_dataset(dataset, paths.RUNS)  # a name or a path: run_dir is only used for synthetic
    info = json.loads((root / "meta" / "info.json").read_text(encoding="utf-8"))
    out: dict[str, Any] = {"episodes": info.get("total_episodes")}
    manifest = read_manifest(root)
    if not manifest:
        return out
    pairs = {
        (int(e["task_id"]), int(e["init_state"]))
        for e in manifest.get("episodes", [])
        if e.get("success") and e.get("episode_index") is not None
    }
    if not pairs:
        return out
    per_task = Counter(t for t, _ in pairs)
    inits = sorted({i for _, i in pairs})
    tasks = resolve_task_ids(EvalConfig(suite=suite, task_ids=task_ids))
    evaluated = {(t, k) for t in tasks for k in range(int(trials_per_task))}
    out.update(
        per_task_min=min(per_task.values()),
        per_task_max=max(per_task.values()),
        init_states=[inits[0], inits[-1]],
        eval_pairs=len(evaluated),
        eval_pairs_seen=len(evaluated & pairs),
    )
    return out
