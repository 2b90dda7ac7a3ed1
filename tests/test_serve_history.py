"""Observation history (issue 27, item 2): training windows with LeRobot's ``delta_timestamps``
semantics (clamped into the episode, ``*_is_pad`` masks), the served policy's per-episode history
(:class:`tutorial_utils.policies.trainable.ServedModel`), its reset (new connection, new
``episode_id``, new prompt, ``reset()``) and the evaluation client's ``observe_only`` frames.

The LeRobot families' own training with history (Diffusion Policy with its recipe's
``n_obs_steps=2``) runs in ``tests/test_policies_lerobot.py``; the equality with LeRobot's own
``LeRobotDataset`` on a converted recording in ``tests/test_train_lerobot_parity.py``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from helpers import needs_lerobot, openpi_observation
from tutorial_utils.policies.base import (
    BATCH_ACTION,
    BATCH_ACTION_IS_PAD,
    BATCH_IMAGE,
    BATCH_STATE,
    BATCH_WRIST,
    EPISODE_KEY,
    OBSERVE_ONLY_KEY,
    STATE_KEY,
)
from tutorial_utils.policies.trainable import ServedModel, TimeWindows
from tutorial_utils.train.data import ArraySource, WindowDataset, collate, random_shift, window_indices

LENGTHS = (5, 7, 4)


def numbered_source(size: int = 8) -> ArraySource:
    """Three episodes whose every frame carries its global index (state, action, image pixels)."""
    n = sum(LENGTHS)
    idx = np.arange(n)
    images = np.broadcast_to((idx % 256).astype(np.uint8)[:, None, None, None], (n, size, size, 3)).copy()
    state = np.repeat(idx[:, None], 8, 1).astype(np.float32)
    action = np.repeat(idx[:, None], 7, 1).astype(np.float32)
    episodes = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    return ArraySource(images, images, state, action, episodes, ["a", "b", "c"], statistics={})


def lerobot_query(i: int, obs_deltas, action_deltas) -> tuple[dict, dict]:
    """LeRobot 0.4.4's own ``LeRobotDataset._get_query_indices`` for frame ``i`` of the same episodes."""
    needs_lerobot()
    from tutorial_utils.policies._torchvision import ensure_importable

    ensure_importable()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    episodes = [{"dataset_from_index": int(a), "dataset_to_index": int(b)} for a, b in zip(starts[:-1], starts[1:])]
    ep = int(np.searchsorted(starts, i, side="right") - 1)
    fake = SimpleNamespace(
        meta=SimpleNamespace(episodes=episodes),
        delta_indices={BATCH_STATE: list(obs_deltas), BATCH_ACTION: list(action_deltas)},
    )
    return LeRobotDataset._get_query_indices(fake, i, ep)


@pytest.mark.parametrize(
    ("obs_deltas", "action_deltas"), [([-1, 0], list(range(-1, 15))), ([-4, -3, -2, -1, 0], list(range(-4, 8)))]
)
def test_windows_are_lerobots_delta_timestamps_windows(obs_deltas, action_deltas):
    """Every frame of every episode: the same indices and padding masks as LeRobot's own code."""
    src = TimeWindows(numbered_source(), obs_deltas, action_deltas)
    for i in range(len(src)):
        w = src.get(i, horizon=999)  # the deltas decide, not the horizon
        query, padding = lerobot_query(i, obs_deltas, action_deltas)
        np.testing.assert_array_equal(w[BATCH_STATE][:, 0], query[BATCH_STATE])
        np.testing.assert_array_equal(w[BATCH_IMAGE][:, 0, 0, 0], np.asarray(query[BATCH_STATE]) % 256)
        np.testing.assert_array_equal(w[BATCH_ACTION][:, 0], query[BATCH_ACTION])
        np.testing.assert_array_equal(w[BATCH_STATE + "_is_pad"], padding[BATCH_STATE + "_is_pad"].numpy())
        np.testing.assert_array_equal(w[BATCH_IMAGE + "_is_pad"], padding[BATCH_STATE + "_is_pad"].numpy())
        np.testing.assert_array_equal(w[BATCH_ACTION_IS_PAD], padding[BATCH_ACTION + "_is_pad"].numpy())


