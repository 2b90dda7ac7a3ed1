"""The positive control chapter 9 shows (``logs/positive_control_cpu.json``): the zoo job on one
libero_spatial task, with demonstrations from starts the evaluation never uses, and
``zoo_tables.controls``, which reads it family by family."""

from __future__ import annotations

import pytest

from tutorial_utils import paths
from tutorial_utils.report import zoo_tables
from tutorial_utils.runs.checkpoints import wilson

CONTROL = paths.LOGS / "positive_control_cpu.json"


def _row(family: str, k: int, n: int, steps: int, best_step: int) -> dict:
    lo, hi = wilson(k, n)
    return {
        "family": family,
        "label": family,
        "successes": k,
        "episodes": n,
        "success_rate": k / n,
        "ci95_low": lo,
        "ci95_high": hi,
        "steps": steps,
        "batch_size": 16,
        "train_min": 7.0,
        "best_step": best_step,
        "timed_s_per_step": 0.42 if family == "a" else None,
        **({"steps_planned": 2000, "time_limited": True} if family == "b" else {}),
        "health": ["data_bound"] if family == "b" else [],
    }


def test_controls_reads_each_family_against_the_target_with_its_validation_curve():
    z = {
        "config": {"batch_size": 16, "train_minutes": 7.0},
        "rows": [_row("a", 18, 20, 1000, 1000), _row("b", 3, 20, 500, 250)],
        "curves": {
            "a": {"val": [[250, 0.3], [500, 0.2], [1000, 0.1]]},
            "b": {"val": [[250, 0.4], [500, 0.5]]},
        },
    }
    df = zoo_tables.controls(z)
    assert df.loc["a", "reached 80%"] and not df.loc["b", "reached 80%"]
    assert df.loc["a", "success"] == "18/20 (90%)" and df.loc["a", "ci95"].startswith("[")
    assert (df.loc["a", "val_first"], df.loc["a", "val_best"], df.loc["a", "val_last"]) == (0.3, 0.1, 0.1)
    assert df.loc["a", "falling at end"] and not df.loc["b", "falling at end"]
    assert (
        df.loc["a", "planned"] == 1000 and df.loc["b", "planned"] == 2000 and df.loc["b", "time limit hit"]
    )  # 7 min at 0.42 s/step
    assert df.loc["b", "last_val_step"] == 500 and df.loc["b", "health"] == "data_bound"
    assert not zoo_tables.controls(z, target=0.95).loc["a", "reached 95%"]
    one = {**z, "curves": {**z["curves"], "a": {"val": [[1000, 0.1]]}}}  # one validation: no trend to read
    assert not zoo_tables.controls(one).loc["a", "falling at end"]


def test_a_diverging_loss_recorded_across_vqbets_phase_switch_is_judged_again_on_its_curve():
    from helpers import decaying

    def curve(losses):
        return [[25 * (i + 1), v] for i, v in enumerate(losses)]

    switch = curve(decaying(20, 1.0, 0.2) + decaying(20, 5000.0, 800.0))  # 500 VQ-VAE steps, then the GPT's loss
    climbs = curve(decaying(20, 1.0, 0.2) + decaying(10, 5000.0, 800.0) + [800.0 * 1.2**i for i in range(1, 11)])
    rows = [
        {**_row("vqbet", 0, 20, 1000, 1000), "health": ["diverging_loss"]},
        {**_row("v2", 0, 20, 1000, 1000), "family": "vqbet", "health": ["diverging_loss", "data_bound"]},
        {**_row("mini", 0, 20, 1000, 1000), "health": ["diverging_loss"]},
    ]
    z = {
        "config": {},
        "rows": rows,
        "curves": {"vqbet": {"train": switch}, "v2": {"train": climbs}, "mini": {"train": switch}},
    }
    health = zoo_tables.controls(z)["health"].to_dict()
    # the jump at the switch is a new loss; a GPT loss that climbs is still one; a one-phase family's rise is kept
    assert health == {"vqbet": "-", "v2": "diverging_loss, data_bound", "mini": "diverging_loss"}


def test_the_promoted_positive_control_has_what_chapter_9_reads():
    z = zoo_tables.load(CONTROL)
    c, d = z["config"], z["config"]["demonstrations"]
    assert z["finished"] and z["kind"] == "zoo" and z["promoted_from"]
    # one task, at least 20 evaluated episodes, none of them from a demonstrated start
    assert c["task_ids"] == "0" and c["trials_per_task"] >= 20 and c["train_minutes"] > 0 and c["batch_size"] >= 1
    assert d["episodes"] >= 1 and d["eval_pairs"] == c["trials_per_task"] and d["eval_pairs_seen"] == 0
    assert d["init_states"][0] >= c["trials_per_task"]
    assert {r["family"] for r in z["rows"]} >= {"mini", "act"}
    for r in z["rows"]:
        assert r["episodes"] == c["trials_per_task"] and r["batch_size"] == c["batch_size"]
        assert (r["ci95_low"], r["ci95_high"]) == pytest.approx(wilson(r["successes"], r["episodes"]))
        assert r["steps"] >= 1 and r["train_min"] > 0 and r["best_step"] >= 1
        # the budget as planned, and whether the time limit cut it (the rows carry both)
        assert r["steps_planned"] >= r["steps"] and (r["steps_planned"] > r["steps"]) == r["time_limited"]
        assert z["curves"][r["family"]]["val"] and [t["task_id"] for t in z["curves"][r["family"]]["per_task"]] == [0]
    df = zoo_tables.controls(z)
    assert list(df.index) == [r["family"] for r in z["rows"]] and df["val_best"].notna().all()
    assert len(zoo_tables.ladder([(r["family"], z, r) for r in z["rows"]])) == len(z["rows"])


