"""LeRobot 0.4.4's ACT, Diffusion Policy and VQ-BeT through the policy seam
(tutorial_utils.policies.lerobot): each family, at a tiny size, is built from overrides, trained
through the project's trainer, saved, reloaded and served; the GPU-server families (SmolVLA, Pi0,
Pi0.5, Pi0-Fast, OpenVLA: their parameters and their teaching errors); plus the bad inputs of the
model zoo (issue 16) and both paths of the torchvision workaround (policies/_torchvision.py).

The tests that build a LeRobot model skip, saying why, where LeRobot is not installed
(``make setup`` installs requirements-lerobot04.txt); the configs, the registry errors and the
torchvision no-op path need neither LeRobot nor torchvision.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from helpers import LEROBOT_SIZE, LEROBOT_TINY, needs_lerobot, openpi_observation
from tutorial_utils import policies
from tutorial_utils.errors import ConfigError
from tutorial_utils.policies.base import CheckpointError, ObservationError, PolicyUnavailable
from tutorial_utils.policies.normalize import StatisticsError
from tutorial_utils.train.config import TrainConfig, parameters_table
from tutorial_utils.train.data import synthetic_source

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SIZE = LEROBOT_SIZE
TINY = LEROBOT_TINY
#: (action_horizon, served replan_steps) of each TINY config (Diffusion: horizon 8 from t - 1, with its
#: recipe's 2 observation frames, so 7 actions from the current frame on)
CHUNKS = {"act": (8, 4), "diffusion": (7, 4), "vqbet": (4, 4)}
#: each family's recipe history (LeRobot 0.4.4's n_obs_steps defaults), kept at the tiny sizes
N_OBS = {"act": 1, "diffusion": 2, "vqbet": 5}
RUN = {
    "steps": 2,
    "batch_size": 4,
    "num_workers": 0,
    "progress": False,
    "scheduler_warmup_steps": 0,
    "val_fraction": 0.25,
    "val_samples": 4,
    "log_freq": 1,
    "eval_freq": 0,
    "save_freq": 0,
    "augment_shift": 2,
    "optimizer_lr": 1e-3,
}
FAMILIES = sorted(TINY)


def observation(size: int = SIZE) -> dict:
    return openpi_observation(size)


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=4, length=10, image_size=SIZE)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, source):
    """One 2-step training run per family (through the project's trainer), shared by the tests."""
    needs_lerobot()
    from tutorial_utils.train.loop import train

    runs = {}

    def run(name: str):
        if name not in runs:
            out = tmp_path_factory.mktemp(f"run_{name}")
            cfg = TrainConfig.from_overrides({**RUN, **TINY[name], "policy": name, "output_dir": str(out)})
            runs[name] = (train(cfg, source=source), out / "checkpoints" / "last")
        return runs[name]

    return run


# --- each family end to end ----------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_family_trains_through_the_trainer_saves_reloads_and_serves(name, trained, source):
    from tutorial_utils.policies.lerobot import LeRobotPolicy

    res, last = trained(name)
    assert res.steps_done == 2 and res.summary["policy"] == name
    assert all(np.isfinite(loss) for _, loss in res.losses)
    assert (last / "model.safetensors").is_file() and json.loads((last / "config.json").read_text())["family"] == name

    model = policies.load(last)
    assert isinstance(model, LeRobotPolicy) and model.name == name
    horizon, replan = CHUNKS[name]
    assert model.action_horizon == horizon and model.image_size == SIZE
    assert model.n_obs_steps == N_OBS[name] == model.lerobot_config.n_obs_steps
    if name == "vqbet":  # phase 1 (the residual VQ) ran one step and is done; a resumed run knows it
        assert model._vqvae.optimized_steps == 1 and bool(model._vqvae.discretized)

    # the reloaded weights are the saved ones, and one observation gives one (H, 7) chunk in robot units
    again = policies.load(last)
    served = policies.make_policy(name, checkpoint=str(last))
    actions = served.infer(observation())["actions"]
    assert actions.shape == (horizon, 7) and actions.dtype == np.float32 and np.isfinite(actions).all()
    assert served.metadata["replan_steps"] == replan and served.metadata["action_horizon"] == horizon
    assert served.metadata["image_size"] == SIZE and served.metadata["n_obs_steps"] == N_OBS[name]
    batch = {
        "observation.images.image": observation()["observation/image"][None],
        "observation.images.wrist_image": observation()["observation/wrist_image"][None],
        "observation.state": observation()["observation/state"][None],
        "task": ["x"],
    }
    import torch

    a = model.predict(batch, generator=torch.Generator().manual_seed(3))
    b = again.predict(batch, generator=torch.Generator().manual_seed(3))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (1, horizon, 7)
    if N_OBS[name] > 1:
        # one frame is the history of an episode's first step (repeated, as LeRobot's select_action
        # fills its queues); a history of different frames predicts differently
        t = N_OBS[name]
        rep = {k: np.repeat(np.asarray(v)[:, None], t, 1) if k != "task" else v for k, v in batch.items()}
        np.testing.assert_array_equal(model.predict(rep, generator=torch.Generator().manual_seed(3)), a)
        hist = dict(rep)
        hist["observation.images.image"] = rep["observation.images.image"].copy()
        hist["observation.images.image"][:, 0] = 255 - hist["observation.images.image"][:, 0]
        hist["observation.state"] = rep["observation.state"].copy()
        hist["observation.state"][:, 0] += 1.0
        other = model.predict(hist, generator=torch.Generator().manual_seed(3))
        assert other.shape == a.shape and np.abs(other - a).max() > 0  # the earlier frames reach the model
        with pytest.raises(ObservationError, match=f"n_obs_steps={t}"):
            model.predict({**rep, "observation.state": rep["observation.state"][:, :1].repeat(t + 1, 1)})


def test_the_exported_lerobot_checkpoint_reloads_with_lerobot(trained, tmp_path):
    """``export_pretrained`` writes LeRobot's own layout; LeRobot's ``from_pretrained`` reads it offline."""
    needs_lerobot()
    import torch
    from lerobot.policies.act.modeling_act import ACTPolicy as LeRobotACT

    _res, last = trained("act")
    model = policies.load(last)
    out = model.export_pretrained(tmp_path / "pretrained")
    assert {"config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    theirs = LeRobotACT.from_pretrained(str(out))
    mine = model.policy.state_dict()
    for k, v in theirs.state_dict().items():
        assert torch.equal(v, mine[k]), k


# --- configs and the registry (no LeRobot needed) ------------------------------------------------


def test_families_are_registered_with_their_own_parameters():
    assert {"act", "diffusion", "vqbet"} <= set(policies.available())
    cfg = TrainConfig.from_overrides({"policy": "act", "chunk_size": "12", "policy.n_action_steps": 6, "steps": 3})
    assert cfg.policy_config.chunk_size == 12 and cfg.policy_config.action_horizon == 12
    cfg = TrainConfig.from_overrides({"policy": "diffusion", "horizon": 32, "num_inference_steps": 5})
    # the UNet denoises 32 actions from t - 1 (2 observation frames): 31 from the current frame on
    assert cfg.policy_config.action_horizon == 31 and cfg.policy_config.num_inference_steps == 5
    cfg = TrainConfig.from_overrides({"policy": "vqbet", "action_chunk_size": 6, "camera": "wrist_image"})
    assert cfg.policy_config.action_horizon == 6
    table = parameters_table("act")
    assert "chunk_size" in table and "vision_backbone" in table and "dim_model" in table


def test_unknown_family_is_refused_with_the_list():
    with pytest.raises(PolicyUnavailable, match=r"unknown policy 'actt'.*act.*diffusion.*vqbet"):
        policies.make("actt")
    with pytest.raises(ConfigError, match="policy='actt'"):
        TrainConfig.from_overrides({"policy": "actt"})


def test_a_family_specific_parameter_given_to_another_family_is_named():
    with pytest.raises(ConfigError, match="unknown parameter 'chunk_size'"):
        TrainConfig.from_overrides({"policy": "mini", "chunk_size": 10})
    with pytest.raises(ConfigError, match="unknown parameter 'chunk_size'"):
        policies.make("diffusion", {"chunk_size": 10})
    with pytest.raises(ConfigError, match="unknown parameter 'num_inference_steps'"):
        TrainConfig.from_overrides({"policy": "act", "num_inference_steps": 10})
    with pytest.raises(ConfigError, match="unknown parameter 'policy.horizon'"):
        TrainConfig.from_overrides({"policy": "vqbet", "policy.horizon": 16})


def test_config_checks_name_the_parameter():
    with pytest.raises(ConfigError, match="n_action_steps=20 must be <= chunk_size=16"):
        TrainConfig.from_overrides({"policy": "act", "n_action_steps": 20})
    with pytest.raises(ConfigError, match="n_obs_steps=2: LeRobot's ACT reads one observation frame"):
        TrainConfig.from_overrides({"policy": "act", "n_obs_steps": 2})
    with pytest.raises(ConfigError, match="n_obs_steps=0 must be >= 1"):
        TrainConfig.from_overrides({"policy": "vqbet", "n_obs_steps": 0})
    with pytest.raises(ConfigError, match="horizon=12 must be a multiple of 2\\*\\*len\\(down_dims\\)=8"):
        TrainConfig.from_overrides({"policy": "diffusion", "horizon": 12})
    with pytest.raises(ConfigError, match="camera='side'"):
        TrainConfig.from_overrides({"policy": "vqbet", "camera": "side"})


def test_statistics_are_converted_to_lerobots_layout_or_refused(source):
    from tutorial_utils.policies.lerobot import lerobot_stats

    stats = lerobot_stats(source.statistics, {"STATE": "MEAN_STD", "ACTION": "MIN_MAX"}, ("observation.images.image",))
    assert set(stats) == {"observation.state", "action", "observation.images.image"}
    np.testing.assert_allclose(stats["observation.state"]["mean"], source.statistics["franka"]["state"]["mean"])
    minmax_only = json.loads(json.dumps(source.statistics))
    minmax_only["franka"]["state"] = {k: minmax_only["franka"]["state"][k] for k in ("min", "max")}
    s = lerobot_stats(minmax_only, {"STATE": "MEAN_STD"}, ())["observation.state"]  # midpoint and half-range
    np.testing.assert_allclose(s["mean"], (s["min"] + s["max"]) / 2)
    assert stats["observation.images.image"]["mean"].shape == (3, 1, 1)
    no_state = {"franka": {"action": source.statistics["franka"]["action"]}}
    with pytest.raises(StatisticsError, match="franka.state is missing"):
        lerobot_stats(no_state, {}, ())
    no_minmax = json.loads(json.dumps(source.statistics))
    no_minmax["franka"]["action"] = {"mean": [0.0] * 7, "std": [1.0] * 7}
    with pytest.raises(StatisticsError, match=r"franka.action lacks \['min', 'max'\].*MIN_MAX"):
        lerobot_stats(no_minmax, {"ACTION": "MIN_MAX"}, ())
    wrong = json.loads(json.dumps(source.statistics))
    wrong["franka"]["action"]["min"] = [0.0] * 6
    with pytest.raises(StatisticsError, match=r"franka.action.min has shape \(6,\).*action is \(7,\)"):
        lerobot_stats(wrong, {}, ())


# --- bad input that needs a model -----------------------------------------------------------------


def test_a_checkpoint_whose_features_do_not_match_names_the_feature(trained, tmp_path):
    _res, last = trained("act")
    ck = tmp_path / "edited"
    shutil.copytree(last, ck)
    manifest = json.loads((ck / "config.json").read_text())
    manifest["policy"]["image_size"] = 64  # the weights were trained at 32
    (ck / "config.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"observation\.images\.image"):
        policies.load(ck)
    with pytest.raises(CheckpointError, match=r"feature observation\.images\.image: config.json says image_size=64"):
        policies.make_policy("act", checkpoint=str(ck))


def test_an_observation_of_another_size_names_the_feature(trained):
    _res, last = trained("diffusion")
    served = policies.make_policy("diffusion", checkpoint=str(last))
    with pytest.raises(ObservationError, match=r"feature observation\.images\.image.*\(3, 32, 32\)"):
        served.infer(observation(size=48))


def test_hub_weights_offline_say_which_weights_and_the_gpu_recipe(source, tmp_path, monkeypatch):
    needs_lerobot()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # an empty cache: nothing downloaded here
    overrides = {**TINY["act"], "pretrained_backbone_weights": "ResNet18_Weights.IMAGENET1K_V1"}
    with pytest.raises(PolicyUnavailable) as err:
        policies.make("act", overrides, source.statistics)
    msg = str(err.value)
    assert "ResNet18_Weights.IMAGENET1K_V1" in msg and "resnet18-" in msg and "offline" in msg
    assert "GPU server" in msg and "pretrained_backbone_weights=None" in msg and "policy=act" in msg
    with pytest.raises(ConfigError, match="not a torchvision weights name"):
        policies.make("act", {**TINY["act"], "pretrained_backbone_weights": "ImageNet"}, source.statistics)


# --- the torchvision workaround ------------------------------------------------------------------


def _python(code: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300, cwd=REPO
    )


def test_torchvision_workaround_applies_only_when_the_import_fails_that_way():
    """With the installed torchvision: ensure_importable() reports True exactly when a plain import
    fails on the missing op schemas (PyPI's CUDA wheel beside the CPU torch), and then imports."""
    needs_lerobot()
    probe = _python(
        """
        try:
            import torchvision
            print("plain-ok")
        except RuntimeError as exc:
            print("plain-failed" if "torchvision::" in str(exc) else f"other {exc}")
        """
    )
    plain = probe.stdout.strip().splitlines()[-1]
    assert plain in ("plain-ok", "plain-failed"), probe.stdout + probe.stderr
    fixed = _python(
        """
        from tutorial_utils.policies._torchvision import ensure_importable
        applied = ensure_importable()
        import torchvision.models
        torchvision.models.resnet18(weights=None)
        print(applied, ensure_importable())
        """
    )
    assert fixed.returncode == 0, fixed.stderr
    expected = "True True" if plain == "plain-failed" else "False False"
    assert fixed.stdout.strip().splitlines()[-1] == expected


def _fake_torchvision(root: Path, body: str) -> str:
    (root / "torchvision").mkdir(parents=True)
    (root / "torchvision" / "__init__.py").write_text(textwrap.dedent(body))
    return str(root)


def test_torchvision_workaround_does_nothing_where_torchvision_imports(tmp_path):
    path = _fake_torchvision(tmp_path, "__version__ = 'fine'\n")
    out = _python(
        """
        import torch
        from tutorial_utils.policies import _torchvision as tv
        print(tv.ensure_importable(), tv._FRAGMENT is None, torch._C._jit_get_schemas_for_operator("torchvision::nms"))
        """,
        pythonpath=path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False True []"


def test_torchvision_workaround_leaves_other_import_errors_alone(tmp_path):
    path = _fake_torchvision(tmp_path, "raise RuntimeError('some other failure')\n")
    out = _python(
        """
        from tutorial_utils.policies._torchvision import ensure_importable
        ensure_importable()
        """,
        pythonpath=path,
    )
    assert out.returncode != 0 and "some other failure" in out.stderr
    assert "even with" not in out.stderr


# --- the GPU-server families (SmolVLA, Pi0, Pi0.5, Pi0-Fast, OpenVLA) -------------------------------

#: what each family's error must name: its weights, and the command of its GPU-server path
GPU = {
    "smolvla": ("lerobot/smolvla_base", "lerobot-train --policy.path=lerobot/smolvla_base"),
    "pi0": ("gs://openpi-assets/checkpoints/pi0_base", "scripts/train.py pi0_libero"),
    "pi05": ("gs://openpi-assets/checkpoints/pi05_libero", "--policy.config=pi05_libero"),
    "pi0_fast": ("physical-intelligence/fast", "scripts/train.py pi0_fast_libero"),
    "openvla": ("openvla/openvla-7b-finetuned-libero-spatial", "vla-scripts/finetune.py"),
}


@pytest.mark.parametrize("name", sorted(GPU))
def test_gpu_server_families_list_their_parameters_and_explain_the_gpu_path(name, capsys):
    from tutorial_utils.train.cli import main

    assert name in policies.gpu_server() and name not in policies.trainable()
    weights, command = GPU[name]
    for build in (lambda: policies.make(name), lambda: policies.make_policy(name, checkpoint="runs/x/last")):
        with pytest.raises(PolicyUnavailable) as err:
            build()
        msg = str(err.value)
        assert f"policy {name!r}" in msg and weights in msg and command in msg
        assert "GPU memory:" in msg and "Licence:" in msg and "GB" in msg
        assert "python -m tutorial_utils eval --host <gpu-server>" in msg and "--protocol openpi" in msg
    # the parameters are job parameters: listed, typed, and refused for another family
    cfg = TrainConfig.from_overrides({"policy": name, "image_size": "256"})
    assert cfg.policy_config.image_size == 256
    assert main(["--list-params", f"policy={name}"]) == 0
    assert "policy.image_size" in capsys.readouterr().out


def test_every_family_lists_its_parameters_and_the_guides_names_are_there(capsys):
    from tutorial_utils.train.cli import main

    for name in policies.trainable() + policies.gpu_server():
        assert main(["--list-params", f"policy={name}"]) == 0, name
    out = capsys.readouterr().out
    for guide in ("max_input_seq_len", "max_decoding_steps", "freeze_vision_encoder", "latent_dim", "chunk_size"):
        assert guide in out, guide
    with pytest.raises(ConfigError, match="unknown parameter 'max_decoding_steps'"):
        TrainConfig.from_overrides({"policy": "smolvla", "max_decoding_steps": 10})
    with pytest.raises(ConfigError, match="unknown parameter 'hidden_dims'"):
        TrainConfig.from_overrides({"policy": "tdmpc", "hidden_dims": "64,64"})


def test_smolvla_message_says_why_it_cannot_be_built_offline_here():
    """The Hub VLM: its weights, why not here (huggingface_hub), and the stand-in smoke test that does run here
    (tests/test_policies_smolvla.py runs it)."""
    msg = str(_smolvla_error())
    assert "HuggingFaceTB/SmolVLM2-500M-Video-Instruct" in msg and "huggingface_hub" in msg
    assert "python -m tutorial_utils zoo smolvla-smoke" in msg


def _smolvla_error() -> PolicyUnavailable:
    with pytest.raises(PolicyUnavailable) as err:
        policies.make("smolvla", {"chunk_size": 10, "n_action_steps": 10})
    return err.value


def test_read_only_arrays_become_tensors_without_a_warning():
    """Decoded video frames come read-only; torch warns on them (a raw UserWarning on chapter 9)."""
    import warnings

    import torch

    from tutorial_utils.policies.lerobot import _as_tensor

    frames = np.arange(24, dtype=np.uint8).reshape(1, 2, 4, 3)
    frames.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = _as_tensor(frames)
        flipped = _as_tensor(np.arange(6.0)[::-1], np.float32)
    assert x.dtype == torch.uint8 and x.tolist() == frames.tolist()
    assert flipped.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    same = torch.zeros(2)
    assert _as_tensor(same) is same


def test_vqbet_trains_with_lerobots_parameter_groups_and_recipe():
    """LeRobot's groups: every trainable parameter in exactly one, the VQ-VAE at its own rate (kept by
    a resume that changes optimizer_lr), biases and norms without weight decay; LeRobot's Adam preset."""
    needs_lerobot()
    import torch

    from tutorial_utils.train.config import family_recipe
    from tutorial_utils.train.resume import apply_changes
    from tutorial_utils.train.schedule import scheduler

    cfg = TrainConfig.from_overrides({**RUN, **TINY["vqbet"], "policy": "vqbet", "policy.optimizer_vqvae_lr": 2e-3})
    model = policies.make(
        "vqbet", cfg.policy_config, synthetic_source(n_episodes=2, length=10, image_size=SIZE).statistics
    )
    groups = model.parameter_groups(cfg)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters() if p.requires_grad}
    (vq,) = [g for g in groups if g.get("own_lr")]
    assert vq["lr"] == 2e-3 and vq["weight_decay"] == 1e-4
    assert any(g.get("weight_decay") == 0.0 for g in groups)
    recipe = family_recipe("vqbet", "cpu")
    assert recipe["optimizer_betas"] == (0.95, 0.999) and recipe["optimizer_weight_decay"] == 1e-6
    assert recipe["optimizer_grad_clip_norm"] == 10.0 and recipe["scheduler_decay_lr"] == 0.0

    opt = model.optimizer(cfg)
    sched = scheduler(opt, cfg)
    changed = TrainConfig.from_overrides({**RUN, **TINY["vqbet"], "policy": "vqbet", "optimizer_lr": 5e-4})
    apply_changes({"optimizer_lr"}, changed, opt, sched)
    rates = {bool(g.get("own_lr")): g["initial_lr"] for g in opt.param_groups}
    assert rates == {True: 2e-3, False: 5e-4}  # the VQ-VAE keeps its own rate
    assert isinstance(opt, torch.optim.Optimizer)


# --- the camera probe (evaluate.latent) -----------------------------------------------------------------


def test_the_keypoint_summary_tells_a_saturated_attention_from_a_moving_one():
    from tutorial_utils.evaluate.latent import LatentProbeError, keypoints_summary

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 8, 4))  # 50 frames, 8 keypoints, a 2x2 map
    flat = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    kp = rng.normal(scale=0.1, size=(50, 16))
    s = keypoints_summary(flat, kp, np.abs(kp))
    assert s["cells"] == 4 and s["attention_peak_if_flat"] == 0.25 and s["attention_peak"] < 0.7
    assert s["keypoint_spread"] > 0.05 and s["dead_features"] == 0.0
    saturated = np.zeros((50, 8, 4))
    saturated[:, :, 1] = 1.0  # every keypoint on one cell, whatever the frame
    features = np.zeros((50, 16))
    features[:, :4] = 0.3  # four units carry a constant, the rest are dead
    c = keypoints_summary(saturated, np.full((50, 16), 0.5), features)
    assert c["attention_peak"] == 1.0 and c["keypoint_spread"] == 0.0 and c["feature_spread"] == 0.0
    assert c["dead_features"] == 0.75
    with pytest.raises(LatentProbeError, match="need"):
        keypoints_summary(flat[:1], kp[:1], kp[:1])


@pytest.mark.parametrize("name", ["diffusion", "vqbet"])
def test_the_camera_probe_opens_each_cameras_encoder_on_the_training_frames(name, trained, source):
    from tutorial_utils import policies
    from tutorial_utils.evaluate.latent import keypoints_summary, probe_cameras

    _, checkpoint = trained(name)
    model = policies.load(checkpoint)
    got = probe_cameras(model, model.training_source(source), [0, 3, 7, 12, 18, 25], batch_size=4)
    assert set(got) == set(model.cameras)  # Diffusion: both cameras, VQ-BeT: its one
    for p in got.values():
        k = model.cfg.spatial_softmax_num_keypoints
        assert p["attention"].shape[:2] == (6, k) and p["keypoints"].shape == (6, 2 * k)
        assert np.allclose(p["attention"].sum(-1), 1.0, atol=1e-5)
        s = keypoints_summary(**p)
        assert s["cells"] == max(1, SIZE // 32) ** 2  # a ResNet's last map: one cell per 32 pixels
        assert 1.0 / s["cells"] <= s["attention_peak"] <= 1.0 and s["feature_spread"] >= 0.0


def test_the_probe_refuses_a_family_without_a_camera_encoder_with_the_ones_it_opens(trained):
    from tutorial_utils import policies
    from tutorial_utils.evaluate.latent import LatentProbeError, probe

    _, checkpoint = trained("act")
    assert policies.load(checkpoint).camera_encoders() == {}  # ACT reads its ResNet with a transformer
    with pytest.raises(LatentProbeError, match="'diffusion', 'vqbet'"):
        probe(checkpoint, "no-dataset-needed")


def test_camera_probes_of_several_checkpoints_read_as_one_table_and_figure():
    from tutorial_utils.evaluate.latent import LatentProbeError, camera_figure, camera_table

    def doc(trained_spread: float, cams=("image",)) -> dict:
        rows = []
        for state, spread, peak in (("trained", trained_spread, 0.99), ("untrained", 0.04, 0.4)):
            for cam in cams:
                rows.append(
                    {
                        "label": f"{state}, {cam}",
                        "cells": 4,
                        "attention_peak": peak,
                        "keypoint_spread": spread,
                        "feature_spread": 0.01,
                        "dead_features": 0.5,
                    }
                )
        return {"kind": "camera_probe", "frames": 40, "training": {"steps": 1483}, "results": rows}

    docs = {"vqbet, one task": doc(0.0004), "diffusion, ten tasks": doc(0.16, ("image", "wrist_image"))}
    t = camera_table(docs)
    # a one-camera model is named by its label, each camera of a two-camera one by label and camera
    assert list(t.index) == ["vqbet, one task", "diffusion, ten tasks, image", "diffusion, ten tasks, wrist_image"]
    assert t.loc["vqbet, one task", "keypoints move (x untrained)"] == 0.01
    assert (
        t.loc["diffusion, ten tasks, image", "keypoints move (x untrained)"] == 4.0
        and t.loc["vqbet, one task", "steps"] == 1483
    )
    fig = camera_figure(docs)
    assert [x.get_text() for x in fig.axes[0].get_yticklabels()][0] == "vqbet, one task"
    with pytest.raises(LatentProbeError, match="not a camera probe"):
        camera_table({"tdmpc": {"kind": "latent_probe", "results": []}})


def test_a_probe_series_follows_one_runs_checkpoints_by_their_step(trained, tmp_path, monkeypatch):
    from tutorial_utils.data.modality import build_modality
    from tutorial_utils.data.stats import compute_all
    from tutorial_utils.data.synth import generate_dataset
    from tutorial_utils.evaluate.latent import LatentProbeError, probe_series, series_figure, series_table

    _, last = trained("vqbet")
    (step,) = sorted(last.parent.glob("step_*"))
    data = generate_dataset(tmp_path / "demo", n_episodes=3, mean_length=12, image_size=SIZE, n_tasks=1)
    build_modality(data)
    compute_all(data)
    from tutorial_utils import policies

    made, make = [], policies.make
    monkeypatch.setattr(policies, "make", lambda *a, **k: made.append(a[0]) or make(*a, **k))
    doc = probe_series([last, step], data, every=3)
    assert doc["kind"] == "probe_series" and doc["family"] == "vqbet"
    assert made == ["vqbet"]  # one run's untrained twin is built and probed once, for the first checkpoint
    untrained = [[r for r in d["results"] if r["label"].startswith("untrained")] for d in doc["probes"]]
    assert untrained[0] and untrained[0] == untrained[1]
    assert doc["first_phase_steps"] == TINY["vqbet"]["n_vqvae_training_steps"]  # VQ-BeT's VQ-VAE phase
    assert [d["checkpoint_step"] for d in doc["probes"]] == [RUN["steps"]] * 2
    t = series_table(doc)
    assert list(t.index.names) == ["step", "model"] and "attention_peak" in t and len(t) == 2
    fig = series_figure(doc)
    assert len(fig.axes) == 2 and fig.axes[1].get_yscale() == "log"
    with pytest.raises(LatentProbeError, match="two checkpoints"):
        probe_series([last], data)
    with pytest.raises(LatentProbeError, match="camera probes"):
        series_figure({"probes": [{"kind": "latent_probe"}]})


def test_vqbet_can_standardise_its_images_as_diffusion_policy_does(source):
    needs_lerobot()
    import torch

    from tutorial_utils.policies.lerobot import VQBeTConfig
    from tutorial_utils.train.data import WindowDataset, collate, random_shift

    with pytest.raises(ConfigError, match="image_normalization='imagenet': use one of identity, mean_std"):
        VQBeTConfig(**TINY["vqbet"], image_normalization="imagenet").check()
    seen = {}
    for mode in ("identity", "mean_std"):
        model = policies.make("vqbet", {**TINY["vqbet"], "image_normalization": mode}, source.statistics)
        data = WindowDataset(model.training_source(source), np.arange(4), model.cfg.action_horizon, SIZE)
        batch = random_shift(collate([data[i] for i in range(4)]), 0, torch.Generator())
        assert model.lerobot_config.normalization_mapping["VISUAL"].name == mode.upper()
        seen[mode] = model._lerobot_batch(batch, with_action=False)[model.lerobot_key(model.cameras[0])]
        assert (
            model.lerobot_kwargs_applied().get("normalization_mapping", {"VISUAL": "IDENTITY"})["VISUAL"]
            == mode.upper()
        )
    assert 0.0 <= float(seen["identity"].min()) and float(seen["identity"].max()) <= 1.0  # pixels in [0, 1]
    assert float(seen["mean_std"].min()) < -1.0  # ImageNet's mean and std: dark pixels well below 0


def test_vqbet_blind_to_its_state_gets_a_constant_state_and_its_actions_cannot_follow_the_arm(source):
    """``use_state`` off: LeRobot's VQ-BeT still has its state input (it requires one) but receives
    the same state whatever the arm does, in training batches and served requests alike."""
    needs_lerobot()
    import torch

    from tutorial_utils.train.data import WindowDataset, collate, random_shift

    torch.manual_seed(0)
    blind = policies.make("vqbet", {**TINY["vqbet"], "use_state": False}, source.statistics)
    torch.manual_seed(0)
    seeing = policies.make("vqbet", {**TINY["vqbet"]}, source.statistics)
    assert blind.uses_state and "use_state" not in blind.cfg.lerobot_kwargs()  # LeRobot's model reads a state
    data = WindowDataset(blind.training_source(source), np.arange(4), blind.cfg.action_horizon, SIZE)
    batch = random_shift(collate([data[i] for i in range(4)]), 0, torch.Generator())
    other = {**batch, "observation.state": batch["observation.state"] + 1.0}
    state = "observation.state"
    assert torch.equal(blind._lerobot_batch(batch, False)[state], blind._lerobot_batch(other, False)[state])
    assert not torch.equal(seeing._lerobot_batch(batch, False)[state], seeing._lerobot_batch(other, False)[state])


def test_state_dropout_hides_the_state_of_some_training_samples_only(source):
    """``state_dropout``: in training, that share of the samples get the blind constant of
    ``use_state`` off (drawn from the step's generator, so a resumed step repeats); evaluation and
    serving always see the state."""
    needs_lerobot()
    import torch

    from tutorial_utils.policies.lerobot import VQBeTConfig
    from tutorial_utils.train.data import WindowDataset, collate, random_shift

    with pytest.raises(ConfigError, match=r"state_dropout=1.0 must be in \[0, 1\)"):
        VQBeTConfig(**TINY["vqbet"], state_dropout=1.0).check()
    with pytest.raises(ConfigError, match="with use_state=false: a blind policy has no state"):
        VQBeTConfig(**TINY["vqbet"], use_state=False, state_dropout=0.5).check()
    blind = policies.make("vqbet", {**TINY["vqbet"], "use_state": False}, source.statistics)
    model = policies.make("vqbet", {**TINY["vqbet"], "state_dropout": 0.5}, source.statistics)
    assert "state_dropout" not in model.cfg.lerobot_kwargs()
    data = WindowDataset(model.training_source(source), np.arange(8), model.cfg.action_horizon, SIZE)
    batch = random_shift(collate([data[i] for i in range(8)]), 0, torch.Generator())
    model.train()
    hide = model._state_dropout(batch, torch.Generator().manual_seed(3))
    assert torch.equal(hide, model._state_dropout(batch, torch.Generator().manual_seed(3)))  # repeatable
    assert 0 < int(hide.sum()) < len(hide)
    state = "observation.state"
    got = model._lerobot_batch(batch, True, hide_state=hide)[state]
    shown = model._lerobot_batch(batch, True)[state]
    dark = blind._lerobot_batch(batch, True)[state]
    assert torch.equal(got[hide], dark[hide]) and torch.equal(got[~hide], shown[~hide])
    assert not torch.equal(got[hide], shown[hide])
    model.eval()
    assert model._state_dropout(batch, torch.Generator()) is None  # evaluation and serving see the state
    model.train()
    assert torch.isfinite(model.loss(batch, torch.Generator().manual_seed(1))["total_loss"])
    unchanged = policies.make("vqbet", {**TINY["vqbet"]}, source.statistics)
    unchanged.train()
    assert unchanged._state_dropout(batch, torch.Generator()) is None  # default 0: the state always there
