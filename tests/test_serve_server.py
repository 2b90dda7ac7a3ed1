"""The websocket policy server and client: framing, openpi interop, bad input and faults."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import pytest

from helpers import openpi_observation
from tutorial_utils import logs
from tutorial_utils.policies import available, make_policy
from tutorial_utils.policies.base import PolicyUnavailable, ZeroPolicy
from tutorial_utils.policies.expert import ExpertPolicy
from tutorial_utils.serve.client import PolicyClient, check_health, wait_for_health
from tutorial_utils.serve.protocol import (
    PortInUse,
    ServerDied,
    ServerError,
    ServerUnavailable,
    reply_actions,
    to_policy_observation,
    to_request,
)
from tutorial_utils.serve.server import HandlerThread, ServerThread, free_port
from tutorial_utils.serve.wire import packb, unpackb


@pytest.fixture(scope="module")
def server():
    with ServerThread(ZeroPolicy()) as srv:
        yield srv


def _start_cli_server(port: int, log_path, policy: str = "zero") -> subprocess.Popen:
    fh = open(log_path, "w")
    return subprocess.Popen(
        [sys.executable, "-m", "tutorial_utils", "serve", "--policy", policy, "--port", str(port)],
        stdout=fh,
        stderr=subprocess.STDOUT,
    )


# --- framing ---------------------------------------------------------------------------------------


def test_pack_roundtrip_and_openpi_framing():
    from openpi_client import msgpack_numpy

    msg = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "s": np.float64(1.5),
        "i": np.int32(7),
        "t": "x",
        "n": [1, 2],
    }
    for data in (packb(msg), msgpack_numpy.packb(msg)):
        for back in (unpackb(data), msgpack_numpy.unpackb(data)):
            np.testing.assert_array_equal(back["a"], msg["a"])
            assert back["a"].dtype == np.float32 and back["s"] == 1.5 and isinstance(back["i"], np.int32)
            assert back["t"] == "x" and back["n"] == [1, 2]
    assert packb(msg) == msgpack_numpy.packb(msg)  # byte-identical framing


def test_unpack_accepts_str_keys():
    import msgpack

    raw = msgpack.packb({"x": {"__ndarray__": True, "data": b"\x01\x02", "dtype": "|u1", "shape": [2]}})
    np.testing.assert_array_equal(unpackb(raw)["x"], [1, 2])


# --- interop ---------------------------------------------------------------------------------------


def test_openpi_client_drives_our_server(server):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    client = WebsocketClientPolicy("127.0.0.1", server.port)
    assert client.get_server_metadata()["action_horizon"] == 8
    reply = client.infer(openpi_observation())
    assert reply["actions"].shape == (8, 7) and reply["actions"].dtype == np.float32
    assert reply["server_timing"]["infer_ms"] >= 0
    with pytest.raises(RuntimeError, match="observation/image"):
        client.infer({"prompt": "x"})
    assert client.infer(openpi_observation())["actions"].shape == (8, 7)  # keeps serving after an error


async def _openpi_style_handler(ws):
    """A server written the openpi way, from openpi_client's msgpack_numpy helpers."""
    from openpi_client import msgpack_numpy

    packer = msgpack_numpy.Packer()
    await ws.send(packer.pack({"server": "openpi-style"}))
    async for frame in ws:
        try:
            obs = msgpack_numpy.unpackb(frame)
            n = int(obs["observation/state"].shape[0])
            await ws.send(packer.pack({"actions": np.full((5, 7), n, np.float32), "server_timing": {"infer_ms": 0.1}}))
        except Exception:
            await ws.send(traceback.format_exc())


def test_our_client_drives_openpi_style_server():
    with HandlerThread(_openpi_style_handler) as srv:
        with PolicyClient(port=srv.port, connect_timeout=5) as client:
            assert client.metadata == {"server": "openpi-style"}
            reply = client.infer(openpi_observation())
            np.testing.assert_array_equal(reply["actions"], np.full((5, 7), 8, np.float32))
            with pytest.raises(ServerError, match="KeyError") as ei:
                client.infer({"prompt": "no state"})
            # openpi's servers send the whole traceback: the client keeps it
            assert ei.value.server_traceback.startswith("Traceback (most recent call last)")
            assert "--- server traceback ---" in str(ei.value)


