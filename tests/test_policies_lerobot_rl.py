"""LeRobot 0.4.4's TD-MPC and SAC fed from demonstrations (tutorial_utils.policies.lerobot_rl):
the windows and their sparse success reward, TD-MPC's offline optimisation steps, its closed-loop
``select_action`` and a served chunk after a checkpoint round trip; SAC's learner update (the
critic, actor and temperature each move, the critic loss is finite, the target critics follow);
and the refusal, naming what is missing, of the trainer's one-frame batches.

Tiny sizes (40-48 px, widths of 8-32) keep each model at a few seconds on one core. The tests
that build a model skip where LeRobot is not installed (``make setup``).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from helpers import needs_lerobot, openpi_observation
from tutorial_utils import policies
from tutorial_utils.errors import ConfigError
from tutorial_utils.policies.base import CheckpointError, PolicyUnavailable
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source

SIZE = 48
H = 3
TDMPC = {
    "image_size": SIZE,
    "horizon": H,
    "n_action_steps": 2,
    "mlp_dim": 32,
    "latent_dim": 16,
    "q_ensemble_size": 2,
    "n_gaussian_samples": 8,
    "n_pi_samples": 4,
    "n_elites": 4,
    "cem_iterations": 2,
    "state_encoder_hidden_dim": 32,
    "image_encoder_hidden_dim": 8,
}
SAC = {"image_size": SIZE, "latent_dim": 16, "hidden_dims": "32,32", "image_encoder_hidden_dim": 8}


def observation(size: int = SIZE) -> dict:
    return openpi_observation(size)


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=3, length=8, image_size=SIZE)  # episodes: frames 0-7, 8-15, 16-23


@pytest.fixture(scope="module")
def tdmpc(source):
    needs_lerobot()
    return policies.make("tdmpc", TDMPC, source.statistics)


# --- the windows (no LeRobot needed) ---------------------------------------------------------------


def test_windows_carry_the_next_frames_and_a_sparse_success_reward(source):
    from tutorial_utils.policies.lerobot_rl import DemonstrationWindows

    w = DemonstrationWindows(source, horizon=H, image_size=SIZE, success_reward=2.0, successful=[0, 2])
    b = w.batch([0, 6, 7, 15, 22])
    assert b["window.observation.images.image"].shape == (5, H + 1, SIZE, SIZE, 3)
    assert b["window.observation.state"].shape == (5, H + 1, 8) and b["action"].shape == (5, H, 7)
    # the standard keys stay the current frame's (what the trainer's validation and predict read)
    assert b["observation.images.image"].shape == (5, SIZE, SIZE, 3) and b["observation.state"].shape == (5, 8)
    np.testing.assert_array_equal(b["observation.state"].numpy(), source.state[[0, 6, 7, 15, 22]])
    # frame 0: mid-episode, nothing padded, no reward
    np.testing.assert_array_equal(b["window.observation.state"][0].numpy(), source.state[0:4])
    np.testing.assert_array_equal(b["action"][0].numpy(), source.action[0:3])
    assert not b["observation.state_is_pad"][0].any() and b["next.reward"][0].sum() == 0
    # frame 6: the episode's last action is the window's second: reward there, then padding
    assert b["next.reward"][1].tolist() == [0.0, 2.0, 0.0] and b["next.done"][1].tolist() == [0.0, 1.0, 0.0]
    assert b["observation.state_is_pad"][1].tolist() == [False, False, True, True]
    assert b["action_is_pad"][1].tolist() == [False, False, True] == b["next.reward_is_pad"][1].tolist()
    np.testing.assert_array_equal(b["window.observation.state"][1, 3].numpy(), source.state[7])  # clamped
    # frame 7: the last frame itself
    assert b["next.reward"][2].tolist() == [2.0, 0.0, 0.0]
    # frame 15 ends episode 1, which did not succeed: done, but no reward
    assert b["next.done"][3, 0] == 1.0 and b["next.reward"][3].sum() == 0
    assert b["next.reward"][4].tolist() == [0.0, 2.0, 0.0] and b["index"].tolist() == [0, 6, 7, 15, 22]


def test_configs_name_the_parameter():
    with pytest.raises(ConfigError, match="image_size=32 is too small for tdmpc.*at least 40"):
        TrainConfig.from_overrides({"policy": "tdmpc", "image_size": 32})
    with pytest.raises(ConfigError, match="n_action_steps=6 must be <= the plan length 5"):
        TrainConfig.from_overrides({"policy": "tdmpc", "n_action_steps": 6})
    with pytest.raises(ConfigError, match="n_elites=200 must be <= n_gaussian_samples"):
        TrainConfig.from_overrides({"policy": "tdmpc", "n_elites": 200})
    with pytest.raises(ConfigError, match="camera='side'"):
        TrainConfig.from_overrides({"policy": "sac", "camera": "side"})
    with pytest.raises(ConfigError, match="unknown parameter 'horizon'"):
        TrainConfig.from_overrides({"policy": "sac", "horizon": 5})
    cfg = TrainConfig.from_overrides({"policy": "sac", "latent_dim": 32, "hidden_dims": "64,64"})
    assert cfg.policy_config.latent_dim == 32 and cfg.policy_config.hidden_dims == [64, 64]


# --- TD-MPC ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tdmpc_trains_offline_plans_in_closed_loop_and_serves_after_a_round_trip(tdmpc, source, tmp_path):
    import torch

    from tutorial_utils.policies.lerobot_rl import offline_steps

    model = tdmpc
    before = {k: v.clone() for k, v in model.state_dict().items()}
    history = offline_steps(model, model.training_source(source), steps=2, batch_size=4, lr=1e-3)
    assert len(history) == 2 and all(np.isfinite(h["total_loss"]) for h in history)
    assert {"consistency_loss", "reward_loss", "Q_value_loss", "V_value_loss", "pi_loss"} <= set(history[0])
    after = model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any(k.startswith("policy.model._") for k in changed)  # the TOLD model learned
    assert any(k.startswith("policy.model_target.") for k in changed)  # and the target followed (EMA)

    # closed loop: LeRobot's select_action plans once, then serves the queued second action
    model.reset()
    a1, a2 = model.select_action(observation()), model.select_action(observation())
    assert a1.shape == a2.shape == (7,) and a1.dtype == np.float32 and np.isfinite([a1, a2]).all()
    assert len(model.policy._queues["action"]) == 0  # n_action_steps=2: both planned actions used

    # the seam's checkpoint, served: one plan of `horizon` actions, replan every n_action_steps
    model.save(tmp_path / "ck")
    served = policies.make_policy("tdmpc", checkpoint=str(tmp_path / "ck"))
    out = served.infer(observation())["actions"]
    assert out.shape == (H, 7) and np.isfinite(out).all()
    assert served.metadata["replan_steps"] == 2 and served.metadata["action_horizon"] == H
    lo, hi = (np.asarray(source.statistics["franka"]["action"][k]) for k in ("min", "max"))
    assert (out >= lo - 1e-5).all() and (out <= hi + 1e-5).all()  # clamped plans, un-normalised to robot units
    again = policies.make_policy("tdmpc", checkpoint=str(tmp_path / "ck")).infer(observation())["actions"]
    np.testing.assert_array_equal(out, again)  # the seeded call plans the same

    # bad input: the checkpoint's features do not match its weights (names the feature)
    edited = tmp_path / "edited"
    shutil.copytree(tmp_path / "ck", edited)
    manifest = json.loads((edited / "config.json").read_text())
    manifest["policy"]["image_size"] = 64
    (edited / "config.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"observation\.images\.image"):
        policies.load(edited)
    with pytest.raises(CheckpointError, match=r"feature observation\.images\.image: config.json says image_size=64"):
        policies.make_policy("tdmpc", checkpoint=str(edited))


@pytest.mark.slow
def test_the_trainer_trains_tdmpc_on_its_windows_and_one_frame_batches_are_refused(tdmpc, source, tmp_path):
    """A one-frame batch is refused, naming the missing window. Through the project's trainer (which
    wraps its source with ``policy.training_source`` and keeps a family's extra keys in ``collate``)
    the same family trains and writes a servable checkpoint."""
    from tutorial_utils.train.loop import train

    plain = {
        "observation.images.image": source.primary[:2],
        "observation.images.wrist_image": source.wrist[:2],
        "observation.state": source.state[:2],
        "action": np.stack([source.action[0:3], source.action[1:4]]),
        "task": ["x", "x"],
    }
    with pytest.raises(PolicyUnavailable, match=r"windows of 4 frames with rewards.*no window.observation.state"):
        tdmpc.loss(plain)
    from tutorial_utils.policies.base import ObservationError
    from tutorial_utils.policies.lerobot_rl import DemonstrationWindows

    other = DemonstrationWindows(source, horizon=H, image_size=56).batch([0, 1])
    with pytest.raises(ObservationError, match=r"feature observation\.images\.image: windows of shape \(3, 56, 56\)"):
        tdmpc.loss(other)
    cfg = TrainConfig.from_overrides(
        {"policy": "tdmpc", **TDMPC, "steps": 2, "batch_size": 2, "num_workers": 0, "progress": False}
        | {"val_fraction": 0.34, "val_samples": 2, "eval_freq": 0, "save_freq": 0, "output_dir": str(tmp_path / "run")}
    )
    res = train(cfg, source=source)  # the trainer wraps its source with policy.training_source
    assert res.steps_done == 2 and all(np.isfinite(loss) for _, loss in res.losses)
    served = policies.make_policy("tdmpc", checkpoint=str(tmp_path / "run" / "checkpoints" / "last"))
    assert served.infer(observation())["actions"].shape == (H, 7)


def test_tdmpcs_behaviour_cloning_term_trains_the_encoder_and_is_off_by_default(tdmpc, source):
    """``bc_coeff`` adds pi(encode(o_t)) vs a_t to LeRobot's loss with gradients into the encoder;
    at 0 (the default) the loss is LeRobot's alone, and a negative weight is refused."""
    import torch

    from tutorial_utils.policies.lerobot_rl import DemonstrationWindows

    assert "bc_loss" not in tdmpc.loss(DemonstrationWindows(source, horizon=H, image_size=SIZE).batch([0, 1, 8]))
    torch.manual_seed(0)
    model = policies.make("tdmpc", {**TDMPC, "bc_coeff": 2.0}, source.statistics)
    batch = model.training_source(source).batch([0, 1, 8])
    out = model.loss(batch, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out["bc_loss"]) and out["bc_loss"] > 0
    model.zero_grad()
    out["bc_loss"].backward()
    encoder = model.policy.model._encoder
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())
    with pytest.raises(ConfigError, match="bc_coeff=-1.*>= 0"):
        TrainConfig.from_overrides({"policy": "tdmpc", "bc_coeff": -1})


