"""Parity with LeRobot's own code path (issue 27, item 3).

A recording in our LeRobot v2.1 layout is converted to LeRobot's current format (v3.0) with LeRobot
0.4.4's own converter (``lerobot.datasets.v30.convert_dataset_v21_to_v30.convert_dataset``, on a
local folder, nothing from the Hub). Then, for the same frames (episode starts and ends included),
the batch our loader and adapter hand to LeRobot's ACT, Diffusion Policy and VQ-BeT
(``WindowDataset`` over ``model.training_source(open_dataset(...))``, then the adapter's
``_lerobot_batch`` + ``_training_batch``: exactly what ``loss`` passes to ``policy.forward``) must equal
what LeRobot's own training path builds: ``LeRobotDataset`` with the ``delta_timestamps`` of
``lerobot.datasets.factory.resolve_delta_timestamps`` (ImageNet statistics for the cameras, as
``make_dataset`` sets by default), torch's default collate, then the pre-processor of
``make_pre_post_processors`` with that dataset's own statistics. The same seeded ``policy.forward``
on both batches gives the same loss.

Then ``python -m tutorial_utils lerobot-train`` converts the recording itself and runs LeRobot's own
training loop (``lerobot.scripts.lerobot_train``) on it (a tiny ACT, 2 steps), and our server serves that
checkpoint, predicting what LeRobot's own policy predicts.

Needs LeRobot 0.4.4 with its dataset dependencies (HF ``datasets``) and a video decoder LeRobot can
use here (``torchcodec``; its ``pyav`` backend needs ``torchvision.io.VideoReader``, which the
installed torchvision no longer has)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import needs_lerobot

pytestmark = pytest.mark.slow

SIZE = 32  # the recording's size, so our loader does not resize (LeRobot's does not either)
LENGTHS = [6, 9, 5]
#: frames to compare: each episode's first, second and last frames and a middle one
FRAMES = [0, 1, 3, 5, 6, 7, 10, 14, 15, 16, 19]


def _requirements():
    needs_lerobot()
    for module, why in (
        ("datasets", "LeRobotDataset reads parquet through HF datasets"),
        ("torchcodec", "LeRobotDataset decodes the converted videos with torchcodec here"),
    ):
        pytest.importorskip(module, reason=f"{module} is not installed ({why}); see requirements-lerobot04.txt")
    from tutorial_utils.policies._torchvision import ensure_importable

    ensure_importable()


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """(our v2.1 recording, LeRobot's v3.0 conversion of a copy of it)."""
    _requirements()
    from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset

    from tutorial_utils.data.modality import build_modality
    from tutorial_utils.data.stats import compute_all
    from tutorial_utils.data.synth import generate_dataset

    tmp = tmp_path_factory.mktemp("parity")
    ours = generate_dataset(tmp / "ours", n_episodes=len(LENGTHS), lengths=LENGTHS, image_size=SIZE)
    build_modality(ours)  # what training needs beside the recording (the record job writes both)
    compute_all(ours)
    shutil.copytree(ours, tmp / "lerobot" / "synth")
    convert_dataset("synth", root=tmp / "lerobot", push_to_hub=False)  # local: no Hub download or push
    converted = tmp / "lerobot" / "synth"
    info = (converted / "meta" / "info.json").read_text()
    assert '"codebase_version": "v3.0"' in info
    return ours, converted


def _ours(model, ours) -> dict:
    from tutorial_utils.train.data import WindowDataset, collate, open_dataset

    source = model.training_source(open_dataset(ours, run_dir=None))
    ds = WindowDataset(source, np.arange(len(source)), model.action_horizon, model.image_size)
    batch = collate([ds[i] for i in FRAMES])
    return model._training_batch(model._lerobot_batch(batch, with_action=True))


def _lerobots(model, converted) -> dict:
    import torch
    from lerobot.datasets.factory import IMAGENET_STATS, resolve_delta_timestamps
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
    from lerobot.policies.factory import make_pre_post_processors

    meta = LeRobotDatasetMetadata("synth", root=converted)
    delta_timestamps = resolve_delta_timestamps(model.lerobot_config, meta)
    ds = LeRobotDataset("synth", root=converted, delta_timestamps=delta_timestamps, video_backend="torchcodec")
    for key in ds.meta.camera_keys:  # make_dataset's default (cfg.dataset.use_imagenet_stats)
        for stats_type, stats in IMAGENET_STATS.items():
            ds.meta.stats[key][stats_type] = torch.tensor(stats, dtype=torch.float32)
    batch = torch.utils.data.default_collate([ds[i] for i in FRAMES])
    pre, _post = make_pre_post_processors(model.lerobot_config, dataset_stats=ds.meta.stats)
    return pre(batch)


@pytest.mark.parametrize("name", ["act", "diffusion", "vqbet"])
def test_our_batch_is_lerobots_batch(name, recordings):
    import torch

    from helpers import LEROBOT_TINY as TINY
    from tutorial_utils import policies
    from tutorial_utils.train.data import open_dataset

    ours_root, converted = recordings
    config = {**TINY[name], "image_size": SIZE}
    model = policies.make(name, config, open_dataset(ours_root, run_dir=None).statistics)
    ours, theirs = _ours(model, ours_root), _lerobots(model, converted)

    # every feature the policy reads, and the masks of the windows
    cfg = model.lerobot_config
    needed = [*cfg.input_features, "action", "action_is_pad"]
    if cfg.n_obs_steps > 1:
        needed += [f"{k}_is_pad" for k in cfg.input_features]
    assert set(needed) <= set(ours), sorted(set(needed) - set(ours))
    for key in needed:
        a, b = ours[key], theirs[key]
        assert tuple(a.shape) == tuple(b.shape), (key, tuple(a.shape), tuple(b.shape))
        if a.dtype == torch.bool:
            assert torch.equal(a, b), key
        else:  # the same video frames, decoded by PyAV (ours) and torchcodec (LeRobot's)
            torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    assert list(ours["task"]) == list(theirs["task"])

    # so LeRobot's own forward gives the same loss on both (on two copies: VQ-BeT's forward fits its
    # residual VQ in place during phase 1)
    model.train()
    twin = copy.deepcopy(model.policy)
    torch.manual_seed(0)
    loss_ours, _ = model.policy.forward(dict(ours))
    torch.manual_seed(0)
    loss_theirs, _ = twin.forward(dict(theirs))
    torch.testing.assert_close(loss_ours, loss_theirs, rtol=1e-5, atol=1e-6)


# --- LeRobot's own training loop, served by our server ------------------------------------------------


def _served_equals_lerobots_own(served, pretrained: Path) -> None:
    """The chunk our served policy computes (and our websocket server sends) equals LeRobot's own
    ``from_pretrained`` policy with its own saved processors on the same observation."""
    import torch
    from lerobot.policies.act.modeling_act import ACTPolicy as LeRobotACT
    from lerobot.policies.factory import make_pre_post_processors

    from helpers import openpi_observation
    from tutorial_utils.data.libero_schema import action_to_env
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.server import ServerThread

    obs = openpi_observation(SIZE)
    got = served.infer(obs)["actions"]
    theirs = LeRobotACT.from_pretrained(pretrained).eval()
    pre, post = make_pre_post_processors(theirs.config, pretrained_path=str(pretrained))
    batch = {
        "observation.images.image": torch.from_numpy(obs["observation/image"]).permute(2, 0, 1)[None].float() / 255,
        "observation.images.wrist_image": torch.from_numpy(obs["observation/wrist_image"]).permute(2, 0, 1)[None]
        / 255.0,
        "observation.state": torch.from_numpy(obs["observation/state"])[None],
        "task": [obs["prompt"]],
    }
    with torch.no_grad():
        want = post(theirs.predict_action_chunk(pre(batch)))[0].numpy()
    assert got.shape == (8, 7) and served.metadata["replan_steps"] == 4
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # what our websocket server sends an openpi client (robosuite's gripper convention; compared inside
    # the environment's [-1, 1] range, which the server may clip to)
    with ServerThread(served) as srv, PolicyClient(port=srv.port, connect_timeout=5) as c:
        sent = np.clip(c.infer(obs)["actions"], -1, 1)
        np.testing.assert_allclose(sent, np.clip(action_to_env(want, "dataset"), -1, 1), rtol=0, atol=1e-5)


def test_lerobot_train_command_converts_trains_and_leaves_a_checkpoint_we_serve(recordings, tmp_path):
    """``python -m tutorial_utils lerobot-train``: our recording converted by LeRobot's converter, trained
    by LeRobot's own script (``lerobot.scripts.lerobot_train``, 2 steps of a tiny ACT) with our family's
    parameters; its ``pretrained_model``, loaded into our adapter (:func:`from_lerobot_pretrained`), is
    saved where our server and evaluate job read it, and served it computes what LeRobot's own policy
    computes."""
    from tutorial_utils import policies
    from tutorial_utils.errors import ConfigError
    from tutorial_utils.train import lerobot_loop

    ours_root, _converted = recordings
    tiny = {"image_size": SIZE, "chunk_size": 8, "n_action_steps": 4, "dim_model": 32, "n_heads": 2}
    tiny |= {"dim_feedforward": 64, "n_encoder_layers": 1, "n_vae_encoder_layers": 1, "latent_dim": 8}
    s = lerobot_loop.train(ours_root, tmp_path / "run", "act", steps=2, batch_size=2, config=tiny)
    assert s["steps"] == 2 and s["losses"] and s["losses"][-1][0] == 2  # LeRobot's own log lines, parsed
    assert "--policy.optimizer_lr_backbone=0.0001" in s["command"]  # one learning rate, ours, for every part
    served = policies.make_policy("act", checkpoint=str(tmp_path / "run" / "checkpoints" / "last"))
    assert served.name == "act" and served.metadata["image_size"] == SIZE
    _served_equals_lerobots_own(served, tmp_path / "run" / "lerobot" / "checkpoints" / "last" / "pretrained_model")
    # LeRobot does not resize: a model of another size trains on a copy at its size, holding the
    # pixels our trainer and server give that model
    from tutorial_utils.data.images import resize
    from tutorial_utils.data.reader import LeRobotDataset

    s = lerobot_loop.train(ours_root, tmp_path / "big", "act", steps=2, batch_size=2, config={**tiny, "image_size": 48})
    assert s["cameras"] == f"{SIZE}x{SIZE}, resized to 48x48 for LeRobot"
    assert (
        policies.make_policy("act", checkpoint=str(tmp_path / "big" / "checkpoints" / "last")).metadata["image_size"]
        == 48
    )
    copy = LeRobotDataset(tmp_path / "big" / "resized" / ours_root.name, verify_videos=False)
    ours = LeRobotDataset(ours_root, verify_videos=False)
    assert copy.num_episodes == ours.num_episodes and list(copy.lengths) == list(ours.lengths)
    key = ours.video_keys[0]
    diff = np.abs(copy.frame(1, key, 3).astype(int) - resize(ours.frame(1, key, 3), 48).astype(int)).mean()
    assert diff < 4, diff  # the same pixels, up to the video codec
    with pytest.raises(ConfigError, match="use_state=false"):
        lerobot_loop.train(ours_root, tmp_path / "other", "act", steps=2, config={**tiny, "use_state": False})
    with pytest.raises(ConfigError, match="state_dropout=0.5: LeRobot's script has no state dropout"):
        lerobot_loop.train(ours_root, tmp_path / "other", "act", steps=2, config={**tiny, "state_dropout": 0.5})