def test_history_at_an_episode_start_repeats_the_first_frame_and_marks_it():
    src = TimeWindows(numbered_source(), [-2, -1, 0], [-2, -1, 0, 1])
    w = src.get(5, 4)  # the first frame of episode 1 (frames 5..11)
    assert w[BATCH_STATE][:, 0].tolist() == [5, 5, 5]
    assert w[BATCH_STATE + "_is_pad"].tolist() == [True, True, False]
    assert w[BATCH_ACTION][:, 0].tolist() == [5, 5, 5, 6] and w[BATCH_ACTION_IS_PAD].tolist() == [
        True,
        True,
        False,
        False,
    ]
    w = src.get(6, 4)
    assert w[BATCH_STATE][:, 0].tolist() == [5, 5, 6] and w[BATCH_STATE + "_is_pad"].tolist() == [True, False, False]
    w = src.get(11, 4)  # the last frame: the future actions repeat it, marked
    assert w[BATCH_ACTION][:, 0].tolist() == [9, 10, 11, 11] and w[BATCH_ACTION_IS_PAD].tolist() == [
        False,
        False,
        False,
        True,
    ]
    idx, pad = window_indices(0, 0, 5, [-1, 0, 5])
    assert idx.tolist() == [0, 0, 4] and pad.tolist() == [True, False, True]


def test_single_frame_windows_are_unchanged_and_history_windows_resize_and_shift_per_frame():
    import torch

    base = numbered_source(size=8)
    one = base.get(3, 4)
    assert (
        one[BATCH_IMAGE].shape == (8, 8, 3) and one[BATCH_STATE].shape == (8,) and "observation.state_is_pad" not in one
    )
    assert one[BATCH_ACTION][:, 0].tolist() == [3, 4, 4, 4] and one[BATCH_ACTION_IS_PAD].tolist() == [
        False,
        False,
        True,
        True,
    ]
    ds = WindowDataset(TimeWindows(base, [-1, 0], range(-1, 3)), np.arange(len(base)), 4, image_size=16)
    b = collate([ds[i] for i in (0, 1, 6)])
    assert b[BATCH_IMAGE].shape == (3, 2, 16, 16, 3) and b[BATCH_WRIST].shape == (3, 2, 16, 16, 3)
    assert b[BATCH_STATE].shape == (3, 2, 8) and b[BATCH_STATE + "_is_pad"][:, 0].tolist() == [True, False, False]
    shifted = random_shift(b, 2, torch.Generator().manual_seed(0))
    assert shifted[BATCH_IMAGE].shape == (3, 2, 3, 16, 16) and shifted[BATCH_IMAGE].dtype == torch.float32


# --- the served history ------------------------------------------------------------------------------


class RecordingModel:
    """Just enough of a TrainablePolicy: keeps every batch ``predict`` receives."""

    name, gripper, action_horizon, image_size = "recording", "dataset", 4, 8

    def __init__(self, n_obs_steps: int):
        self.n_obs_steps, self.batches = n_obs_steps, []

    def predict(self, batch, generator=None):
        self.batches.append(batch)
        return np.zeros((1, 4, 7), np.float32)


def obs_at(t: float, episode=None, prompt: str = "put the bowl on the plate", **extra) -> dict:
    obs = openpi_observation(8)
    obs[STATE_KEY] = np.full(8, t, np.float32)
    obs["prompt"] = prompt
    if episode is not None:
        obs[EPISODE_KEY] = episode
    return {**obs, **extra}


def test_served_history_pads_at_the_start_keeps_the_last_frames_and_resets_per_episode():
    model = RecordingModel(n_obs_steps=3)
    served = ServedModel(model)
    assert served.metadata["n_obs_steps"] == 3

    def last():
        b = model.batches[-1]
        return b[BATCH_STATE][0, :, 0].tolist(), b[BATCH_STATE + "_is_pad"][0].tolist()

    served.infer(obs_at(0, "e1"))
    assert model.batches[-1][BATCH_IMAGE].shape == (1, 3, 8, 8, 3)
    assert last() == ([0, 0, 0], [True, True, False])
    reply = served.infer(obs_at(1, "e1", **{OBSERVE_ONLY_KEY: True}))  # joins the history, no prediction
    assert reply["actions"].shape == (0, 7) and len(model.batches) == 1
    served.infer(obs_at(2, "e1"))
    assert last() == ([0, 1, 2], [False, False, False])
    served.infer(obs_at(3, "e1"))
    assert last() == ([1, 2, 3], [False, False, False])
    served.infer(obs_at(10, "e2"))  # a new episode_id: a new history
    assert last() == ([10, 10, 10], [True, True, False])
    served.infer(obs_at(11, "e2"))
    assert last() == ([10, 10, 11], [True, False, False])
    served.reset()  # what the server does on a new connection
    served.infer(obs_at(12, "e2"))
    assert last() == ([12, 12, 12], [True, True, False])
    served.infer(obs_at(13, "e2", prompt="open the drawer"))  # a new task: a new history
    assert last() == ([13, 13, 13], [True, True, False])
    served.infer(obs_at(20))  # no episode_id (openpi's own client): the history goes on within a task
    served.infer(obs_at(21))
    assert last() == ([20, 20, 21], [True, False, False])


