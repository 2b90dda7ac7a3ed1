"""LeRobot 0.4.4's own ACT, Diffusion Policy and VQ-BeT behind the policy seam (TD-MPC and SAC, on
the same adapter, are in ``policies/lerobot_rl.py``), and the families that need a GPU server
(Pi0, Pi0.5, Pi0-Fast, OpenVLA, and SmolVLA's recipe: each class's ``gpu_recipe``, the ``*_RECIPE`` constants at the end of this module;
SmolVLA's adapter and its local stand-in are ``policies/smolvla.py``).

Each family here is a thin :class:`~tutorial_utils.policies.trainable.TrainablePolicy` around the
real LeRobot policy (``make_policy_config`` -> ``get_policy_class(name)(cfg)``), so the project's
trainer, checkpoints, policy server and LIBERO client drive LeRobot's implementation, not a copy:

- features come from our dataset schema, channel-first (LeRobot only turns an image channel-first
  when its last axis is named ``"channels"``; our datasets, like IPEC's, say ``"rgb"``):
  ``observation.images.image`` and ``observation.images.wrist_image`` (VISUAL, (3, S, S) at
  ``image_size``), ``observation.state`` (STATE, (8,)), ``action`` (ACTION, (7,));
- normalisation is LeRobot's own pre/post-processor pipeline
  (``make_pre_post_processors(cfg, dataset_stats=...)``) fed from our ``dataset_statistics.json``
  (:func:`lerobot_stats`), with ImageNet mean/std for the cameras, as LeRobot's training does by
  default (``dataset.use_imagenet_stats``);
- ``loss(batch)`` is ``policy.forward(pre(batch))``: our batches already use LeRobot's key names,
  the adapter only turns uint8 HWC images into float CHW in [0, 1];
- ``predict(batch)`` is ``policy.predict_action_chunk`` + the post-processor: (B, H, 7) actions
  in robot units, H = :attr:`action_horizon` (the chunk the data windows train on). The
  family's ``n_action_steps`` (how many actions LeRobot's ``select_action`` executes before it
  asks again) becomes the served policy's ``replan_steps``;
- checkpoints are the seam's (safetensors of this wrapper's state_dict + config.json +
  dataset_statistics.json); :meth:`LeRobotPolicy.export_pretrained` also writes LeRobot's own
  ``save_pretrained`` layout for LeRobot's tools.

Everything runs offline: ``pretrained_backbone_weights`` stays None (backbones learn from scratch)
unless torchvision's weights file is already in the torch hub cache.

Observation history is each family's recipe (LeRobot's ``n_obs_steps`` default): ACT 1, Diffusion
Policy 2, VQ-BeT 5. The training windows are LeRobot's: :meth:`LeRobotPolicy.training_source` reads
the family's own ``observation_delta_indices`` / ``action_delta_indices`` from LeRobot's config
(Diffusion with 2 frames: observations at t-1, t and actions t-1 .. t+14), clamped into the episode
with ``*_is_pad`` masks as ``LeRobotDataset`` does. ``predict`` takes (B, T, ...) histories (or one
frame, repeated as ``select_action`` does at an episode's start) and returns the chunk from the
current frame on; the served policy keeps the episode's history
(:class:`~tutorial_utils.policies.trainable.ServedModel`).

LeRobot is imported only when a model is built (``pip install --no-deps -r
requirements-lerobot04.txt``, done by ``make setup``), so listing the families and their parameters
works without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from tutorial_utils.errors import ConfigError
from tutorial_utils.params import param
from tutorial_utils.policies.base import (
    BATCH_ACTION,
    BATCH_ACTION_IS_PAD,
    BATCH_IMAGE,
    BATCH_STATE,
    BATCH_TASK,
    BATCH_WRIST,
    PAD_SUFFIX,
    STATE_DIM,
    CheckpointError,
    ObservationError,
    PolicyUnavailable,
)
from tutorial_utils.policies.normalize import EMBODIMENT, STATS_FILE, StatisticsError
from tutorial_utils.policies.trainable import TrainablePolicy

ACTION_DIM = 7
LEROBOT_VERSION = "0.4.4"  # what requirements-lerobot04.txt pins and this adapter was written against
#: LeRobot's ImageNet statistics (``lerobot.datasets.factory.IMAGENET_STATS``), per channel
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CAMERA_NAMES = {"image": BATCH_IMAGE, "wrist_image": BATCH_WRIST}
INSTALL_HINT = (
    f"LeRobot {LEROBOT_VERSION} is not installed in this environment: run `make setup` (it installs "
    "requirements-lerobot04.txt with `pip install --no-deps -r requirements-lerobot04.txt`)."
)

_RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


# --- configs: the guide's parameters, CPU-sized defaults ------------------------------------------
# Sizes were chosen for a 2-core CPU (benchmarks/bench_zoo.py measures them): 64 px cameras
# (a quarter of the ResNet-18 cost of 128 px; mini trains at 64 px too, so the zoo compares at
# one resolution), a chunk of 16 executed 8 at a time (the same replanning cadence as mini's
# 8-step chunks), a few transformer/UNet/GPT layers instead of LeRobot's GPU defaults. Every
# default can be raised on a GPU server with the same parameter.


# the book's own knobs on a LeRobot family, which LeRobot's config does not have (kept out of lerobot_kwargs)
_OURS = ("image_size", "use_state", "state_dropout")
_STATE_DROPOUT_HELP = (
    "share of training samples whose state is replaced by the blind constant of use_state=false (0: none). "
    "The policy learns to act from its cameras on those samples and still gets its state when served"
)


def _check_common(cfg: Any) -> None:
    if cfg.image_size < 32:
        raise ConfigError(
            f"image_size={cfg.image_size} must be >= 32: the ResNet backbone downsamples by 32 (32 px leaves "
            "a 1x1 feature map)"
        )
    if cfg.n_obs_steps < 1:
        raise ConfigError(f"n_obs_steps={cfg.n_obs_steps} must be >= 1 (the current frame and the ones before it)")
    if cfg.vision_backbone not in _RESNETS:
        raise ConfigError(f"vision_backbone={cfg.vision_backbone!r}: LeRobot uses torchvision ResNets: {_RESNETS}")
    drop = getattr(cfg, "state_dropout", 0.0)
    if not 0.0 <= drop < 1.0:
        raise ConfigError(
            f"state_dropout={drop} must be in [0, 1): the share of training samples whose state is hidden "
            "(1 would be use_state=false)"
        )
    if drop and not getattr(cfg, "use_state", True):
        raise ConfigError(
            f"state_dropout={drop} with use_state=false: a blind policy has no state to drop; set one of them"
        )


@dataclass
class ACTConfig:
    """ACT (Action Chunking with Transformers): a ResNet + transformer encoder-decoder (CVAE)."""

    image_size: int = param(64, "camera images are resized to this square size (>= 32; GPU: 128-224)", "model")
    chunk_size: int = param(
        16,
        "actions predicted per chunk, the training window (guide: 10-50; LeRobot: 100 at 50 Hz). "
        "LIBERO runs at 20 Hz, so 16 is 0.8 s",
        "model",
    )
    n_action_steps: int = param(
        8,
        "actions of each chunk executed before predicting again, the served replan_steps (<= chunk_size; "
        "guide and LeRobot: usually = chunk_size). Half the chunk reacts faster, as mini's 8 do",
        "model",
    )
    n_obs_steps: int = param(
        1, "observation frames per sample (guide: 1 in most cases; LeRobot's ACT supports only 1)", "model"
    )
    vision_backbone: str = param(
        "resnet18",
        "torchvision ResNet that encodes each camera (guide: resnet18/34/50/101/152; resnet18 on a CPU)",
        "model",
    )
    pretrained_backbone_weights: str | None = param(
        None,
        "torchvision weights for the backbone, e.g. ResNet18_Weights.IMAGENET1K_V1 (LeRobot's default; "
        "downloaded, so only where the file is cached or online). None: learn from scratch (offline)",
        "model",
    )
    dim_model: int = param(
        256, "transformer hidden size (guide and LeRobot: 512; 256 on a CPU). Must be a multiple of n_heads", "model"
    )
    n_heads: int = param(8, "attention heads of each transformer layer (guide and LeRobot: 8)", "model")
    dim_feedforward: int = param(1024, "feed-forward width of each transformer layer (LeRobot: 3200)", "model")
    n_encoder_layers: int = param(2, "transformer encoder layers (LeRobot: 4)", "model")
    n_decoder_layers: int = param(
        1, "transformer decoder layers (LeRobot: 1, what the original ACT's 7 effectively used)", "model"
    )
    use_vae: bool = param(True, "train with the CVAE objective (ACT's latent style variable)", "model")
    latent_dim: int = param(32, "CVAE latent size (LeRobot: 32)", "model")
    n_vae_encoder_layers: int = param(2, "layers of the CVAE encoder, used only while training (LeRobot: 4)", "model")
    kl_weight: float = param(10.0, "weight of the KL term of the CVAE loss (LeRobot: 10)", "model")
    dropout: float = param(0.1, "dropout in the transformer layers", "model")
    use_state: bool = param(
        True,
        "feed the robot state (eef pose, gripper) to the model as well as the cameras (LeRobot: yes when the "
        "dataset has it). False: cameras only, so the policy cannot steer by its own arm pose alone",
        "model",
    )
    state_dropout: float = param(0.0, _STATE_DROPOUT_HELP, "model")

    @property
    def action_horizon(self) -> int:
        return self.chunk_size

    def check(self) -> None:
        _check_common(self)
        for name in ("chunk_size", "n_action_steps", "dim_model", "n_heads", "dim_feedforward", "latent_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_action_steps > self.chunk_size:
            raise ConfigError(f"n_action_steps={self.n_action_steps} must be <= chunk_size={self.chunk_size}")
        if self.dim_model % self.n_heads:
            raise ConfigError(f"n_heads={self.n_heads} must divide dim_model={self.dim_model}")
        if self.n_obs_steps != 1:
            raise ConfigError(
                f"n_obs_steps={self.n_obs_steps}: LeRobot's ACT reads one observation frame (its config refuses "
                "more); use n_obs_steps=1, or Diffusion (2) / VQ-BeT (5) for observation history."
            )

    def lerobot_kwargs(self) -> dict:
        return _same_names(self, skip=_OURS)


def _same_names(cfg: Any, skip: tuple[str, ...]) -> dict:
    """The fields that are LeRobot's own parameters, under the same names (all but ``skip``)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in skip}


