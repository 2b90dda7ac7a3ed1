"""The LIBERO evaluation client loop, the two-process chain and promotion.

Most tests drive the real client loop against a fake env (no MuJoCo, seconds); the ones
marked ``libero`` run real LIBERO through the full two-process chain.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import FakeEnv
from tutorial_utils import logs
from tutorial_utils.evaluate.chain import _absolute, run_job
from tutorial_utils.evaluate.loop import (
    EvalConfig,
    StageFailed,
    latency_summary,
    results_table,
    run_episode,
    run_evaluation,
    suite_max_steps,
    to_env_action,
)
from tutorial_utils.params import parse_task_ids
from tutorial_utils.policies import base as policies
from tutorial_utils.policies.expert import ExpertPolicy
from tutorial_utils.report import promote as P
from tutorial_utils.serve.client import wait_for_health
from tutorial_utils.serve.protocol import ServerDied, ServerUnavailable
from tutorial_utils.serve.server import ServerThread, free_port

# --- pieces ------------------------------------------------------------------------------------------


def test_env_actions():
    a = to_env_action([2, 0, 0, 0, 0, 0, 1], "dataset")
    assert a[0] == 1.0 and a[6] == -1.0  # clipped; dataset "open" -> robosuite -1
    assert to_env_action([0] * 6 + [-1], "dataset")[6] == 1.0
    assert to_env_action([0] * 6 + [0.3], "robosuite")[6] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="7 numbers"):
        to_env_action([0, 0, 0])
    with pytest.raises(ValueError, match="gripper convention"):
        to_env_action([0] * 7, "weird")


def test_parse_task_ids_and_max_steps():
    assert parse_task_ids("all") is None and parse_task_ids("") is None
    assert parse_task_ids("0-2,5") == [0, 1, 2, 5]
    assert parse_task_ids(3) == [3] and parse_task_ids([1, "2"]) == [1, 2]
    assert suite_max_steps("libero_spatial") == 220 and suite_max_steps("libero_10") == 520
    assert suite_max_steps("libero_spatial", 30) == 30
    with pytest.raises(ValueError, match="libero_goal"):
        suite_max_steps("libero_nope")


# --- the client loop against a fake env ------------------------------------------------------------


class CountingPolicy(policies.Policy):
    """Chunks of 4 actions [1, 0.., gripper +1 (dataset: open)]; records what it saw."""

    name = "counting"

    def __init__(self, privileged=False):
        self.privileged, self.seen = privileged, []

    @property
    def metadata(self):
        return {
            **super().metadata,
            "image_size": 96,
            "action_horizon": 4,
            "replan_steps": 2,
            "gripper": "dataset",
            "needs_privileged": self.privileged,
        }

    def infer(self, obs):
        self.seen.append({k: (v.shape if hasattr(v, "shape") else v) for k, v in obs.items()})
        a = np.zeros((4, 7), np.float32)
        a[:, 0] = 1.0
        a[:, 6] = 1.0
        return {"actions": a}


@pytest.fixture
def fake_envs(monkeypatch):
    from tutorial_utils.sim import libero_env

    made = []

    def make_env(suite, task_id, **kw):
        env = FakeEnv(task_id, goal=6.0 if task_id == 0 else 1e9)
        made.append(env)
        return env

    monkeypatch.setattr(libero_env, "make_env", make_env)
    return made


def test_client_loop_with_fake_env(tmp_path, fake_envs, capsys):
    pol = CountingPolicy()
    with ServerThread(pol) as srv:
        cfg = EvalConfig(
            task_ids=[0, 1], trials_per_task=2, port=srv.port, max_steps=12, output_dir=str(tmp_path), connect_timeout=5
        )
        res = run_evaluation(cfg)
    out = capsys.readouterr().out
    env0, env1 = fake_envs
    # settle steps first, then the policy's actions with the gripper flipped to robosuite
    first = np.array(env0.actions[:10])
    np.testing.assert_array_equal(first, np.tile([0, 0, 0, 0, 0, 0, -1.0], (10, 1)))
    assert env0.actions[10][0] == 1.0 and env0.actions[10][6] == -1.0
    assert len(env0.actions) == 10 + 6  # success after 6 policy steps
    assert len(env1.actions) == 10 + 12  # max_steps
    # replan every 2 actions: 3 requests per successful episode, 6 per failed one
    assert len(pol.seen) == 2 * 3 + 2 * 6
    assert pol.seen[0]["observation/image"] == (96, 96, 3) and "privileged" not in pol.seen[0]
    assert env0.priv_calls == 0
    # documented log lines, parsed back
    parsed = logs.parse_eval_log(out)
    assert [t["task"] for t in parsed["tasks"]] == ["fake task 0", "fake task 1"]
    assert parsed["episodes"] == 4 and parsed["successes"] == 2 and parsed["total_rate"] == 0.5
    assert out.splitlines()[:2] == ["Task: fake task 0", "Starting episode 1..."]
    # results.json and videos
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(res)) and saved["finished"] and saved["success_rate"] == 0.5
    ep = saved["tasks"][0]["episodes"][1]
    assert ep["success"] and ep["steps"] == 6 and ep["init_state"] == 1 and ep["wall_s"] >= 0
    assert (tmp_path / ep["video"]).stat().st_size > 0
    assert saved["tasks"][1]["episodes"][0]["video"].endswith("_failure.mp4")
    rows = results_table(saved)
    assert rows[0]["success"] == "2/2" and rows[1]["success"] == "0/2"


def test_privileged_state_only_when_asked(tmp_path, fake_envs):
    pol = CountingPolicy(privileged=True)
    with ServerThread(pol) as srv:
        cfg = EvalConfig(task_ids=[0], port=srv.port, output_dir=str(tmp_path), videos=False, connect_timeout=5)
        run_evaluation(cfg)
    assert "privileged" in pol.seen[0] and fake_envs[0].priv_calls == len(pol.seen)
    assert not list(tmp_path.glob("videos/*"))


def test_server_stops_mid_evaluation_client_fails_fast(tmp_path, fake_envs):
    class SlowPolicy(CountingPolicy):
        def infer(self, obs):
            time.sleep(0.05)
            return super().infer(obs)

    srv = ServerThread(SlowPolicy()).start()
    threading.Timer(0.5, srv.stop).start()
    cfg = EvalConfig(
        task_ids=[1],
        trials_per_task=50,
        port=srv.port,
        max_steps=200,
        output_dir=str(tmp_path),
        videos=False,
        connect_timeout=5,
        recv_timeout=5,
    )
    t0 = time.monotonic()
    with pytest.raises(ServerDied):
        run_evaluation(cfg)
    assert time.monotonic() - t0 < 10


def test_client_before_server_and_no_server(tmp_path, fake_envs):
    cfg = EvalConfig(task_ids=[0], port=free_port(), output_dir=str(tmp_path), videos=False, connect_timeout=1)
    with pytest.raises(ServerUnavailable, match="could not connect"):
        run_evaluation(cfg)


# --- one image resize, one gripper conversion ----------------------------------------------------------


class SeeingPolicy(policies.Policy):
    """Keeps the images it receives; answers one action in the dataset convention (gripper +1: open)."""

    name = "seeing"

    def __init__(self, image_size=64):
        self.image_size, self.images = image_size, []

    @property
    def metadata(self):
        return {**super().metadata, "image_size": self.image_size, "gripper": "dataset"}

    def infer(self, obs):
        self.images.append((obs["observation/image"].copy(), obs["observation/wrist_image"].copy()))
        return {"actions": np.array([[0.5, 0, 0, 0, 0, 0, 1.0]], np.float32)}


class PictureEnv(FakeEnv):
    """A FakeEnv whose cameras show one fixed picture (the wrist camera: upside down)."""

    def __init__(self, picture):
        super().__init__(0, goal=1e9, size=picture.shape[0])
        self.picture = picture

    def images(self, obs):
        return self.picture, self.picture[::-1].copy()


def _picture(size=256):
    """Noise plus a hard edge: a different resize (PIL's bilinear, no antialias...) gives other pixels."""
    img = np.random.default_rng(3).integers(0, 256, (size, size, 3), dtype=np.uint8)
    img[size // 4 : size // 2, :, 0] = 255
    return img


def test_same_pixels_in_training_serving_and_evaluation():
    """One 256x256 frame reaches a 64x64 policy with identical pixels through the training window,
    the server (a client sending the full frame) and our LIBERO client loop (which resizes first)."""
    import torch
    from PIL import Image

    from tutorial_utils.data.images import resize
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.train.data import ArraySource, WindowDataset

    torch.set_num_threads(1)
    img, size = _picture(256), 64
    wrist = img[::-1].copy()
    src = ArraySource(img[None], wrist[None], np.zeros((1, 8)), np.zeros((1, 7)), np.zeros(1), ["t"], statistics={})
    window = WindowDataset(src, np.arange(1), horizon=1, image_size=size)[0]
    trained = (window["observation.images.image"], window["observation.images.wrist_image"])
    pol = SeeingPolicy(size)
    env = PictureEnv(img)
    with ServerThread(pol) as srv, PolicyClient(port=srv.port, connect_timeout=5) as client:
        client.infer(
            {
                "observation/image": img,
                "observation/wrist_image": wrist,
                "observation/state": np.zeros(8, np.float32),
                "prompt": "t",
            }
        )
        ep = run_episode(env, client, dict(client.metadata), EvalConfig(num_steps_wait=0, videos=False), 0, 1, {})
    served, evaluated = pol.images
    for i, full in enumerate((img, wrist)):
        want = resize(full, size)
        assert want.shape == (size, size, 3) and want.dtype == np.uint8
        for path in (trained, served, evaluated):
            np.testing.assert_array_equal(path[i], want)
    pil = np.asarray(Image.fromarray(img).resize((size, size), Image.BILINEAR))
    assert not np.array_equal(pil, resize(img, size))  # the old second resize would have differed
    # the server answered in robosuite's convention; the client only clipped
    assert ep["steps"] == 1
    # the one request was timed by the client and by the server (openpi's server_timing)
    assert len(ep["round_trip_ms"]) == 1 and len(ep["server_infer_ms"]) == 1
    assert 0 <= ep["server_infer_ms"][0] <= ep["round_trip_ms"][0]
    lat = latency_summary({"tasks": [{"episodes": [ep, {**ep, "round_trip_ms": [1e6], "server_infer_ms": []}]}]})
    assert lat["requests"] == 2 and lat["round_trip_ms_p90"] > lat["round_trip_ms_p50"] >= ep["round_trip_ms"][0]
    assert latency_summary({"tasks": [{"episodes": [{"success": True}]}]})["round_trip_ms_p50"] is None
    np.testing.assert_array_equal(env.actions[0], [0.5, 0, 0, 0, 0, 0, -1.0])


def test_dit4dit_client_applies_the_policy_gripper():
    """DiT4DiT replies stay in the policy's convention: the client converts with metadata['policy_gripper']."""
    from tutorial_utils.serve.client import PolicyClient

    pol = SeeingPolicy(64)
    env = PictureEnv(_picture(128))
    cfg = EvalConfig(num_steps_wait=0, videos=False, protocol="dit4dit")
    with ServerThread(pol) as srv, PolicyClient(port=srv.port, connect_timeout=5, protocol="dit4dit") as client:
        assert client.metadata["gripper"] == "robosuite" and client.metadata["policy_gripper"] == "dataset"
        run_episode(env, client, dict(client.metadata), cfg, 0, 2, {})
    assert [float(a[6]) for a in env.actions] == [-1.0, -1.0]
    assert pol.images[0][0].shape == (64, 64, 3)


# --- the chain: stages that fail before LIBERO --------------------------------------------------------


def test_chain_names_server_stage_when_policy_unavailable(tmp_path):
    with pytest.raises(StageFailed) as exc:
        run_job(tmp_path / "run", policy="dit4dit", server_timeout=60)
    assert exc.value.stage == "server"
    assert "GPU checkout" in str(exc.value) and "the policy cannot be served here" in str(exc.value)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["stage"] == "server" and status["success_signs"]["server running"] is False


def test_chain_port_already_in_use(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        with pytest.raises(StageFailed, match="already in use") as exc:
            run_job(tmp_path / "run", policy="zero", port=holder.getsockname()[1], server_timeout=60)
        assert exc.value.stage == "server"
    finally:
        holder.close()


# --- promotion -----------------------------------------------------------------------------------------


def test_promote(tmp_path):
    server_ok = (
        "\n".join(
            [
                logs.SERVER_RUNNING.format(host="127.0.0.1", port=1),
                logs.SERVER_LISTENING.format(host="127.0.0.1", port=1),
                logs.SERVER_CONNECTION_OPEN,
            ]
        )
        + "\n"
    )

    def eval_log(finish=True):
        lines = [
            logs.EVAL_TASK.format(task="t"),
            logs.EVAL_STARTING_EPISODE.format(n=1),
            logs.EVAL_SUCCESS.format(success=True),
        ]
        return "\n".join(lines + ([logs.EVAL_TOTAL_RATE.format(rate=1.0)] if finish else [])) + "\n"

    run = tmp_path / "run"
    (run / "videos").mkdir(parents=True)
    (run / "server.log").write_text(server_ok)
    (run / "eval_libero_spatial.log").write_text(eval_log())
    (run / "videos" / "a.mp4").write_bytes(b"fake video")
    (run / "videos" / "f.mp4").write_bytes(b"failed video")
    results = {
        "suite": "libero_spatial",
        "config": {"output_dir": str(run)},
        "tasks": [
            {
                "task_id": 0,
                "task": "t",
                "episodes": [
                    {"success": False, "video": None, "steps": 3, "wall_s": 1},
                    {"success": True, "video": "videos/a.mp4", "steps": 2, "wall_s": 1},
                    {"success": False, "video": "videos/f.mp4", "steps": 3, "wall_s": 1},
                ],
            }
        ],
    }
    (run / "results.json").write_text(json.dumps(results))
    out = P.evaluation(run, tmp_path / "logs", tmp_path / "assets")
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "eval_libero_spatial.log",
        "eval_results.json",
        "eval_server.log",
    ]
    assert out["video"].read_bytes() == b"fake video" and out["video"].name == "eval_rollout.mp4"
    # the success is shown, so the first failure with a video goes beside it
    assert out["failed_video"].read_bytes() == b"failed video" and out["failed_video"].name == "eval_failed_rollout.mp4"
    other = P.evaluation(run, tmp_path / "logs3", tmp_path / "assets3", prefix="eval_mini_")
    assert sorted(p.name for p in other.values()) == [
        "eval_mini_failed_rollout.mp4",
        "eval_mini_libero_spatial.log",
        "eval_mini_results.json",
        "eval_mini_rollout.mp4",
        "eval_mini_server.log",
    ]
    # a run without a success shows its first failure as the rollout and writes no second copy of it
    results["tasks"][0]["episodes"][1]["success"] = False
    (run / "results.json").write_text(json.dumps(results))
    none_won = P.evaluation(run, tmp_path / "logs4", tmp_path / "assets4")
    assert "failed_video" not in none_won and none_won["video"].read_bytes() == b"fake video"
    assert sorted(p.name for p in (tmp_path / "assets4").iterdir()) == ["eval_rollout.mp4"]
    (run / "eval_libero_spatial.log").write_text(eval_log(finish=False))
    with pytest.raises(ValueError, match="success checks"):
        P.evaluation(run, tmp_path / "logs2", tmp_path / "assets2")


# --- real LIBERO ------------------------------------------------------------------------------------------


@pytest.mark.libero
@pytest.mark.slow
def test_chain_real_libero_zero_policy(tmp_path):
    res = run_job(tmp_path / "run", policy="zero", task_ids="0", max_steps=8, server_timeout=60, client_timeout=300)
    assert res.diagnosis.ok and res.results["total_episodes"] == 1
    assert (tmp_path / "run" / "server.log").is_file() and (tmp_path / "run" / "eval_libero_spatial.log").is_file()
    video = tmp_path / "run" / res.results["tasks"][0]["episodes"][0]["video"]
    assert video.stat().st_size > 0


@pytest.mark.libero
@pytest.mark.slow
def test_server_killed_mid_real_evaluation(tmp_path):
    port = free_port()
    with open(tmp_path / "server.log", "w") as fh:
        server = subprocess.Popen(
            [sys.executable, "-m", "tutorial_utils", "serve", "--policy", "zero", "--port", str(port)],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    log = tmp_path / "eval_libero_spatial.log"
    try:
        wait_for_health(port=port, timeout=60)
        with open(log, "w") as fh:
            client = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tutorial_utils",
                    "eval",
                    "--port",
                    str(port),
                    "--task-ids",
                    "0",
                    "--max-steps",
                    "220",
                    "--output-dir",
                    str(tmp_path),
                    "--videos",
                    "false",
                    "--recv-timeout",
                    "20",
                ],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + 240
        while "Starting episode 1..." not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # a few policy requests in
        server.send_signal(signal.SIGKILL)
        rc = client.wait(60)
    finally:
        server.kill()
    assert rc != 0
    text = log.read_text()
    # one teaching line (the CLI prints "error: <message>", no traceback): what happened and where to look
    assert "error: " in text and "closed the connection" in text and "server.log" in text
    assert "Traceback" not in text
    d = logs.diagnose(tmp_path)
    assert d.failed_stage == "evaluation" and any("ServerDied" in c for c in d.causes)


class DatasetConventionExpert(ExpertPolicy):
    """The scripted expert answering as a policy trained on the LIBERO datasets would: 64x64
    inputs, gripper in the dataset convention (+1 open, -1 close). Keeps the image sizes it sees."""

    def __init__(self):
        super().__init__()
        self.sizes = set()

    @property
    def metadata(self):
        return {**super().metadata, "image_size": 64, "gripper": "dataset"}

    def infer(self, obs):
        from tutorial_utils.data.libero_schema import env_action_to_dataset

        self.sizes.add(obs["observation/image"].shape)
        out = super().infer(obs)
        return {**out, "actions": env_action_to_dataset(out["actions"])}


@pytest.mark.libero
@pytest.mark.slow
def test_openpi_libero_example_loop_drives_our_server():
    """openpi's examples/libero/main.py loop, no conversion on the client: flip, resize_with_pad to
    224, send, pass `actions` straight to env.step. Our server resizes to the policy's 64 and
    answers in robosuite's gripper convention; the (dataset-convention) expert must succeed."""
    import collections
    import uuid

    from openpi_client import image_tools
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from tutorial_utils.sim import libero_env as le

    env = le.make_env("libero_spatial", 0, init_state=0, image_size=64, render_profile="fast")
    pol = DatasetConventionExpert()
    try:
        with ServerThread(pol) as srv:
            client = WebsocketClientPolicy("127.0.0.1", srv.port)
            meta = client.get_server_metadata()
            assert meta["gripper"] == "robosuite" and meta["policy_gripper"] == "dataset"
            task_info, episode_id = env.info.to_dict(), uuid.uuid4().hex
            obs = env.reset(0)
            plan, t, done = collections.deque(), 0, False
            max_steps = le.MAX_STEPS["libero_spatial"]
            while t < max_steps + le.NUM_STEPS_WAIT:
                if t < le.NUM_STEPS_WAIT:  # openpi's LIBERO_DUMMY_ACTION
                    obs, _r, done, _info = env.step([0.0] * 6 + [-1.0])
                    t += 1
                    continue
                img = np.ascontiguousarray(obs["agentview_image"][::-1, ::-1])
                wrist = np.ascontiguousarray(obs["robot0_eye_in_hand_image"][::-1, ::-1])
                if t == le.NUM_STEPS_WAIT:
                    np.testing.assert_array_equal(img, env.images(obs)[0])  # our env flips the same way
                img = image_tools.convert_to_uint8(image_tools.resize_with_pad(img, 224, 224))
                wrist = image_tools.convert_to_uint8(image_tools.resize_with_pad(wrist, 224, 224))
                if not plan:
                    element = {
                        "observation/image": img,
                        "observation/wrist_image": wrist,
                        "observation/state": np.concatenate(
                            (
                                obs["robot0_eef_pos"],
                                le.quat2axisangle(obs["robot0_eef_quat"]),
                                obs["robot0_gripper_qpos"],
                            )
                        ),
                        "prompt": str(env.task_language),
                        "privileged": {
                            "episode_id": episode_id,
                            "task_info": task_info,
                            "obs": env.privileged_observation(),
                        },
                    }
                    plan.extend(client.infer(element)["actions"][:5])  # openpi's replan_steps
                obs, _r, done, _info = env.step(plan.popleft().tolist())
                if done:
                    break
                t += 1
            success = env.check_success()
    finally:
        env.close()
    assert done and success, f"the episode did not succeed within {max_steps} steps (stopped at step {t})"
    assert pol.sizes == {(64, 64, 3)}


def test_relative_paths_resolve_for_the_child_processes(tmp_path, monkeypatch):
    from tutorial_utils import paths

    (tmp_path / "ck").mkdir()
    monkeypatch.chdir(tmp_path)
    assert _absolute("ck") == tmp_path / "ck"  # exists here
    assert _absolute("runs/x/checkpoints/last") == paths.REPO / "runs/x/checkpoints/last"  # else the repo
    assert _absolute("/abs/path") == Path("/abs/path")


def test_one_libero_suite_list():
    """LIBERO's suites are sim.libero_env.SUITES (with their step limits); the Hub's published
    datasets are a subset of them; the evaluation refuses any other name."""
    from tutorial_utils.hub import assets
    from tutorial_utils.sim import libero_env

    assert libero_env.SUITES == tuple(libero_env.MAX_STEPS) and set(assets.SUITES) < set(libero_env.SUITES)
    from tutorial_utils.errors import ConfigError

    with pytest.raises(ConfigError, match="suite='libero_100': use one of libero_spatial"):
        EvalConfig(suite="libero_100").check()
