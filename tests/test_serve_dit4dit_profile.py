"""The ``dit4dit`` client profile (upstream's LIBERO client wire shape, docs/FACTS.md section 11) and our
server's ``dit4dit`` replies: preprocessing on known arrays, un-normalisation, whole chunks, bad
statistics files, the round trip through our server, and one real LIBERO episode."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tutorial_utils.data.images import resize_area
from tutorial_utils.errors import TutorialError
from tutorial_utils.evaluate.loop import EvalConfig, run_episode
from tutorial_utils.policies import Policy
from tutorial_utils.policies.normalize import StatisticsError
from tutorial_utils.serve import dit4dit_profile as D
from tutorial_utils.serve.client import PolicyClient
from tutorial_utils.serve.protocol import ServerError, ServingError, to_policy_observation, to_request
from tutorial_utils.serve.server import ServerThread

#: statistics with a masked-out motion dim (2) and spans that differ per dim
LOW = [-0.5, -1.0, -0.2, -0.1, -0.3, -0.4, -1.0]
HIGH = [0.5, 1.0, 0.6, 0.1, 0.3, 0.2, 1.0]
MASK = [True, True, False, True, True, True, False]


def _stats_file(tmp_path, low=LOW, high=HIGH, mask=MASK, key="franka", name="dataset_statistics.json"):
    path = tmp_path / name
    action = {"min": list(low), "max": list(high), "mean": [0.0] * len(low)}
    if mask is not None:
        action["mask"] = list(mask)
    path.write_text(json.dumps({key: {"action": action, "state": {}, "num_trajectories": 1}}))
    return path


# --- preprocessing -----------------------------------------------------------------------------------


def test_area_resize_is_the_block_mean_on_a_2x_shrink():
    img = np.array([[0, 10, 20, 30], [40, 50, 61, 70], [80, 90, 100, 110], [120, 131, 140, 255]], np.uint8)
    img = np.repeat(img[..., None], 3, axis=2)
    # hand-computed 2x2 means, halves rounded up: (0+10+40+50)/4=25, (20+30+61+70)/4=45.25,
    # (80+90+120+131)/4=105.25, (100+110+140+255)/4=151.25
    want = np.array([[25, 45], [105, 151]], np.uint8)
    np.testing.assert_array_equal(resize_area(img, 2)[..., 0], want)
    big = np.random.default_rng(1).integers(0, 256, (448, 448, 3), dtype=np.uint8)
    block = big.reshape(224, 2, 224, 2, 3).astype(np.float64).mean(axis=(1, 3))
    np.testing.assert_array_equal(resize_area(big, 224), np.floor(block + 0.5).astype(np.uint8))


def test_area_resize_weights_partly_covered_pixels():
    row = np.array([[[0] * 3, [90] * 3, [180] * 3]], np.uint8)  # 1x3 -> 1x2: each output covers 1.5 pixels
    # out0 = (0 * 1 + 90 * 0.5) / 1.5 = 30; out1 = (90 * 0.5 + 180 * 1) / 1.5 = 150
    np.testing.assert_array_equal(resize_area(row, (1, 2))[0, :, 0], [30, 150])
    with pytest.raises(ValueError, match="uint8"):
        resize_area(row.astype(np.float32), 2)


def test_area_resize_matches_opencv_inter_area():
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(2)
    for side in (256, 128, 448):  # upstream renders 256; our fast profile 128
        img = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        ours = resize_area(img, 224).astype(int)
        ref = cv2.resize(img, (224, 224), interpolation=cv2.INTER_AREA).astype(int)
        assert np.abs(ours - ref).max() <= 1, side


def test_request_is_upstreams_shape():
    rng = np.random.default_rng(0)
    primary = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    wrist = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    state = np.array([0.1, -0.2, 1.1, 3.0, -0.5, 0.25, 0.04, -0.04], np.float32)
    obs = {"observation/image": primary, "observation/wrist_image": wrist, "observation/state": state, "prompt": "p"}
    req = to_request(obs, "dit4dit")
    assert set(req) == {"examples", "do_sample", "use_ddim", "num_ddim_steps"}
    assert (req["do_sample"], req["use_ddim"], req["num_ddim_steps"]) == (False, True, 10)
    (ex,) = req["examples"]
    assert set(ex) == {"image", "lang", "state"} and ex["lang"] == "p"
    (img,) = ex["image"]
    assert img.shape == (224, 448, 3) and img.dtype == np.uint8
    np.testing.assert_array_equal(img[:, :224], resize_area(primary, 224))  # primary left
    np.testing.assert_array_equal(img[:, 224:], resize_area(wrist, 224))  # wrist right
    assert ex["state"].shape == (1, 16) and ex["state"].dtype == np.float32
    # our server reads it back: the halves, and the state through atan2(sin, cos)
    back = to_policy_observation(req, 224)
    np.testing.assert_array_equal(back["observation/wrist_image"], img[:, 224:])
    np.testing.assert_allclose(back["observation/state"], state, atol=1e-6)


def test_state_is_interleaved_sin_cos_then_padded():
    s = np.array([0.0, np.pi / 2, np.pi, -np.pi / 2, np.pi / 6], np.float32)
    enc = D.encode_state(s)
    assert enc.shape == (1, 16)
    want = [0, 1, 1, 0, 0, -1, -1, 0, 0.5, np.sqrt(3) / 2] + [0] * 6  # sin s0, cos s0, sin s1, ...
    np.testing.assert_allclose(enc[0], want, atol=1e-6)
    eight = np.arange(8, dtype=np.float32) / 10
    np.testing.assert_allclose(D.encode_state(eight)[0, 0::2], np.sin(eight), atol=1e-7)
    np.testing.assert_allclose(D.encode_state(eight)[0, 1::2], np.cos(eight), atol=1e-7)
    np.testing.assert_allclose(D.decode_state(D.encode_state(eight)), eight, atol=1e-6)
    np.testing.assert_allclose(D.decode_state(D.encode_state([4.0] * 8))[0], 4.0 - 2 * np.pi, atol=1e-6)  # mod 2 pi
    with pytest.raises(ValueError, match="sin/cos slots"):
        D.encode_state(np.zeros(9))


def test_run_episode_rotates_each_camera_like_upstream():
    """The env's raw robosuite frames reach the request flipped 180 degrees, then area-resized."""
    from tutorial_utils.sim.libero_env import policy_images

    rng = np.random.default_rng(5)
    raw = {
        "agentview_image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
        "robot0_eye_in_hand_image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
    }

    class RawEnv(ChunkEnv):
        def images(self, obs):
            return policy_images(raw)

    client = RecordingClient()
    meta = {D.METADATA_KEY: D.ActionStatistics.action_space().to_dict()}
    run_episode(RawEnv(), client, meta, EvalConfig(protocol="dit4dit", num_steps_wait=0, videos=False), 0, 1, {})
    img = client.requests[0]["examples"][0]["image"][0]
    np.testing.assert_array_equal(img[:, :224], resize_area(raw["agentview_image"][::-1, ::-1], 224))
    np.testing.assert_array_equal(img[:, 224:], resize_area(raw["robot0_eye_in_hand_image"][::-1, ::-1], 224))