def _crop_shape(cfg: Any) -> tuple[int, int] | None:
    if cfg.crop_ratio >= 1.0:
        return None
    side = max(1, int(round(cfg.image_size * cfg.crop_ratio)))
    return (side, side)


def _as_tensor(value, dtype=None):
    """``value`` as a torch tensor. A read-only NumPy array (a decoded video frame, a memory-mapped
    column) is copied first: torch cannot share it and warns (a UserWarning on the page)."""
    if isinstance(value, torch.Tensor):
        return value
    arr = np.asarray(value, dtype=dtype)
    if not arr.flags.writeable or any(step < 0 for step in arr.strides):
        arr = arr.copy()
    return torch.as_tensor(arr)


@dataclass
class DiffusionConfig:
    """Diffusion Policy: a ResNet + spatial-softmax encoder conditioning a 1-D UNet that denoises a chunk."""

    #: fields added after checkpoints were written, and the value those checkpoints were trained with
    written_before: ClassVar[dict[str, Any]] = {"prediction_type": "epsilon"}

    image_size: int = param(64, "camera images are resized to this square size (>= 32; the paper: 84-96)", "model")
    horizon: int = param(
        16,
        "actions denoised per chunk, the training window (guide and LeRobot: 16; a multiple of 2**len(down_dims))",
        "model",
    )
    n_action_steps: int = param(
        8, "actions of each chunk executed before predicting again (the served replan_steps; LeRobot: 8)", "model"
    )
    n_obs_steps: int = param(
        2,
        "observation frames per sample, the current one and those before it, one step apart (LeRobot: 2)",
        "model",
    )
    num_inference_steps: int = param(
        10,
        "denoising steps per chunk at inference, one UNet pass each (guide: 10; LeRobot's DDPM "
        "default runs all num_train_timesteps; DDIM makes 10 of 100 work with prediction_type=sample, while an "
        "undertrained epsilon model needs more)",
        "model",
    )
    noise_scheduler_type: str = param(
        "DDIM", "DDPM or DDIM (DDIM can skip steps at inference; LeRobot's default is DDPM)", "model"
    )
    num_train_timesteps: int = param(100, "diffusion steps of the noise schedule (LeRobot: 100)", "model")
    prediction_type: str = param(
        "sample",
        "what the UNet learns to predict: sample (the clean action chunk; the CPU default) or epsilon (the noise; "
        "LeRobot's and the paper's default, which after a few thousand CPU steps and 10 DDIM steps gives chunks "
        "that differ from each other as much as from the truth: validation error 0.346 in the comparison)",
        "model",
    )
    vision_backbone: str = param("resnet18", "torchvision ResNet that encodes the cameras", "model")
    pretrained_backbone_weights: str | None = param(
        None, "torchvision weights for the backbone (None: learn from scratch, offline; LeRobot: None)", "model"
    )
    down_dims: list[int] = param(
        [64, 128, 256],
        "UNet widths per level (LeRobot: 512,1024,2048 = 267M parameters, about 12 s/step on one CPU core)",
        "model",
    )
    diffusion_step_embed_dim: int = param(64, "size of the timestep embedding (LeRobot: 128)", "model")
    kernel_size: int = param(5, "UNet convolution kernel size (LeRobot: 5)", "model")
    n_groups: int = param(8, "group-norm groups in the UNet (must divide every down_dims entry)", "model")
    spatial_softmax_num_keypoints: int = param(
        32, "keypoints per camera from the spatial softmax (LeRobot: 32)", "model"
    )
    crop_ratio: float = param(
        1.0,
        "random crop (centre crop at inference) to this fraction of image_size; 1.0: no crop "
        "(the trainer's augment_shift already shifts images)",
        "model",
    )

    @property
    def action_horizon(self) -> int:
        # the UNet denoises ``horizon`` actions from t - n_obs_steps + 1 (LeRobot's action_delta_indices);
        # the chunk predicted from the current frame on is the rest
        return self.horizon - self.n_obs_steps + 1

    def check(self) -> None:
        _check_common(self)
        if self.noise_scheduler_type not in ("DDPM", "DDIM"):
            raise ConfigError(f"noise_scheduler_type={self.noise_scheduler_type!r}: use DDPM or DDIM")
        if self.prediction_type not in ("epsilon", "sample"):
            raise ConfigError(f"prediction_type={self.prediction_type!r}: use epsilon or sample")
        if not self.down_dims or any(d < 1 for d in self.down_dims):
            raise ConfigError(f"down_dims={self.down_dims} must be positive widths, e.g. 64,128,256")
        factor = 2 ** len(self.down_dims)
        if self.horizon < factor or self.horizon % factor:
            raise ConfigError(
                f"horizon={self.horizon} must be a multiple of 2**len(down_dims)={factor} (the UNet halves it per level)"
            )
        if not 1 <= self.n_action_steps <= self.horizon - self.n_obs_steps + 1:
            raise ConfigError(
                f"n_action_steps={self.n_action_steps} must be in 1..horizon-n_obs_steps+1={self.horizon - self.n_obs_steps + 1}"
            )
        if not 1 <= self.num_inference_steps <= self.num_train_timesteps:
            raise ConfigError(
                f"num_inference_steps={self.num_inference_steps} must be in 1..num_train_timesteps={self.num_train_timesteps}"
            )
        if any(d % self.n_groups for d in self.down_dims):
            raise ConfigError(f"n_groups={self.n_groups} must divide every down_dims entry {self.down_dims}")
        if not 0.0 < self.crop_ratio <= 1.0:
            raise ConfigError(f"crop_ratio={self.crop_ratio} must be in (0, 1]")

    def lerobot_kwargs(self) -> dict:
        return {
            **_same_names(self, skip=("image_size", "crop_ratio")),
            "down_dims": tuple(self.down_dims),
            "crop_shape": _crop_shape(self),
            # LeRobot's formula (horizon - n_action_steps - n_obs_steps + 1), for its own dataset sampler
            "drop_n_last_frames": max(0, self.horizon - self.n_action_steps - self.n_obs_steps + 1),
        }


#: VQ-BeT's ``image_normalization`` values (LeRobot's NormalizationMode names, lower case)
IMAGE_NORMALIZATIONS = ("identity", "mean_std")


