"""The mini DiT4DiT policy: a small vision-language-action model in plain torch.

It keeps DiT4DiT's shape at a size a CPU can train (docs/FACTS.md section 1):

- ``backbone`` (the context): a conv encoder per camera (``primary_encoder``,
  ``wrist_encoder``), a hashed-word instruction encoder (``language_encoder``) and a state
  encoder (``state_encoder``: the 8-D state as sin/cos, 16 dims, as DiT4DiT). Their tokens are
  the context the action head attends to. DiT4DiT's context is the hidden states of a video
  DiT; ours is a few conv feature maps, which is what makes it trainable on two cores.
- ``action_model`` (the flow-matching DiT head): the noisy action chunk (horizon 8) as tokens,
  DiT blocks with adaLN-Zero conditioned on the denoising time ``t``, self-attention over the
  action tokens and cross-attention to the context tokens.

Objective (GR00T-style flow matching, as DiT4DiT): ``noisy = (1-t)*a + t*noise``, target
velocity ``noise - a``, ``t ~ Beta(1.5, 1.0)``, masked MSE. Inference: ``num_inference_steps``
(4) Euler steps from t=1 (noise) to t=0 (actions).

Actions are normalised with ``dataset_statistics.json`` (the ``franka`` block): min-max to
[-1, 1] where the action mask is true (x..yaw), raw where it is false (the gripper).

It is the ``mini`` family of the policy registry (:mod:`tutorial_utils.policies`): batches in
LeRobot's key names, checkpoints in the shared format (:mod:`tutorial_utils.policies.checkpoint`),
served through :meth:`~tutorial_utils.policies.trainable.TrainablePolicy.serving_policy`.
``MiniPolicy.load(dir)`` gives a ready policy; ``policy.predict_action(primary, wrist, state,
instruction)`` returns an (8, 7) chunk in robot units.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tutorial_utils.errors import ConfigError
from tutorial_utils.params import by_profile, param
from tutorial_utils.policies.base import (
    BATCH_ACTION,
    BATCH_ACTION_IS_PAD,
    BATCH_IMAGE,
    BATCH_STATE,
    BATCH_TASK,
    BATCH_WRIST,
)
from tutorial_utils.policies.normalize import EMBODIMENT, STATS_FILE, ActionNormalizer, StatisticsError
from tutorial_utils.policies.trainable import TrainablePolicy

# --- config -----------------------------------------------------------------------------------


@dataclass
class PolicyConfig:
    """The model's shape. Saved in ``config.json``; a checkpoint loads only into the same shape."""

    image_size: int = param(64, "camera images are resized to this square size (a multiple of 16)", "model", gpu=128)
    model_dim: int = param(128, "token width of the encoders and the DiT head", "model", gpu=256)
    num_heads: int = param(4, "attention heads", "model")
    action_depth: int = param(4, "DiT blocks in the action head", "model", gpu=6)
    language_layers: int = param(1, "transformer layers of the instruction encoder", "model")
    vocab_size: int = param(4096, "hashed word vocabulary (no tokenizer download)", "model")
    max_words: int = param(24, "instruction words kept", "model")
    state_dim: int = param(8, "raw state size; the encoder sees sin/cos of it (2 x state_dim)", "model")
    action_dim: int = param(7, "action size (LIBERO: 6-D delta pose + gripper)", "model")
    action_horizon: int = param(8, "actions per predicted chunk (DiT4DiT: 8)", "model")
    num_inference_steps: int = param(4, "Euler steps from noise to actions at inference (DiT4DiT: 4)", "model")
    mlp_ratio: float = param(4.0, "hidden width of the DiT blocks' MLP, as a multiple of model_dim", "model")
    dropout: float = param(0.0, "dropout in the transformer layers", "model")

    def check(self) -> None:
        if self.model_dim % self.num_heads:
            raise ConfigError(f"model_dim={self.model_dim} must be divisible by num_heads={self.num_heads}")
        if self.image_size < 16 or self.image_size % 16:
            raise ConfigError(f"image_size={self.image_size} must be a multiple of 16 (>= 16)")
        for name in (
            "model_dim",
            "num_heads",
            "action_depth",
            "num_inference_steps",
            "action_horizon",
            "action_dim",
            "state_dim",
            "vocab_size",
            "max_words",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.language_layers < 0:
            raise ConfigError(f"language_layers must be >= 0, got {self.language_layers}")


# --- instruction tokens -----------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def _as_tensor(x, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """``torch.as_tensor`` that copies read-only numpy arrays (msgpack-decoded requests are
    read-only; sharing their memory makes torch warn that writing would be undefined)."""
    if isinstance(x, np.ndarray) and (not x.flags.writeable or not x.flags.c_contiguous):
        x = np.array(x, order="C")
    return torch.as_tensor(x, dtype=dtype, device=device)


def tokenize(texts: list[str], vocab_size: int, max_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hashed word ids (crc32 of each lower-case word, 1..vocab_size-1; 0 is padding) and a
    padding mask (True = pad). Stable across processes and machines, nothing to download."""
    ids = torch.zeros(len(texts), max_words, dtype=torch.long)
    for i, text in enumerate(texts):
        words = _WORD.findall(str(text).lower())[:max_words] or ["<empty>"]
        for j, w in enumerate(words):
            ids[i, j] = 1 + zlib.crc32(w.encode()) % (vocab_size - 1)
    return ids, ids == 0


