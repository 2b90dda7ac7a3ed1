"""The synthetic LIBERO-schema dataset generator."""

from __future__ import annotations

import numpy as np

from tutorial_utils.data.libero_schema import libero_features
from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.data.synth import generate_dataset, synth_episode


def test_synth_episode_shapes():
    ep = synth_episode(15, 32, np.random.default_rng(0))
    assert ep["observation.state"].shape == (15, 8) and ep["observation.state"].dtype == np.float32
    assert ep["action"].shape == (15, 7) and np.abs(ep["action"]).max() <= 1.0
    assert set(np.unique(ep["action"][:, 6])) <= {-1.0, 1.0}
    for key in ("observation.images.image", "observation.images.wrist_image"):
        assert ep[key].shape == (15, 32, 32, 3) and ep[key].dtype == np.uint8
        assert not np.array_equal(ep[key][0], ep[key][-1])  # frames change over time


def test_generate_sizes_deterministic_and_resumable(tmp_path):
    a = generate_dataset(tmp_path / "a", n_episodes=4, mean_length=12, image_size=32, n_tasks=3, seed=5)
    ds = LeRobotDataset(a)
    assert ds.num_episodes == 4 and len(ds.tasks) == 3
    assert ds.features["observation.images.image"]["shape"] == libero_features(32)["observation.images.image"]["shape"]
    assert all(9 <= n <= 15 for n in ds.lengths)
    # same seed -> same low-dim data; an interrupted generation resumes to the same result
    b = generate_dataset(
        tmp_path / "b",
        n_episodes=2,
        mean_length=12,
        image_size=32,
        n_tasks=3,
        seed=5,
        lengths=[int(x) for x in ds.lengths[:2]],
    )
    b = generate_dataset(
        tmp_path / "b",
        n_episodes=4,
        mean_length=12,
        image_size=32,
        n_tasks=3,
        seed=5,
        lengths=[int(x) for x in ds.lengths],
    )
    db = LeRobotDataset(b)
    for i in range(4):
        np.testing.assert_array_equal(ds.episode(i).state, db.episode(i).state)
    assert ds.tasks == db.tasks
    c = generate_dataset(tmp_path / "a", n_episodes=2, mean_length=10, image_size=32, overwrite=True)
    assert LeRobotDataset(c).num_episodes == 2


def test_generate_explicit_lengths(tmp_path):
    root = generate_dataset(tmp_path / "d", n_episodes=3, lengths=[5, 7, 9], image_size=32)
    assert LeRobotDataset(root).lengths.tolist() == [5, 7, 9]
