"""The job entry points: each job notebook's config classes and extra parameters.

A job notebook under ``notebooks/jobs/`` names its entry here in its front matter, and nothing
else (``tutorial_job: train``). An entry holds ``"module:attribute"`` strings, resolved when a
job is read or run (:func:`resolve`), so this plumbing module imports no stage:

- ``configs``: the job's config classes, in order. Its ``parameters`` cell is generated from them
  (:func:`tutorial_utils.jobs.parameters.generated_parameters`, ``python -m tutorial_utils job
  params --write``) and a ``-p NAME null`` is checked against their types;
- ``extra_parameters`` (optional): a function that, given the job's parameters (defaults and
  overrides merged), returns ``{name: default}`` of the parameters the job takes beyond its
  ``parameters`` cell (the train job: the chosen family's own). It may carry
  ``explain(unknown, params)`` for the error about a name it does not take.

``JOBS`` is a literal: ``tests/test_layout.py`` reads it with :mod:`ast` and checks each target
as an import edge from plumbing into a stage, which an import graph cannot see; and
``tests/test_jobs_parameters.py`` checks that each job notebook names its entry.
"""

from __future__ import annotations

import importlib
from typing import Any

from tutorial_utils.jobs.records import JobError

#: job (its notebook's name under notebooks/jobs/) -> its entry points, as "module:attribute" strings
JOBS: dict[str, dict[str, Any]] = {
    "download": {"configs": ("tutorial_utils.hub.job:DownloadConfig",)},
    "evaluate": {
        "configs": ("tutorial_utils.evaluate.loop:EvalConfig", "tutorial_utils.bridge.commands:BackendParams")
    },
    "record_demos": {"configs": ("tutorial_utils.sim.record:RecordConfig",)},
    "sweep": {"configs": ("tutorial_utils.experiments.sweep:SweepConfig",)},
    "train": {
        "configs": ("tutorial_utils.train.config:TrainConfig", "tutorial_utils.bridge.commands:BackendParams"),
        "extra_parameters": "tutorial_utils.train.job:family_parameters",
    },
    "zoo": {"configs": ("tutorial_utils.experiments.zoo:ZooConfig",)},
}


def entry(job: Any) -> dict[str, Any]:
    """The entry of ``job`` (what a job notebook's front matter ``tutorial_job:`` names)."""
    if isinstance(job, str) and job in JOBS:
        return JOBS[job]
    raise JobError(
        f"`tutorial_job: {job!r}` in the notebook's front matter names no job of tutorial_utils.jobs.registry.JOBS "
        f"({', '.join(JOBS)}). Fix: the front matter names the job only (`tutorial_job: train`); its config "
        "classes and extra parameters are listed in JOBS (add a new job there)."
    )


def resolve(ref: str) -> Any:
    """The object a ``"module:attribute"`` string names (the module is imported now)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)