# --- building blocks ---------------------------------------------------------------------------


def sinusoidal(x: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """(B,) -> (B, dim) sinusoidal features."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=x.device, dtype=torch.float32) / half)
    args = x.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ImageEncoder(nn.Module):
    """uint8-range image (B,3,S,S) in [0,1] -> (S/16)^2 tokens of model_dim."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        d = cfg.model_dim
        chans = [3, 32, 64, d, d]
        layers: list[nn.Module] = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.GroupNorm(8, cout), nn.SiLU()]
        self.conv = nn.Sequential(*layers)
        n = (cfg.image_size // 16) ** 2
        self.pos = nn.Parameter(torch.zeros(1, n, d))
        nn.init.normal_(self.pos, std=0.02)
        self.proj = nn.Linear(d, d)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.conv(img * 2.0 - 1.0)  # (B,d,h,w)
        x = x.flatten(2).transpose(1, 2)  # (B,h*w,d)
        return self.proj(x) + self.pos


class LanguageEncoder(nn.Module):
    """Hashed word ids -> word tokens (a small transformer over them) and a pooled vector."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        d = cfg.model_dim
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(1, cfg.max_words, d))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(
            d, cfg.num_heads, int(d * cfg.mlp_ratio), cfg.dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = (
            nn.TransformerEncoder(layer, cfg.language_layers, enable_nested_tensor=False)
            if cfg.language_layers
            else None
        )
        self.norm = nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos[:, : ids.shape[1]]
        if self.encoder is not None:
            x = self.encoder(x, src_key_padding_mask=pad)
        return self.norm(x)


class StateEncoder(nn.Module):
    """8-D state -> sin/cos (16 dims, DiT4DiT's ``libero_franka`` transform) -> one token."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        d = cfg.model_dim
        self.mlp = nn.Sequential(nn.Linear(2 * cfg.state_dim, d), nn.SiLU(), nn.Linear(d, d))

    @staticmethod
    def sincos(state: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.sin(state), torch.cos(state)], dim=-1)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.sincos(state.float()))[:, None, :]


class Backbone(nn.Module):
    """All context encoders. Output: context tokens (B, N, d) and a key padding mask (B, N)."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.primary_encoder = ImageEncoder(cfg)
        self.wrist_encoder = ImageEncoder(cfg)
        self.language_encoder = LanguageEncoder(cfg)
        self.state_encoder = StateEncoder(cfg)
        # one learned "which source" embedding per token type: state, language, primary, wrist
        self.type_embed = nn.Parameter(torch.zeros(4, cfg.model_dim))
        nn.init.normal_(self.type_embed, std=0.02)

    def forward(self, primary, wrist, state, ids, pad) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.state_encoder(state) + self.type_embed[0]
        lang = self.language_encoder(ids, pad) + self.type_embed[1]
        p = self.primary_encoder(primary) + self.type_embed[2]
        w = self.wrist_encoder(wrist) + self.type_embed[3]
        ctx = torch.cat([s, lang, p, w], dim=1)
        B = ctx.shape[0]
        no_pad = lambda n: torch.zeros(B, n, dtype=torch.bool, device=ctx.device)  # noqa: E731
        mask = torch.cat([no_pad(1), pad.to(ctx.device), no_pad(p.shape[1]), no_pad(w.shape[1])], dim=1)
        return ctx, mask


def _modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    """adaLN-Zero DiT block: self-attention over action tokens, cross-attention to context, MLP."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        d, h = cfg.model_dim, cfg.num_heads
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.self_attn = nn.MultiheadAttention(d, h, dropout=cfg.dropout, batch_first=True)
        self.norm_ctx = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.cross_attn = nn.MultiheadAttention(d, h, dropout=cfg.dropout, batch_first=True)
        self.norm3 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        hidden = int(d * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, d))
        self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        nn.init.zeros_(self.adaLN[-1].weight)
        nn.init.zeros_(self.adaLN[-1].bias)

    def forward(self, x, c, ctx, ctx_pad):
        sh1, sc1, g1, sh2, sc2, g2 = self.adaLN(c).chunk(6, dim=-1)
        h = _modulate(self.norm1(x), sh1, sc1)
        x = x + g1[:, None] * self.self_attn(h, h, h, need_weights=False)[0]
        kv = self.norm_ctx(ctx)
        x = x + self.cross_attn(self.norm2(x), kv, kv, key_padding_mask=ctx_pad, need_weights=False)[0]
        x = x + g2[:, None] * self.mlp(_modulate(self.norm3(x), sh2, sc2))
        return x


