"""tutorial_utils.runs.compare and best-by-metric (runs.checkpoints): the best/last table, the
parameter diff, seeds aggregated, the curves, the best (run, checkpoint) by a metric that is
lower-better or higher-better, and the bad inputs (an unknown metric, a run without metrics).

Three crafted runs (helpers.make_run writes the files the training loop writes)::

    a  seed 1, lr 1e-3   val_action_mae 0.30 @10, 0.25 @20   success 8/10 @10, 6/10 @20
    b  seed 2, lr 1e-3   val_action_mae 0.28 @10, 0.27 @20
    c  seed 1, lr 3e-3   val_action_mae 0.20 @10, 0.22 @20   success 2/10 @20
"""

from __future__ import annotations

import json
import math
import re

import pytest

from helpers import make_run, results
from tutorial_utils.errors import ConfigError
from tutorial_utils.runs import checkpoints as rck
from tutorial_utils.runs import compare as C
from tutorial_utils.runs.cli import main as runs_cli


@pytest.fixture
def three(tmp_path):
    a = make_run(tmp_path, "a", seed=1, lr=1e-3, val={10: 0.30, 20: 0.25})
    b = make_run(tmp_path, "b", seed=2, lr=1e-3, val={10: 0.28, 20: 0.27})
    c = make_run(tmp_path, "c", seed=1, lr=3e-3, val={10: 0.20, 20: 0.22})
    results(a / "evaluations" / "step_000010" / "results.json", 8, 10)
    results(a / "evaluations" / "step_000020" / "results.json", 6, 10)
    results(c / "evaluations" / "step_000020" / "results.json", 2, 10)
    return a, b, c


def test_table_diff_and_seed_groups(three):
    a, b, c = three
    cmp = C.compare([a, b, c])
    t = cmp.table
    assert list(t.index) == ["a", "b", "c"] and cmp.mode == "min"
    assert t.loc["a", "best_val_action_mae"] == 0.25 and t.loc["a", "best_step"] == 20
    assert t.loc["c", "best_val_action_mae"] == 0.20 and t.loc["c", "last_val_action_mae"] == 0.22
    assert t.loc["a", "success_rate"] == 0.8 and t.loc["a", "success_checkpoint"] == "step_000010"
    lo, hi = rck.wilson(8, 10)
    assert (t.loc["a", "ci95_low"], t.loc["a", "ci95_high"]) == pytest.approx((lo, hi))
    assert 0.44 < lo < 0.5 and 0.94 < hi < 0.97  # 8/10: the interval is wide
    assert math.isnan(t.loc["b", "success_rate"])  # never evaluated
    # only what differs: seed and learning rate (not output_dir, run_id, nor the dataset's copy)
    assert cmp.diff == {"optimizer_lr": {"a": 1e-3, "b": 1e-3, "c": 3e-3}, "seed": {"a": 1, "b": 2, "c": 1}}
    assert list(cmp.diff_table.columns) == ["a", "b", "c"]
    # a and b differ only in seed: one group of two; c alone
    groups = sorted(cmp.groups, key=lambda g: -g["n"])
    assert groups[0]["runs"] == ["a", "b"] and groups[0]["seeds"] == [1, 2] and groups[1]["runs"] == ["c"]
    assert groups[0]["best_val_action_mae_mean"] == pytest.approx(0.26)
    assert groups[0]["best_val_action_mae_std"] == pytest.approx(math.sqrt(2 * 0.01**2))
    assert (groups[0]["best_val_action_mae_min"], groups[0]["best_val_action_mae_max"]) == (0.25, 0.27)
    assert groups[1]["best_val_action_mae_std"] is None  # one run: no spread
    assert cmp.best["run"] == "c" and cmp.best["checkpoint"] == "step_000010" and cmp.best["value"] == 0.20
    text = cmp.text()
    assert "parameters that differ" in text and "seeds aggregated" in text and "n=2 seeds [1, 2]" in text
    assert "best across runs: c step_000010" in text and "[0.49, 0.94]" in text


def _highlighted(html: str) -> set[tuple[int, int]]:
    """(row, col) of the cells the Styler's CSS gives the highlight colour."""
    cells = set()
    for sel, body in re.findall(r"(#T_\w+?(?:, #T_\w+?)*) \{([^}]*)\}", html):
        if "#c8ecc8" in body:
            cells |= {(int(r), int(c)) for r, c in re.findall(r"_row(\d+)_col(\d+)", sel)}
    return cells


@pytest.mark.slow
def test_styled_table_highlights_the_best_and_the_figure(three, tmp_path):
    cmp = C.compare(list(three))
    cols = list(cmp.table.columns)
    got = _highlighted(cmp.styled().to_html())
    assert (2, cols.index("best_val_action_mae")) in got  # c: lowest best error
    assert (2, cols.index("last_val_action_mae")) in got  # c: lowest last error (0.22)
    assert (0, cols.index("success_rate")) in got  # a: highest success
    assert (1, cols.index("best_val_action_mae")) not in got
    fig = cmp.figure(smoothing=0.8)
    loss_ax, val_ax, lr_ax = fig.axes
    assert len(loss_ax.lines) == 6 and len(lr_ax.lines) == 3  # raw + smoothed per run; lr per run
    assert len(val_ax.lines) == 4  # 3 runs + the best star
    smoothed = loss_ax.lines[1].get_ydata()
    assert list(smoothed) == pytest.approx(C.ema(loss_ax.lines[0].get_ydata(), 0.8))
    out = tmp_path / "cmp.svg"
    fig.savefig(out)
    assert "<svg" in out.read_text()[:500]
    # success rate as the metric: points with their Wilson intervals
    fig = C.compare(list(three), "success_rate").figure()
    assert len(fig.axes[1].containers) == 3  # a @10, a @20, c @20


