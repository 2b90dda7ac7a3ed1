"""tutorial_utils.report.concepts: batch from an episode, shape tracing, freezing, Euler path, clocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tutorial_utils.data import synth
from tutorial_utils.policies import mini as P
from tutorial_utils.report import concepts as C

torch.set_num_threads(1)

SMALL = dict(image_size=32, model_dim=32, num_heads=2, action_depth=2, vocab_size=256, max_words=8)


@pytest.fixture(scope="module")
def episode():
    return synth.synth_episode(12, 32, np.random.default_rng(0))


@pytest.fixture()
def setup(episode):
    torch.manual_seed(0)
    batch = C.episode_batch(episode, [0, 6], 8, "pick up the black bowl")
    pol = P.MiniPolicy(P.PolicyConfig(**SMALL), C.action_statistics(episode["action"]))
    return pol, batch


def test_episode_batch_masks_past_the_end(episode):
    b = C.episode_batch(episode, [0, 6], 8, "x")
    assert b["observation.images.image"].shape == (2, 32, 32, 3) and b["observation.state"].shape == (2, 8)
    assert b["action"].shape == (2, 8, 7) and b["task"] == ["x", "x"]
    assert not b["action_is_pad"][0].any() and b["action_is_pad"][1].tolist() == [False] * 6 + [True] * 2
    np.testing.assert_array_equal(b["action"][1, -1], episode["action"][-1])
    with pytest.raises(IndexError, match="outside the episode"):
        C.episode_batch(episode, [12], 8, "x")


def test_describe():
    assert C.describe(np.zeros((2, 8, 7))) == "2×8×7"
    assert C.describe((torch.zeros(2, 3), torch.zeros(2))) == "(2×3, 2)"
    assert C.describe(["a", "b"]) == "2 strings"
    assert C.describe(torch.tensor(1.0)) == "scalar"


def test_trace_shapes_follows_the_forward_pass(setup):
    pol, batch = setup
    rows = {r["module"]: r for r in C.trace_shapes(pol, batch, generator=torch.Generator().manual_seed(0))}
    n_img = (32 // 16) ** 2
    assert rows["backbone.primary_encoder"]["output"] == f"2×{n_img}×32"
    assert rows["backbone.state_encoder"]["output"] == "2×1×32"
    assert rows["backbone"]["output"] == f"(2×{1 + 8 + 2 * n_img}×32, 2×{1 + 8 + 2 * n_img})"
    assert rows["action_model"]["output"] == "2×8×7"
    assert np.isfinite(float(rows["loss"]["output"]))
    # hooks are removed afterwards
    assert all(not m._forward_hooks for m in pol.modules())
    with pytest.raises(KeyError, match="no module"):
        C.trace_shapes(pol, batch, stages=[("backbone.nope", "")])


def test_freeze_report_leaves_policy_untouched(setup):
    pol, _ = setup
    rep = C.freeze_report(pol, ["backbone"])
    head = sum(p.numel() for p in pol.action_model.parameters())
    assert rep["trainable"] == head and rep["total"] == rep["trainable"] + rep["frozen"]
    assert 0 < rep["ratio %"] < 100
    assert all(p.requires_grad for p in pol.parameters())
    table = {r["module"]: r["parameters"] for r in C.parameter_table(pol)}
    assert table["backbone"] + table["action_model"] == rep["total"]


def test_euler_path_matches_sample(setup):
    pol, batch = setup
    pol.eval()
    ts, xs = C.euler_path(pol, batch, seed=3)
    assert ts.tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert xs.shape == (5, 2, 8, 7)
    ref = pol.sample(batch, torch.Generator().manual_seed(3)).numpy()
    np.testing.assert_allclose(xs[-1], ref, atol=1e-5)


def test_fit_action_head_lowers_loss_and_freezes_backbone(setup):
    pol, batch = setup
    before = [p.detach().clone() for p in pol.backbone.parameters()]
    losses = C.fit_action_head(pol, batch, steps=25, lr=3e-3)
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert all(torch.equal(a, b) for a, b in zip(before, pol.backbone.parameters()))
    assert not any(p.requires_grad for p in pol.backbone.parameters())
    assert "encode" not in vars(pol)  # the cached context is gone: encode is the method again


def test_time_scales_numbers():
    rows = C.time_scales(fps=20, horizon=8, denoise_steps=4)
    assert len(rows) == 4
    assert "t = 1, 0.75, 0.5, 0.25 -> 0" in rows[1]["per policy call"]
    assert "400 ms" in rows[2]["numbers"] and "250 ms" in rows[3]["numbers"]


def test_plot_euler_path(setup):
    import matplotlib

    matplotlib.use("Agg")
    ts = np.linspace(1, 0, 5)
    xs = np.zeros((5, 1, 8, 7))
    fig = C.plot_euler_path(ts, xs, target=np.zeros((1, 8, 7)))
    assert len([a for a in fig.axes if a.has_data()]) == 7