def test_dit4dit_examples_request(server):
    with PolicyClient(port=server.port, protocol="dit4dit") as client:
        reply = client.infer(openpi_observation())
    assert reply["data"]["normalized_actions"].shape == (1, 8, 8)
    assert reply_actions(reply).shape == (8, 7)
    obs = to_policy_observation(to_request(openpi_observation(), "dit4dit"), 224)
    np.testing.assert_allclose(obs["observation/state"], openpi_observation()["observation/state"], atol=1e-5)
    np.testing.assert_array_equal(obs["observation/wrist_image"], openpi_observation()["observation/wrist_image"])


def test_infer_in_thread():
    with ServerThread(ZeroPolicy(horizon=4), min_chunk=0) as srv:  # min_chunk=0: no padding to openpi's 5
        srv.server.infer_in_thread = True
        with PolicyClient(port=srv.port) as client:
            assert client.infer(openpi_observation())["actions"].shape == (4, 7)


def test_healthz(server):
    assert check_health(port=server.port)
    assert wait_for_health(port=server.port, timeout=2) < 2


# --- bad input --------------------------------------------------------------------------------------


def test_malformed_msgpack_gets_error_and_server_keeps_serving(server):
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None, proxy=None) as ws:
        unpackb(ws.recv(timeout=5))  # metadata
        ws.send(b"\xc1\xc1 not msgpack")
        err = ws.recv(timeout=5)
        assert isinstance(err, str) and err.startswith("WireError: ") and "not valid msgpack" in err
        assert "Traceback" not in err and ".py" not in err  # type and message only (no --debug)
        ws.send(packb(openpi_observation()))
        assert unpackb(ws.recv(timeout=5))["actions"].shape == (8, 7)


def test_missing_observation_key(server):
    obs = openpi_observation()
    del obs["observation/wrist_image"]
    with PolicyClient(port=server.port) as client:
        with pytest.raises(
            ServerError, match="ObservationError: request is missing key.*observation/wrist_image"
        ) as ei:
            client.infer(obs)
    assert ei.value.server_traceback is None and "Traceback" not in str(ei.value)


def test_wrong_image_shape(server):
    obs = openpi_observation()
    obs["observation/image"] = np.zeros((128, 96, 3), np.uint8)  # any size is resized to the policy's
    with PolicyClient(port=server.port) as client:
        assert client.infer(obs)["actions"].shape == (8, 7)
        obs["observation/image"] = np.zeros((224, 224), np.uint8)
        with pytest.raises(ServerError, match=r"observation/image.*\(H, W, 3\)"):
            client.infer(obs)
        obs["observation/image"] = np.zeros((224, 224, 3), np.float32)
        with pytest.raises(ServerError, match=r"observation/image.*uint8"):
            client.infer(obs)
        assert client.infer(openpi_observation())["actions"].shape == (8, 7)


class DatasetGripperPolicy(ZeroPolicy):
    """A stub trained-policy: 64x64 inputs, actions in the LIBERO datasets' gripper convention
    (+1 open, -1 close); keeps the observations it receives."""

    name = "dataset-stub"
    GRIPPER = np.array([1.0, -1.0, 0.3, -0.2], np.float32)

    def __init__(self):
        super().__init__(horizon=4, image_size=64)
        self.seen = []

    @property
    def metadata(self):
        return {**super().metadata, "gripper": "dataset"}

    def infer(self, obs):
        self.seen.append(obs)
        a = np.tile(np.arange(7, dtype=np.float32) / 10, (4, 1))
        a[:, 6] = self.GRIPPER
        return {"actions": a}


