"""Every client through the server's door: actions clipped to the env's range (counted, logged),
openpi's replan horizon met, DiT4DiT's 8-action chunk kept, and the server's thread count."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from helpers import openpi_observation
from tutorial_utils.policies.base import Policy
from tutorial_utils.serve.protocol import (
    DIT4DIT_CHUNK,
    OPENPI_REPLAN_STEPS,
    ActionGuard,
    fit_chunk,
    reply_actions,
    to_request,
)
from tutorial_utils.serve.server import ServerThread


class FixedPolicy(Policy):
    """Returns the same chunk every call (robosuite convention)."""

    name = "fixed"

    def __init__(self, chunk, replan_steps: int | None = None):
        self.chunk = np.asarray(chunk, np.float32)
        self.replan = replan_steps or len(self.chunk)

    @property
    def metadata(self):
        h = len(self.chunk)
        return {**super().metadata, "image_size": 32, "action_horizon": h, "replan_steps": self.replan}

    def infer(self, obs):
        return {"actions": self.chunk.copy()}


def _chunk(h: int, value: float = 0.5) -> np.ndarray:
    a = np.full((h, 7), value, np.float32)
    a[:, 6] = -1.0
    return a


# --- the guard on its own --------------------------------------------------------------------------


def test_guard_clips_to_the_env_range_and_counts_every_clipped_value(caplog):
    guard = ActionGuard(action_horizon=8, replan_steps=8)
    a = _chunk(8)
    a[0, 0], a[3, 2], a[5, 6] = 136.0, -2.5, 1.0  # two out of range, one exactly on the bound
    with caplog.at_level(logging.WARNING, "tutorial_utils.serve"):
        out = guard(a)
    assert out.min() >= -1.0 and out.max() <= 1.0
    assert out[0, 0] == 1.0 and out[3, 2] == -1.0 and out[5, 6] == 1.0
    np.testing.assert_array_equal(np.delete(out.ravel(), [0 * 7 + 0, 3 * 7 + 2]), np.delete(a.ravel(), [0, 23]))
    assert (guard.last_clipped, guard.clipped_values, guard.clipped_replies, guard.replies) == (2, 2, 1, 1)
    assert guard.largest == 136.0
    assert "clipped 2 of 56 action values to [-1, 1]" in caplog.text and "136" in caplog.text

    guard(_chunk(8))  # in range: nothing clipped, nothing added
    assert (guard.last_clipped, guard.clipped_values, guard.replies) == (0, 2, 2)
    assert "2 value(s) clipped to [-1, 1] in 1 of 2 replies (largest |value| 136)" in guard.summary()


def test_guard_logs_the_first_clipped_replies_then_every_power_of_ten(caplog):
    guard = ActionGuard(action_horizon=8)
    with caplog.at_level(logging.WARNING, "tutorial_utils.serve"):
        for _ in range(120):
            guard(_chunk(8, 3.0))
    lines = [r for r in caplog.records if "clipped" in r.getMessage()]
    assert len(lines) == 5  # replies 1, 2, 3, 10, 100
    assert guard.clipped_replies == 120 and guard.clipped_values == 120 * 8 * 6


def test_fit_chunk_pads_with_the_last_action_and_cuts_long_chunks():
    a = np.arange(14, dtype=np.float32).reshape(2, 7)
    padded, how = fit_chunk(a, 5)
    assert how == "padded" and padded.shape == (5, 7)
    np.testing.assert_array_equal(padded[:2], a)
    np.testing.assert_array_equal(padded[2:], np.repeat(a[-1:], 3, axis=0))
    cut, how = fit_chunk(np.zeros((16, 7)), 8)
    assert how == "cut" and cut.shape == (8, 7)
    same, how = fit_chunk(a, 2)
    assert how == "" and same is not None and same.shape == (2, 7)


def test_guard_refuses_a_negative_min_chunk():
    from tutorial_utils.errors import ConfigError

    with pytest.raises(ConfigError, match="min-chunk"):
        ActionGuard(min_chunk=-1)


# --- through the server ----------------------------------------------------------------------------


def test_openpi_client_gets_clipped_actions_and_the_count(caplog):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    chunk = _chunk(8)
    chunk[:, 0] = 136.0  # VQ-BeT sent 136 to openpi's client, which forwards it to the robot
    with caplog.at_level(logging.INFO, "tutorial_utils.serve"), ServerThread(FixedPolicy(chunk)) as srv:
        client = WebsocketClientPolicy(host="127.0.0.1", port=srv.port)
        meta = client.get_server_metadata()
        reply = client.infer(openpi_observation(32))
        reply2 = client.infer(openpi_observation(32))
        stats = srv.server.guard
    assert meta["action_range"] == [-1.0, 1.0]
    a = np.asarray(reply["actions"])
    assert a.shape == (8, 7) and a.max() <= 1.0 and a[:, 0].tolist() == [1.0] * 8
    assert reply["clipped_values"] == 8 and reply2["clipped_values"] == 8
    assert (stats.clipped_values, stats.clipped_replies, stats.replies) == (16, 2, 2)
    assert "clipped 8 of 56 action values" in caplog.text


def test_a_one_action_chunk_meets_openpis_replan_horizon(caplog):
    """SAC's one-action chunk tripped openpi's ``assert len(action_chunk) >= replan_steps`` (5): the
    server pads it by repeating the action, says so in its metadata and log, and our own client
    (which follows metadata['replan_steps']) still executes only the policy's one action."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    one = _chunk(1, 0.25)
    with caplog.at_level(logging.INFO, "tutorial_utils.serve"), ServerThread(FixedPolicy(one)) as srv:
        client = WebsocketClientPolicy(host="127.0.0.1", port=srv.port)
        meta = client.get_server_metadata()
        action_chunk = client.infer(openpi_observation(32))["actions"]
        padded = srv.server.guard.padded_replies
    # openpi's examples/libero/main.py, as written there:
    replan_steps = 5
    assert len(action_chunk) >= replan_steps, (
        f"We want to replan every {replan_steps} steps, but policy only predicts {len(action_chunk)} steps."
    )
    np.testing.assert_array_equal(action_chunk, np.repeat(one, OPENPI_REPLAN_STEPS, axis=0))
    assert padded == 1
    assert meta["action_horizon"] == 1 and meta["replan_steps"] == 1 and meta["openpi_min_chunk"] == 5
    assert "padded to 5 by repeating its last action" in meta["chunk_padding"]
    assert "padded to 5" in caplog.text


