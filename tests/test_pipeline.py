"""The main job's chain: stages pass outputs forward, and a second run reuses finished runs."""

import json

from conftest import write_notebook
from tutorial_utils import logs, pipeline
from tutorial_utils.report import promote, train_report


def _stage_notebooks(folder):
    write_notebook(
        folder / "make.md",
        [
            (
                "code",
                "from tutorial_utils import jobs\njobs.update_status(run_dir, success_signs={'dataset': f'/data/{n}'})",
            )
        ],
        params="n = 3\nrun_dir = ''",
    )
    write_notebook(
        folder / "use.md",
        [
            (
                "code",
                "from pathlib import Path\nPath(run_dir, 'used.txt').write_text(dataset)\n"
                "from tutorial_utils import jobs\njobs.update_status(run_dir, used=dataset)",
            )
        ],
        params="dataset = ''\nrun_dir = ''",
    )


def test_chain_passes_outputs_and_reuses_finished_runs(tmp_path, runs_dir, monkeypatch):
    nbs = tmp_path / "jobs"
    _stage_notebooks(nbs)
    monkeypatch.setattr(pipeline.paths, "JOBS", nbs)
    stages = [
        pipeline.Stage("make", "make.md", lambda ctx: {}, lambda rd, st: {"dataset": st["success_signs"]["dataset"]}),
        pipeline.Stage("use", "use.md", lambda ctx: {"dataset": ctx["dataset"]}, lambda rd, st: {"used": st["used"]}),
    ]
    first = pipeline.run(stages, echo=False)
    assert first["used"] == "/data/3"
    assert [t["reused"] for t in first["timings"]] == [False, False]
    again = pipeline.run(stages, echo=False)
    assert [t["reused"] for t in again["timings"]] == [True, True]
    assert again["use_run"] == first["use_run"]


def test_stage_without_outputs_fails_clearly(tmp_path):
    import pytest

    with pytest.raises(RuntimeError, match="names no dataset"):
        pipeline._record_outputs(tmp_path, {"success_signs": {}})
    with pytest.raises(RuntimeError, match="left no checkpoint"):
        pipeline._train_outputs(tmp_path, {"train": {"best_checkpoint": str(tmp_path / "nope")}})


LOG = """Total parameters: 2,804,359 (2.804M)
Trainable parameters: 1,539,079 (1.539M)
Frozen parameters: 1,265,280 (1.265M)
Trainable ratio: 54.88%
  Total optimization steps = 2
  len(vla_train_dataloader) = 52
[Exp: r] Step 1, Loss: {'action_dit_loss': 1.69, 'total_loss': 1.69}
[Exp: r] Step 2, Loss: {'action_dit_loss': 2.42, 'total_loss': 2.42}
Training complete. Final model saved at /x/final_model
"""


def test_smoke_test_signs_seen_and_missing(tmp_path):
    (tmp_path / "train.log").write_text(LOG)
    signs = train_report.smoke_test_signs(logs.parse_train_log(tmp_path / "train.log"), steps=2)
    assert all(r["seen"] for r in signs)
    (tmp_path / "train.log").write_text(
        "\n".join(line for line in LOG.splitlines() if "Step 2" not in line and "complete" not in line)
    )
    missing = [
        r["sign"]
        for r in train_report.smoke_test_signs(logs.parse_train_log(tmp_path / "train.log"), steps=2)
        if not r["seen"]
    ]
    assert missing == ["Step 2, Loss: {...}", "Training complete. Final model saved"]


def test_promote_copies_a_finished_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(LOG)
    (run / "summary.json").write_text(json.dumps({"steps": 2}))
    out = promote.training(run, prefix="t_", logs_dir=tmp_path / "logs")
    assert sorted(p.name for p in out.values()) == ["t_summary.json", "t_train.log"]
    import pytest

    with pytest.raises(FileNotFoundError, match="finished training run"):
        promote.training(tmp_path / "logs", logs_dir=tmp_path / "x")


def test_for_book_makes_this_machines_paths_portable(tmp_path, monkeypatch):
    from tutorial_utils import paths

    repo = tmp_path / "repo"
    monkeypatch.setenv("HOME", "/home/reader")
    monkeypatch.setattr(paths, "REPO", repo)
    monkeypatch.setattr(paths, "RUNS", repo / "runs")
    monkeypatch.setattr(paths, "DATA", tmp_path / "disk" / "data")  # TUTORIAL_DATA_DIR outside the repo
    got = paths.for_book(
        {
            "ckpt": f"{repo}/runs/r1/checkpoints/best",
            "n": 3,
            "cmd": ["--data", f"{tmp_path}/disk/data/ds", "--home", "/home/reader/.cache/x"],
            "line": f"loading {repo}/runs/r1/final_model at step 3",
            "cd": f"cd {repo} && make",
        }
    )
    assert got == {
        "ckpt": "runs/r1/checkpoints/best",
        "n": 3,
        "cmd": ["--data", "$TUTORIAL_DATA_DIR/ds", "--home", "~/.cache/x"],
        "line": "loading runs/r1/final_model at step 3",
        "cd": "cd . && make",
    }
    assert paths.for_book(f"{repo}other/x").endswith("/repoother/x")  # a sibling folder is not the repository