class ActionModel(nn.Module):
    """The flow-matching DiT head: (noisy actions, t, context) -> velocity (B, H, action_dim)."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        d = cfg.model_dim
        self.action_in = nn.Sequential(nn.Linear(cfg.action_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.pos = nn.Parameter(torch.zeros(1, cfg.action_horizon, d))
        nn.init.normal_(self.pos, std=0.02)
        self.time_embed = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.action_depth))
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.adaLN_out = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.action_out = nn.Linear(d, cfg.action_dim)
        nn.init.zeros_(self.adaLN_out[-1].weight)
        nn.init.zeros_(self.adaLN_out[-1].bias)
        self.dim = d

    def forward(self, noisy, t, ctx, ctx_pad):
        c = self.time_embed(sinusoidal(t * 1000.0, self.dim))
        x = self.action_in(noisy) + self.pos[:, : noisy.shape[1]]
        for blk in self.blocks:
            x = blk(x, c, ctx, ctx_pad)
        sh, sc = self.adaLN_out(c).chunk(2, dim=-1)
        return self.action_out(_modulate(self.norm_out(x), sh, sc))


# --- the policy ----------------------------------------------------------------------------------


class MiniPolicy(nn.Module, TrainablePolicy):
    """``backbone`` (encoders) + ``action_model`` (flow-matching DiT head) + action normaliser.

    Batch (LeRobot's key names; what training feeds and ``predict`` takes), arrays or tensors:
      ``observation.images.image``, ``observation.images.wrist_image``: uint8 (B,H,W,3) or
      float (B,3,S,S) in [0,1]; ``observation.state``: (B,8) float; ``task``: list of B strings;
      for the loss also ``action`` (B,H,7) in robot units and ``action_is_pad`` (B,H) bool.
    """

    name = "mini"
    config_class = PolicyConfig
    catalog = {
        "group": "this book",
        "scenario": "the DiT4DiT recipe at laptop size (flow-matching DiT head)",
        "here": "trained, served and evaluated by the main chain and in the comparison below",
    }
    comparison = True
    #: the book's recipe (train.config.RECIPE: from scratch at 3e-4 in the cpu and gpu profiles, above
    #: the platform guide's 1e-5..1e-4 for fine-tuning); the ci profile's 2-step smoke test trains only
    #: the action head (its encoders stay as built)
    train_defaults = {"freeze_modules": by_profile("backbone", cpu="")}
    accepts_device_batch = True  # every input goes through torch.as_tensor(...).to(device)
    compile_targets = ("backbone", "action_model")  # tensor-only forwards: no graph breaks

    def __init__(self, cfg: PolicyConfig | None = None, statistics: Mapping[str, Any] | None = None):
        super().__init__()
        self.cfg = cfg or PolicyConfig()
        self.cfg.check()
        self.backbone = Backbone(self.cfg)
        self.action_model = ActionModel(self.cfg)
        self.statistics: dict = dict(statistics) if statistics is not None else {}
        self.normalizer = ActionNormalizer.from_statistics(statistics) if statistics is not None else None
        if self.normalizer is not None and self.normalizer.dim != self.cfg.action_dim:
            raise StatisticsError(
                f"{STATS_FILE}: {EMBODIMENT}.action has {self.normalizer.dim} dims but the policy has "
                f"action_dim={self.cfg.action_dim}; set action_dim to match the dataset."
            )

    # -- inputs
    def prepare_images(self, img) -> torch.Tensor:
        """uint8 HWC (numpy or tensor, batched) -> float (B,3,S,S) in [0,1] at image_size."""
        x = _as_tensor(img)
        if x.ndim == 3:
            x = x[None]
        if x.shape[-1] == 3 and x.shape[1] != 3:  # channels last
            x = x.permute(0, 3, 1, 2)
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        s = self.cfg.image_size
        if x.shape[-2:] != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        return x.to(self.device)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def encode(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, pad = tokenize(list(batch[BATCH_TASK]), self.cfg.vocab_size, self.cfg.max_words)
        dev = self.device
        return self.backbone(
            self.prepare_images(batch[BATCH_IMAGE]),
            self.prepare_images(batch[BATCH_WRIST]),
            _as_tensor(batch[BATCH_STATE], dtype=torch.float32, device=dev),
            ids.to(dev),
            pad.to(dev),
        )

    # -- training
    def forward(self, batch: Mapping[str, Any], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Flow-matching loss. ``generator`` (CPU) makes t and the noise reproducible."""
        return self.loss(batch, generator)

    def loss(self, batch: Mapping[str, Any], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        if self.normalizer is None:
            raise StatisticsError("the policy has no dataset statistics; build it with MiniPolicy(cfg, statistics)")
        dev = self.device
        ctx, ctx_pad = self.encode(batch)
        a = self.normalizer.normalize(_as_tensor(batch[BATCH_ACTION], dtype=torch.float32).to(dev))
        B, H, D = a.shape
        t = _beta_sample(1.5, 1.0, B, generator)
        noise = torch.randn(B, H, D, generator=generator)
        t, noise = t.to(dev), noise.to(dev)
        noisy = (1 - t[:, None, None]) * a + t[:, None, None] * noise
        target = noise - a
        pred = self.action_model(noisy, t, ctx, ctx_pad)
        is_pad = batch.get(BATCH_ACTION_IS_PAD)
        if is_pad is None:
            mask = torch.ones(B, H, D, device=dev)
        else:
            mask = (~torch.as_tensor(is_pad, dtype=torch.bool)).to(dev).float()
            if mask.ndim == 2:
                mask = mask[:, :, None].expand(B, H, D)
        err = (pred - target) ** 2 * mask
        loss = err.sum() / mask.sum().clamp_min(1.0)
        return {"action_dit_loss": loss, "total_loss": loss}

    # -- inference
    @torch.no_grad()
    def sample(
        self, batch: Mapping[str, Any], generator: torch.Generator | None = None, steps: int | None = None
    ) -> torch.Tensor:
        """Normalised action chunk (B,H,D): Euler from t=1 (noise) to t=0 in ``steps`` steps."""
        ctx, ctx_pad = self.encode(batch)
        B = ctx.shape[0]
        steps = steps or self.cfg.num_inference_steps
        x = torch.randn(B, self.cfg.action_horizon, self.cfg.action_dim, generator=generator).to(self.device)
        dt = 1.0 / steps
        for i in range(steps):
            t = torch.full((B,), 1.0 - i * dt, device=self.device)
            x = x - dt * self.action_model(x, t, ctx, ctx_pad)
        return x

    @torch.no_grad()
    def predict(self, batch: Mapping[str, Any], generator: torch.Generator | None = None) -> np.ndarray:
        """Action chunk (B, action_horizon, action_dim) float32 in robot units."""
        if self.normalizer is None:
            raise StatisticsError("the policy has no dataset statistics; load it with MiniPolicy.load(checkpoint_dir)")
        was_training = self.training
        self.eval()
        try:
            out = self.normalizer.unnormalize(self.sample(batch, generator).float().cpu())
        finally:
            self.train(was_training)
        return out.numpy().astype(np.float32)

    def predict_action(self, primary, wrist, state, instruction: str, seed: int | None = None) -> np.ndarray:
        """One observation -> (action_horizon, action_dim) float32 chunk in robot units.

        ``primary``, ``wrist``: (H,W,3) uint8 in the dataset's orientation; ``state``: (8,).
        ``seed`` fixes the initial noise (deterministic output)."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        batch = {
            BATCH_IMAGE: np.asarray(primary, dtype=np.uint8)[None],
            BATCH_WRIST: np.asarray(wrist, dtype=np.uint8)[None],
            BATCH_STATE: np.asarray(state, dtype=np.float32).reshape(1, -1),
            BATCH_TASK: [instruction],
        }
        return self.predict(batch, gen)[0]


def _beta_sample(a: float, b: float, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """Beta(a, 1) by inverse CDF (CDF x**a, so x = u**(1/a)), drawn from ``generator`` so a
    seeded run draws the same t on resume (torch's Beta sampler takes no generator)."""
    if b != 1.0:
        raise NotImplementedError("seeded Beta sampling is implemented for b == 1 (DiT4DiT's Beta(1.5, 1.0))")
    u = torch.rand(n, generator=generator)
    return u.pow(1.0 / a)