def test_min_chunk_zero_sends_the_policys_own_chunk():
    from tutorial_utils.serve.client import PolicyClient

    with ServerThread(FixedPolicy(_chunk(1)), min_chunk=0) as srv, PolicyClient(port=srv.port) as client:
        reply = client.infer(openpi_observation(32))
        assert "chunk_padding" not in client.metadata
    assert reply_actions(reply).shape == (1, 7)


@pytest.mark.parametrize("horizon", [16, 8, 1])
def test_dit4dit_replies_carry_at_most_upstreams_8_actions(horizon, caplog):
    """Upstream's server always sends 8 and its client executes them all: ACT's 16 are cut to the
    first 8, a shorter chunk goes out as it is (padding would make the client repeat an action open
    loop); the values are clipped to the env's range first."""
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.dit4dit_profile import ActionStatistics

    chunk = _chunk(horizon)
    chunk[:, 0] = np.linspace(-0.9, 0.9, horizon)
    chunk[0, 1] = 5.0  # out of range: clipped before it is normalised
    with caplog.at_level(logging.INFO, "tutorial_utils.serve"), ServerThread(FixedPolicy(chunk)) as srv:
        with PolicyClient(port=srv.port) as client:
            reply = client.infer(to_request(openpi_observation(32), "dit4dit"))
        guard = srv.server.guard
    normalized = np.asarray(reply["data"]["normalized_actions"])
    assert normalized.shape == (1, min(DIT4DIT_CHUNK, horizon), 8)
    back = ActionStatistics.action_space().to_env(normalized[0])
    expect = chunk[:8]
    np.testing.assert_allclose(back[:, :6], np.clip(expect[:, :6], -1, 1), atol=1e-6)
    assert back[0, 1] == 1.0 and guard.clipped_values == 1
    assert (guard.cut_replies, guard.padded_replies) == ((1, 0) if horizon > 8 else (0, 0))
    if horizon > 8:
        assert "replies carry its first 8" in caplog.text


# --- serve --threads -------------------------------------------------------------------------------


def test_serve_threads_reaches_torch(monkeypatch):
    import torch

    from tutorial_utils.serve import cli
    from tutorial_utils.serve.server import PolicyServer

    seen = {}

    async def no_serve(self):  # start nothing: we only check what the process was set to
        seen["threads"] = torch.get_num_threads()
        seen["min_chunk"] = self.guard.min_chunk

    before = torch.get_num_threads()
    monkeypatch.setattr(PolicyServer, "serve", no_serve)
    try:
        assert cli.main(["--policy", "zero", "--port", "0", "--threads", "1", "--min-chunk", "3"]) == 0
        assert seen == {"threads": 1, "min_chunk": 3}
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(cli.os, "cpu_count", lambda: 8)
        assert cli.default_threads() == 4
        assert cli.main(["--policy", "zero", "--port", "0"]) == 0
        assert seen["threads"] == 4
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert cli.default_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_serve_refuses_a_negative_thread_count(capsys):
    from tutorial_utils.serve import cli

    with pytest.raises(SystemExit):
        cli.main(["--policy", "zero", "--threads", "-2"])
    assert "threads" in capsys.readouterr().err