# --- SAC -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sac_updates_from_demonstration_transitions(source, tmp_path):
    needs_lerobot()
    import torch

    model = policies.make("sac", SAC, source.statistics)
    p = model.policy
    snap = {
        "critic": [x.detach().clone() for x in p.critic_ensemble.parameters()],
        "target": [x.detach().clone() for x in p.critic_target.parameters()],
        "actor": [x.detach().clone() for n, x in p.actor.named_parameters() if not n.startswith("encoder")],
        "temperature": [p.log_alpha.detach().clone()],
    }
    windows = model.training_source(source)
    batch = windows.batch([0, 7, 12, 23])  # frames 7 and 23 end successful episodes: reward 1, done
    assert batch["next.reward"][:, 0].tolist() == [0.0, 1.0, 0.0, 1.0]
    sac = model.transitions(batch)
    assert sac["action"].shape == (4, 7) and sac["state"]["observation.state"].shape == (4, 8)
    assert set(sac["next_state"]) == {"observation.images.image", "observation.images.wrist_image", "observation.state"}
    assert sac["done"].tolist() == [0.0, 1.0, 0.0, 1.0]

    opts = model.make_optimizers()
    losses = [model.update(batch, opts, step) for step in range(2)]
    for out in losses:
        assert {"loss_critic", "loss_actor", "loss_temperature"} <= set(out)
        assert all(np.isfinite(v) for v in out.values())
    now = {
        "critic": list(p.critic_ensemble.parameters()),
        "target": list(p.critic_target.parameters()),
        "actor": [x for n, x in p.actor.named_parameters() if not n.startswith("encoder")],
        "temperature": [p.log_alpha],
    }
    for part, old in snap.items():
        assert any(not torch.equal(a, b) for a, b in zip(old, now[part], strict=True)), f"{part} did not move"
    assert losses[1]["temperature"] < 1.0  # alpha starts at 1 and the temperature step lowered it

    # the trainer's single-loss path says how SAC is updated instead
    with pytest.raises(PolicyUnavailable, match="three optimisers"):
        model.loss(batch)
    # one action per observation, closed loop and served after a round trip
    assert model.select_action(observation()).shape == (7,)
    model.save(tmp_path / "ck")  # the shared encoder is written once and fills every alias on load
    again = policies.load(tmp_path / "ck")
    mine, theirs = torch.nn.Module.state_dict(model), torch.nn.Module.state_dict(again)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert again.policy.critic_target.encoder is again.policy.encoder_critic
    served = policies.make_policy("sac", checkpoint=str(tmp_path / "ck"))
    assert served.infer(observation())["actions"].shape == (1, 7) and served.metadata["replan_steps"] == 1


