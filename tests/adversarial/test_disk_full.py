"""A full disk never leaves half a file and always gives the project's teaching error.

Each case runs on a small tmpfs mounted for the test (root only; where mounting is not
allowed the tests skip and say why): the dataset statistics, a policy checkpoint, a
training-state checkpoint and the job runner's writability check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import fill
from tutorial_utils.errors import DiskFull


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(".*") if ".tmp" in p.name or ".old-" in p.name)


def test_dataset_statistics_on_a_full_disk(small_disk):
    from tutorial_utils.data import stats
    from tutorial_utils.data.synth import generate_dataset

    root = generate_dataset(small_disk / "ds", n_episodes=2, mean_length=8, image_size=32, seed=0)
    before = {p: p.read_bytes() for p in (root / "meta").iterdir() if p.is_file()}
    fill(small_disk)
    with pytest.raises(DiskFull, match=r"stats_gr00t\.json|steps_index|stats_cache|disk is full"):
        stats.compute_all(root)
    assert not leftovers(root)
    assert {p: p.read_bytes() for p in before} == before  # nothing that existed was touched


def test_policy_checkpoint_on_a_full_disk(small_disk):
    pytest.importorskip("torch")
    from tutorial_utils import policies
    from tutorial_utils.train.data import synthetic_source

    model = policies.make("mlp", {"image_size": 16, "pool": 2, "hidden_dim": 16}, synthetic_source(2, 6, 16).statistics)
    model.save(small_disk / "ck")  # fits
    first = (small_disk / "ck" / "model.safetensors").read_bytes()
    fill(small_disk, leave=2048)
    with pytest.raises(DiskFull, match="ck"):
        model.save(small_disk / "ck")
    assert (small_disk / "ck" / "model.safetensors").read_bytes() == first  # the old checkpoint is intact
    assert not leftovers(small_disk)


def test_training_state_checkpoint_on_a_full_disk(small_disk):
    torch = pytest.importorskip("torch")
    from tutorial_utils.io import atomic_dir

    fill(small_disk, leave=2048)
    with pytest.raises(DiskFull, match="step_000001"):
        with atomic_dir(small_disk / "step_000001") as tmp:
            torch.save({"w": torch.zeros(200_000)}, tmp / "training_state.pt")
    assert not leftovers(small_disk)


def test_job_run_directory_on_a_full_disk(small_disk):
    from tutorial_utils import jobs

    fill(small_disk)
    with pytest.raises(DiskFull, match="disk is full"):
        jobs.ensure_run_dir(small_disk / "run", "train")
    assert not list((small_disk / "run").glob(".write-probe-*"))
