"""The open-loop check (``tutorial_utils.evaluate.openloop``): demonstrations replayed through a
checkpoint as the served policy. Untrained models on a small synthetic recording: the numbers
are checked against what each model is built to read, not against a skill."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tutorial_utils.evaluate import openloop


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    from tutorial_utils.data.modality import build_modality
    from tutorial_utils.data.stats import compute_all
    from tutorial_utils.data.synth import generate_dataset

    root = generate_dataset(tmp_path_factory.mktemp("ol") / "rec", n_episodes=3, lengths=[18, 20, 22], image_size=64)
    build_modality(root)
    compute_all(root)
    return root


def _checkpoint(tmp_path, recording, family: str, config=None):
    from tutorial_utils import policies
    from tutorial_utils.policies.checkpoint import save_policy
    from tutorial_utils.train.data import dataset_statistics

    stats = dataset_statistics(recording, None)
    model = policies.make(family, config, stats)
    return save_policy(model, tmp_path / "run" / "checkpoints" / "best")


def test_mini_reads_its_cameras_far_more_than_its_state(tmp_path, recording):
    ck = _checkpoint(tmp_path, recording, "mini")
    r = openloop.open_loop(ck, recording, progress=False)
    assert r["family"] == "mini" and r["checkpoint"] == "run/checkpoints/best"  # no machine path
    assert r["episodes"] == [0, 1, 2] and r["predictions"] == sum(-(-n // r["every"]) for n in (18, 20, 22))
    # mini sees the state as sin/cos of raw metres and radians (DiT4DiT's transform): a few
    # centimetres barely move its token, while other frames move its actions
    assert 0.0 < r["reads_state"] < r["reads_cameras"] / 10, r
    assert set(r["action_mae_per_dim"]) == set(openloop.ACTION_NAMES)
    assert r["action_mae"] == pytest.approx(np.mean(list(r["action_mae_per_dim"].values())), abs=2e-3)


def test_act_reads_the_state_unless_built_with_cameras_only(tmp_path, recording):
    pytest.importorskip("lerobot")
    with_state = openloop.open_loop(_checkpoint(tmp_path / "a", recording, "act"), recording, progress=False)
    assert with_state["reads_state"] > 0.0
    cameras_only = _checkpoint(tmp_path / "b", recording, "act", {"use_state": False})
    r = openloop.open_loop(cameras_only, recording, episodes="0,2", progress=False)
    assert r["reads_state"] == 0.0 and r["reads_cameras"] > 0.0 and r["episodes"] == [0, 2]


def test_the_error_is_against_the_demonstrated_actions(tmp_path, recording, monkeypatch):
    """A policy that answers the demonstration's own next actions has no error; one that answers
    zeros has the mean |action| of the executed frames."""
    from tutorial_utils.data.reader import LeRobotDataset
    from tutorial_utils.policies import base as P

    ds = LeRobotDataset(recording, verify_videos=False)
    actions = {e: np.asarray(ds._lowdim(e)["action"], np.float32) for e in range(3)}
    states = {e: np.asarray(ds._lowdim(e)["observation.state"], np.float32) for e in range(3)}

    class Oracle(P.Policy):
        name = "oracle"
        metadata = {"image_size": 64, "replan_steps": 4, "action_horizon": 4}

        def __init__(self, zero=False):
            self.zero = zero

        def infer(self, obs):
            for e, st in states.items():  # find the frame by its state
                hit = np.flatnonzero(np.all(st == obs[P.STATE_KEY], axis=1))
                if hit.size:
                    a = actions[e][hit[0] : hit[0] + 4]
                    a = np.concatenate([a, np.repeat(a[-1:], 4 - len(a), axis=0)])  # a full chunk at the end
                    return {"actions": np.zeros_like(a) if self.zero else a}
            raise AssertionError("unknown state")

    ck = _checkpoint(tmp_path, recording, "mini")
    monkeypatch.setattr("tutorial_utils.policies.make_policy", lambda family, checkpoint: Oracle())
    assert openloop.open_loop(ck, recording, progress=False)["action_mae"] == 0.0
    monkeypatch.setattr("tutorial_utils.policies.make_policy", lambda family, checkpoint: Oracle(zero=True))
    r = openloop.open_loop(ck, recording, progress=False)
    executed = np.concatenate([actions[e][f : f + 4] for e in range(3) for f in range(0, len(actions[e]), 4)])
    assert r["action_mae"] == pytest.approx(float(np.abs(executed).mean()), abs=1e-4)


def test_bad_input_names_the_problem(tmp_path, recording, capsys):
    ck = _checkpoint(tmp_path, recording, "mini")
    with pytest.raises(openloop.OpenLoopError, match="episodes \\[7\\]"):
        openloop.open_loop(ck, recording, episodes="0,7", progress=False)
    with pytest.raises(openloop.OpenLoopError, match="at least two episodes"):
        openloop.open_loop(ck, recording, episodes="1", progress=False)
    with pytest.raises(openloop.OpenLoopError, match="not a LeRobot v2.1 dataset"):
        openloop.open_loop(ck, tmp_path, progress=False)
    assert openloop.main(["--checkpoint", str(ck), "--dataset", str(tmp_path)]) == 2
    assert "not a LeRobot v2.1 dataset" in capsys.readouterr().out


def test_the_cli_writes_the_json_chapter_9_reads(tmp_path, recording, capsys):
    ck = _checkpoint(tmp_path, recording, "mini")
    out = tmp_path / "ol.json"
    argv = ["--checkpoint", str(ck), str(ck), "--dataset", str(recording), "--out", str(out)]
    assert openloop.main([*argv, "--label", "one"]) == 2  # one label for two checkpoints
    assert "one per checkpoint" in capsys.readouterr().out
    assert openloop.main([*argv, "--label", "a", "b"]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "open_loop" and [r["label"] for r in doc["results"]] == ["a", "b"]
    printed = capsys.readouterr().out
    assert "moves with cameras" in printed and str(tmp_path) not in printed.split("wrote")[0]
    assert list(openloop.table(doc["results"]).index) == ["a", "b"]
