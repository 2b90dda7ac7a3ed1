"""Check, then act (issue 26): a destructive runs operation that refuses changes nothing.

Each refusal is checked by hashing every byte of the run folder (names, link targets, file
contents) before and after: a resume from another run's checkpoint, a resume from a corrupt
checkpoint, a delete through a symbolic link, a refused rollback, a bad keep_last, an export
over an existing bundle. Every run is the tiny ``mlp`` family on the in-memory synthetic source."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from helpers import TINY_MLP_RUN
from tutorial_utils.errors import TutorialError
from tutorial_utils.runs import checkpoints as rck
from tutorial_utils.runs import control, registry
from tutorial_utils.runs.cli import main as runs_cli
from tutorial_utils.runs.export import ExportError, export
from tutorial_utils.train.checkpoints import CheckpointNotFound, load_train_state
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source
from tutorial_utils.train.loop import train

torch.set_num_threads(1)

BASE = {**TINY_MLP_RUN, "augment_shift": 0, "optimizer_lr": 3e-3}


def tree_hash(root: Path) -> str:
    """Every name, link target and file content under ``root`` (links not followed)."""
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode())
            if p.is_symlink():
                h.update(b"->" + os.readlink(p).encode())
            elif p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=5, length=12, image_size=16)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, source):
    """Two finished runs of 12 steps (checkpoints 4, 8, 12): ``a`` and ``b`` (same model, other
    seed), and ``wide`` (another model)."""
    root = tmp_path_factory.mktemp("runs")
    for name, kw in (("a", {}), ("b", {"seed": 7}), ("wide", {"hidden_dim": 24})):
        train(TrainConfig.from_overrides({**BASE, **kw, "output_dir": str(root / name), "steps": 12}), source=source)
    return root


def _copy_run(runs: Path, name: str, dest: Path) -> Path:
    import shutil

    shutil.copytree(runs / name, dest, symlinks=True)
    cfg = json.loads((dest / "train_config.json").read_text())
    cfg["train"]["output_dir"] = str(dest)
    (dest / "train_config.json").write_text(json.dumps(cfg))
    return dest


def test_resume_from_another_models_checkpoint_changes_nothing(runs, tmp_path, source):
    run = _copy_run(runs, "a", tmp_path / "a")
    before = tree_hash(run)
    with pytest.raises(TutorialError, match="Nothing was changed"):
        control.resume(run, resume_from=str(runs / "wide/checkpoints/step_000004"), source=source)
    assert tree_hash(run) == before
    assert (run / "checkpoints/last").resolve().name == "step_000012"


def test_resume_from_a_same_shape_foreign_checkpoint_forks_with_full_lineage(runs, tmp_path, source):
    run = _copy_run(runs, "a", tmp_path / "a")
    before = tree_hash(run)
    foreign = runs / "b/checkpoints/step_000004"
    res = control.resume(run, resume_from=str(foreign), source=source)
    assert tree_hash(run) == before  # the run is not touched: no discarded checkpoints, same weights
    fork = Path(res.output_dir) if hasattr(res, "output_dir") else None
    forks = [p for p in tmp_path.iterdir() if p.name.startswith("a-from-")]
    assert len(forks) == 1 and (fork is None or fork.resolve() == forks[0].resolve())
    saved = json.loads((forks[0] / "train_config.json").read_text())
    lineage = saved["forked_from"]
    assert lineage["run"] == "a" and lineage["checkpoint"] == "step_000004" and lineage["step"] == 4
    assert lineage["checkpoint_path"] == str(foreign.resolve())
    assert lineage["checkpoint_run"]["run"] == "b" and lineage["checkpoint_run"]["path"] == str((runs / "b").resolve())
    assert saved["resumes"][-1]["from"] == "step_000004"
    assert res.steps_done == 12 and res.summary["start_step"] == 4


def test_resume_from_a_corrupt_training_state_is_our_error_and_changes_nothing(runs, tmp_path, source):
    run = _copy_run(runs, "a", tmp_path / "a")
    (run / "checkpoints/step_000004/training_state.pt").write_bytes(b"not a torch file at all")
    before = tree_hash(run)
    with pytest.raises(CheckpointNotFound) as info:
        control.resume(run, resume_from="step_000004", source=source)
    assert "weights_only=False" not in str(info.value).replace(
        "do not load training_state.pt with weights_only=False", ""
    )
    assert "training_state.pt is corrupt" in str(info.value) and "runs checkpoints RUN" in str(info.value)
    assert tree_hash(run) == before
    with pytest.raises(CheckpointNotFound, match="corrupt"):
        load_train_state(run / "checkpoints/step_000004")


def test_resume_with_a_change_a_resume_cannot_make_changes_nothing(runs, tmp_path, source):
    run = _copy_run(runs, "a", tmp_path / "a")
    before = tree_hash(run)
    with pytest.raises(TutorialError, match="which a resume cannot change"):
        control.resume(run, resume_from="step_000004", source=source, seed=99)
    assert tree_hash(run) == before


def test_a_resume_in_place_from_an_earlier_step_still_rewinds(runs, tmp_path, source):
    run = _copy_run(runs, "a", tmp_path / "a")
    res = control.resume(run, resume_from="step_000008", source=source)
    assert res.summary["start_step"] == 8 and res.steps_done == 12
    assert (run / "checkpoints/last").resolve().name == "step_000012"


def test_the_loop_refuses_a_foreign_resume_from_before_touching_the_run(runs, tmp_path, source):
    run = _copy_run(runs, "a", tmp_path / "a")
    foreign = runs / "b/checkpoints/step_000004"
    cfg = TrainConfig.from_overrides(
        {**BASE, "output_dir": str(run), "steps": 12, "resume": True, "resume_from": str(foreign)}
    )
    with pytest.raises(TutorialError, match="is not a checkpoint of"):
        train(cfg, source=source)
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000004", "step_000008", "step_000012"]


def test_delete_through_a_symlink_deletes_nothing_outside(runs, tmp_path, capsys):
    outside = _copy_run(runs, "a", tmp_path / "elsewhere")
    root = tmp_path / "runs"
    root.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    before = tree_hash(outside)
    with pytest.raises(registry.RunBusy, match="symbolic link"):
        registry.delete("link", root)
    assert runs_cli(["--runs-dir", str(root), "delete", "link"]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and "Traceback" not in err
    assert tree_hash(outside) == before and (root / "link").is_symlink()


def test_a_refused_rollback_changes_nothing(runs, tmp_path):
    run = _copy_run(runs, "a", tmp_path / "a")
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    before, before_dest = tree_hash(run), tree_hash(dest)
    with pytest.raises(registry.RunBusy, match="not empty"):
        control.rollback(run, "step_000004", dest)
    with pytest.raises(CheckpointNotFound):
        control.rollback(run, "step_000099")
    (run / "checkpoints/step_000008/training_state.pt").write_bytes(b"\x00" * 10)
    before = tree_hash(run)
    n = len(list(tmp_path.iterdir()))
    with pytest.raises(CheckpointNotFound, match="corrupt"):
        control.rollback(run, "step_000008")
    assert tree_hash(run) == before and tree_hash(dest) == before_dest and len(list(tmp_path.iterdir())) == n


def test_prune_with_a_bad_keep_last_changes_nothing(runs, tmp_path):
    run = _copy_run(runs, "a", tmp_path / "a")
    before = tree_hash(run)
    for bad in (0, -3, True):
        with pytest.raises(TutorialError, match="keep_last"):
            rck.prune(run, bad)
    assert tree_hash(run) == before
    gone = rck.prune(run, 1)  # a valid keep_last still prunes
    assert set(gone) <= {"step_000004", "step_000008"} and (run / "checkpoints/step_000012").is_dir()


def test_export_over_an_existing_bundle_changes_nothing(runs, tmp_path):
    bundle = tmp_path / "bundle"
    export(runs / "a/checkpoints/step_000004", bundle)
    before = tree_hash(bundle)
    with pytest.raises(ExportError, match="not empty"):
        export(runs / "a/checkpoints/step_000008", bundle)
    assert tree_hash(bundle) == before
