"""LIBERO's original HDF5 demonstrations (robomimic layout) -> LeRobot v2.1, checked frame by frame."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tutorial_utils.data.hdf5 import import_hdf5, noop_mask, task_from_filename
from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.errors import DatasetError

SPATIAL = "pick up the black bowl next to the ramekin and place it on the plate"
S = 32  # camera size in the test files (LIBERO's release: 128)


def _demo(rng, t: int, with_noops: bool = False) -> dict[str, np.ndarray]:
    """One demo in LIBERO's layout: robosuite actions (-1 open, +1 close), upside-down images."""
    actions = rng.uniform(-1, 1, (t, 7)).astype(np.float64)
    actions[:, 6] = np.where(np.arange(t) < t // 2, -1.0, 1.0)
    if with_noops:
        actions[1:3, :6] = 0.0  # no motion, gripper unchanged: no-ops
        actions[3, :6], actions[3, 6] = 0.0, 1.0  # no motion, but the gripper changes: kept
        actions[2, 6] = actions[1, 6]
    yy, xx = np.mgrid[0:S, 0:S]
    imgs = []
    for cam in range(2):
        frames = np.zeros((t, S, S, 3), np.uint8)
        for i in range(t):  # bright top-left corner, dark bottom-right: a flip is unmistakable
            frames[i, ..., 0] = np.clip(250 - 6 * (yy + xx) + 3 * i, 0, 255)
            frames[i, ..., 1] = np.clip(40 + 5 * xx + 60 * cam, 0, 255)
            frames[i, ..., 2] = np.clip(30 + 5 * yy, 0, 255)
        imgs.append(frames)
    return {
        "actions": actions,
        "obs/ee_pos": rng.normal(0, 0.2, (t, 3)),
        "obs/ee_ori": rng.normal(0, 1, (t, 3)),
        "obs/gripper_states": rng.uniform(-0.04, 0.04, (t, 2)),
        "obs/joint_states": rng.normal(0, 1, (t, 7)),
        "obs/agentview_rgb": imgs[0],
        "obs/eye_in_hand_rgb": imgs[1],
        "rewards": np.zeros(t, np.uint8),
        "dones": np.eye(t, dtype=np.uint8)[-1],
    }


def write_libero_hdf5(path, demos: dict[str, dict], task: str | None = None, convention: str = "opengl"):
    with h5py.File(path, "w") as f:
        grp = f.create_group("data")
        if task is not None:
            grp.attrs["problem_info"] = json.dumps(
                {"problem_name": "libero_tabletop_manipulation", "domain_name": "x", "language_instruction": task}
            )
        grp.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation"})
        grp.attrs["macros_image_convention"] = convention
        for name, arrays in demos.items():
            g = grp.create_group(name)
            for key, value in arrays.items():
                g.create_dataset(key, data=value)
            g.attrs["num_samples"] = len(arrays["actions"])
    return path


@pytest.fixture
def libero_files(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "libero_spatial"
    folder.mkdir()
    a = {"demo_0": _demo(rng, 6), "demo_10": _demo(rng, 5), "demo_2": _demo(rng, 7)}
    b = {"demo_0": _demo(rng, 4)}
    write_libero_hdf5(folder / "whatever_name_demo.hdf5", a, task=SPATIAL)
    write_libero_hdf5(folder / "KITCHEN_SCENE3_turn_on_the_stove_demo.hdf5", b)
    return folder, a, b


def test_task_from_the_file_name():
    assert task_from_filename("KITCHEN_SCENE3_turn_on_the_stove_demo.hdf5") == "turn on the stove"
    assert task_from_filename("LIVING_ROOM_SCENE10_put_the_cup_demo.hdf5") == "put the cup"
    assert (
        task_from_filename("/x/pick_up_the_black_bowl_on_the_plate_demo.hdf5") == "pick up the black bowl on the plate"
    )


def test_episodes_frame_by_frame(libero_files, tmp_path):
    folder, a, b = libero_files
    out = import_hdf5(folder, tmp_path / "ds", preset="ultrafast", crf=10)
    assert out["episodes"] == 4 and out["frames"] == 6 + 7 + 5 + 4 and out["image_size"] == S
    ds = LeRobotDataset(tmp_path / "ds")
    ds.validate(deep=True)
    # files sorted by name (KITCHEN... < whatever...), demos by their number: 0, 2, 10
    expected = [
        (b["demo_0"], "turn on the stove"),
        (a["demo_0"], SPATIAL),
        (a["demo_2"], SPATIAL),
        (a["demo_10"], SPATIAL),
    ]
    for i, (demo, task) in enumerate(expected):
        ep = ds.episode(i)
        assert ep.task == task and ep.length == len(demo["actions"])
        want_action = demo["actions"].astype(np.float32)
        want_action[:, 6] *= -1  # robosuite (-1 open) -> dataset (+1 open)
        np.testing.assert_array_equal(ep.action, want_action)
        want_state = np.concatenate([demo["obs/ee_pos"], demo["obs/ee_ori"], demo["obs/gripper_states"]], 1)
        np.testing.assert_array_equal(ep.state, want_state.astype(np.float32))
        for cam, key in (
            ("observation.images.image", "obs/agentview_rgb"),
            ("observation.images.wrist_image", "obs/eye_in_hand_rgb"),
        ):
            got = ep.frames(cam).astype(np.int16)
            flipped = demo[key][:, ::-1, ::-1].astype(np.int16)
            assert got.shape == flipped.shape
            assert np.abs(got - flipped).mean() < 4, "decoded frames differ from the rotated source"
            assert np.abs(got - demo[key].astype(np.int16)).mean() > 40, "images were not rotated 180 degrees"
    tasks = [json.loads(line)["task"] for line in (tmp_path / "ds/meta/tasks.jsonl").read_text().splitlines()]
    assert sorted(tasks) == sorted({SPATIAL, "turn on the stove"})


def test_opencv_files_are_not_flipped_and_resize_and_noops(tmp_path):
    rng = np.random.default_rng(1)
    demo = _demo(rng, 8, with_noops=True)
    path = write_libero_hdf5(tmp_path / "put_the_cup_demo.hdf5", {"demo_0": demo}, convention="opencv")
    out = import_hdf5(path, tmp_path / "ds", image_size=16, drop_noops=True, preset="ultrafast", crf=10)
    keep = ~noop_mask(demo["actions"])
    assert keep.tolist() == [True, False, False, True, True, True, True, True]
    ep = LeRobotDataset(tmp_path / "ds").episode(0)
    assert out["frames"] == ep.length == 6 and ep.frames("observation.images.image").shape == (6, 16, 16, 3)
    np.testing.assert_array_equal(ep.state[:, :3], demo["obs/ee_pos"][keep].astype(np.float32))
    top_left = ep.frames("observation.images.image")[:, :4, :4, 0].mean()
    assert top_left > 200  # opencv convention: already upright, kept as is


def test_noop_rule_matches_the_recording_rule():
    from tutorial_utils.sim.libero_env import is_noop

    rng = np.random.default_rng(2)
    actions = rng.uniform(-1, 1, (40, 7))
    actions[rng.random(40) < 0.5, :6] = 0.0
    actions[:, 6] = np.sign(rng.uniform(-1, 1, 40))
    mask = noop_mask(actions)
    assert mask.any() and not mask.all()
    assert mask.tolist() == [is_noop(a, actions[i - 1] if i else None) for i, a in enumerate(actions)]


def test_resume_and_refusals(libero_files, tmp_path):
    folder, _, _ = libero_files
    root = tmp_path / "ds"
    first = import_hdf5(folder, root, max_episodes=2, preset="ultrafast")
    assert first["episodes"] == 2
    again = import_hdf5(folder, root, preset="ultrafast")
    assert again["resumed_from"] == 2 and again["episodes"] == 4
    with pytest.raises(DatasetError, match="other HDF5 sources or settings"):
        import_hdf5(folder, root, drop_noops=True, preset="ultrafast")
    bad = tmp_path / "bad_demo.hdf5"
    demo = _demo(np.random.default_rng(3), 3)
    del demo["obs/ee_ori"]
    write_libero_hdf5(bad, {"demo_0": demo})
    with pytest.raises(DatasetError, match=r"bad_demo\.hdf5 \[data/demo_0/obs/ee_ori\]: missing.*Fix: export"):
        import_hdf5(bad, tmp_path / "bad")
    with pytest.raises(DatasetError, match="no demonstrations"):
        with h5py.File(tmp_path / "empty_demo.hdf5", "w") as f:
            f.create_group("data")
        import_hdf5(tmp_path / "empty_demo.hdf5", tmp_path / "empty")


def test_cli_import_hdf5(libero_files, tmp_path, capsys):
    from tutorial_utils.data.cli import main

    folder, _, _ = libero_files
    assert main(["import-hdf5", str(folder), "--root", str(tmp_path / "ds"), "--max-episodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 2
    assert main(["import-hdf5", str(tmp_path / "nothing"), "--root", str(tmp_path / "x")]) == 1
    assert "no such file or folder" in capsys.readouterr().err