# --- reply and statistics ------------------------------------------------------------------------------


def test_unnormalize_clips_thresholds_and_respects_the_mask(tmp_path):
    st = D.ActionStatistics.from_file(_stats_file(tmp_path))
    n = np.zeros((3, 8), np.float32)
    n[0, :7] = [1.0, -1.0, 0.3, 0.0, 2.0, -3.0, 0.5]
    n[1, :7] = [0.0, 0.5, -0.7, 1.0, -1.0, 1.0, 0.49]
    n[2, :7] = [-1.0, 0.0, 1.5, -1.0, 0.0, 0.0, -1.0]
    got = st.unnormalize(n)
    # 0.5 * (a + 1) * (max - min) + min where masked; dim 2 and the gripper stay (clipped) as sent
    want = np.array(
        [
            [0.5, -1.0, 0.3, 0.0, 0.3, -0.4, 1.0],  # 2.0 and -3.0 clipped; gripper 0.5 -> 1
            [0.0, 0.5, -0.7, 0.1, -0.3, 0.2, 0.0],  # gripper 0.49 -> 0
            [-0.5, 0.0, 1.0, -0.1, 0.0, -0.1, 0.0],
        ]
    )
    np.testing.assert_allclose(got, want, atol=1e-6)
    env = st.to_env(n)
    np.testing.assert_array_equal(env[:, 6], [-1.0, 1.0, 1.0])  # 1 - 2g: open -1, close +1
    np.testing.assert_allclose(env[:, :6], want[:, :6], atol=1e-6)


