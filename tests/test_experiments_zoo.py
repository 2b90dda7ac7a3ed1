"""The model zoo comparison (tutorial_utils.experiments): families, budget, a real (tiny) zoo run through the
train and evaluate jobs, its table, figures and promotion."""

from __future__ import annotations

import dataclasses
import json

import pytest

from helpers import check_catalog_matches_registry
from tutorial_utils import paths
from tutorial_utils.errors import ConfigError
from tutorial_utils.experiments import budget, catalog, coverage, sweep, zoo
from tutorial_utils.report import zoo_tables
from tutorial_utils.train import speed


def test_families_are_checked_with_a_teaching_error():
    assert catalog.parse_families(" mini, act ") == ["mini", "act"]
    # a trainable family outside the comparison may run (the positive control names mlp)
    assert "mlp" not in catalog.comparison_families() and catalog.parse_families("mini,mlp") == ["mini", "mlp"]
    with pytest.raises(ConfigError, match="'nosuch' is not in the zoo.*trainable families: .*act"):
        catalog.parse_families("mini,nosuch")
    assert catalog.parse_families("tdmpc") == ["tdmpc"]  # trained offline by the trainer: a control may run it
    with pytest.raises(ConfigError, match="'sac' is not in the zoo.*reinforcement learning"):
        catalog.parse_families("sac")  # the trainer refuses SAC
    with pytest.raises(ConfigError, match="twice"):
        catalog.parse_families("act,act")
    with pytest.raises(ConfigError, match="at least one"):
        catalog.parse_families(" , ")


def test_budget_turns_minutes_into_steps():
    assert speed.budget_steps(0.1, 10.0) == 6000
    assert speed.budget_steps(0.5, 10.0) == 1200
    assert speed.budget_steps(100.0, 0.5) == 20  # at least a few steps
    with pytest.raises(ConfigError, match="must be > 0"):
        speed.budget_steps(0.1, 0)


def test_the_slow_start_is_paid_once_out_of_the_budget():
    assert budget.budget_minutes({"start_s": 30.0}, 10.0) == 9.5
    assert budget.budget_minutes({"start_s": 0.0}, 10.0) == budget.budget_minutes({}, 10.0) == 10.0
    assert budget.budget_minutes({"start_s": 3600.0}, 10.0) == 1.0  # never less than a tenth of the budget


@pytest.mark.slow
def test_calibrate_times_the_real_trainer_past_its_start(tmp_path):
    t = budget.calibrate("mini", "synthetic", batch_size=2, num_workers=0, seconds=4.0, log_freq=2)
    assert t["s_per_step"] > 0 and t["steps"] >= 8 and t["start_s"] >= 0.0
    # the trainer's own time limit ended it: the steps at the steady rate plus the start fill the seconds
    assert t["wall_s"] >= 4.0 and t["steps"] * t["s_per_step"] + t["start_s"] >= 3.9
    with pytest.raises(RuntimeError, match="give it more seconds or a smaller log_freq"):
        budget.calibrate("mini", "synthetic", batch_size=2, num_workers=0, seconds=0.5, log_freq=10_000)


