"""runs.evaluation: chosen checkpoints of a run evaluated in LIBERO on the same episodes, their
success rates (with Wilson intervals) recorded in the run and listed beside the validation metrics."""

from __future__ import annotations

import pytest
import torch

from helpers import TINY_MLP_RUN
from tutorial_utils.errors import ConfigError
from tutorial_utils.runs import checkpoints as rck
from tutorial_utils.runs import evaluation
from tutorial_utils.runs.cli import main as runs_cli
from tutorial_utils.train.checkpoints import CheckpointNotFound
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source
from tutorial_utils.train.loop import train

torch.set_num_threads(1)

TINY = {**TINY_MLP_RUN, "steps": 8, "log_freq": 2}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    out = runs / "tiny"
    train(TrainConfig.from_overrides({**TINY, "output_dir": str(out)}), source=synthetic_source(4, 12, image_size=16))
    return runs, out


def test_bad_requests_fail_before_any_evaluation(trained):
    runs, run = trained
    with pytest.raises(CheckpointNotFound):
        evaluation.evaluate_checkpoints(run, ["last", "step_999999"])
    with pytest.raises(ConfigError, match="policy= is set from each checkpoint"):
        evaluation.evaluate_checkpoints(run, ["last"], policy="zero")
    with pytest.raises(ConfigError, match="no checkpoint to evaluate"):
        evaluation.evaluate_checkpoints(run, [])


@pytest.mark.libero
@pytest.mark.slow
def test_two_checkpoints_evaluated_in_libero_and_listed_with_intervals(trained, capsys):
    runs, run = trained
    rc = runs_cli(
        ["--runs-dir", str(runs), "evaluate", str(run), "step_000004", "last", "step_000008"]
        + ["--set", "task_ids=0", "trials_per_task=1", "max_steps=15", "num_steps_wait=2", "env_image_size=64"]
    )
    assert rc in (0, None)
    printed = capsys.readouterr().out
    assert "step_000004" in printed and "95% CI" in printed
    assert len(printed.strip().splitlines()) == 3  # header + 2: `last` and step_000008 are one checkpoint
    listed = {r["name"]: r for r in rck.list_checkpoints(run)}
    for name in ("step_000004", "step_000008"):  # `last` resolves to the newest step
        row = listed[name]
        assert row["episodes"] == 1 and row["successes"] in (0, 1)
        lo, hi = row["ci95"]
        assert 0.0 <= lo <= row["success_rate"] <= hi <= 1.0 and hi - lo > 0.5  # one episode says little