def test_missing_mask_means_every_dim_as_upstream(tmp_path):
    st = D.ActionStatistics.from_file(_stats_file(tmp_path, mask=None))
    assert st.mask.all()
    n = np.array([[0.0] * 6 + [1.0]])
    assert st.to_env(n)[0, 6] == -1.0  # g=1 -> 0.5*2*(1-(-1))-1 = 1 > 0.5: open


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not valid JSON"),
        (json.dumps([1, 2]), "expected a map"),
        (json.dumps({"franka": {"state": {}}}), "'franka.action' is missing"),
        (json.dumps({"franka": {"action": {"min": [0] * 7}}}), "'franka.action.max' is missing"),
        (json.dumps({"franka": {"action": {"min": [0] * 7, "max": ["a"] * 7}}}), "'franka.action.max' must be"),
        (json.dumps({"franka": {"action": {"min": [0] * 6, "max": [1] * 6}}}), "one length >= 7"),
        (json.dumps({"franka": {"action": {"min": [0] * 7, "max": [1] * 7, "mask": [True] * 6}}}), "one length"),
        (json.dumps({"franka": {"action": {"min": [1] * 7, "max": [0] * 7}}}), r"'franka.action.max'\[0\]"),
        (json.dumps({"a": {"action": {}}, "b": {"action": {}}}), "2 blocks"),
    ],
)
def test_bad_statistics_files_are_teaching_errors(tmp_path, content, match):
    path = tmp_path / "dataset_statistics.json"
    path.write_text(content)
    with pytest.raises(StatisticsError, match=match) as ei:
        D.ActionStatistics.from_file(path)
    assert isinstance(ei.value, TutorialError) and str(path) in str(ei.value)


def test_missing_statistics_file_names_it_and_the_fix(tmp_path):
    with pytest.raises(StatisticsError, match="not found") as ei:
        D.client_statistics(tmp_path / "nope.json")
    assert "nope.json" in str(ei.value) and "statistics" in str(ei.value)
    with pytest.raises(StatisticsError, match="dataset_statistics.json not found"):  # <pt>.parents[1]
        D.client_statistics("", tmp_path / "run" / "final_model" / "pytorch_model.pt")
    assert D.statistics_path_for("/r/final_model/pytorch_model.pt").as_posix() == "/r/dataset_statistics.json"
    with pytest.raises(StatisticsError, match="neither `statistics` nor `checkpoint`"):
        D.client_statistics("", "", {})
    client = RecordingClient()
    cfg = EvalConfig(protocol="dit4dit", statistics=str(tmp_path / "gone.json"), num_steps_wait=0, videos=False)
    with pytest.raises(StatisticsError, match="gone.json"):
        run_episode(ChunkEnv(), client, {}, cfg, 0, 3, {})
    assert client.requests == []  # checked before the first request


def test_error_replies():
    with pytest.raises(ServerError, match="boom"):
        D.reply_chunk({"status": "error", "ok": False, "error": {"message": "boom"}})
    with pytest.raises(ServingError, match="protocol=openpi"):
        D.reply_chunk({"actions": np.zeros((8, 7))})
    with pytest.raises(ServingError, match="shape"):
        D.reply_chunk({"data": {"normalized_actions": np.zeros((1, 8, 3))}})


# --- the client loop: whole chunks ---------------------------------------------------------------------