@pytest.mark.slow
def test_a_tiny_zoo_trains_evaluates_tabulates_and_promotes(tmp_path, runs_dir, monkeypatch):
    """One family through the real train and evaluate jobs (2 steps, one 5-step episode in
    LIBERO), its row, the figures, the reuse of both jobs, and promotion."""
    monkeypatch.setattr(paths, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(paths, "PROMOTED", tmp_path / "promoted")
    (tmp_path / "logs").mkdir()
    kw = dict(families="mini", dataset="synthetic", steps=2, batch_size=2, max_steps=5, task_ids="0")
    out = zoo.run(tmp_path / "zoo1", **kw)
    (row,) = out["rows"]
    assert out["finished"] and row["family"] == "mini" and row["steps"] == 2 and row["episodes"] == 1
    assert row["requests"] >= 1 and row["round_trip_ms_p50"] > 0 and row["params_m"] > 0
    assert row["ci95_low"] == 0.0 and 0.7 < row["ci95_high"] < 0.8  # Wilson for 0/1
    assert out["curves"]["mini"]["train"] and out["curves"]["mini"]["per_task"][0]["episodes"] == 1
    train_dir = paths.from_book(row["train_run"])
    # the evaluation is attached to the training run's checkpoint
    assert list((train_dir / "evaluations").glob("*/results.json"))
    assert "mini" in zoo_tables.text(out) and "0/1 (0%)" in zoo_tables.text(out)
    zoo_tables.figure(out)
    zoo_tables.per_task_figure(out)
    again = zoo.run(tmp_path / "zoo2", **kw)  # both jobs reused, same table
    assert again["rows"][0]["reused"] and again["rows"][0]["train_run"] == row["train_run"]
    # another replan_steps: the same training, a new evaluation that executes 2 actions per request
    replanned = zoo.run(tmp_path / "zoo3", **kw, replan_steps=2)["rows"][0]
    assert replanned["train_run"] == row["train_run"] and replanned["eval_run"] != row["eval_run"]
    assert "replan_steps: 2" in (paths.from_book(replanned["eval_run"]) / "params.yaml").read_text()
    with pytest.raises(ConfigError, match="replan_steps=-1"):
        zoo.run(tmp_path / "zoo4", **kw, replan_steps=-1)
    dest, *videos = zoo.promote(tmp_path / "zoo2", prefix="zoo_test")
    promoted_row = json.loads(dest.read_text())["rows"][0]
    assert promoted_row["family"] == "mini"
    assert zoo_tables.load(dest)["promoted_from"].endswith("zoo2")
    # the row's rollout (its one episode failed: no success to show) went to assets/ beside it
    assert set(promoted_row["videos"]) == {"failure"} and promoted_row["videos"]["failure"]["episode"] == 0
    assert [v.name for v in videos] == ["zoo_test_mini_failure.mp4"] and videos[0].stat().st_size > 1000
    assert promoted_row["videos"]["failure"]["video"] == "assets/zoo_test_mini_failure.mp4"
    again_dest, *_ = zoo.promote(dest, prefix="zoo_test")  # a promoted file promoted again keeps its source
    assert zoo_tables.load(again_dest)["promoted_from"].endswith("zoo2")
    data = json.loads((tmp_path / "zoo2" / zoo_tables.ZOO_FILE).read_text())
    (tmp_path / "zoo2" / zoo_tables.ZOO_FILE).write_text(json.dumps({**data, "finished": False}))
    with pytest.raises(ConfigError, match="did not finish"):
        zoo.promote(tmp_path / "zoo2")


def test_load_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="zoo.json: no zoo results here.*job run notebooks/jobs/zoo.md"):
        zoo_tables.load(tmp_path)
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a zoo result"):
        zoo_tables.load(tmp_path / "x.json")
    assert zoo.main(["table", str(tmp_path)]) == 1


def test_the_catalog_matches_the_policy_registry():
    """Every family the guide names is in the registry, and every registered family that trains or
    names a GPU recipe is in the catalog (mlp is the book's own baseline, not a guide family)."""
    check_catalog_matches_registry()


def test_the_zoo_adds_only_its_warm_up_to_a_family_recipe():
    assert zoo._family_schedule("act", 1083) == {}  # ACT's own recipe (LeRobot's) has no warm-up
    assert zoo._family_schedule("tdmpc", 1083) == {}
    assert zoo._family_schedule("diffusion", 1000) == {"scheduler_warmup_steps": 100}
    assert zoo._family_schedule("mlp", 5000) == {"scheduler_warmup_steps": 200}
    assert catalog.learning_rate("act") == 1e-4 and catalog.learning_rate("tdmpc") == 3e-4


def test_a_first_phase_the_timing_leaves_out_comes_on_top_of_the_budget():
    """VQ-BeT's timing sets its first phase to one step (it fits only the action codes, no images), so
    the zoo adds that phase's steps to the ones the budget buys; the first comparison did not, and
    the GPT got half of VQ-BeT's minutes."""
    from tutorial_utils import policies

    vqbet = policies.family("vqbet")
    assert catalog.untimed_steps("vqbet") == vqbet.config_class().n_vqvae_training_steps > 0
    assert catalog.untimed_steps("mini") == catalog.untimed_steps("act") == 0
    for name in policies.trainable():
        cls = policies.family(name)
        if catalog.untimed_steps(name):  # a phase left untimed must be one the timing really shortens
            timed = dataclasses.replace(cls.config_class(), **cls.timing_overrides)
            assert cls.first_phase_steps(timed) < catalog.untimed_steps(name), name