def test_ema():
    assert C.ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # debiased: no pull towards 0
    assert C.ema([0.0, 10.0], 0.5) == pytest.approx([0.0, 10 * 0.5 / 0.75])
    assert C.ema([1.0, 3.0], 0.0) == [1.0, 3.0]
    out = C.ema([1.0, float("nan"), 1.0], 0.5)
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == 1.0
    with pytest.raises(ConfigError, match="smoothing"):
        C.ema([1.0], 1.0)


def test_best_by_a_named_metric_lower_or_higher_is_better(three):
    a, _, _ = three
    assert rck.best_checkpoint(a)["name"] == "step_000020"  # val_action_mae, lower: 0.25 @20
    assert rck.best_checkpoint(a, "val_gripper_mae")["name"] == "step_000010"  # 1 - mae: 0.70 @10
    best = rck.best_checkpoint(a, "success_rate")  # higher: 8/10 @10
    assert (best["name"], best["mode"], best["value"], best["episodes"]) == ("step_000010", "max", 0.8, 10)
    assert rck.best_checkpoint(a, "val_action_mae", mode="max")["name"] == "step_000010"
    # mark it: best/ gets the weights, config.json records the metric
    path = rck.mark_best(a, metric="success_rate")
    marked = json.loads((path / "config.json").read_text())["best"]
    assert (marked["by"], marked["from"], marked["metric"], marked["value"]) == (
        "hand",
        "step_000010",
        "success_rate",
        0.8,
    )
    rows = {r["name"]: r for r in rck.list_checkpoints(a)}
    assert rows["step_000010"]["is_best"] and not rows["step_000020"]["is_best"]


def test_best_across_runs_and_mark_it(three, capsys):
    a, b, c = three
    best = C.best_across_runs([a, b, c])
    assert (best["run"], best["checkpoint"], best["value"]) == ("c", "step_000010", 0.20)
    best = C.best_across_runs([a, b, c], "success_rate")  # b has no evaluation: passed over
    assert (best["run"], best["checkpoint"]) == ("a", "step_000010") and len(best["passed_over"]) == 1
    marked = C.mark_best_across_runs([a, b, c], "val_action_mae")
    conf = json.loads((c / "checkpoints" / "best" / "config.json").read_text())
    assert marked["best_dir"].endswith("c/checkpoints/best") and conf["best"]["from"] == "step_000010"
    assert not (a / "checkpoints" / "best").exists()  # the other runs are untouched
    assert runs_cli(["best", str(a), str(b), str(c), "--metric", "success_rate", "--mark"]) == 0
    out = capsys.readouterr().out
    assert "best by success_rate (max): a step_000010" in out and "marked:" in out
    assert json.loads((a / "checkpoints" / "best" / "config.json").read_text())["best"]["metric"] == "success_rate"


def test_bad_input(three, tmp_path, capsys):
    a, b, _ = three
    with pytest.raises(
        rck.MetricError, match="Available: success_rate, val_action_mae, val_action_mae_xyz, val_gripper_mae"
    ):
        C.compare([a, b], "val_succes")
    with pytest.raises(rck.MetricError, match=r"has no metric 'loss'\. Its metrics: success_rate, val_action_mae"):
        rck.best_checkpoint(a, "loss")
    with pytest.raises(rck.MetricError, match="no metric 'success_rate'"):
        rck.best_checkpoint(b, "success_rate")
    with pytest.raises(ConfigError, match="mode='best'"):
        rck.best_checkpoint(a, mode="best")
    empty = make_run(tmp_path, "empty")
    (empty / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5')  # one truncated line, no rows
    with pytest.warns(UserWarning, match="skipped 1 line"), pytest.raises(C.RunWithoutMetrics, match="metrics.jsonl"):
        C.compare([a, empty])
    # validated at steps without a checkpoint: the table works, best says why there is none
    off = make_run(tmp_path, "off", val={5: 0.3, 15: 0.2})
    with pytest.raises(rck.MetricError, match="make save_freq a multiple of eval_freq"):
        rck.best_checkpoint(off)
    cmp = C.compare([off])
    assert cmp.best is None and cmp.table.loc["off", "best_val_action_mae"] == 0.2
    with pytest.raises(ConfigError, match="at least one run"):
        C.compare([])
    assert runs_cli(["compare", str(a), "--metric", "nope"]) == 2
    assert "Available:" in capsys.readouterr().err


def test_cli_compare(three, tmp_path, capsys):
    svg = tmp_path / "figures" / "new" / "curves.svg"  # a folder that does not exist yet
    assert runs_cli(["compare", *map(str, three), "--out", str(svg), "--smoothing", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "runs by val_action_mae (lower is better)" in out and "optimizer_lr" in out and "seeds aggregated" in out
    assert f"curves: {svg}" in out and svg.stat().st_size > 1000
    assert runs_cli(["mark-best", str(three[1]), "--metric", "val_action_mae"]) == 0
    assert "best <- step_000020 (by val_action_mae = 0.27)" in capsys.readouterr().out
    # a named checkpoint and a metric at once is ambiguous: refused, nothing marked
    assert runs_cli(["mark-best", str(three[1]), "step_000010", "--metric", "val_action_mae"]) != 0
    assert "both a checkpoint ('step_000010') and a metric" in capsys.readouterr().err
