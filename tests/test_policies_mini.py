"""tutorial_utils.policies.mini: shapes, flow matching, Euler sampling, normalisation, checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tutorial_utils.policies import load as load_policy
from tutorial_utils.policies import make_policy as serve_policy
from tutorial_utils.policies.base import CheckpointError
from tutorial_utils.policies.checkpoint import load_weights_into
from tutorial_utils.policies.mini import MiniPolicy, PolicyConfig, StateEncoder, _beta_sample
from tutorial_utils.policies.normalize import ActionNormalizer, StatisticsError, read_statistics

torch.set_num_threads(1)

STATS = {
    "franka": {
        "action": {
            "min": [-0.5, -1, -1, -0.2, -0.2, -0.2, -1],
            "max": [0.5, 1, 1, 0.2, 0.2, 0.2, 1],
            "mask": [True] * 6 + [False],
        },
        "state": {},
        "num_trajectories": 1,
        "num_transitions": 1,
    }
}
SMALL = dict(image_size=32, model_dim=32, num_heads=2, action_depth=2, vocab_size=256, max_words=8)


def make_policy(**kw) -> MiniPolicy:
    torch.manual_seed(0)
    return MiniPolicy(PolicyConfig(**{**SMALL, **kw}), STATS)


def make_batch(b: int = 4, size: int = 48, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "observation.images.image": rng.integers(0, 255, (b, size, size, 3), dtype=np.uint8),
        "observation.images.wrist_image": rng.integers(0, 255, (b, size, size, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(b, 8)).astype(np.float32),
        "task": ["pick up the black bowl", "open the drawer", "", "put the cup on the plate"][:b] * (b // 4 or 1),
        "action": rng.uniform(-0.4, 0.4, (b, 8, 7)).astype(np.float32),
        "action_is_pad": np.zeros((b, 8), bool),
    }


def test_shapes_and_module_split():
    p = make_policy()
    b = make_batch()
    ctx, pad = p.encode(b)
    n_img = (32 // 16) ** 2
    assert ctx.shape == (4, 1 + 8 + 2 * n_img, 32) and pad.shape == ctx.shape[:2]
    out = p.loss(b, torch.Generator().manual_seed(0))
    assert out["total_loss"].ndim == 0 and torch.isfinite(out["total_loss"])
    assert p.sample(b).shape == (4, 8, 7)
    chunk = p.predict_action(
        b["observation.images.image"][0],
        b["observation.images.wrist_image"][0],
        b["observation.state"][0],
        "pick up the bowl",
        seed=1,
    )
    assert chunk.shape == (8, 7) and chunk.dtype == np.float32
    names = p.module_names()
    for n in (
        "backbone",
        "action_model",
        "backbone.primary_encoder",
        "backbone.wrist_encoder",
        "backbone.language_encoder",
        "backbone.state_encoder",
        "action_model.blocks",
    ):
        assert n in names
    c = p.parameter_counts()
    assert c["total"] == sum(x.numel() for x in p.backbone.parameters()) + sum(
        x.numel() for x in p.action_model.parameters()
    )


def test_state_encoder_is_sincos_16():
    s = torch.tensor([[0.0] * 8])
    enc = StateEncoder.sincos(s)
    assert enc.shape == (1, 16) and torch.allclose(enc[0, 8:], torch.ones(8))


def test_flow_matching_loss_decreases_on_tiny_overfit():
    p = make_policy()
    b = make_batch()
    opt = torch.optim.AdamW(p.parameters(), lr=3e-3)
    losses = []
    for step in range(40):
        loss = p.loss(b, torch.Generator().manual_seed(step % 4))["total_loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4]), losses


def test_masked_loss_ignores_padded_steps():
    p = make_policy()
    b = make_batch()
    b2 = {**b, "action": b["action"].copy()}
    b["action_is_pad"][:, 5:] = True
    b2["action_is_pad"] = b["action_is_pad"]
    b2["action"][:, 5:] = 0.33  # different values where masked out
    l1 = p.loss(b, torch.Generator().manual_seed(3))["total_loss"]
    l2 = p.loss(b2, torch.Generator().manual_seed(3))["total_loss"]
    assert torch.allclose(l1, l2)


def test_beta_time_distribution():
    t = _beta_sample(1.5, 1.0, 20000, torch.Generator().manual_seed(0))
    assert 0 <= t.min() and t.max() <= 1
    assert abs(t.mean().item() - 0.6) < 0.01  # mean of Beta(1.5, 1) = 1.5 / 2.5


def test_euler_sampling_follows_the_straight_flow():
    """With the exact velocity of the straight path to A, 4 Euler steps from t=1 land on A."""
    p = make_policy()
    b = make_batch(2)
    target = torch.full((2, 8, 7), 0.25)
    calls = []

    def exact_velocity(x, t, ctx, pad):
        calls.append(float(t[0]))
        return (x - target) / t[:, None, None]

    p.action_model.forward = exact_velocity
    out = p.sample(b, torch.Generator().manual_seed(0))
    assert calls == [1.0, 0.75, 0.5, 0.25]
    assert torch.allclose(out, target, atol=1e-5)


def test_normalisation_round_trip_and_raw_gripper():
    n = ActionNormalizer.from_statistics(STATS)
    a = np.array([[0.5, -1, 0, 0.1, -0.2, 0.2, -1], [-0.5, 1, 0.5, 0, 0, 0, 1]], np.float32)
    z = n.normalize(a)
    assert np.allclose(z[0, :6], [1, -1, 0, 0.5, -1, 1]) and np.allclose(z[:, 6], a[:, 6])
    assert np.allclose(n.unnormalize(z), a, atol=1e-6)
    zt = n.normalize(torch.from_numpy(a))
    assert torch.allclose(n.unnormalize(zt), torch.from_numpy(a), atol=1e-6)
    const = ActionNormalizer(np.zeros(2), np.zeros(2), np.array([True, True]))  # min == max
    assert np.isfinite(const.normalize(np.ones((1, 2), np.float32))).all()


def test_statistics_errors(tmp_path):
    with pytest.raises(StatisticsError, match="franka"):
        ActionNormalizer.from_statistics({"libero": {}})
    with pytest.raises(StatisticsError, match="dataset stats"):
        read_statistics(tmp_path / "dataset_statistics.json")
    with pytest.raises(StatisticsError, match="action_dim"):
        MiniPolicy(PolicyConfig(**{**SMALL, "action_dim": 6}), STATS)


def test_save_load_round_trip(tmp_path):
    p = make_policy()
    b = make_batch(2)
    ck = p.save(tmp_path / "ck")
    assert sorted(x.name for x in ck.iterdir()) == ["config.json", "dataset_statistics.json", "model.safetensors"]
    q = load_policy(ck)
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    assert np.array_equal(p.predict(b, gen()), q.predict(b, gen()))
    manifest = json.loads((ck / "config.json").read_text())
    assert manifest["policy"]["model_dim"] == 32 and len(manifest["weights"]["sha256"]) == 64


def test_checkpoint_from_a_different_config(tmp_path):
    ck = make_policy().save(tmp_path / "ck")
    other = make_policy(model_dim=64)
    with pytest.raises(CheckpointError, match="different model config.*model_dim"):
        load_weights_into(other, ck)
    # config.json edited to another shape: the weights no longer fit
    m = json.loads((ck / "config.json").read_text())
    m["policy"]["action_depth"] = 3
    (ck / "config.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="does not fit"):
        load_policy(ck)


def test_corrupted_checkpoint_file(tmp_path):
    ck = make_policy().save(tmp_path / "ck")
    w = ck / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted.*sha256"):
        load_policy(ck)
    w.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(CheckpointError, match="corrupted.*bytes"):
        load_policy(ck)
    (ck / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is corrupted"):
        load_policy(ck)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_policy(tmp_path / "nowhere")


def test_serving_adapter(tmp_path):
    ck = make_policy().save(tmp_path / "ck", {"dataset": {"image_size": 48, "gripper": "robosuite"}})
    sp = serve_policy("mini", ck)
    b = make_batch(1)
    obs = {
        "observation/image": b["observation.images.image"][0],
        "observation/wrist_image": b["observation.images.wrist_image"][0],
        "observation/state": b["observation.state"][0],
        "prompt": "pick up the bowl",
    }
    out = sp.infer(obs)
    assert out["actions"].shape == (8, 7) and out["actions"].dtype == np.float32
    assert np.array_equal(out["actions"], sp.infer(obs)["actions"])  # seeded noise: deterministic
    back = sp.model.normalizer.unnormalize(sp.normalize_actions(out["actions"]), clip=False)
    assert np.allclose(back, out["actions"], atol=1e-5)
    md = sp.metadata
    assert md["policy"] == "mini" and md["action_horizon"] == 8 and md["replan_steps"] == 8 and md["image_size"] == 32
    assert md["gripper"] == "robosuite"  # the checkpoint's dataset convention


@pytest.mark.slow
def test_read_only_request_arrays_are_served_without_a_torch_warning(tmp_path):
    """msgpack-decoded arrays are read-only; the server log once carried torch's 'not writable'
    warning. Torch warns once per process, so the check runs in a fresh one."""
    import subprocess
    import sys

    ck = make_policy().save(tmp_path / "ck")
    code = f"""