def test_for_book_writes_the_cache_temp_and_home_folders_as_names(monkeypatch, tmp_path):
    import tempfile

    from tutorial_utils import paths

    monkeypatch.setenv("HOME", "/home/reader")
    monkeypatch.setenv("HF_HOME", "/home/reader/.cache/huggingface")
    monkeypatch.setattr(tempfile, "tempdir", "/scratch/tmp")
    line = (
        "models /home/reader/.cache/huggingface: 75 GB free; at /scratch/tmp/gpu-path-1q/datasets; "
        "see /home/reader/notes.txt, not /home/readers or /scratch/tmpfoo"
    )
    assert paths.for_book(line) == (
        "models $HF_HOME: 75 GB free; at $TMPDIR/gpu-path-1q/datasets; see ~/notes.txt, not /home/readers "
        "or /scratch/tmpfoo"
    )
    assert str(paths.from_book("$TMPDIR/gpu-path-1q")) == "/scratch/tmp/gpu-path-1q"
    assert str(paths.from_book("~/notes.txt")) == "/home/reader/notes.txt"


def test_promoted_files_carry_no_path_of_this_machine(tmp_path, monkeypatch):
    from tutorial_utils import paths

    monkeypatch.setattr(paths, "REPO", tmp_path)
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "train.log").write_text(LOG + f"Saved checkpoint to {run}/checkpoints/step_2\n")
    (run / "summary.json").write_text(json.dumps({"steps": 2, "best": str(run / "checkpoints/best")}))
    out = promote.training(run, prefix="t_", logs_dir=tmp_path / "logs")
    for p in out.values():
        assert str(tmp_path) not in p.read_text(), p
    assert json.loads(out["summary.json"].read_text())["best"] == "runs/r1/checkpoints/best"
    assert "Saved checkpoint to runs/r1/checkpoints/step_2" in out["train.log"].read_text()


def test_promote_puts_the_recording_card_and_its_first_episode_in_this_builds_copy(tmp_path, monkeypatch):
    from tutorial_utils import paths
    from tutorial_utils.data import synth

    ds = tmp_path / "data" / "rec"
    synth.generate_dataset(ds, n_episodes=2, mean_length=12, image_size=32)
    monkeypatch.setattr(paths, "PROMOTED", tmp_path / "promoted")
    ctx = {"profile": "cpu", "dataset": str(ds), "timings": [{"stage": "record", "run_s": 12.5}]}
    out = {p.name for p in pipeline.promote(ctx)}
    assert out == {
        "record_dataset.json",
        "record_episode.json",
        "record_episode_primary.mp4",
        "record_episode_wrist.mp4",
        "promoted.json",
    }
    card = json.loads((tmp_path / "promoted" / "logs" / "record_dataset.json").read_text())
    assert card["total_episodes"] == 2 and card["job_wall_s"] == 12.5
    assert (tmp_path / "promoted" / "assets" / "record_episode_primary.mp4").stat().st_size > 0
    stamp = json.loads((tmp_path / "promoted" / "logs" / "promoted.json").read_text())["files"][
        "logs/record_dataset.json"
    ]
    assert stamp["dataset"] == "rec" and stamp["episodes"] == 2 and len(stamp["fingerprint"]) == 12
    assert pipeline.promote({"profile": "ci", "dataset": str(ds)}) == []  # smoke runs are not promoted


def test_recorded_dataset_follows_the_card_then_the_chain(tmp_path, monkeypatch):
    from tutorial_utils import paths
    from tutorial_utils.data import synth

    monkeypatch.setattr(paths, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(paths, "PROMOTED", tmp_path / "promoted")  # not this checkout's own build
    (tmp_path / "logs").mkdir()
    (tmp_path / "runs").mkdir()
    assert pipeline.recorded_dataset() == (None, None)
    root = synth.generate_dataset(tmp_path / "runs" / "r1" / "dataset", n_episodes=1, mean_length=4, image_size=32)
    (tmp_path / "runs" / "pipeline.json").write_text(json.dumps({"dataset": str(root)}))
    folder, source = pipeline.recorded_dataset()
    assert folder == root and source.endswith("pipeline.json")
    (tmp_path / "logs" / "record_dataset.json").write_text(
        json.dumps({"summary": {"output_dir": "$TUTORIAL_RUNS_DIR/gone"}})
    )
    assert pipeline.recorded_dataset()[0] == root  # the card names a folder that is gone: the chain's is used


def test_from_book_inverts_for_book(monkeypatch, tmp_path):
    from tutorial_utils import paths

    assert paths.from_book("runs/x/dataset") == paths.REPO / "runs/x/dataset"
    monkeypatch.setattr(paths, "RUNS", tmp_path / "elsewhere")
    assert paths.from_book("$TUTORIAL_RUNS_DIR/a/b") == tmp_path / "elsewhere" / "a/b"
    assert paths.from_book(paths.for_book(str(tmp_path / "elsewhere" / "c"))) == tmp_path / "elsewhere" / "c"