def test_sweep_values_are_typed_and_checked():
    assert sweep.parse_values("mini", "optimizer_lr", "1e-4, 3e-4") == [1e-4, 3e-4]
    assert sweep.parse_values("mlp", "hidden_dim", "32,64") == [32, 64]  # a family's own parameter
    with pytest.raises(ConfigError, match="'chunk_size' is not a training parameter of policy='mini'"):
        sweep.parse_values("mini", "chunk_size", "8,16")
    with pytest.raises(ConfigError, match="at least two different values"):
        sweep.parse_values("mini", "optimizer_lr", "1e-4,1e-4")
    with pytest.raises(ConfigError, match="optimizer_lr"):
        sweep.parse_values("mini", "optimizer_lr", "fast,slow")
    with pytest.raises(ConfigError, match="not a training parameter"):
        sweep.parse_values("mini", "dataset", "a,b")


@pytest.mark.slow
def test_a_tiny_sweep_compares_exports_and_evaluates_the_bundle(tmp_path, runs_dir, monkeypatch):
    monkeypatch.setattr(paths, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(paths, "PROMOTED", tmp_path / "promoted")
    (tmp_path / "logs").mkdir()
    out = sweep.sweep(
        tmp_path / "sw", param="hidden_dim", values="16,32", policy="mlp", steps=2, eval_freq=1,
        batch_size=2, max_steps=5,
    )  # fmt: skip
    assert out["finished"] and [r["value"] for r in out["rows"]] == [16, 32] and out["best"] in out["curves"]
    # each run trained as the zoo trains the family: mlp has no learning rate of its own, so only the warm-up
    assert out["config"]["scheduler_warmup_steps"] == 0 and "optimizer_lr" not in out["config"]
    assert out["config"]["seed"] == 42 and out["config"]["eval_seed"] == 7  # training seed, client seed
    b = out["bundle"]
    assert b["parity"]["max_abs_diff"] == 0.0 and "validation episodes" in b["parity"]["data"]
    assert b["episodes"] == 1 and b["requests"] >= 1 and "model.safetensors" in b["files"]
    assert (tmp_path / "sw" / "bundle" / "manifest.json").is_file()
    text = zoo_tables.text(out)
    assert "hidden_dim=16" in text and "bundle of hidden_dim=" in text and "mlp, 2 values of hidden_dim" in text
    zoo_tables.figure(out)
    dest, *videos = zoo.promote(tmp_path / "sw")
    assert len(videos) == 2 and all(v.is_file() for v in videos)  # one rollout per value
    assert dest.name == "sweep_cpu.json" and zoo_tables.load(dest)["kind"] == "sweep"


@pytest.mark.parametrize("promoted", ["logs/sweep_cpu.json", "logs/zoo_cpu.json"])
def test_the_success_bars_labels_do_not_overlap(promoted):
    """The chapters' comparison and sweep figures: each bar's label readable on its own (the sweep's
    'optimizer_lr=0.0001' labels once ran into each other under the bars)."""
    z = zoo_tables.load(paths.REPO / promoted)
    fig = zoo_tables.figure(z)
    fig.canvas.draw()
    ax = fig.axes[0]
    boxes = sorted((t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()), key=lambda b: b.x0)
    assert len(boxes) == len(z["rows"])
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:], strict=False)), [(b.x0, b.x1) for b in boxes]


@pytest.mark.parametrize("job", ["zoo.md", "sweep.md"])
def test_full_size_profiles_evaluate_whole_episodes(job):
    """The ci profile runs short episodes; the full-size profiles run them to the suite's limit:
    None, the one "no override" (no 0 sentinel: `pick(ci=20, cpu=None)` is None under cpu)."""
    from tutorial_utils import jobs

    nb = jobs.read_notebook(paths.JOBS / job)
    assert jobs.default_parameters(nb, profile="ci")["max_steps"] > 0
    for profile in ("cpu", "gpu"):
        assert jobs.default_parameters(nb, profile=profile)["max_steps"] is None


