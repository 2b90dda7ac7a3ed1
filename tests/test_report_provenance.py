"""Every result names where it came from; a reader's build promotes beside the shipped reference,
never over it; pages prefer this build's files; success rates carry their interval."""

import json
import subprocess

import pytest

from conftest import REPO
from tutorial_utils import paths, pipeline
from tutorial_utils.report import promote, provenance


@pytest.fixture
def copies(tmp_path, monkeypatch):
    """A throwaway reference (logs/, assets/) and this build's copy (promoted/)."""
    monkeypatch.setattr(paths, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(paths, "ASSETS", tmp_path / "assets")
    monkeypatch.setattr(paths, "PROMOTED", tmp_path / "promoted")
    (tmp_path / "logs").mkdir()
    (tmp_path / "assets").mkdir()
    return tmp_path


def _recording(root, starts):
    """A synthetic dataset with a record manifest naming the (task, init state) of each episode."""
    from tutorial_utils.data import synth

    synth.generate_dataset(root, n_episodes=len(starts), mean_length=6, image_size=32)
    episodes = [
        {"episode_index": i, "task_id": t, "init_state": s, "length": 6, "success": True, "task": "t"}
        for i, (t, s) in enumerate(starts)
    ]
    (root / "meta" / "record_manifest.json").write_text(json.dumps({"episodes": episodes, "failed": []}))
    return root


def test_pages_prefer_this_builds_file_and_say_which_copy(copies):
    (copies / "logs" / "eval_mini_results.json").write_text('{"from": "reference"}')
    assert provenance.find("logs/eval_mini_results.json") == copies / "logs" / "eval_mini_results.json"
    assert provenance.origin("logs/eval_mini_results.json") == provenance.REFERENCE_LABEL
    (copies / "promoted" / "logs").mkdir(parents=True)
    (copies / "promoted" / "logs" / "eval_mini_results.json").write_text('{"from": "build"}')
    assert provenance.load_json("logs/eval_mini_results.json") == {"from": "build"}
    assert provenance.origin("logs/eval_mini_results.json") == provenance.BUILD_LABEL == "this build's run"
    # a path under LOGS names the same promoted file
    assert provenance.find(paths.LOGS / "eval_mini_results.json").parent == copies / "promoted" / "logs"
    with pytest.raises(FileNotFoundError, match="logs/nope.json.*pipeline"):
        provenance.find("logs/nope.json")
    with pytest.raises(ValueError, match="logs/<file> or assets/<file>"):
        provenance.find("eval_mini_results.json")


def test_success_carries_the_wilson_interval_and_the_demonstrated_starts():
    assert provenance.success(14, 20) == "14/20 = 70% (95% interval 48% to 85%)"
    assert provenance.success(3, 10, 0).endswith("; 0 of the 10 evaluated starts were demonstrated (all held out)")
    assert "18 to 20 of the 20 evaluated starts were demonstrated" in provenance.success(12, 20, (18, 20))
    assert provenance.success(0, 0) == "no episodes evaluated"


def test_demonstrated_starts_exact_from_the_card_and_bounded_without_it():
    results = {"tasks": [{"task_id": t, "episodes": [{"init_state": 0}, {"init_state": 1}]} for t in (0, 1)]}
    assert provenance.demonstrated_starts(results, {"starts": [[0, 0], [1, 1], [1, 5]]}) == (2, 2)
    card = {"config": {"init_state_offset": 0, "episodes_per_task": 5}, "per_task": {"0": {"failed": 1}, "1": {}}}
    assert provenance.demonstrated_starts(results, card) == (3, 4)
    assert provenance.demonstrated_starts({**results, "demonstrations": {"eval_pairs_seen": 0}}, card) == (0, 0)


def test_a_main_job_promotion_stamps_its_files_and_says_when_a_result_used_another_recording(copies, tmp_path):
    ds = _recording(tmp_path / "data" / "rec", [(0, 10), (0, 11), (1, 10)])
    run = tmp_path / "runs" / "20261204-101500-train-abc123"
    run.mkdir(parents=True)
    (run / "train.log").write_text("Step 1, Loss: {'total_loss': 1.0}\n")
    (run / "summary.json").write_text(json.dumps({"run_id": run.name, "steps": 2}))
    (run / "status.json").write_text(json.dumps({"run_id": run.name, "started": "2026-12-04T10:15:00"}))
    ctx = {"profile": "cpu", "dataset": str(ds), "train_run": str(run), "timings": []}
    pipeline.promote(ctx)
    text = provenance.line("logs/train_cpu_summary.json")
    fp = provenance.dataset_identity(ds)["fingerprint"]
    assert f"Run {run.name} (2026-12-04), dataset rec (3 episodes, fingerprint {fp}), commit " in text
    assert text.endswith("; this build's run.") and "different recording" not in text
    card = provenance.load_json("logs/record_dataset.json")
    assert card["starts"] == [[0, 10], [0, 11], [1, 10]]
    # a zoo shipped with the book from another recording of the same name: the page says so
    zoo = {"config": {"dataset": "rec", "demonstrations": {"episodes": 48}}, "rows": [], "promoted_from": "runs/z1"}
    (copies / "logs" / "zoo_cpu.json").write_text(json.dumps(zoo))
    line = provenance.line("logs/zoo_cpu.json")
    assert "the reference run shipped with the book" in line
    assert "Note: made from a different recording, rec (48 episodes), than the one chapters 3 and 4 show" in line
    # a re-recording with the same name and count but other episodes: the fingerprints differ
    other = _recording(tmp_path / "data2" / "rec", [(0, 0), (0, 1), (1, 0)])
    assert provenance.dataset_identity(other)["fingerprint"] != fp
    assert provenance.compare_recording(provenance.dataset_identity(other), provenance.info("logs/record_dataset.json"))


def test_the_main_job_evaluation_records_how_many_evaluated_starts_were_demonstrated(tmp_path):
    ds = _recording(tmp_path / "rec", [(0, 10), (0, 11), (1, 0)])
    ev = tmp_path / "eval"
    ev.mkdir()
    tasks = [{"task_id": t, "episodes": [{"init_state": 0}, {"init_state": 1}]} for t in (0, 1)]
    (ev / "results.json").write_text(json.dumps({"tasks": tasks}))
    got = pipeline.demonstrated(ev, ds)
    assert got == {"episodes": 3, "init_states": [0, 11], "eval_pairs": 4, "eval_pairs_seen": 1}


@pytest.mark.parametrize("profile", ["ci", "cpu"])
def test_the_main_job_evaluates_only_init_states_the_recording_did_not_use(profile, monkeypatch):
    """The evaluation runs trial k of a task from init state k; the recording starts at its offset."""
    import jupytext

    from tutorial_utils import jobs

    monkeypatch.setenv("TUTORIAL_PROFILE", profile)
    rec = jobs.default_parameters(jupytext.read(REPO / "notebooks" / "jobs" / "record_demos.md"), profile)
    record_stage, _, eval_stage = pipeline.STAGES
    rec.update(record_stage.params({}))
    ev = jobs.default_parameters(jupytext.read(REPO / "notebooks" / "jobs" / "evaluate.md"), profile)
    ev.update(eval_stage.params({"policy": "mini", "checkpoint": "x"}))  # the stage's own overrides, if any
    trials = ev["trials_per_task"]
    recorded = set(range(rec["init_state_offset"], rec["init_state_offset"] + rec["episodes_per_task"]))
    assert recorded and not recorded & set(range(trials)), (recorded, trials)


def test_a_main_job_promotion_leaves_the_tracked_reference_unchanged(tmp_path, monkeypatch):
    """`make book`'s promotion writes under _build/promoted/, never over logs/ and assets/."""
    before = subprocess.run(
        ["git", "status", "--porcelain", "logs", "assets"], cwd=REPO, capture_output=True, text=True
    )
    if before.returncode != 0 or before.stdout.strip():
        pytest.skip("not a clean git checkout of logs/ and assets/")
    monkeypatch.setattr(paths, "PROMOTED", tmp_path / "promoted")
    ds = _recording(tmp_path / "rec", [(0, 10)])
    out = pipeline.promote({"profile": "cpu", "dataset": str(ds), "timings": []})
    assert out and all(p.is_relative_to(tmp_path / "promoted") for p in out)
    after = subprocess.run(["git", "status", "--porcelain", "logs", "assets"], cwd=REPO, capture_output=True, text=True)
    assert after.stdout.strip() == "", after.stdout


def test_promote_reference_copies_this_builds_files_over_the_shipped_ones(copies, tmp_path):
    ds = _recording(tmp_path / "rec", [(0, 10)])
    with pytest.raises(FileNotFoundError, match="no promoted files"):
        promote.to_reference()
    pipeline.promote({"profile": "cpu", "dataset": str(ds), "timings": []})
    assert not (copies / "logs" / "record_dataset.json").exists()
    assert promote.main(["--reference"]) == 0
    assert json.loads((copies / "logs" / "record_dataset.json").read_text())["total_episodes"] == 1
    assert (copies / "assets" / "record_episode_primary.mp4").is_file()
    assert "logs/record_dataset.json" in json.loads((copies / "logs" / "promoted.json").read_text())["files"]


def test_every_shipped_file_has_a_known_producer_and_the_artifacts_page_lists_zoo_and_sweep():
    from tutorial_utils.report import summary

    text, read = summary.artifacts_md()
    assert "unknown" not in text, [line for line in text.splitlines() if "unknown" in line]
    for name in ("logs/zoo_cpu.json", "logs/sweep_cpu.json", "logs/record_dataset.json", "logs/eval_mini_results.json"):
        assert f"`{name}`" in text
    assert summary.producer("logs/zoo_gpu.json") and summary.producer("logs/something_new.txt") is None


def test_the_results_summary_is_rendered_from_the_promoted_files(copies):
    from tutorial_utils.report import summary

    results = {"total_episodes": 20, "total_successes": 14, "wall_s": 600, "tasks": [], "config": {}}
    (copies / "logs" / "eval_mini_results.json").write_text(json.dumps(results))
    text, read = summary.results_summary_md()
    assert "14/20 = 70% (95% interval 48% to 85%)" in text and "10 min" in text
    assert read == [copies / "logs" / "eval_mini_results.json"]


def test_every_fact_links_to_a_reference_the_book_cites():
    from tutorial_utils.report import facts

    refs = (REPO / "book" / "references.md").read_text()
    for name in facts.FACTS:
        label, url = facts.REFERENCES[facts.reference(name)]
        assert url in refs, f"{name}: its source {url} is not on the references page"
        assert "FACTS.md" not in facts.source_text(name) and "seeds/" not in facts.source_text(name)


def test_an_expert_evaluation_says_it_learned_from_no_data(copies):
    results = {"policy": {"policy": "expert"}, "config": {"output_dir": "runs/eval-expert"}, "tasks": []}
    (copies / "logs" / "eval_results.json").write_text(json.dumps(results))
    line = provenance.line("logs/eval_results.json")
    assert line.startswith("Run eval-expert, no training data (the scripted expert), commit")


def test_a_benchmark_says_it_is_one_and_what_data_it_made(copies):
    (copies / "logs" / "bench_x.json").write_text(json.dumps({"bench": "x"}))
    stamp = provenance.stamp(None, stage="bench", no_dataset="a generated dataset")
    provenance.write_stamps({"logs/bench_x.json": stamp}, reference=True)
    line = provenance.line("logs/bench_x.json")
    assert line.startswith(f"Benchmark ({stamp['date']}), a generated dataset, commit"), line
    assert "not recorded" not in line


def test_promote_train_by_hand_stamps_its_files_with_the_run_and_its_dataset(copies, tmp_path, monkeypatch):
    """``python -m tutorial_utils promote train RUN``: the promoted files carry the run and the
    dataset it learned from, as the pipeline's and the zoo's promotions do (no stamping by hand)."""
    ds = _recording(tmp_path / "data" / "rec", [(0, 3), (0, 4)])
    run = tmp_path / "runs" / "20261205-101500-train-def456"
    run.mkdir(parents=True)
    (run / "train.log").write_text("Step 1, Loss: {'total_loss': 1.0}\n")
    (run / "summary.json").write_text(json.dumps({"run_id": run.name, "steps": 2}))
    (run / "status.json").write_text(json.dumps({"run_id": run.name, "started": "2026-12-05T10:15:00"}))
    (run / "train_config.json").write_text(json.dumps({"train": {"dataset": str(ds)}}))
    assert promote.main(["train", str(run), "--prefix", "hand_", "--reference"]) == 0
    stamps = provenance.stamps(build=False)
    fp = provenance.dataset_identity(ds)["fingerprint"]
    assert stamps["logs/hand_summary.json"]["run_id"] == run.name
    assert (
        stamps["logs/hand_summary.json"]["fingerprint"] == fp and stamps["logs/hand_summary.json"]["stage"] == "train"
    )


def test_rollout_pair_copies_the_first_success_and_the_first_failure(tmp_path):
    run = tmp_path / "run"
    (run / "videos").mkdir(parents=True)
    eps = []
    for i, ok in enumerate([False, True, False, True]):
        name = f"videos/ep{i}.mp4"
        (run / name).write_bytes(b"clip %d" % i)
        eps.append({"episode": i, "success": ok, "video": name})
    eps.append({"episode": 4, "success": True, "video": "videos/gone.mp4"})  # recorded, not on disk: skipped
    (run / "results.json").write_text(json.dumps({"config": {}, "tasks": [{"task_id": 3, "episodes": eps}]}))
    assert [e["episode"] for e in promote.rollouts(run)] == [1, 3, 0, 2]  # successes first, in order
    pair = promote.rollout_pair(run, tmp_path / "out" / "zoo_act")
    assert pair["success"]["episode"] == 1 and pair["failure"]["episode"] == 0 and pair["success"]["task_id"] == 3
    assert (tmp_path / "out" / "zoo_act_success.mp4").read_bytes() == b"clip 1"
    assert (tmp_path / "out" / "zoo_act_failure.mp4").read_bytes() == b"clip 0"
    with pytest.raises(ValueError, match="too large to promote"):
        promote.rollout_pair(run, tmp_path / "out" / "big", max_video_bytes=3)


def test_files_of_one_run_share_one_source_paragraph_and_several_runs_name_their_files(copies, tmp_path):
    """A block of results from one run prints one Source paragraph, not one per file; from two
    runs, each paragraph names the files it covers."""
    a = provenance.stamp(tmp_path / "runs" / "20261205-101500-evaluate-aaa111", None, stage="evaluate")
    b = provenance.stamp(tmp_path / "runs" / "20261205-111500-evaluate-bbb222", None, stage="evaluate")
    files = {"logs/x_results.json": a, "logs/openloop_x.json": a, "logs/latent_x.json": a, "logs/y_results.json": b}
    for name in files:
        (copies / name).write_text("{}")
    provenance.write_stamps(files, reference=True)

    one = provenance.show("logs/x_results.json", "logs/openloop_x.json", "logs/latent_x.json")
    md = one._repr_markdown_()
    assert md.count("*Source: ") == 1 and "aaa111" in md and "bbb222" not in md

    two = provenance.show("logs/x_results.json", "logs/y_results.json", "logs/latent_x.json")
    paragraphs = two._repr_markdown_().split("\n\n")
    assert len(paragraphs) == 2
    assert paragraphs[0].startswith("*Source of `x_results.json`, `latent_x.json`: Run 20261205-101500-evaluate-aaa111")
    assert paragraphs[1].startswith("*Source of `y_results.json`: Run 20261205-111500-evaluate-bbb222")
    assert str(two).splitlines()[1].startswith("Source of `y_results.json`: Run")


def test_rungs_divide_the_samples_by_the_demonstrations_of_each_checkpoint():
    from tutorial_utils.report import zoo_tables

    t = zoo_tables.rungs(
        {
            "twenty": ("logs/vqbet_blind3x_eval_results.json", "logs/latent_vqbet_blind3x_cpu.json"),
            "thirty": ("logs/vqbet_blind30_eval_results.json", "logs/latent_vqbet_blind30_cpu.json"),
        }
    )
    assert list(t["demonstrations"]) == [20, 30] and list(t["steps"]) == [4449, 4449]
    assert list(t["samples per demonstration"]) == [3559, 2373]
    assert list(t["success"]) == ["13/20 (65%)", "2/20 (10%)"] and not t["reached 80%"].any()
    assert not zoo_tables.intervals_overlap(t.loc["twenty"], t.loc["thirty"])
    assert t.loc["thirty", "best at last step"]


def test_a_rung_whose_probe_names_no_training_run_is_refused_naming_the_file(copies):
    from tutorial_utils.errors import ConfigError
    from tutorial_utils.report import zoo_tables

    (copies / "logs" / "r_results.json").write_text(json.dumps({"total_episodes": 20, "total_successes": 5}))
    (copies / "logs" / "latent_r.json").write_text(json.dumps({"training": {}, "results": []}))
    with pytest.raises(ConfigError, match="latent_r.json: no training steps"):
        zoo_tables.rungs({"r": ("logs/r_results.json", "logs/latent_r.json")})