class ChunkEnv:
    """Just enough of LiberoEnv; never succeeds."""

    task_language = "fake task"
    num_init_states = 1

    def __init__(self):
        self.actions = []

    def reset(self, init_state=0):
        return {}

    def step(self, a):
        self.actions.append(np.asarray(a, dtype=np.float64))
        return {}, 0.0, False, {}

    def check_success(self):
        return False

    def images(self, obs):
        return np.zeros((128, 128, 3), np.uint8), np.full((128, 128, 3), 9, np.uint8)

    def state_vector(self, obs):
        return np.zeros(8, np.float32)

    def close(self):
        pass


class RecordingClient:
    """A stand-in for PolicyClient(protocol="dit4dit"): records the request, answers an 8-chunk whose
    action k has dx = k / 8 - 0.5 (normalised), gripper open on even k."""

    metadata: dict = {}

    def __init__(self):
        self.requests = []

    def reset(self):
        pass

    def infer(self, obs):
        self.requests.append(to_request(obs, "dit4dit"))
        n = np.zeros((1, 8, 8), np.float32)
        n[0, :, 0] = np.arange(8) / 8 - 0.5
        n[0, :, 6] = np.where(np.arange(8) % 2 == 0, 1.0, -1.0)
        return D.pad_reply(n[0])


def test_the_whole_8_action_chunk_runs_before_the_next_request(tmp_path):
    stats = _stats_file(tmp_path, low=[-1] * 7, high=[1] * 7, mask=[True] * 6 + [False])
    env, client = ChunkEnv(), RecordingClient()
    cfg = EvalConfig(protocol="dit4dit", statistics=str(stats), replan_steps=2, num_steps_wait=0, videos=False)
    ep = run_episode(env, client, {"replan_steps": 1}, cfg, 0, 20, {})
    assert ep["steps"] == 20 and len(env.actions) == 20
    assert len(client.requests) == 3  # steps 0, 8, 16: replan_steps applies to openpi only
    dx = [a[0] for a in env.actions]
    np.testing.assert_allclose(dx[:8], np.arange(8) / 8 - 0.5, atol=1e-6)
    assert [a[6] for a in env.actions[:4]] == [-1.0, 1.0, -1.0, 1.0]  # open, close, ... (robosuite)


# --- round trip through our server ------------------------------------------------------------------------


class FixedChunkPolicy(Policy):
    """Returns one fixed 8-action chunk in the ``gripper`` convention; records what it saw."""

    name = "fixed"

    def __init__(self, chunk, gripper="dataset"):
        self.chunk, self.gripper, self.seen = np.asarray(chunk, np.float32), gripper, []

    @property
    def metadata(self):
        return {**super().metadata, "image_size": 224, "action_horizon": 8, "gripper": self.gripper}

    def infer(self, obs):
        self.seen.append(obs)
        return {"actions": self.chunk.copy()}


def _chunk_inside(low, high, gripper_values):
    rng = np.random.default_rng(4)
    low, high = np.asarray(low), np.asarray(high)
    a = low + rng.uniform(0.05, 0.95, (8, 7)) * (high - low)
    a[:, 2] = rng.uniform(-0.9, 0.9, 8)  # the masked-out dim travels raw: keep it in [-1, 1]
    a[:, 6] = gripper_values
    return a.astype(np.float32)