@dataclass
class VQBeTConfig:
    """VQ-BeT: a residual VQ-VAE turns action chunks into codes (phase 1), then a GPT predicts
    codes and offsets from the image and state (phase 2). LeRobot's VQ-BeT sees one camera."""

    image_size: int = param(64, "camera images are resized to this square size (>= 32; LeRobot: 96, crop 84)", "model")
    camera: str = param("image", "the one camera VQ-BeT sees: image (agent view) or wrist_image", "model")
    action_chunk_size: int = param(
        8,
        "actions per chunk, one VQ code each (the training window and the served replan_steps; LeRobot: 5)",
        "model",
    )
    n_obs_steps: int = param(
        5,
        "observation frames per sample, the current one and those before it, one step apart (LeRobot: 5)",
        "model",
    )
    n_vqvae_training_steps: int = param(
        500,
        "phase 1: the first N training steps fit only the residual VQ-VAE on action chunks (cheap, no images), "
        "then the GPT trains; about 10-20% of steps (LeRobot: 20000 of 200k)",
        "model",
    )
    optimizer_vqvae_lr: float = param(
        1e-3, "learning rate of the action VQ-VAE, its own parameter group (LeRobot: 1e-3)", "model"
    )
    optimizer_vqvae_weight_decay: float = param(1e-4, "weight decay of the action VQ-VAE (LeRobot: 1e-4)", "model")
    vqvae_n_embed: int = param(16, "codes per residual VQ layer (LeRobot: 16)", "model")
    vqvae_embedding_dim: int = param(128, "VQ code size (LeRobot: 256)", "model")
    vqvae_enc_hidden_dim: int = param(128, "hidden width of the VQ-VAE encoder/decoder (LeRobot: 128)", "model")
    gpt_n_layer: int = param(4, "GPT layers (LeRobot: 8)", "model")
    gpt_n_head: int = param(4, "GPT attention heads (must divide gpt_hidden_dim; LeRobot: 8)", "model")
    gpt_hidden_dim: int = param(256, "GPT width; also its input and output size here (LeRobot: 512)", "model")
    vision_backbone: str = param("resnet18", "torchvision ResNet that encodes the camera", "model")
    pretrained_backbone_weights: str | None = param(
        None, "torchvision weights for the backbone (None: learn from scratch, offline; LeRobot: None)", "model"
    )
    spatial_softmax_num_keypoints: int = param(32, "keypoints from the spatial softmax (LeRobot: 32)", "model")
    crop_ratio: float = param(
        1.0,
        "random crop (centre crop at inference) to this fraction of image_size; 1.0: no crop "
        "(LeRobot: 84/96; the trainer's augment_shift already shifts images)",
        "model",
    )
    offset_loss_weight: float = param(
        10000.0, "weight of the offset loss against the code losses (LeRobot: 10000)", "model"
    )
    bet_softmax_temperature: float = param(0.1, "sampling temperature of the code head (LeRobot: 0.1)", "model")
    dropout: float = param(0.1, "dropout in the GPT", "model")
    image_normalization: str = param(
        "identity",
        "how camera pixels reach the encoder: identity (in [0, 1]; LeRobot's VQ-BeT) or mean_std (standardised "
        "with ImageNet's per-channel mean and std, as LeRobot's Diffusion Policy does)",
        "model",
    )
    use_state: bool = param(
        True,
        "feed the robot state to the model as well as the camera. False: LeRobot's VQ-BeT, which requires a state "
        "input, gets the same state (zeros, then normalised) in training and when served, so the policy cannot "
        "steer by its own arm pose alone",
        "model",
    )
    state_dropout: float = param(0.0, _STATE_DROPOUT_HELP, "model")

    @property
    def action_horizon(self) -> int:
        # LeRobot's window is n_obs_steps - 1 past actions then n_action_pred_token + action_chunk_size - 1
        # from the current step; the adapter predicts one token (n_action_pred_token=1), so the chunk that
        # predict_action_chunk returns is the window's last action_chunk_size actions
        return self.action_chunk_size

    def check(self) -> None:
        _check_common(self)
        if self.camera not in CAMERA_NAMES:
            raise ConfigError(f"camera={self.camera!r}: use one of {', '.join(CAMERA_NAMES)}")
        for name in ("action_chunk_size", "vqvae_n_embed", "vqvae_embedding_dim", "gpt_n_layer", "gpt_hidden_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_vqvae_training_steps < 0:
            raise ConfigError(f"n_vqvae_training_steps={self.n_vqvae_training_steps} must be >= 0")
        if self.gpt_hidden_dim % self.gpt_n_head:
            raise ConfigError(f"gpt_n_head={self.gpt_n_head} must divide gpt_hidden_dim={self.gpt_hidden_dim}")
        if not 0.0 < self.crop_ratio <= 1.0:
            raise ConfigError(f"crop_ratio={self.crop_ratio} must be in (0, 1]")
        if self.image_normalization not in IMAGE_NORMALIZATIONS:
            raise ConfigError(
                f"image_normalization={self.image_normalization!r}: use one of {', '.join(IMAGE_NORMALIZATIONS)}"
            )

    def lerobot_kwargs(self) -> dict:
        out = {
            **_same_names(self, skip=(*_OURS, "camera", "crop_ratio", "image_normalization")),
            "n_action_pred_token": 1,  # see action_horizon
            "gpt_input_dim": self.gpt_hidden_dim,
            "gpt_output_dim": self.gpt_hidden_dim,
            "crop_shape": _crop_shape(self),
        }
        if self.image_normalization != "identity":  # LeRobot's default mapping otherwise
            from lerobot.configs.types import NormalizationMode

            out["normalization_mapping"] = {
                "VISUAL": NormalizationMode[self.image_normalization.upper()],
                "STATE": NormalizationMode.MIN_MAX,
                "ACTION": NormalizationMode.MIN_MAX,
            }
        return out


# --- statistics ------------------------------------------------------------------------------------


def lerobot_stats(
    statistics: Mapping[str, Any], norm_modes: Mapping[str, str], cameras: tuple[str, ...]
) -> dict[str, dict[str, torch.Tensor]]:
    """Our ``dataset_statistics.json`` -> LeRobot's per-feature ``{"mean","std","min","max"}`` tensors.

    ``franka.state`` becomes ``observation.state``, ``franka.action`` ``action``; each camera gets
    ImageNet's mean/std (shape (3, 1, 1)) and min 0 / max 1, as LeRobot's training uses by default.
    Statistics with only min/max (older files, the synthetic source) get mean = midpoint and
    std = half-range, which is exactly the min-max scaling to [-1, 1]. ``norm_modes`` maps a
    feature type (``"STATE"``, ``"ACTION"``) to LeRobot's normalisation mode, so a mode whose
    statistics are missing is refused here, naming the key.
    """
    block = statistics.get(EMBODIMENT) if isinstance(statistics, Mapping) else None
    if not isinstance(block, Mapping):
        found = sorted(statistics) if isinstance(statistics, Mapping) else type(statistics).__name__
        raise StatisticsError(
            f"{STATS_FILE}: expected a {EMBODIMENT!r} block with 'state' and 'action' statistics (found {found}). "
            "Create it with `python -m tutorial_utils dataset stats DIR`."
        )
    out: dict[str, dict[str, torch.Tensor]] = {}
    for ours, feature, dim, kind in (
        ("state", BATCH_STATE, STATE_DIM, "STATE"),
        ("action", BATCH_ACTION, ACTION_DIM, "ACTION"),
    ):
        s = block.get(ours)
        if not isinstance(s, Mapping):
            raise StatisticsError(
                f"{STATS_FILE}: {EMBODIMENT}.{ours} is missing; LeRobot normalises {feature} with it. "
                "Recompute the statistics with `python -m tutorial_utils dataset stats DIR`."
            )
        d = {k: np.asarray(s[k], dtype=np.float32) for k in ("mean", "std", "min", "max") if k in s}
        for k, v in d.items():
            if v.shape != (dim,):
                raise StatisticsError(
                    f"{STATS_FILE}: {EMBODIMENT}.{ours}.{k} has shape {v.shape}; the feature {feature} is ({dim},). "
                    "These statistics belong to another dataset layout."
                )
        if "min" in d and "max" in d:
            d.setdefault("mean", (d["min"] + d["max"]) / 2)
            d.setdefault("std", (d["max"] - d["min"]) / 2)
        mode = str(norm_modes.get(kind, "IDENTITY")).upper()
        need = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max")}.get(mode, ())
        missing = [k for k in need if k not in d]
        if missing:
            raise StatisticsError(
                f"{STATS_FILE}: {EMBODIMENT}.{ours} lacks {missing}, which LeRobot's {mode} normalisation of "
                f"{feature} needs. Recompute the statistics with `python -m tutorial_utils dataset stats DIR`."
            )
        out[feature] = {k: torch.from_numpy(v) for k, v in d.items()}
    for cam in cameras:
        out[cam] = {
            "mean": torch.tensor(IMAGENET_MEAN, dtype=torch.float32).view(3, 1, 1),
            "std": torch.tensor(IMAGENET_STD, dtype=torch.float32).view(3, 1, 1),
            "min": torch.zeros(3, 1, 1),
            "max": torch.ones(3, 1, 1),
        }
    return out


# --- offline rules ---------------------------------------------------------------------------------


def check_backbone_weights(family: str, weights: str | None) -> None:
    """Refuse, before LeRobot tries to download them, backbone weights that are not cached here."""
    if weights is None:
        return
    from tutorial_utils.policies._torchvision import ensure_importable

    ensure_importable()
    import torchvision

    try:
        entry = torchvision.models.get_weight(weights)
    except (ValueError, KeyError, AttributeError):
        raise ConfigError(
            f"pretrained_backbone_weights={weights!r} is not a torchvision weights name "
            "(e.g. ResNet18_Weights.IMAGENET1K_V1), or None to learn the backbone from scratch."
        ) from None
    filename = Path(str(entry.url).rsplit("/", 1)[-1])
    cached = Path(torch.hub.get_dir()) / "checkpoints" / filename
    if cached.is_file():
        return
    raise PolicyUnavailable(
        f"policy {family!r}: pretrained_backbone_weights={weights!r} asks for torchvision's ImageNet weights "
        f"({filename}), which LeRobot would download while it builds the backbone; this project builds offline "
        f"and the file is not in the torch hub cache ({cached}). Here: leave pretrained_backbone_weights=None (the "
        "CPU default; the backbone learns from scratch), or copy that file into the cache. On a GPU server "
        "with internet: `make setup` (or `pip install -r requirements.txt` and `pip install --no-deps -r "
        "requirements-lerobot04.txt`), then `python -m tutorial_utils train policy="
        f"{family} pretrained_backbone_weights={weights} device=cuda dataset=<your dataset>` (the first build "
        "downloads the file into the cache; the checkpoint then holds the weights)."
    )


def _feature_record(features: Mapping[str, tuple[int, ...]]) -> nn.Module:
    """Empty buffers whose shapes are the features the weights were trained on, at state_dict paths
    named after them (``lerobot_features.observation.images.image`` is (0, 3, S, S)): a checkpoint
    of another shape fails to load naming the feature, and costs no bytes."""
    root = nn.Module()
    for name, shape in features.items():
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if not hasattr(m, part):
                m.add_module(part, nn.Module())
            m = getattr(m, part)
        m.register_buffer(leaf, torch.empty((0, *shape)))
    return root


# --- the adapter -----------------------------------------------------------------------------------


class LeRobotPolicy(nn.Module, TrainablePolicy):
    """The shared adapter; a family sets :attr:`name`, :attr:`config_class` and :attr:`lerobot_type`."""

    #: LeRobot's policy type (``make_policy_config`` / ``get_policy_class``)
    lerobot_type: ClassVar[str] = ""

    def __init__(self, cfg: Any = None, statistics: Mapping[str, Any] | None = None):
        super().__init__()
        self.cfg = cfg or self.config_class()
        self.cfg.check()
        self.statistics: dict = dict(statistics) if statistics is not None else {}
        check_backbone_weights(self.name, getattr(self.cfg, "pretrained_backbone_weights", None))
        try:
            from tutorial_utils.policies._torchvision import ensure_importable

            ensure_importable()
            from lerobot.configs.types import FeatureType, PolicyFeature
            from lerobot.policies.factory import get_policy_class, make_policy_config
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in ("lerobot", "torchvision"):
                raise PolicyUnavailable(f"policy {self.name!r}: {INSTALL_HINT} ({exc})") from None
            raise
        s = self.cfg.image_size
        self.features = {cam: (3, s, s) for cam in self.cameras}
        if self.uses_state:
            self.features[BATCH_STATE] = (STATE_DIM,)
        self.features[BATCH_ACTION] = (ACTION_DIM,)
        # registered before the policy, so a checkpoint of other features names them first
        self.lerobot_features = _feature_record(self.features)
        inputs = {self.lerobot_key(cam): PolicyFeature(FeatureType.VISUAL, (3, s, s)) for cam in self.cameras}
        if self.uses_state:
            inputs[BATCH_STATE] = PolicyFeature(FeatureType.STATE, (STATE_DIM,))
        outputs = {BATCH_ACTION: PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))}
        self.lerobot_config = make_policy_config(
            self.lerobot_type,
            input_features=inputs,
            output_features=outputs,
            device="cpu",
            push_to_hub=False,
            **self.cfg.lerobot_kwargs(),
        )
        self.policy = get_policy_class(self.lerobot_type)(self.lerobot_config)
        self._processors: tuple | None = None
        self._processor_device: str | None = None

    # -- what the seam reads
    @property
    def cameras(self) -> tuple[str, ...]:
        return (BATCH_IMAGE, BATCH_WRIST)

    @property
    def uses_state(self) -> bool:
        """Whether LeRobot's model reads ``observation.state`` (a family's ``use_state``; default yes).
        Without it the state still travels in the batch (the seam's requests carry it), unread."""
        return bool(getattr(self.cfg, "use_state", True))

    def lerobot_key(self, camera: str) -> str:
        """The name LeRobot's policy reads ``camera`` under (the same name, except TD-MPC's one image)."""
        return camera

    @property
    def replan_steps(self) -> int:
        return int(self.cfg.n_action_steps)

    @property
    def observation_delta_indices(self) -> list[int]:
        """Frame offsets of the observations in a training window: LeRobot's own
        ``observation_delta_indices`` of this config (None there means the current frame)."""
        return list(self.lerobot_config.observation_delta_indices or [0])

    @property
    def action_delta_indices(self) -> list[int]:
        """Frame offsets of the actions in a training window (LeRobot's ``action_delta_indices``);
        the predicted chunk is its last :attr:`action_horizon` actions."""
        return list(self.lerobot_config.action_delta_indices)

    def training_source(self, source: Any):
        """The windows this family trains on: LeRobot's ``delta_timestamps`` windows when they are more
        than the current frame and the next ``action_horizon`` actions, else ``source`` unchanged."""
        from tutorial_utils.policies.trainable import TimeWindows

        obs, act = self.observation_delta_indices, self.action_delta_indices
        if obs == [0] and act == list(range(self.action_horizon)):
            return source
        return TimeWindows(source, obs, act)

    def serving_policy(self, checkpoint: str = "", replan_steps: int | None = None, **kwargs: Any):
        """The seam's served model; ``replan_steps`` defaults to the family's ``n_action_steps``
        (what LeRobot's ``select_action`` executes of each chunk)."""
        return super().serving_policy(checkpoint=checkpoint, replan_steps=replan_steps or self.replan_steps, **kwargs)

    # -- LeRobot's processors, built for the device the weights are on
    def processors(self) -> tuple:
        """LeRobot's (preprocessor, postprocessor) with our statistics (rebuilt when the model moves)."""
        if not self.statistics:
            raise StatisticsError(
                f"the {self.name!r} policy has no dataset statistics; build it with "
                f"policies.make({self.name!r}, config, statistics) or load a checkpoint (it holds {STATS_FILE})."
            )
        device = str(next(self.policy.parameters()).device)
        if self._processors is None or self._processor_device != device:
            from lerobot.policies.factory import make_pre_post_processors

            modes = {str(k): getattr(v, "name", str(v)) for k, v in self.lerobot_config.normalization_mapping.items()}
            self.lerobot_config.device = device
            stats = lerobot_stats(self.statistics, modes, tuple(self.lerobot_key(c) for c in self.cameras))
            self._processors = make_pre_post_processors(self.lerobot_config, dataset_stats=stats)
            self._processor_device = device
        return self._processors

    def _lerobot_batch(
        self, batch: Mapping[str, Any], with_action: bool, hide_state: torch.Tensor | None = None
    ) -> dict:
        """Our batch (LeRobot's key names; uint8 HWC or float CHW images) -> LeRobot's input, normalised.
        ``hide_state`` (B booleans): the samples whose state becomes the blind constant (``state_dropout``)."""
        out: dict[str, Any] = {}
        s = self.cfg.image_size
        t = self.n_obs_steps
        for cam in self.cameras:
            if cam not in batch:
                raise ObservationError(
                    f"the batch has no {cam}; {self.name} reads the cameras {', '.join(self.cameras)}"
                )
            x = _as_tensor(batch[cam])
            if x.ndim not in (4, 5):
                raise ObservationError(
                    f"feature {cam}: expected (B, H, W, 3) or (B, T, H, W, 3) images, got {tuple(x.shape)}"
                )
            if x.shape[-1] == 3 and x.shape[-3] != 3:
                x = x.movedim(-1, -3)  # (..., H, W, 3) -> (..., 3, H, W)
            if x.dtype == torch.uint8:
                x = x.float() / 255.0  # uint8 -> float in [0, 1]
            if tuple(x.shape[-3:]) != (3, s, s):
                raise ObservationError(
                    f"feature {cam}: got images of shape {tuple(x.shape[-3:])} (channel-first), the {self.name!r} "
                    f"model was built for (3, {s}, {s}) (image_size={s}). Resize the cameras to {s}x{s}."
                )
            out[self.lerobot_key(cam)] = self._frames(x.float(), cam, t)
        state = _as_tensor(batch[BATCH_STATE], np.float32)
        if state.ndim not in (2, 3) or state.shape[-1] != STATE_DIM:
            raise ObservationError(
                f"feature {BATCH_STATE}: expected (B, {STATE_DIM}) or (B, T, {STATE_DIM}), got {tuple(state.shape)}"
            )
        if not getattr(self.cfg, "use_state", True):  # blind to the arm's pose: a constant state (VQ-BeT)
            state = torch.zeros_like(state)
        elif hide_state is not None:  # state dropout: those samples see what a blind policy sees
            hide = hide_state.to(state.device).reshape(-1, *([1] * (state.ndim - 1)))
            state = torch.where(hide, torch.zeros_like(state), state)
        out[BATCH_STATE] = self._frames(state, BATCH_STATE, t)
        for key in (*self.cameras, BATCH_STATE):  # LeRobot's dataset masks; its processors pass them through
            pad = batch.get(key + PAD_SUFFIX)
            if pad is not None and t > 1:
                out[self.lerobot_key(key) + PAD_SUFFIX] = torch.as_tensor(np.asarray(pad, dtype=bool))
        if with_action:
            out[BATCH_ACTION] = _as_tensor(batch[BATCH_ACTION], np.float32)
            pad = batch.get(BATCH_ACTION_IS_PAD)
            out[BATCH_ACTION_IS_PAD] = (
                torch.as_tensor(np.asarray(pad, dtype=bool))
                if pad is not None
                else torch.zeros(out[BATCH_ACTION].shape[:2], dtype=torch.bool)
            )
        tasks = batch.get(BATCH_TASK)
        out[BATCH_TASK] = list(tasks) if tasks is not None else [""] * len(state)
        pre, _post = self.processors()
        return pre(out)

    def _frames(self, x: torch.Tensor, key: str, t: int) -> torch.Tensor:
        """A feature with the time axis the model reads: (B, ...) for one frame (n_obs_steps=1); with
        history (B, T, ...), one frame given being repeated T times, as LeRobot's ``select_action``
        fills its queues at an episode's first step."""
        frame_ndim = 1 if key == BATCH_STATE else 3
        if x.ndim == frame_ndim + 2:
            if t == 1 and x.shape[1] == 1:
                return x[:, 0]
            if x.shape[1] != t:
                raise ObservationError(
                    f"feature {key}: got {x.shape[1]} observation frames, the {self.name!r} model reads "
                    f"n_obs_steps={t}. Give (B, {t}, ...) or one frame (B, ...)."
                )
            return x
        return x if t == 1 else x.unsqueeze(1).expand(-1, t, *x.shape[1:]).contiguous()

    @contextlib.contextmanager
    def _seeded(self, generator) -> Iterator[None]:
        """LeRobot draws noise, dropout and VAE samples from torch's global generator; with a
        ``generator`` (the trainer's per-step one, the server's per-call one) they are drawn from a
        seed taken from it, so a resumed run and a served call repeat exactly."""
        if generator is None:
            yield
            return
        seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
        dev = next(self.policy.parameters()).device
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            yield

    # -- the seam
    def forward(self, batch: Mapping[str, Any], generator=None) -> dict:
        return self.loss(batch, generator)

    def loss(self, batch: Mapping[str, Any], generator=None) -> dict:
        lb = self._training_batch(
            self._lerobot_batch(batch, with_action=True, hide_state=self._state_dropout(batch, generator))
        )
        with self._seeded(generator):
            loss, parts = self.policy.forward(lb)
        out = {"total_loss": loss}
        for k, v in (parts or {}).items():
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                out[k] = v.detach().float().reshape(())
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = torch.tensor(float(v), device=loss.device)  # LeRobot logs floats; the trainer reduces tensors
        return out

    def _training_batch(self, lb: dict) -> dict:
        return lb

    def _state_dropout(self, batch: Mapping[str, Any], generator) -> torch.Tensor | None:
        """Which samples of a training batch hide their state (``state_dropout`` of them, drawn from the
        step's generator so a resumed run repeats); None when nothing is hidden (evaluation, or 0)."""
        p = float(getattr(self.cfg, "state_dropout", 0.0))
        if not self.training or p <= 0.0:
            return None
        n = len(batch[BATCH_STATE])
        device = generator.device if generator is not None else None  # a generator draws on its own device
        return torch.rand(n, generator=generator, device=device) < p

    @torch.no_grad()
    def predict(self, batch: Mapping[str, Any], generator=None) -> np.ndarray:
        was_training = self.training
        self.eval()
        try:
            lb = self._lerobot_batch(batch, with_action=False)
            with self._seeded(generator):
                chunk = self._predict_chunk(lb)
            _pre, post = self.processors()
            actions = post(chunk)
        finally:
            self.train(was_training)
        return actions.detach().float().cpu().numpy().astype(np.float32)

    def _predict_chunk(self, lb: dict) -> torch.Tensor:
        return self.policy.predict_action_chunk(lb)

    # -- checkpoints: the seam's format; LeRobot's as an extra export
    def camera_encoders(self) -> dict[str, nn.Module]:
        """The spatial-softmax image encoder each camera goes through (LeRobot's ``rgb_encoder`` of
        Diffusion Policy and VQ-BeT: a ResNet, a 1x1 convolution to keypoint maps, a softmax over
        each map's cells, the expected (x, y) of each, a linear layer and a ReLU); empty for a family
        without one (ACT reads its ResNet's features with a transformer)."""
        inner = getattr(self.policy, "diffusion", None) or getattr(self.policy, "vqbet", None)
        enc = getattr(inner, "rgb_encoder", None)
        if enc is None:
            return {}
        if isinstance(enc, nn.ModuleList):
            return dict(zip(self.cameras, enc, strict=True))
        return {cam: enc for cam in self.cameras}

    @torch.no_grad()
    def probe_cameras(self, batch: Mapping[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
        """Each camera's encoder opened on ``batch``'s current frames, as at serving (centre crop):
        ``attention`` (B, K, cells), the softmax of each keypoint map; ``keypoints`` (B, 2K), their
        expected positions in [-1, 1]; ``features`` (B, D), what the encoder hands on;
        ``feature_map`` (H, W), the cells of the ResNet's last map."""
        lb = self._lerobot_batch(batch, with_action=False)
        out = {}
        for cam, enc in self.camera_encoders().items():
            x = lb[self.lerobot_key(cam)]
            x = x[:, -1] if x.ndim == 5 else x  # the current frame of a history
            if getattr(enc, "resize", None) is not None:
                x = enc.resize(x)
            if enc.do_crop:
                x = enc.center_crop(x)
            fmap = enc.backbone(x)
            logits = enc.pool.nets(fmap) if enc.pool.nets is not None else fmap
            keypoints = enc.pool(fmap).flatten(1)
            out[cam] = {
                "attention": torch.softmax(logits.flatten(2), dim=-1),
                "keypoints": keypoints,
                "features": enc.relu(enc.out(keypoints)),
                "feature_map": torch.tensor(fmap.shape[-2:]),
            }
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        theirs = {k: tuple(v.shape[1:]) for k, v in state_dict.items() if k.startswith("lerobot_features.")}
        for name, shape in self.features.items():
            got = theirs.get(f"lerobot_features.{name}")
            if got is not None and got != tuple(shape):
                raise CheckpointError(
                    f"feature {name}: the weights were trained on {got}, this {self.name!r} model is built for "
                    f"{tuple(shape)} (image_size={self.cfg.image_size}). Load the checkpoint with the config it "
                    "was written with (config.json), or retrain for the new size."
                )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @classmethod
    def load(cls, directory, device: str = "cpu"):
        """Like the seam's ``load``, after checking that config.json's features match the weights'
        (naming the feature that differs)."""
        check_checkpoint_features(directory)
        return super().load(directory, device=device)

    def lerobot_kwargs_applied(self) -> dict:
        """The LeRobot config parameters this model was built with, as ``config.json`` writes them."""
        out = {}
        for k in self.cfg.lerobot_kwargs():
            v = getattr(self.lerobot_config, k, None)
            if isinstance(v, Mapping):  # normalization_mapping: enum values by name
                v = {str(a): getattr(b, "name", b) for a, b in v.items()}
            out[k] = list(v) if isinstance(v, tuple) else v
        return out

    def export_pretrained(self, directory) -> Path:
        """Also write LeRobot's own layout (``policy.save_pretrained`` + its processors) into
        ``directory``, for LeRobot's tools (``lerobot-eval --policy.path=...``)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.policy.save_pretrained(d)
        pre, post = self.processors()
        pre.save_pretrained(d)
        post.save_pretrained(d)
        return d


def check_checkpoint_features(directory) -> None:
    """Raise :class:`CheckpointError` naming the feature when a checkpoint's config.json asks for
    other features than its weights were trained on (e.g. an edited ``image_size``)."""
    from safetensors import safe_open

    from tutorial_utils.policies import family
    from tutorial_utils.policies.checkpoint import CONFIG_FILE, WEIGHTS_FILE, read_checkpoint_config

    d = Path(directory)
    manifest = read_checkpoint_config(d)
    cls = family(manifest["family"])
    if not issubclass(cls, LeRobotPolicy) or not (d / WEIGHTS_FILE).is_file():
        return
    cfg = manifest.get("policy", {})
    size = cfg.get("image_size")
    try:
        with safe_open(str(d / WEIGHTS_FILE), "pt") as fh:
            shapes = {k: tuple(fh.get_slice(k).get_shape()[1:]) for k in fh.keys() if k.startswith("lerobot_features.")}
    except Exception:  # noqa: BLE001 - a corrupted file is reported by the seam's loader, with its fix
        return
    for key, shape in shapes.items():
        name = key[len("lerobot_features.") :]
        if len(shape) == 3 and isinstance(size, int) and shape != (3, size, size):
            raise CheckpointError(
                f"{d / CONFIG_FILE}: feature {name}: config.json says image_size={size} (3, {size}, {size}), "
                f"the weights in {WEIGHTS_FILE} were trained on {shape}. Restore image_size={shape[-1]} in "
                "config.json, or retrain for the new size."
            )


def from_lerobot_pretrained(directory, statistics: Mapping[str, Any], family: str | None = None) -> LeRobotPolicy:
    """A policy trained by LeRobot's own training loop (``lerobot-train``), as this project's model.

    ``directory`` is LeRobot's ``checkpoints/<step>/pretrained_model`` (its ``config.json`` and
    ``model.safetensors``); ``statistics`` our ``dataset_statistics.json`` of the recording it was
    trained on (the converted recording's statistics are the same numbers:
    ``tests/test_train_lerobot_parity.py``). The weights load into the family's adapter with the same
    parameters, so ``save`` writes a checkpoint our server serves (``serve --policy act --checkpoint
    ...``). Refuses, naming the parameter, a LeRobot config our family cannot express."""
    import json

    from safetensors.torch import load_file

    from tutorial_utils.policies import family as family_class

    d = Path(directory)
    theirs = json.loads((d / "config.json").read_text())
    name = family or str(theirs.get("type", ""))
    cls = family_class(name)
    if not issubclass(cls, LeRobotPolicy) or cls.lerobot_type != theirs.get("type"):
        raise CheckpointError(f"{d / 'config.json'}: type {theirs.get('type')!r} is not the {name!r} family's")
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    cfg = {k: v for k, v in theirs.items() if k in fields}
    shapes = [tuple(f["shape"]) for f in (theirs.get("input_features") or {}).values() if f.get("type") == "VISUAL"]
    if not shapes:
        raise CheckpointError(f"{d / 'config.json'}: no VISUAL input feature; this project's families read cameras")
    shape = shapes[0]
    cfg["image_size"] = int(shape[1] if shape[0] == 3 else shape[0])  # (3, S, S), or (S, S, 3) from "rgb" names
    if "use_state" in fields:  # LeRobot reads the state when its config lists it as an input
        cfg["use_state"] = BATCH_STATE in (theirs.get("input_features") or {})
    if isinstance(cfg.get("down_dims"), list):
        cfg["down_dims"] = [int(x) for x in cfg["down_dims"]]
    if "crop_shape" in theirs and "crop_ratio" in fields:
        crop = theirs["crop_shape"]
        cfg["crop_ratio"] = 1.0 if crop is None else float(crop[0]) / cfg["image_size"]
    model = cls.build(cfg, statistics)
    missing = [k for k, v in model.lerobot_kwargs_applied().items() if theirs.get(k, v) != v]
    if missing:
        raise CheckpointError(
            f"{d / 'config.json'}: {', '.join(missing)} differ from what the {name!r} family builds; it cannot serve "
            "these weights as they were trained"
        )
    model.policy.load_state_dict(load_file(str(d / "model.safetensors")))
    return model.eval()


class ACTPolicy(LeRobotPolicy):
    """LeRobot's ACT (``lerobot.policies.act``): both cameras, the chunk is ``chunk_size`` long."""

    name = "act"
    config_class = ACTConfig
    lerobot_type = "act"
    catalog = {
        "group": "imitation learning",
        "scenario": "learn a task from expert demonstrations (sorting objects)",
        "here": "trained on the recorded demonstrations, served, evaluated in LIBERO (the comparison below)",
    }
    comparison = True
    #: LeRobot's recipe for ACT (its AdamW preset: 1e-4 from scratch, ACT's 1e-5 being for a pretrained
    #: backbone; clipping 10, betas 0.9/0.999, weight decay 1e-4, a constant learning rate; no image
    #: shifts), which the train job, the zoo and the sweep train it with unless given other values. With
    #: DiT4DiT's recipe ACT learned to steer by its state and failed every episode of chapter 9's positive
    #: control; with this one it succeeds (logs/act_recipe_eval_*)
    train_defaults = {
        "optimizer_lr": 1e-4,
        "optimizer_weight_decay": 1e-4,
        "optimizer_grad_clip_norm": 10.0,
        "optimizer_betas": (0.9, 0.999),
        "scheduler_warmup_steps": 0,
        "scheduler_decay_lr": 1e-4,
        "augment_shift": 0,
    }


class DiffusionPolicy(LeRobotPolicy):
    """LeRobot's Diffusion Policy (``lerobot.policies.diffusion``): both cameras, one shared ResNet."""

    name = "diffusion"
    config_class = DiffusionConfig
    lerobot_type = "diffusion"
    catalog = {
        "group": "policy learning",
        "scenario": "precise multi-step manipulation (assembly), several ways to do a move",
        "here": "trained on the recorded demonstrations, served, evaluated in LIBERO (the comparison below)",
    }
    comparison = True
    #: LeRobot's learning rate for it from scratch; the rest of the book's recipe (train.config.RECIPE)
    train_defaults = {"optimizer_lr": 1e-4}

    def _training_batch(self, lb: dict) -> dict:
        return _with_time_axis(lb, (BATCH_STATE, *self.cameras))

    def _predict_chunk(self, lb: dict) -> torch.Tensor:
        # LeRobot keeps n_action_steps of the horizon from the current frame on; the seam returns the
        # whole chunk from there (the server executes n_action_steps of it), so ask for all of it
        return _queued_chunk(self.policy, lb, self.cameras, {"n_action_steps": self.cfg.action_horizon})


class VQBeTPolicy(LeRobotPolicy):
    """LeRobot's VQ-BeT (``lerobot.policies.vqbet``): one camera (``camera``), two training phases."""

    name = "vqbet"
    config_class = VQBeTConfig
    lerobot_type = "vqbet"
    catalog = {
        "group": "policy learning",
        "scenario": "behaviours with a few distinct modes, as discrete action codes",
        "here": "trained on the recorded demonstrations, served, evaluated in LIBERO (the comparison below)",
    }
    comparison = True
    #: LeRobot's recipe for VQ-BeT (its Adam preset: 1e-4, betas 0.95/0.999, weight decay 1e-6, clipping
    #: 10; a cosine decay to 0), with the book's warm-up length and image shifts. With the book's
    #: recipe VQ-BeT reached the other families' validation error on chapter 9's positive control and
    #: its actions did not move with its camera (logs/openloop_positive_control_calibrated_cpu.json).
    #: LeRobot's parameter groups (the VQ-VAE's own rate) are :meth:`parameter_groups`, its schedule
    #: (full rate through the first phase, the warm-up after it) :meth:`first_phase_steps`
    train_defaults = {
        "optimizer_lr": 1e-4,
        "optimizer_betas": (0.95, 0.999),
        "optimizer_weight_decay": 1e-6,
        "optimizer_grad_clip_norm": 10.0,
        "scheduler_decay_lr": 0.0,
    }
    #: the zoo's timing: its first steps fit the VQ-VAE on actions alone (no images, milliseconds);
    #: its GPT phase is what most of its steps cost
    timing_overrides = {"n_vqvae_training_steps": 1}

    @property
    def uses_state(self) -> bool:
        """LeRobot's VQ-BeT always reads ``observation.state``; ``use_state`` off feeds it zeros."""
        return True

    def __init__(self, cfg: Any = None, statistics: Mapping[str, Any] | None = None):
        super().__init__(cfg, statistics)
        # LeRobot counts phase-1 steps in a plain attribute; keep it in the state_dict so a resumed
        # run continues phase 1 where it stopped
        self.register_buffer("vqvae_optimized_steps", torch.zeros((), dtype=torch.int64))

    @property
    def cameras(self) -> tuple[str, ...]:
        return (CAMERA_NAMES[self.cfg.camera],)

    @property
    def replan_steps(self) -> int:
        return int(self.cfg.action_chunk_size)

    @property
    def _vqvae(self):
        return self.policy.vqbet.action_head.vqvae_model

    def parameter_groups(self, cfg: Any) -> list[dict]:
        """LeRobot's groups (``get_optim_params``): the GPT, encoders and heads with the run's weight
        decay, the action VQ-VAE with its own rate and weight decay (``optimizer_vqvae_lr``; marked
        ``own_lr``, so a resume that changes ``optimizer_lr`` leaves it), and biases and norms
        without weight decay. A trainable parameter no group names joins the first."""
        groups = []
        for g in self.policy.get_optim_params():
            params = [p for p in g["params"] if p.requires_grad]
            extra = {k: v for k, v in g.items() if k != "params"}
            if "lr" in extra:
                extra["own_lr"] = True
            groups.append({"params": params, **extra})
        named = {id(p) for g in groups for p in g["params"]}
        groups[0]["params"] += [p for p in self.parameters() if p.requires_grad and id(p) not in named]
        return [g for g in groups if g["params"]]

    @classmethod
    def first_phase_steps(cls, config: Any) -> int:
        # the zoo adds these to the steps its budget buys (the first comparison counted them against
        # the budget, which left the GPT half of its minutes)
        return int(config.n_vqvae_training_steps)

    def loss(self, batch: Mapping[str, Any], generator=None) -> dict:
        phase = 2.0 if bool(self._vqvae.discretized) else 1.0  # 1: the residual VQ-VAE, 2: the GPT
        out = super().loss(batch, generator)
        self.vqvae_optimized_steps.fill_(int(self._vqvae.optimized_steps))
        out["vqbet_phase"] = torch.tensor(phase, device=out["total_loss"].device)
        return out

    def _training_batch(self, lb: dict) -> dict:
        return _with_time_axis(lb, (BATCH_STATE, *self.cameras))

    def _predict_chunk(self, lb: dict) -> torch.Tensor:
        return _queued_chunk(self.policy, lb, self.cameras, {})

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._vqvae.optimized_steps = int(self.vqvae_optimized_steps)
        return result


def _with_time_axis(lb: dict, keys: tuple[str, ...]) -> dict:
    """LeRobot's Diffusion and VQ-BeT read (B, n_obs_steps, ...) features; one frame gets the axis."""
    lb = dict(lb)
    for key in keys:
        if lb[key].ndim == (2 if key == BATCH_STATE else 4):
            lb[key] = lb[key].unsqueeze(1)
    return lb


def _queued_chunk(policy, lb: dict, cameras: tuple[str, ...], config_overrides: Mapping[str, Any]) -> torch.Tensor:
    """``predict_action_chunk`` of a LeRobot policy that reads its observation queues (Diffusion,
    VQ-BeT): after ``reset()``, fill them frame by frame with the observation history (B, T, ...),
    as ``select_action`` does over an episode's steps (one frame fills the whole queue)."""
    from lerobot.policies.utils import populate_queues
    from lerobot.utils.constants import OBS_IMAGES

    policy.reset()
    b = _with_time_axis({k: v for k, v in lb.items() if k != BATCH_ACTION}, (BATCH_STATE, *cameras))
    b = {k: v for k, v in b.items() if PAD_SUFFIX not in k}  # the preprocessor adds action=None
    b[OBS_IMAGES] = torch.stack([b[k] for k in cameras], dim=-4)
    for t in range(b[BATCH_STATE].shape[1]):
        policy._queues = populate_queues(policy._queues, {k: b[k][:, t] for k in policy._queues if k in b})
    saved = {k: getattr(policy.config, k) for k in config_overrides}
    try:
        for k, v in config_overrides.items():
            setattr(policy.config, k, v)
        return policy.predict_action_chunk(b)
    finally:
        for k, v in saved.items():
            setattr(policy.config, k, v)
        policy.reset()


# --- the families that need a GPU server and Hub weights ---------------------------------------------
# SmolVLA, Pi0, Pi0.5, Pi0-Fast and OpenVLA are fine-tuned from released weights (0.45B to 7.5B
# parameters) that this project cannot download or fit on its CPU machine. Each is a registry family
# with the guide's parameters (so `python -m tutorial_utils train --list-params policy=pi0` and the
# parameter tables work), and building one raises PolicyUnavailable with the weights, the GPU
# memory, the licence, the GPU-server command and how its server reaches our LIBERO client.

#: our LIBERO client against a policy server running elsewhere (openpi's websocket framing)
CLIENT_COMMAND = (
    "python -m tutorial_utils eval --host <gpu-server> --port <port> --protocol openpi --suite libero_spatial"
)


@dataclass(frozen=True)
class GPURecipe:
    """What a GPU-server family needs, in the words of its error message."""

    title: str
    weights: str
    vram: str
    licence: str
    train: str
    serve: str
    why_not_here: str

    def message(self, family: str) -> str:
        return (
            f"policy {family!r} ({self.title}) cannot be built on this machine: {self.why_not_here} "
            f"Weights: {self.weights}. GPU memory: {self.vram}. Licence: {self.licence}. "
            f"On a GPU server with Hub access: {self.train} "
            f"Serving to our LIBERO client: {self.serve}"
        )


_OPENPI_SERVE = (
    "openpi's own policy server speaks the websocket protocol our client uses (msgpack-numpy, openpi "
    "LIBERO keys observation/image, observation/wrist_image, observation/state, prompt; reply "
    "{{'actions': (H, 7)}}): on the GPU server `uv run scripts/serve_policy.py policy:checkpoint "
    "--policy.config={config} --policy.dir={ckpt}` (port 8000), then "
    f"here `{CLIENT_COMMAND.replace('<port>', '8000')}`."
)
_OPENPI_NOTE = (
    "LeRobot 0.4.4's port fails with stock transformers (it needs a patched fork; transformers is not even "
    "installed here), its weights come from the Hub, and 3.5B parameters do not train on this CPU."
)
_OPENPI_LICENCE = (
    "openpi's code is Apache-2.0; read the terms of the checkpoints you download and the Gemma Terms of Use "
    "of the PaliGemma base they are built on"
)

#: each GPU-server family's recipe (its class's ``gpu_recipe``, the text of its error)
SMOLVLA_RECIPE = GPURecipe(
    title="SmolVLA, 450M parameters, LeRobot 0.4.4's `smolvla`",
    weights="the policy lerobot/smolvla_base and the VLM HuggingFaceTB/SmolVLM2-500M-Video-Instruct (its "
    "config.json and processor/tokenizer are read from the Hub even when no weights are loaded)",
    vram="not measured here; by arithmetic ~1.8 GB of float32 weights (450M) plus ~1.2 GB of gradients and Adam state for "
    "the 99.9M trainable parameters (train_expert_only), plus activations that grow with batch_size (LeRobot's "
    "recipe: 64; lower it on a smaller card)",
    licence="Apache-2.0 (lerobot/smolvla_base and SmolVLM2)",
    train="`pip install 'lerobot[smolvla]==0.4.4'` (brings transformers>=4.57.1,<5, which needs "
    "huggingface_hub<1.0: use a separate environment from this project's huggingface_hub 2.x), then "
    "`lerobot-train --policy.path=lerobot/smolvla_base --dataset.repo_id=<you>/<libero dataset, v3.0> "
    "--batch_size=64 --steps=20000 --policy.device=cuda --output_dir=outputs/train/smolvla_libero`.",
    serve="LeRobot 0.4.4 has no websocket policy server: on the GPU machine load the trained policy "
    "(SmolVLAPolicy.from_pretrained(<output_dir>/checkpoints/last/pretrained_model)) behind a "
    "tutorial_utils.policies.base.Policy whose infer() returns {'actions': (H, 7)} and serve it with this "
    f"project's websocket server (tutorial_utils.serve.server.PolicyServer), then here `{CLIENT_COMMAND}`.",
    why_not_here="its weights (lerobot/smolvla_base, SmolVLM2-500M) come from the Hub and 450M parameters are "
    "a GPU job; its transformers 4.57 needs huggingface_hub<1.0, so here it runs only in the .smolvla folder "
    "beside the venv (requirements-smolvla.txt), on a local stand-in VLM with random weights "
    "(tutorial_utils.policies.smolvla).",
)
PI0_RECIPE = GPURecipe(
    title="Pi0 (openpi), PaliGemma + a flow-matching action expert, ~3.5B parameters",
    weights="openpi's gs://openpi-assets/checkpoints/pi0_base (no LIBERO-tuned Pi0 is published: fine-tune "
    "it with openpi's pi0_libero config)",
    vram="inference > 8 GB, LoRA fine-tuning > 22.5 GB, full fine-tuning > 70 GB (openpi's README)",
    licence=_OPENPI_LICENCE,
    train="clone Physical-Intelligence/openpi, `GIT_LFS_SKIP_SMUDGE=1 uv sync`, then "
    "`uv run scripts/compute_norm_stats.py --config-name pi0_libero` and "
    "`XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 uv run scripts/train.py pi0_libero --exp-name=<name>`.",
    serve=_OPENPI_SERVE.format(config="pi0_libero", ckpt="checkpoints/pi0_libero/<name>/<step>"),
    why_not_here=_OPENPI_NOTE,
)
PI05_RECIPE = GPURecipe(
    title="Pi0.5 (openpi), Pi0 trained with knowledge insulation, ~3.5B parameters",
    weights="openpi's gs://openpi-assets/checkpoints/pi05_base (to fine-tune) or pi05_libero (already "
    "fine-tuned on LIBERO, ready to serve)",
    vram="inference > 8 GB, LoRA fine-tuning > 22.5 GB, full fine-tuning > 70 GB (openpi's README)",
    licence=_OPENPI_LICENCE,
    train="in an openpi checkout: `uv run scripts/compute_norm_stats.py --config-name pi05_libero`, then "
    "`XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 uv run scripts/train.py pi05_libero --exp-name=<name>`.",
    serve=_OPENPI_SERVE.format(config="pi05_libero", ckpt="gs://openpi-assets/checkpoints/pi05_libero"),
    why_not_here=_OPENPI_NOTE,
)
PI0_FAST_RECIPE = GPURecipe(
    title="Pi0-FAST (openpi), PaliGemma 3B decoding FAST action tokens autoregressively",
    weights="openpi's gs://openpi-assets/checkpoints/pi0_fast_base (fine-tune it with openpi's "
    "pi0_fast_libero config), plus the FAST tokenizer physical-intelligence/fast (Hub)",
    vram="inference > 8 GB, LoRA fine-tuning > 22.5 GB, full fine-tuning > 70 GB (openpi's README)",
    licence=_OPENPI_LICENCE,
    train="in an openpi checkout: `uv run scripts/compute_norm_stats.py --config-name pi0_fast_libero`, "
    "then `XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 uv run scripts/train.py pi0_fast_libero --exp-name=<name>`.",
    serve=_OPENPI_SERVE.format(config="pi0_fast_libero", ckpt="checkpoints/pi0_fast_libero/<name>/<step>"),
    why_not_here="its tokenizers come from the Hub, LeRobot 0.4.4's port needs transformers (not installed "
    "here), and 3B parameters do not train on this CPU.",
)
OPENVLA_RECIPE = GPURecipe(
    title="OpenVLA 7B (Prismatic: SigLIP + DINOv2 + Llama 2 7B), not part of LeRobot",
    weights="openvla/openvla-7b (fine-tune) or openvla/openvla-7b-finetuned-libero-spatial (LIBERO-tuned, LoRA r=32)",
    vram="inference ~11 GB in bfloat16 (~6 GB 4-bit); LoRA fine-tuning fits a 40 GB A100 at a small batch; "
    "full fine-tuning needs 2+ 80 GB GPUs (the OpenVLA maintainers)",
    licence="MIT (OpenVLA code and weights); the Llama 2 base is under the Llama 2 Community License",
    train="clone openvla/openvla, `pip install -e .`, then `torchrun --standalone --nnodes 1 "
    "--nproc-per-node 1 vla-scripts/finetune.py --vla_path openvla/openvla-7b --data_root_dir <rlds dir> "
    "--dataset_name libero_spatial_no_noops --lora_rank 32 --batch_size 8`.",
    serve="OpenVLA's vla-scripts/deploy.py is a REST server (POST /act, json-numpy), not our protocol: wrap "
    "the model (or that endpoint) in a tutorial_utils.policies.base.Policy whose infer() returns "
    "{'actions': (1, 7)} (unnorm_key libero_spatial_no_noops) and serve it with tutorial_utils.serve.server.PolicyServer on "
    f"the GPU machine, then here `{CLIENT_COMMAND}` (replan_steps 1).",
    why_not_here="7.5B parameters are more than this machine's memory, and the weights come from the Hub.",
)


@dataclass
class Pi0Config:
    """Pi0 / Pi0.5: PaliGemma + a flow-matching action expert (openpi; LeRobot's port names)."""

    image_size: int = param(224, "image resolution (openpi: 224)", "model")
    chunk_size: int = param(50, "actions predicted per chunk, openpi's action_horizon (LIBERO configs: 10)", "model")
    n_action_steps: int = param(50, "actions executed per chunk (openpi's LIBERO client: replan_steps 5)", "model")
    num_inference_steps: int = param(10, "flow-matching denoising steps (openpi: 10)", "model")
    tokenizer_max_length: int = param(
        48, "longest tokenized prompt (the guide's max_input_seq_len; openpi: 48 for Pi0, 200 for Pi0.5)", "model"
    )
    freeze_vision_encoder: bool = param(
        False, "keep the SigLIP vision encoder frozen (guide: freeze_vision_encoder)", "model"
    )
    train_expert_only: bool = param(False, "freeze the whole VLM and train the action expert only", "model")

    @property
    def action_horizon(self) -> int:
        return self.chunk_size


@dataclass
class Pi0FastConfig:
    """Pi0-FAST: PaliGemma decoding FAST (DCT) action tokens (openpi; LeRobot's port names)."""

    image_size: int = param(224, "image resolution (openpi: 224)", "model")
    chunk_size: int = param(10, "actions per chunk, openpi's action_horizon (LIBERO config: 10)", "model")
    n_action_steps: int = param(5, "actions executed per chunk (openpi's LIBERO client: replan_steps 5)", "model")
    tokenizer_max_length: int = param(
        200, "longest prompt + state tokens (the guide's max_input_seq_len; openpi: 180-250)", "model"
    )
    max_decoding_steps: int = param(
        256, "most action tokens decoded per chunk (guide: max_decoding_steps; LeRobot: 256)", "model"
    )
    temperature: float = param(0.0, "sampling temperature of the action tokens (0: greedy)", "model")
    freeze_vision_encoder: bool = param(
        False, "keep the SigLIP vision encoder frozen (guide: freeze_vision_encoder)", "model"
    )

    @property
    def action_horizon(self) -> int:
        return self.chunk_size


@dataclass
class OpenVLAConfig:
    """OpenVLA: 7 discretised action tokens per step from a Llama 2 VLM (OpenVLA's own scripts)."""

    image_size: int = param(224, "image resolution (OpenVLA: 224, the LIBERO client centre-crops)", "model")
    lora_rank: int = param(32, "LoRA rank of the fine-tuning (OpenVLA's LIBERO runs: 32)", "model")
    unnorm_key: str = param(
        "libero_spatial_no_noops", "the dataset statistics predict_action un-normalises with", "model"
    )
    load_in_4bit: bool = param(False, "4-bit quantised inference (~6 GB instead of ~11 GB)", "model")

    @property
    def action_horizon(self) -> int:
        return 1


class GPUServerPolicy(nn.Module, TrainablePolicy):
    """A family whose weights and memory need a GPU server: building it explains where and how."""

    needs_gpu_server: ClassVar[bool] = True
    #: what it needs and how it runs elsewhere (the text of its error and of chapter 9's list)
    gpu_recipe: ClassVar[GPURecipe]

    @classmethod
    def recipe(cls) -> str:
        return cls.gpu_recipe.message(cls.name)

    def __init__(self, cfg: Any = None, statistics: Mapping[str, Any] | None = None):
        raise PolicyUnavailable(self.recipe())


class Pi0Policy(GPUServerPolicy):
    name = "pi0"
    config_class = Pi0Config
    gpu_recipe = PI0_RECIPE
    catalog = {
        "group": "imitation learning",
        "scenario": "general manipulation from a pretrained VLA (openpi)",
        "here": "GPU server only (openpi, ~3.5B); openpi's server speaks our client's protocol",
    }


class Pi05Policy(GPUServerPolicy):
    name = "pi05"
    config_class = Pi0Config
    gpu_recipe = PI05_RECIPE
    catalog = {
        "group": "imitation learning",
        "scenario": "general manipulation; a LIBERO-tuned checkpoint is published",
        "here": "GPU server only (openpi, ~3.5B); openpi's server speaks our client's protocol",
    }


class Pi0FastPolicy(GPUServerPolicy):
    name = "pi0_fast"
    config_class = Pi0FastConfig
    gpu_recipe = PI0_FAST_RECIPE
    catalog = {
        "group": "imitation learning",
        "scenario": "Pi0 with faster, autoregressive action tokens",
        "here": "GPU server only (openpi); its FAST tokenizer comes from the Hub",
    }


class OpenVLAPolicy(GPUServerPolicy):
    name = "openvla"
    config_class = OpenVLAConfig
    gpu_recipe = OPENVLA_RECIPE
    catalog = {
        "group": "vision-language-action",
        "scenario": "complex scenes and long instructions, with a large GPU",
        "here": "GPU server only (7.5B parameters, not in LeRobot); served to our client through a wrapper",
    }