# --- the latent probe (evaluate.latent) -------------------------------------------------------------


def test_the_latent_summary_tells_a_collapsed_latent_from_a_spread_one():
    from tutorial_utils.evaluate.latent import LatentProbeError, latent_summary

    rng = np.random.default_rng(0)
    spread = rng.normal(size=(200, 16))
    s = latent_summary(spread, spread + 0.1 * rng.normal(size=spread.shape), spread)
    assert 0.95 < s["spread"] <= 1.0 and s["effective_dims"] > 12  # centred noise: all of it varies
    assert 0.0 < s["moves_with_camera"] < 0.2 and s["moves_with_state"] == 0.0
    collapsed = np.ones((200, 16)) + 1e-4 * rng.normal(size=(200, 16))  # the same latent for every frame
    c = latent_summary(collapsed)
    assert c["spread"] < 1e-3 and "moves_with_camera" not in c
    line = np.outer(rng.normal(size=200), np.ones(16))  # frames spread along one direction only
    assert latent_summary(line)["effective_dims"] < 1.01
    with pytest.raises(LatentProbeError, match="need"):
        latent_summary(np.zeros((1, 4)))


def test_the_probe_opens_tdmpc_on_its_own_windows(tdmpc, source):
    from tutorial_utils.evaluate.latent import probe_model, rewards_summary

    windows = tdmpc.training_source(source)
    idx = [0, 3, 5, 8, 13, 16, 21]  # 5, 13 and 21: windows that reach their episode's reward
    p = probe_model(tdmpc, windows, idx, batch_size=4)
    assert p["z"].shape == p["z_image_swapped"].shape == (len(idx), TDMPC["latent_dim"])
    assert p["reward_pred"].shape == p["reward"].shape == (len(idx), H) and p["value"].shape == (len(idx),)
    assert not np.allclose(p["z_image_swapped"], p["z"]) and not np.allclose(p["z_state_swapped"], p["z"])
    r = rewards_summary(p)
    assert r["rewarded_steps"] == 3 and r["reward_pred_at_reward"] is not None and r["value_std"] >= 0.0


def test_the_probe_names_the_training_its_checkpoint_came_from(tmp_path):
    from tutorial_utils.evaluate.latent import training_of

    run = tmp_path / "run"
    (run / "checkpoints" / "best").mkdir(parents=True)
    summary = {"steps_done": 1900, "batch_size": 16, "best": {"val_action_mae": 0.4, "step": 1250}}
    (run / "summary.json").write_text(json.dumps(summary))
    got = training_of(run / "checkpoints" / "best")
    assert got["steps"] == 1900 and got["best_val_action_mae"] == 0.4 and got["best_step"] == 1250
    assert training_of(tmp_path / "loose_checkpoint") == {}  # not inside a run: nothing to name