def test_the_open_loop_check_chapter_9_reads_shows_what_each_act_reads():
    """Chapter 9's reading of ``logs/openloop_positive_control_cpu.json``: ACT steers by its state,
    mini by its cameras, the cameras-only ACT cannot read the state at all, and no family's
    open-loop error is far from its validation error in the control (no wiring defect)."""
    import json

    doc = json.loads((paths.LOGS / "openloop_positive_control_cpu.json").read_text())
    r = {x["label"]: x for x in doc["results"]}
    assert doc["kind"] == "open_loop" and doc["dataset"] == zoo_tables.load(CONTROL)["config"]["dataset"]
    assert r["act"]["reads_state"] > 3 * r["act"]["reads_cameras"]
    assert r["act, sweep: state"]["reads_state"] > 10 * r["act, sweep: state"]["reads_cameras"]
    assert r["act, sweep: cameras only"]["reads_state"] == 0.0 and r["act, sweep: cameras only"]["reads_cameras"] > 0
    assert r["mini"]["reads_cameras"] > 10 * r["mini"]["reads_state"]
    for name in ("act, LeRobot's loop", "act, LeRobot's recipe"):  # with LeRobot's recipe ACT reads its cameras
        assert r[name]["reads_cameras"] > 0.5 * r[name]["reads_state"] > 0
        assert r[name]["reads_cameras"] > 20 * r["act, clipping 10"]["reads_cameras"]  # clipping alone: no
    for fam in ("mlp", "vqbet"):  # "lean on the state too"
        assert r[fam]["reads_state"] > r[fam]["reads_cameras"]
    control = {row["family"]: row["best_val_action_mae"] for row in zoo_tables.load(CONTROL)["rows"]}
    for fam, val in control.items():
        assert r[fam]["action_mae"] < 1.5 * val, (fam, r[fam]["action_mae"], val)
    for x in doc["results"]:  # run names, never the machine's paths
        assert not x["checkpoint"].startswith("/") and "/checkpoints/" in x["checkpoint"]


def test_the_act_state_sweeps_compare_one_parameter_on_the_control_episodes():
    """The sweeps chapter 9 reads: ACT with and without the state, everything else equal, on the
    control's task and episodes; pooled over the seeds the cameras-only ACT succeeds more often."""
    control = zoo_tables.load(CONTROL)["config"]
    pooled = {True: [0, 0], False: [0, 0]}
    files = sorted(paths.LOGS.glob("positive_control_act_state_*cpu.json"))
    assert files
    for f in files:
        sw = zoo_tables.load(f)
        c = sw["config"]
        assert sw["kind"] == "sweep" and sw["finished"] and c["policy"] == "act" and c["param"] == "use_state"
        assert c["dataset"] == control["dataset"] and c["task_ids"] == "0" and c["trials_per_task"] == 20
        assert sorted(r["value"] for r in sw["rows"]) == [False, True]
        assert len({r["steps"] for r in sw["rows"]}) == 1
        for row in sw["rows"]:
            pooled[row["value"]][0] += row["successes"]
            pooled[row["value"]][1] += row["episodes"]
    (k_off, n_off), (k_on, n_on) = pooled[False], pooled[True]
    assert k_off / n_off > k_on / n_on


def test_the_act_recipe_runs_chapter_9_reads():
    """LeRobot's loop and this book's trainer with LeRobot's recipe succeed in more than half the
    control's episodes; DiT4DiT's recipe with LeRobot's clipping fails them all."""
    import json

    def rate(prefix: str) -> tuple[int, int]:
        res = json.loads((paths.LOGS / f"{prefix}_results.json").read_text())
        assert res["config"]["task_ids"] in ("0", [0]) and res["config"]["trials_per_task"] == 20
        return res["total_successes"], res["total_episodes"]

    (k_lr, n_lr), (k_rec, n_rec), (k_clip, _n) = (
        rate("act_lerobot_eval"),
        rate("act_recipe_eval"),
        rate("act_clip10_eval"),
    )
    assert k_lr / n_lr > 0.5 and k_rec / n_rec > 0.5 and k_clip == 0
    train = json.loads((paths.LOGS / "act_lerobot_train.json").read_text())
    assert train["steps"] == 1083 and train["losses"][-1][1] < train["losses"][0][1] and "/work" not in train["command"]