@pytest.mark.parametrize("gripper", ["dataset", "robosuite"])
def test_round_trip_client_recovers_the_policys_actions(tmp_path, gripper):
    from tutorial_utils.data.libero_schema import action_to_env

    g = np.array([1, -1, 0.7, -0.3, 1, 1, -1, 0.2], np.float32)
    chunk = _chunk_inside(LOW, HIGH, g)
    pol = FixedChunkPolicy(chunk, gripper)
    path = _stats_file(tmp_path)
    state = np.array([0.1, -0.2, 1.1, 3.0, -0.5, 0.25, 0.04, -0.04], np.float32)
    rng = np.random.default_rng(6)
    obs = {
        "observation/image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
        "observation/state": state,
        "prompt": "put the bowl on the plate",
    }
    with ServerThread(pol, statistics=str(path)) as srv, PolicyClient(port=srv.port, protocol="dit4dit") as client:
        reply = client.infer(obs)
    assert set(reply) == {"status", "ok", "type", "request_id", "data"}  # upstream's keys, nothing more
    assert (reply["status"], reply["ok"], reply["type"], reply["request_id"]) == (
        "ok",
        True,
        "inference_result",
        "default",
    )
    assert set(reply["data"]) == {"normalized_actions"}
    n = reply["data"]["normalized_actions"]
    assert n.shape == (1, 8, 8) and n.dtype == np.float32 and np.abs(n).max() <= 1.0
    assert not np.allclose(n[0, :, :7], chunk)  # it really is normalised
    out = D.ActionStatistics.from_file(path).to_env(D.reply_chunk(reply))
    np.testing.assert_allclose(out[:, :6], chunk[:, :6], atol=1e-5)
    np.testing.assert_array_equal(out[:, 6], np.where(action_to_env(chunk, gripper)[:, 6] < 0, -1.0, 1.0))
    seen = pol.seen[0]
    np.testing.assert_allclose(seen["observation/state"], state, atol=1e-5)
    np.testing.assert_array_equal(seen["observation/wrist_image"], resize_area(obs["observation/wrist_image"], 224))


def test_server_uses_the_served_checkpoints_statistics_and_announces_them(tmp_path):
    """A served model's own statistics (ServedModel.model.statistics) normalise the reply; the
    metadata carries them, so our client works without a statistics file."""
    stats = json.loads(_stats_file(tmp_path).read_text())
    chunk = _chunk_inside(LOW, HIGH, np.ones(8))

    class Served(FixedChunkPolicy):
        class model:  # noqa: N801
            statistics = stats

    pol = Served(chunk)
    with ServerThread(pol) as srv, PolicyClient(port=srv.port, protocol="dit4dit") as client:
        assert client.metadata[D.METADATA_KEY]["mask"] == MASK
        env = ChunkEnv()
        cfg = EvalConfig(protocol="dit4dit", num_steps_wait=0, videos=False)
        run_episode(env, client, dict(client.metadata), cfg, 0, 8, {})
    np.testing.assert_allclose(np.stack(env.actions)[:, :6], chunk[:, :6], atol=1e-5)
    assert [a[6] for a in env.actions] == [-1.0] * 8
    # a policy without statistics: the action space's, which leave the actions as they are
    assert D.server_statistics(FixedChunkPolicy(chunk)).to_dict()["min"] == [-1.0] * 7


# --- real LIBERO ----------------------------------------------------------------------------------------


@pytest.mark.libero
@pytest.mark.slow
def test_our_dit4dit_client_drives_our_server_through_a_real_libero_episode(tmp_path):
    """Our client in dit4dit mode (upstream's wire shape, 256-pixel renders area-resized to 224,
    the statistics file, whole chunks) against our server in dit4dit mode serving the expert."""
    from tutorial_utils.policies.expert import ExpertPolicy
    from tutorial_utils.sim import libero_env as le

    class SeeingExpert(ExpertPolicy):
        def __init__(self):
            super().__init__()
            self.shapes = set()

        def infer(self, obs):
            self.shapes.add((obs["observation/image"].shape, obs["observation/state"].shape))
            return super().infer(obs)

    stats = _stats_file(tmp_path, low=[-1] * 7, high=[1] * 7, mask=[True] * 6 + [False])
    pol = SeeingExpert()
    env = le.make_env("libero_spatial", 0, init_state=0, image_size=256, render_profile="fast")
    cfg = EvalConfig(protocol="dit4dit", statistics=str(stats), env_image_size=256, videos=False)
    try:
        with (
            ServerThread(pol, statistics=str(stats)) as srv,
            PolicyClient(port=srv.port, protocol="dit4dit") as client,
        ):
            ep = run_episode(
                env, client, dict(client.metadata), cfg, 0, le.MAX_STEPS["libero_spatial"], env.info.to_dict()
            )
            assert srv.server.requests == ep["steps"]  # the expert's chunk is one action: one request a step
    finally:
        env.close()
    assert ep["success"], f"the expert did not succeed through the dit4dit wire within {ep['steps']} steps"
    assert pol.shapes == {((224, 224, 3), (8,))}
