"""The recording job: resume, refusal of another dataset, failures midway, and one real episode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from helpers import RECORD_SIZE as SIZE
from helpers import fake_record_item as fake_item
from helpers import record_config as cfg
from tutorial_utils.report import promote as P
from tutorial_utils.sim import record as rec


def episodes(root):
    return [json.loads(x) for x in (root / "meta" / "episodes.jsonl").read_text().splitlines() if x.strip()]


def test_record_and_resume_without_duplicates(tmp_path):
    root = tmp_path / "ds"
    s = rec.record(root, cfg(), episode_fn=fake_item, progress=False, log=None)
    assert s["episodes"] == 4 and s["new_episodes"] == 4
    s2 = rec.record(root, cfg(), episode_fn=fake_item, progress=False, log=None)
    assert s2["episodes"] == 4 and s2["new_episodes"] == 0
    s3 = rec.record(root, cfg(episodes_per_task=3), episode_fn=fake_item, progress=False, log=None)
    assert s3["episodes"] == 6 and s3["new_episodes"] == 2
    man = json.loads((root / rec.MANIFEST).read_text())
    pairs = [(e["task_id"], e["init_state"]) for e in man["episodes"]]
    assert len(pairs) == len(set(pairs)) == 6
    assert [e["length"] for e in episodes(root)] == [e["length"] for e in man["episodes"]]


def test_refuses_a_different_dataset(tmp_path):
    root = tmp_path / "ds"
    rec.record(root, cfg(), episode_fn=fake_item, progress=False, log=None)
    with pytest.raises(rec.RecordError, match="different recording.*image_size"):
        rec.record(root, cfg(image_size=64), episode_fn=fake_item, progress=False, log=None)
    with pytest.raises(rec.RecordError, match="render_profile"):
        rec.record(root, cfg(render_profile="reference"), episode_fn=fake_item, progress=False, log=None)
    # a LeRobot dataset this recorder did not write
    other = tmp_path / "other"
    rec.record(other, cfg(), episode_fn=fake_item, progress=False, log=None)
    (other / rec.MANIFEST).unlink()
    with pytest.raises(rec.RecordError, match="did not write"):
        rec.record(other, cfg(), episode_fn=fake_item, progress=False, log=None)


def test_a_failure_midway_leaves_a_valid_dataset(tmp_path, monkeypatch):
    from tutorial_utils.data.reader import LeRobotDataset
    from tutorial_utils.data.writer import LeRobotWriter

    root = tmp_path / "ds"
    calls = {"n": 0}
    real = LeRobotWriter._write_parquet

    def flaky(self, path, cols):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (simulated)")
        return real(self, path, cols)

    monkeypatch.setattr(LeRobotWriter, "_write_parquet", flaky)
    with pytest.raises(OSError, match="disk full"):
        rec.record(root, cfg(), episode_fn=fake_item, progress=False, log=None)
    ds = LeRobotDataset(root)
    assert ds.num_episodes == 2
    man = json.loads((root / rec.MANIFEST).read_text())
    assert [e["episode_index"] for e in man["episodes"]] == [0, 1]
    monkeypatch.setattr(LeRobotWriter, "_write_parquet", real)
    s = rec.record(root, cfg(), episode_fn=fake_item, progress=False, log=None)
    assert s["episodes"] == 4 and LeRobotDataset(root).num_episodes == 4


def test_failed_items_are_skipped_and_counted(tmp_path):
    s = rec.record(
        tmp_path / "ds",
        cfg(task_ids=(0,), episodes_per_task=1, init_state_offset=99),
        episode_fn=fake_item,
        progress=False,
        log=None,
    )
    assert s["episodes"] == 0 and s["failed"] == 1 and s["success_rate"] == 0.0


def test_bad_parameters_fail_before_any_work(tmp_path):
    from tutorial_utils.sim import libero_env as le

    with pytest.raises(le.LiberoError, match="unknown LIBERO suite"):
        rec.record(tmp_path / "a", cfg(suite="libero_nope"), progress=False, log=None)
    with pytest.raises(le.LiberoError, match="unknown task id 12"):
        rec.record(tmp_path / "b", cfg(task_ids=(12,)), progress=False, log=None)
    with pytest.raises(rec.RecordError, match="out of range"):
        rec.record(tmp_path / "c", cfg(init_state_offset=49), progress=False, log=None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


@pytest.mark.slow
def test_resume_after_kill(tmp_path):
    """SIGKILL a recording between episodes, rerun: every item once, nothing half-written."""
    root = tmp_path / "ds"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from helpers import fake_record_item as fake_item, record_config as cfg
        from tutorial_utils.sim import record as rec
        def slow(c, it):
            time.sleep(0.4)
            return fake_item(c, it)
        rec.record({str(root)!r}, cfg(episodes_per_task=4), episode_fn=slow, progress=False, log=None)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while time.time() < deadline:
        ep = root / "meta" / "episodes.jsonl"
        if ep.is_file() and len(ep.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = len(episodes(root))
    assert 2 <= first < 8
    s = rec.record(root, cfg(episodes_per_task=4), episode_fn=fake_item, progress=False, log=None)
    assert s["episodes"] == 8
    man = json.loads((root / rec.MANIFEST).read_text())
    pairs = [(e["task_id"], e["init_state"]) for e in man["episodes"]]
    assert sorted(pairs) == sorted(cfg(episodes_per_task=4).items())
    from tutorial_utils.data.reader import LeRobotDataset

    LeRobotDataset(root).validate()


def test_replay_drops_noops():
    """Replay keeps only frames whose action moves the arm or changes the gripper command."""
    from tutorial_utils.sim import libero_env as le

    class FakeEnv:
        def __init__(self):
            self.t = 0

        def reset(self):
            return self._obs()

        def _obs(self):
            img = np.full((8, 8, 3), self.t, dtype=np.uint8)
            return {
                "robot0_eef_pos": np.zeros(3) + self.t,
                "robot0_eef_quat": np.array([0, 0, 0, 1.0]),
                "robot0_gripper_qpos": np.zeros(2),
                "agentview_image": img,
                "robot0_eye_in_hand_image": img,
            }

        def step(self, a):
            self.t += 1
            return self._obs(), 0.0, False, {}

        def check_success(self):
            return self.t >= le.NUM_STEPS_WAIT + 5

    z = np.array([0, 0, 0, 0, 0, 0, -1.0])
    m = np.array([0.5, 0, 0, 0, 0, 0, -1.0])
    c = np.array([0, 0, 0, 0, 0, 0, 1.0])
    frames, ok, dropped = rec.replay(FakeEnv(), np.array([z, m, z, c, c]))
    assert ok and dropped == 3  # both z (no motion, gripper unchanged) and the repeated close
    assert frames["action"].shape == (2, 7) and frames["action"][0, 6] == 1.0  # dataset gripper: 1 = open
    assert frames["action"][1, 6] == -1.0 and frames["observation.images.image"].shape == (2, 8, 8, 3)


@pytest.mark.libero
@pytest.mark.slow
def test_one_real_recorded_episode(tmp_path):
    from tutorial_utils.data.reader import LeRobotDataset

    root = tmp_path / "real"
    s = rec.record(
        root, rec.RecordConfig(task_ids=(2,), episodes_per_task=1, image_size=SIZE), progress=False, log=None
    )
    assert s["episodes"] == 1 and s["noops_dropped"] >= 1  # at least the expert's first settle action
    ds = LeRobotDataset(root)
    assert ds.num_episodes == 1 and ds.num_frames == s["frames"]
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["features"]["observation.images.image"]["shape"] == [SIZE, SIZE, 3]
    tasks = [json.loads(x)["task"] for x in (root / "meta" / "tasks.jsonl").read_text().splitlines()]
    assert tasks == ["pick up the black bowl from table center and place it on the plate"]
    man = json.loads((root / rec.MANIFEST).read_text())
    # the expert's first attempt succeeds on this start and is recorded in one pass with the cameras
    assert man["episodes"][0]["recorded_by"] == "expert_with_cameras"


def test_parse_task_ids_and_output_dir(tmp_path):
    from tutorial_utils.errors import ConfigError
    from tutorial_utils.params import parse_task_ids

    assert parse_task_ids("all") is None and parse_task_ids("") is None  # every task of the suite
    assert parse_task_ids("0-2,5") == [0, 1, 2, 5]
    assert parse_task_ids(3) == [3] and parse_task_ids([1, "2"]) == [1, 2]
    with pytest.raises(ConfigError, match="task_ids"):
        parse_task_ids("zero")
    with pytest.raises(ConfigError, match="task_ids"):
        parse_task_ids("4-2")
    assert rec.RecordConfig(task_ids="0-1", episodes_per_task=2, init_state_offset=0).items() == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    # by default the recording starts at init state 10: the evaluation's starts (0, 1, ...) stay held out
    assert rec.RecordConfig(task_ids="0", episodes_per_task=2).items() == [(0, 10), (0, 11)]
    assert rec.resolve_output_dir("run", tmp_path, "libero_spatial", 128) == tmp_path / "dataset"
    assert (
        rec.resolve_output_dir("", tmp_path, "libero_spatial", 128).name == "libero_spatial_no_noops_expert_128_lerobot"
    )
    # a recording from other init states never resumes into (and mixes with) the default one
    assert (
        rec.resolve_output_dir("", tmp_path, "libero_spatial", 128, 10).name
        == "libero_spatial_no_noops_expert_128_init10_lerobot"
    )


def test_schema_report_against_ipec(tmp_path):
    root = tmp_path / "ds"
    rec.record(root, cfg(task_ids=(0,), episodes_per_task=1), episode_fn=fake_item, progress=False, log=None)
    rep = P.schema_report(root)
    assert rep["names_equal"] and rep["dtypes_equal"] and rep["shapes_equal_except_resolution"]
    assert not rep["shapes_equal"]  # 32x32 images instead of IPEC's 256x256
    card = P.dataset_card(root, out=tmp_path / "card.json")
    assert card["total_episodes"] == 1 and card["per_task"]["0"]["episodes"] == 1
    clip = P.recording_episode(root, 0, assets_dir=tmp_path / "assets")
    assert (tmp_path / "assets" / clip["primary"]).stat().st_size > 0
    with pytest.raises(rec.RecordError, match="episode 5 does not exist"):
        P.recording_episode(root, 5, assets_dir=tmp_path / "assets")


def test_the_card_counts_the_tasks_recorded_not_the_letters_of_all(tmp_path, monkeypatch):
    """Chapter 4 reads ``len(card["config"]["task_ids"])``: "all" once made it say 3 tasks."""
    from tutorial_utils.sim import libero_env

    root = tmp_path / "ds"
    rec.record(root, cfg(task_ids="0-1", episodes_per_task=1), episode_fn=fake_item, progress=False, log=None)
    card = P.dataset_card(root, out=tmp_path / "card.json")
    assert card["config"]["task_ids"] == [0, 1]
    # a manifest written before the recorder resolved them says "all": the card resolves it
    man = json.loads((root / rec.MANIFEST).read_text())
    man["config"]["task_ids"] = "all"
    (root / rec.MANIFEST).write_text(json.dumps(man))
    monkeypatch.setattr(libero_env, "num_tasks", lambda suite: 10)
    assert P.dataset_card(root, out=tmp_path / "card.json")["config"]["task_ids"] == list(range(10))
    # without LIBERO: the tasks the manifest saw
    monkeypatch.setattr(libero_env, "num_tasks", lambda suite: (_ for _ in ()).throw(ImportError("no libero")))
    assert P.dataset_card(root, out=tmp_path / "card.json")["config"]["task_ids"] == [0, 1]