def test_single_frame_models_get_plain_batches():
    model = RecordingModel(n_obs_steps=1)
    served = ServedModel(model)
    served.infer(obs_at(0, "e1"))
    served.infer(obs_at(1, "e1"))
    assert model.batches[-1][BATCH_STATE].shape == (1, 8) and served.metadata["n_obs_steps"] == 1


def test_the_server_resets_the_history_on_a_new_connection():
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.server import ServerThread

    model = RecordingModel(n_obs_steps=2)
    served = ServedModel(model)
    with ServerThread(served) as srv:
        with PolicyClient(port=srv.port, connect_timeout=5) as c:
            assert c.get_server_metadata()["n_obs_steps"] == 2
            c.infer(obs_at(0))
            c.infer(obs_at(1))
            assert model.batches[-1][BATCH_STATE][0, :, 0].tolist() == [0, 1]
        with PolicyClient(port=srv.port, connect_timeout=5) as c:
            reply = c.infer(obs_at(5))
            assert model.batches[-1][BATCH_STATE][0, :, 0].tolist() == [5, 5]
            assert reply["actions"].shape == (5, 7)  # the 4-action chunk, padded to openpi replan_steps


def test_the_evaluation_client_sends_every_frame_of_an_episode_to_a_history_policy(tmp_path, monkeypatch):
    """Replanning every 2 steps, the history still sees every step: the frames in between arrive
    ``observe_only``, each request carries the episode's id, and a new episode starts a new history."""
    from helpers import FakeEnv
    from tutorial_utils.evaluate.loop import EvalConfig, run_evaluation
    from tutorial_utils.serve.server import ServerThread
    from tutorial_utils.sim import libero_env

    monkeypatch.setattr(libero_env, "make_env", lambda suite, task_id, **kw: FakeEnv(task_id, goal=1e9, size=8))

    class Moving(RecordingModel):
        def predict(self, batch, generator=None):
            self.batches.append(batch)
            a = np.zeros((1, 4, 7), np.float32)
            a[..., 0] = 1.0  # FakeEnv's state is the sum of the x actions: one per step
            return a

    model = Moving(n_obs_steps=3)
    with ServerThread(ServedModel(model, replan_steps=2)) as srv:
        cfg = EvalConfig(
            task_ids=[0], trials_per_task=2, port=srv.port, max_steps=6, output_dir=str(tmp_path), videos=False,
            connect_timeout=5, num_steps_wait=0,
        )  # fmt: skip
        run_evaluation(cfg)
    seen = [b[BATCH_STATE][0, :, 0].tolist() for b in model.batches]
    # 6 steps, a prediction at steps 0, 2, 4 of each episode; the state is x = the step
    assert seen == [[0, 0, 0], [0, 1, 2], [2, 3, 4]] * 2
    assert [b[BATCH_STATE + "_is_pad"][0].tolist() for b in model.batches[:2]] == [[True, True, False], [False] * 3]


def test_openpis_episode_start_control_frame_is_acknowledged_and_resets_the_history():
    """Current openpi's LIBERO loop calls ``client.episode_start(...)`` before each episode and
    ``client.episode_end(...)`` after it: control frames ``{"__ctrl__": ...}`` that openpi's server
    acknowledges with ``{"__ack__": ...}``. Ours does too, and an episode start resets the history."""
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.server import ServerThread

    model = RecordingModel(n_obs_steps=2)
    with ServerThread(ServedModel(model)) as srv, PolicyClient(port=srv.port, connect_timeout=5) as c:
        start = {"__ctrl__": "episode_start", "__experiment__": "libero_spatial", "__task__": "t", "__episode_id__": 0}
        assert c.infer(start) == {"__ack__": "episode_start"}
        c.infer(obs_at(0))
        c.infer(obs_at(1))
        assert model.batches[-1][BATCH_STATE][0, :, 0].tolist() == [0, 1]
        assert c.infer({"__ctrl__": "episode_end", "__success__": True}) == {"__ack__": "episode_end"}
        assert c.infer({**start, "__episode_id__": 1}) == {"__ack__": "episode_start"}
        c.infer(obs_at(7))
        assert model.batches[-1][BATCH_STATE][0, :, 0].tolist() == [7, 7]
        assert c.infer({"__ctrl__": "something_new"}) == {"__ack__": "ignored"}
        assert srv.server.errors == 0 and len(model.batches) == 3  # control frames reach no policy


def test_time_windows_survive_pickling_for_spawned_dataloader_workers():
    import pickle

    src = TimeWindows(numbered_source(), [-1, 0], [-1, 0, 1])
    again = pickle.loads(pickle.dumps(src))
    assert len(again) == len(src) and again.frame_episode.tolist() == src.frame_episode.tolist()
    for key in (BATCH_STATE, BATCH_ACTION, BATCH_STATE + "_is_pad"):
        np.testing.assert_array_equal(again.get(5, 3)[key], src.get(5, 3)[key])