import warnings, numpy as np
from tutorial_utils.policies.normalize import ActionNormalizer, read_statistics
from tutorial_utils.policies.base import CheckpointError
from tutorial_utils.policies.normalize import StatisticsError
from tutorial_utils.policies.mini import MiniPolicy, PolicyConfig, StateEncoder, _beta_sample
from tutorial_utils.policies import load as load_policy
from tutorial_utils.policies.checkpoint import load_weights_into
from tutorial_utils.policies import make_policy as serve_policy
from tutorial_utils.serve.wire import packb, unpackb
warnings.simplefilter("error")
rng = np.random.default_rng(0)
img = lambda: rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)
obs = unpackb(packb({{"observation/image": img(), "observation/wrist_image": img(),
                      "observation/state": rng.normal(size=8).astype(np.float32), "prompt": "pick up the bowl"}}))
assert not obs["observation/image"].flags.writeable and not obs["observation/state"].flags.writeable
print(serve_policy("mini", {str(ck)!r}).infer(obs)["actions"].shape)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "(8, 7)" in r.stdout, r.stderr[-2000:]


def test_openpi_and_lerobot_keys_map_one_way_and_back():
    """observation_to_batch and batch_to_observation read the one table, OPENPI_TO_BATCH."""
    import numpy as np

    from tutorial_utils.policies import base as B

    rng = np.random.default_rng(0)
    batch = {
        B.BATCH_IMAGE: rng.integers(0, 255, (2, 8, 8, 3), dtype=np.uint8),
        B.BATCH_WRIST: rng.integers(0, 255, (2, 8, 8, 3), dtype=np.uint8),
        B.BATCH_STATE: rng.normal(size=(2, B.STATE_DIM)).astype(np.float32),
        B.BATCH_TASK: ["pick", "place"],
    }
    obs = B.batch_to_observation(batch, 1)
    assert set(obs) == set(B.OPENPI_TO_BATCH) == set(B.OPENPI_KEYS) and obs[B.PROMPT_KEY] == "place"
    back = B.observation_to_batch(obs)
    assert set(back) == set(B.OPENPI_TO_BATCH.values())
    for key in (B.BATCH_IMAGE, B.BATCH_WRIST, B.BATCH_STATE):
        np.testing.assert_array_equal(back[key][0], batch[key][1])
    assert back[B.BATCH_TASK] == ["place"]
    with pytest.raises(B.ObservationError, match="observation.state"):
        B.batch_to_observation({k: v for k, v in batch.items() if k != B.BATCH_STATE})
