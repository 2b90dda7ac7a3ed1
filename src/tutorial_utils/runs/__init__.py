"""tutorial_utils.runs: the training platform over run directories, one API behind the notebooks,
the CLI (``python -m tutorial_utils runs ...``) and the widgets.

- :mod:`~tutorial_utils.runs.registry`: ``list_runs`` (id, job, state running / paused / stopped /
  finished / failed / stale / created, step/total, best metric, wall time, size on disk),
  ``show``, ``copy`` (a new run with the same parameters plus overrides), ``start``, ``delete``
  (refuses a running run, reports the bytes freed), ``read_metrics`` (skips broken lines);
- :mod:`~tutorial_utils.runs.control`: ``stop`` and ``pause`` (a command in ``control.json`` the
  training loop polls once per step), ``resume`` (exact; from any ``step_*``; with parameter
  changes from an allow-list, recorded in ``train_config.json``), ``rollback`` (a new run forked
  from a checkpoint, the old run untouched);
- :mod:`~tutorial_utils.runs.checkpoints`: ``list_checkpoints`` (name, step, time, size,
  validation metrics, evaluated success rate with a Wilson interval), ``mark_best``, ``prune``
  (keep-last-N, never ``last`` nor ``best``);
- :mod:`~tutorial_utils.runs.export`: ``export`` (a self-contained, verified bundle that is also a
  checkpoint directory: ``serve --checkpoint BUNDLE`` serves it) and ``verify``.

A run is a directory: a job run (``status.json`` written by :mod:`tutorial_utils.jobs`), a
training run (``train_config.json``, see :mod:`tutorial_utils.train.loop`) or both (the train
job), or a copy not started yet (``copy.json``). ``run`` arguments take a path or a run id under
the runs directory (``TUTORIAL_RUNS_DIR``, default ``runs/``).
"""