def test_openpi_request_resized_and_answered_in_env_convention():
    """openpi's client sends 224x224 images and passes `actions` straight to env.step: the server
    resizes to the policy's 64 with data.images.resize and flips a dataset-convention gripper."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from tutorial_utils.data.images import resize
    from tutorial_utils.data.libero_schema import dataset_action_to_env

    pol = DatasetGripperPolicy()
    obs = openpi_observation(224)
    with ServerThread(pol, min_chunk=0) as srv:  # the policy's own 4 actions (no padding to openpi's 5)
        client = WebsocketClientPolicy("127.0.0.1", srv.port)
        meta = client.get_server_metadata()
        assert meta["gripper"] == "robosuite" and meta["policy_gripper"] == "dataset" and meta["image_size"] == 64
        actions = client.infer(obs)["actions"]
        with PolicyClient(port=srv.port, protocol="dit4dit") as ours:
            dit = reply_actions(ours.infer(obs))
    seen = pol.seen[0]
    for key in ("observation/image", "observation/wrist_image"):
        assert seen[key].shape == (64, 64, 3) and seen[key].dtype == np.uint8
        np.testing.assert_array_equal(seen[key], resize(obs[key], 64))
    assert actions.shape == (4, 7) and actions.dtype == np.float32
    np.testing.assert_array_equal(actions[:, 6], [-1.0, 1.0, -1.0, 1.0])  # robosuite: -1 open, +1 close
    np.testing.assert_allclose(actions[:, :6], np.tile(np.arange(6) / 10, (4, 1)), rtol=1e-6)
    np.testing.assert_array_equal(actions, dataset_action_to_env(pol.infer(obs)["actions"]))
    # DiT4DiT: upstream's normalised gripper, +1 open (the dataset's > 0) / -1 close
    assert dit.shape == (4, 7)  # the policy's own 4 actions (at most upstream's 8; a shorter chunk is not padded)
    np.testing.assert_array_equal(dit[:4, 6], np.where(DatasetGripperPolicy.GRIPPER > 0, 1.0, -1.0))


def test_server_refuses_unknown_gripper_convention():
    class Weird(ZeroPolicy):
        @property
        def metadata(self):
            return {**super().metadata, "gripper": "upside-down"}

    with pytest.raises(ValueError, match="gripper.*upside-down.*robosuite.*dataset"):
        ServerThread(Weird())


# --- faults -------------------------------------------------------------------------------------------


def test_server_killed_mid_evaluation(tmp_path):
    port = free_port()
    proc = _start_cli_server(port, tmp_path / "server.log")
    try:
        client = PolicyClient(port=port, connect_timeout=30, recv_timeout=10)
        assert client.infer(openpi_observation())["actions"].shape == (8, 7)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        with pytest.raises(ServerDied, match="closed the connection"):
            for _ in range(3):
                client.infer(openpi_observation())
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()
        proc.wait()
    text = (tmp_path / "server.log").read_text()
    for sign in ("server running", "server listening on", logs.SERVER_CONNECTION_OPEN):
        assert sign in text, text


def test_server_stuck_times_out():
    """A server that accepts and then never answers: the client gives up after recv_timeout."""
    from websockets.sync.server import serve

    def handler(ws):
        ws.send(packb({"stuck": True}))
        time.sleep(3)

    with serve(handler, "127.0.0.1", 0) as srv:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        port = srv.socket.getsockname()[1]
        client = PolicyClient(port=port, recv_timeout=0.5)
        with pytest.raises(ServerDied, match="did not answer within"):
            client.infer(openpi_observation())
        srv.shutdown()


def test_port_already_in_use(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(PortInUse, match=f"port {port} .*already in use"):
            ServerThread(ZeroPolicy(), port=port).start()
        proc = subprocess.run(
            [sys.executable, "-m", "tutorial_utils", "serve", "--policy", "zero", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2
        assert "already in use" in proc.stderr
    finally:
        holder.close()


def test_client_started_before_server(tmp_path):
    port = free_port()
    result = {}

    def connect():
        try:
            c = PolicyClient(port=port, connect_timeout=30, retry_interval=0.2)
            result["reply"] = c.infer(openpi_observation())
            c.close()
        except Exception as exc:  # reported below
            result["error"] = exc

    t = threading.Thread(target=connect)
    t.start()
    time.sleep(1.0)
    assert t.is_alive()  # still retrying
    with ServerThread(ZeroPolicy(), port=port):
        t.join(20)
    assert "error" not in result, result.get("error")
    assert result["reply"]["actions"].shape == (8, 7)


def test_client_gives_up_with_clear_error():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable, match=f"could not connect.*{port}.*within 1 s"):
        PolicyClient(port=port, connect_timeout=1, retry_interval=0.2)
    assert time.monotonic() - t0 < 5
    with pytest.raises(ServerUnavailable, match="healthz"):
        wait_for_health(port=port, timeout=0.5, interval=0.1)


# --- policies ------------------------------------------------------------------------------------


def test_registry_clear_errors():
    assert {"expert", "zero", "mini", "dit4dit"} <= set(available())
    with pytest.raises(PolicyUnavailable, match="GPU checkout"):
        make_policy("dit4dit")
    with pytest.raises(PolicyUnavailable, match="unknown policy 'nope'.*expert"):
        make_policy("nope")
    with pytest.raises(PolicyUnavailable, match="mini"):
        make_policy("mini")


def test_expert_without_privileged_state_is_refused(server):
    with ServerThread(ExpertPolicy()) as srv, PolicyClient(port=srv.port) as client:
        assert client.metadata["needs_privileged"] is True
        with pytest.raises(ServerError, match="privileged"):
            client.infer(openpi_observation())


def test_expert_policy_fresh_controller_per_episode(monkeypatch):
    from tutorial_utils.sim import expert

    made = []

    class FakeExpert:
        def __init__(self):
            self.resets = []
            made.append(self)

        def reset(self, task_info):
            self.resets.append(task_info)

        def act(self, priv):
            return np.arange(7, dtype=np.float64)

    monkeypatch.setattr(expert, "ScriptedExpert", FakeExpert)
    pol = ExpertPolicy()
    for ep in ("a", "a", "b"):
        out = pol.infer(
            {"privileged": {"episode_id": ep, "task_info": {"objects_of_interest": ["bowl", "plate"]}, "obs": {}}}
        )
    assert out["actions"].shape == (1, 7) and out["actions"].dtype == np.float32
    assert (
        len(made) == 2 and made[0].resets == [{"objects_of_interest": ["bowl", "plate"]}] and len(made[1].resets) == 1
    )


def test_mini_policy_served_from_a_checkpoint(tmp_path):
    """The registry's `mini` entry serves a (tiny, untrained) checkpoint of tutorial_utils.policies.mini."""
    torch = pytest.importorskip("torch")
    from tutorial_utils.policies import mini as P

    torch.set_num_threads(1)
    stats = {
        "franka": {
            "action": {"min": [-1] * 7, "max": [1] * 7, "mask": [True] * 6 + [False]},
            "state": {},
            "num_trajectories": 1,
            "num_transitions": 1,
        }
    }
    cfg = P.PolicyConfig(image_size=32, model_dim=32, num_heads=2, action_depth=2, vocab_size=256, max_words=8)
    ck = P.MiniPolicy(cfg, stats).save(tmp_path / "ck", {"dataset": {"image_size": 32, "gripper": "dataset"}})
    pol = make_policy("mini", checkpoint=str(ck))
    with ServerThread(pol) as srv, PolicyClient(port=srv.port) as client:
        md = client.metadata
        assert md["policy"] == "mini" and md["image_size"] == 32 and not md["needs_privileged"]
        assert md["gripper"] == "robosuite" and md["policy_gripper"] == "dataset"  # the server flips for openpi
        reply = client.infer(openpi_observation(32))
        assert reply["actions"].shape == (md["action_horizon"], 7)
        assert set(np.unique(reply["actions"][:, 6])) <= {-1.0, 1.0}
        assert client.infer(openpi_observation(224))["actions"].shape == (
            md["action_horizon"],
            7,
        )  # resized by the server