def test_a_rerun_reuses_the_earlier_budget(runs_dir):
    """Calibration never repeats exactly; a rerun of an interrupted zoo finds the steps of the
    finished training with the same budget and data (same profile) and reuses them."""
    from tutorial_utils.train.config import family_recipe

    params = {"policy": "act", "dataset": "d", "batch_size": 16, "num_workers": 1, "seed": 42, "time_limit_min": 12.5}
    recipe = {k: list(v) if isinstance(v, tuple) else v for k, v in family_recipe("act", "ci").items()}
    for name, extra, state in (("a", {"steps": 777}, "succeeded"), ("b", {"steps": 999}, "failed")):
        (runs_dir / name).mkdir(parents=True)
        status = {"job": "train", "state": state, "profile": "ci", "parameters": {**params, **extra}}
        (runs_dir / name / "status.json").write_text(json.dumps(status))
        (runs_dir / name / "train_config.json").write_text(
            json.dumps({"train": {**recipe, "scheduler_warmup_steps": 77}})
        )
    assert zoo._budgeted_before("act", "d", 16, 1, 42, 10.0) == (777, {"reused_budget_of": "a"})
    # a training made with another recipe (the family's changed since) is not this budget's
    (runs_dir / "a" / "train_config.json").write_text(json.dumps({"train": {**recipe, "optimizer_betas": [0.9, 0.95]}}))
    assert zoo._budgeted_before("act", "d", 16, 1, 42, 10.0) is None
    (runs_dir / "a" / "train_config.json").write_text(json.dumps({"train": recipe}))
    assert zoo._budgeted_before("act", "d", 16, 1, 42, 20.0) is None  # another budget
    assert zoo._budgeted_before("diffusion", "d", 16, 1, 42, 10.0) is None
    # a training budgeted by the 30-step timing (safety limit 1.5 x the budget) is not taken for one timed now
    (runs_dir / "c").mkdir()
    old = {
        "job": "train",
        "state": "succeeded",
        "profile": "ci",
        "parameters": {**params, "time_limit_min": 6.0, "steps": 5},
    }
    (runs_dir / "c" / "status.json").write_text(json.dumps(old))
    assert zoo._budgeted_before("act", "d", 16, 1, 42, 4.0) is None


def test_demonstrations_say_which_evaluated_init_states_were_demonstrated(tmp_path):
    """The record manifest's (task, init state) pairs against the evaluation's (trial k: init state k)."""
    root = tmp_path / "demos"
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps({"total_episodes": 5, "total_frames": 500}))
    eps = [(0, 3), (0, 4), (0, 12), (1, 10), (1, 11)]
    man = {
        "episodes": [
            {"task_id": t, "init_state": i, "success": True, "episode_index": k} for k, (t, i) in enumerate(eps)
        ]
    }
    man["episodes"].append({"task_id": 1, "init_state": 0, "success": False})  # the expert failed: not in the data
    (root / "meta" / "record_manifest.json").write_text(json.dumps(man))
    d = coverage.demonstrations(str(root), "libero_spatial", "0,1", trials_per_task=5)
    assert d == {
        "episodes": 5,
        "per_task_min": 2,
        "per_task_max": 3,
        "init_states": [3, 12],
        "eval_pairs": 10,
        "eval_pairs_seen": 2,  # task 0 from init states 3 and 4; task 1's failed init state 0 does not count
    }
    assert coverage.demonstrations("synthetic", "libero_spatial", "0", 1) is None


def test_ladder_lines_up_one_family_under_several_budgets():
    z = zoo_tables.load(paths.LOGS / "zoo_cpu.json")
    rows = [("a", z, z["rows"][0]), ("b", {**z, "config": {**z["config"], "replan_steps": 4}}, z["rows"][1])]
    df = zoo_tables.ladder(rows)
    assert list(df.index) == ["a", "b"] and df.loc["a", "replan"] == "chunk" and df.loc["b", "replan"] == 4
    assert df.loc["a", "success"].startswith(f"{z['rows'][0]['successes']}/{z['rows'][0]['episodes']}")
    lo, hi = z["rows"][0]["ci95_low"], z["rows"][0]["ci95_high"]
    assert df.loc["a", "ci95"] == f"[{100 * lo:.0f}%, {100 * hi:.0f}%]"
    zoo_tables.ladder_figure(rows)
    # the result comes first: a table wider than the page scrolls and cuts off its last columns
    assert list(df.columns[:3]) == ["family", "success", "ci95"]
    assert list(zoo_tables.table(z).columns[:2]) == ["success", "ci95"]
    head = zoo_tables.text(z).splitlines()[1]
    assert head.split()[:2] == ["success", "ci95"]


