"""Experiments beside the pipeline: the model zoo's comparison and its positive controls
(:mod:`.zoo`, the ``zoo`` job), the sweep (:mod:`.sweep`), the catalogue of families
(:mod:`.catalog`), turning a CPU budget into steps (:mod:`.budget`), how a recording meets an
evaluation (:mod:`.coverage`) and SmolVLA's smoke test (:mod:`.smolvla_smoke`). Their tables and
figures are in :mod:`tutorial_utils.report.zoo_tables`."""