def test_side_by_side_sets_two_budgets_of_the_same_families_beside_each_other():
    def row(fam, k, steps):
        return {"family": fam, "successes": k, "episodes": 20, "success_rate": k / 20, "ci95_low": 0.1,
                "ci95_high": 0.9, "steps": steps, "best_val_action_mae": 0.05}  # fmt: skip

    short = {"rows": [row("mini", 14, 100), row("act", 0, 50), row("mlp", 0, 10)]}
    long = {"rows": [row("act", 13, 100), row("mini", 17, 200)]}
    df = zoo_tables.side_by_side({"8 min": short, "16 min": long})
    assert list(df.index) == ["mini", "act"]  # families both have, in the first zoo's order
    assert df.loc["mini", ("16 min", "success")] == "17/20 (85%)" and df.loc["act", ("8 min", "steps")] == 50


def test_one_family_sets_its_runs_from_several_zoos_side_by_side_with_their_curves():
    def row(fam, k):
        return {"family": fam, "successes": k, "episodes": 20, "success_rate": k / 20, "ci95_low": 0.1,
                "ci95_high": 0.9, "steps": 100, "best_val_action_mae": 0.05, "train_min": 8.0}  # fmt: skip

    short = {"config": {"train_minutes": 16.0}, "rows": [row("mini", 14), row("act", 15)],
             "curves": {"act": {"val": [[50, 0.2], [100, 0.1]]}, "mini": {"val": [[100, 0.3]]}}}  # fmt: skip
    long = {"config": {"train_minutes": 32.0}, "rows": [row("act", 18)], "curves": {"act": {"val": [[100, 0.05]]}}}
    both = zoo_tables.one_family({"16 min": short, "32 min": long}, "act")
    assert [r["label"] for r in both["rows"]] == ["act, 16 min", "act, 32 min"]
    assert both["curves"]["act, 16 min"]["val"][-1] == [100, 0.1] and both["config"]["train_minutes"] == 32.0
    df = zoo_tables.controls(both)
    assert list(df.index) == ["act, 16 min", "act, 32 min"] and df.loc["act, 32 min", "val_best"] == 0.05
    assert zoo_tables.intervals_overlap(both["rows"][0], both["rows"][1])
    assert not zoo_tables.intervals_overlap({"ci95_low": 0.1, "ci95_high": 0.3}, {"ci95_low": 0.4, "ci95_high": 0.9})
    merged = zoo_tables.merge([{**short, "rows": short["rows"][:1]}, long])
    assert [r["family"] for r in merged["rows"]] == ["mini", "act"] and merged["curves"]["act"]["val"] == [[100, 0.05]]
    assert merged["config"]["train_minutes"] == 16.0
    with pytest.raises(ValueError, match="both have a 'act' row"):
        zoo_tables.merge([short, long])
    with pytest.raises(KeyError, match="'32 min' has no 'mini' row"):
        zoo_tables.one_family({"16 min": short, "32 min": long}, "mini")


def test_the_zoo_waits_for_a_quiet_machine_before_timing_a_family(monkeypatch):
    loads = iter([1.9, 1.9, 1.4, 0.8, 0.8, 0.8])
    monkeypatch.setattr(budget.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(budget.os, "cpu_count", lambda: 2)
    naps = []
    before, after, waited = budget.settle(max_s=60, poll_s=5, sleep=naps.append)
    assert (before, after) == (1.9, 0.8) and waited == 10 and naps == [5, 5]  # until below half the cores
    monkeypatch.setattr(budget.os, "getloadavg", lambda: (2.5, 0.0, 0.0))
    assert budget.settle(max_s=15, poll_s=5, sleep=lambda s: None)[2] == 15  # never quiet: gives up at max_s
