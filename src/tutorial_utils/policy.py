"""The mini DiT4DiT policy: a small vision-language-action model in plain torch.

It keeps DiT4DiT's shape at a size a CPU can train (FACTS.md section 1):

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

A checkpoint is a directory: ``model.safetensors``, ``config.json`` (the model config and a
size + sha256 manifest of the weights) and ``dataset_statistics.json``.
``load_policy(dir)`` gives a ready policy; ``policy.predict_action(primary, wrist, state,
instruction)`` returns an (8, 7) chunk in robot units.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tutorial_utils.io import atomic_dir, atomic_write_json

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
STATS_FILE = "dataset_statistics.json"
CHECKPOINT_FORMAT = "tutorial_utils.mini_dit4dit"
CHECKPOINT_VERSION = 1
EMBODIMENT = "franka"


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, corrupted or from a different model config."""


class StatisticsError(ValueError):
    """``dataset_statistics.json`` is missing a key or has the wrong shape."""


# --- config -----------------------------------------------------------------------------------


@dataclass
class PolicyConfig:
    """The model's shape. Saved in ``config.json``; a checkpoint loads only into the same shape."""

    image_size: int = 64  # both cameras are resized to image_size x image_size
    model_dim: int = 128  # width of every token
    num_heads: int = 4
    action_depth: int = 4  # DiT blocks in the action head
    language_layers: int = 1  # transformer layers over the instruction's word tokens
    vocab_size: int = 4096  # hashed word vocabulary (no tokenizer download)
    max_words: int = 24
    state_dim: int = 8  # raw state; the encoder sees sin/cos of it (2 * state_dim = 16)
    action_dim: int = 7
    action_horizon: int = 8
    num_inference_steps: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "config") -> "PolicyConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise CheckpointError(
                f"{source}: unknown policy config key(s) {unknown}; known: {sorted(names)}. "
                "The checkpoint was written by a different version of tutorial_utils.policy; "
                "retrain or load it with the version that wrote it."
            )
        return cls(**dict(d))

    def validate(self) -> None:
        if self.model_dim % self.num_heads:
            raise ValueError(f"model_dim={self.model_dim} must be divisible by num_heads={self.num_heads}")
        if self.image_size < 16 or self.image_size % 16:
            raise ValueError(f"image_size={self.image_size} must be a multiple of 16 (>= 16)")
        for name in ("action_depth", "num_inference_steps", "action_horizon", "action_dim", "state_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


# --- normalisation ----------------------------------------------------------------------------


class ActionNormalizer:
    """Min-max to [-1, 1] on the dims where ``mask`` is true, identity elsewhere (DiT4DiT's
    ``libero_franka``: x..yaw normalised, gripper raw)."""

    def __init__(self, low: np.ndarray, high: np.ndarray, mask: np.ndarray):
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        self.mask = np.asarray(mask, dtype=bool)
        if not (self.low.shape == self.high.shape == self.mask.shape) or self.low.ndim != 1:
            raise StatisticsError(
                f"action min/max/mask must be 1-D of one length, got {self.low.shape}, {self.high.shape}, {self.mask.shape}"
            )
        span = self.high - self.low
        self.span = np.where(span > 1e-8, span, 1.0).astype(np.float32)

    @classmethod
    def from_statistics(cls, stats: Mapping[str, Any], source: str = STATS_FILE) -> "ActionNormalizer":
        block = stats.get(EMBODIMENT)
        if not isinstance(block, Mapping) or "action" not in block:
            raise StatisticsError(
                f"{source}: expected a {EMBODIMENT!r} block with 'action' statistics "
                f"(keys found: {sorted(stats)}). Create it with tutorial_utils.stats "
                "(`python -m tutorial_utils dataset stats DIR`)."
            )
        act = block["action"]
        missing = [k for k in ("min", "max") if k not in act]
        if missing:
            raise StatisticsError(f"{source}: {EMBODIMENT}.action lacks {missing}; recompute it with tutorial_utils.stats.")
        low = np.asarray(act["min"], dtype=np.float32)
        mask = act.get("mask")
        if mask is None:  # DiT4DiT's default for LIBERO: every dim but the last (gripper)
            mask = [True] * (len(low) - 1) + [False]
        return cls(low, np.asarray(act["max"], dtype=np.float32), np.asarray(mask, dtype=bool))

    @property
    def dim(self) -> int:
        return int(self.low.shape[0])

    def normalize(self, a):
        low, span, mask = self._like(a)
        n = 2.0 * (a - low) / span - 1.0
        return n * mask + a * (1 - mask)

    def unnormalize(self, n, clip: bool = True):
        low, span, mask = self._like(n)
        if clip:
            n = n.clamp(-1, 1) if isinstance(n, torch.Tensor) else np.clip(n, -1, 1)
        a = (n + 1.0) * 0.5 * span + low
        return a * mask + n * (1 - mask)

    def _like(self, x):
        if isinstance(x, torch.Tensor):
            f = lambda v: torch.as_tensor(v, dtype=x.dtype, device=x.device)  # noqa: E731
        else:
            f = lambda v: np.asarray(v, dtype=np.float32)  # noqa: E731
        return f(self.low), f(self.span), f(self.mask.astype(np.float32))


def read_statistics(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise StatisticsError(
            f"{path} not found. Create the dataset statistics with tutorial_utils.stats "
            "(`python -m tutorial_utils dataset stats DATASET_DIR`)."
        )
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StatisticsError(f"{path} is not valid JSON ({exc}); delete it and recompute it with tutorial_utils.stats.") from None
    ActionNormalizer.from_statistics(stats, source=str(path))
    return stats


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
        self.encoder = nn.TransformerEncoder(layer, cfg.language_layers, enable_nested_tensor=False) if cfg.language_layers else None
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


class MiniPolicy(nn.Module):
    """``backbone`` (encoders) + ``action_model`` (flow-matching DiT head) + action normaliser.

    Batch format (what ``train`` feeds and ``predict`` takes), tensors:
      ``primary``, ``wrist``: uint8 (B,H,W,3) or float (B,3,S,S) in [0,1];
      ``state``: (B,8) float; ``instruction``: list of B strings;
      for the loss also ``action`` (B,H,7) in robot units and ``action_mask`` (B,H) or (B,H,7).
    """

    def __init__(self, cfg: PolicyConfig | None = None, statistics: Mapping[str, Any] | None = None):
        super().__init__()
        self.cfg = cfg or PolicyConfig()
        self.cfg.validate()
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
        ids, pad = tokenize(list(batch["instruction"]), self.cfg.vocab_size, self.cfg.max_words)
        dev = self.device
        return self.backbone(
            self.prepare_images(batch["primary"]),
            self.prepare_images(batch["wrist"]),
            _as_tensor(batch["state"], dtype=torch.float32, device=dev),
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
        a = self.normalizer.normalize(_as_tensor(batch["action"], dtype=torch.float32).to(dev))
        B, H, D = a.shape
        t = _beta_sample(1.5, 1.0, B, generator)
        noise = torch.randn(B, H, D, generator=generator)
        t, noise = t.to(dev), noise.to(dev)
        noisy = (1 - t[:, None, None]) * a + t[:, None, None] * noise
        target = noise - a
        pred = self.action_model(noisy, t, ctx, ctx_pad)
        mask = batch.get("action_mask")
        if mask is None:
            mask = torch.ones(B, H, D, device=dev)
        else:
            mask = torch.as_tensor(mask).to(dev).float()
            if mask.ndim == 2:
                mask = mask[:, :, None].expand(B, H, D)
        err = (pred - target) ** 2 * mask
        loss = err.sum() / mask.sum().clamp_min(1.0)
        return {"action_dit_loss": loss, "total_loss": loss}

    # -- inference
    @torch.no_grad()
    def sample(self, batch: Mapping[str, Any], generator: torch.Generator | None = None, steps: int | None = None) -> torch.Tensor:
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
            raise StatisticsError("the policy has no dataset statistics; load it with load_policy(checkpoint_dir)")
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
            "primary": np.asarray(primary, dtype=np.uint8)[None],
            "wrist": np.asarray(wrist, dtype=np.uint8)[None],
            "state": np.asarray(state, dtype=np.float32).reshape(1, -1),
            "instruction": [instruction],
        }
        return self.predict(batch, gen)[0]

    # -- bookkeeping
    def module_names(self, depth: int = 2) -> list[str]:
        """Dotted module names up to ``depth`` levels (what ``freeze_modules`` accepts)."""
        return [n for n, _ in self.named_modules() if n and n.count(".") < depth]

    def parameter_counts(self) -> dict[str, int]:
        total = sum(p.numel() for p in self.parameters())
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return {"total": total, "trainable": trainable, "frozen": total - trainable}

    def save(self, directory: str | os.PathLike, extra: Mapping[str, Any] | None = None) -> Path:
        """Write the checkpoint directory atomically (see ``save_policy``)."""
        return save_policy(self, directory, extra)


def _beta_sample(a: float, b: float, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """Beta(a, 1) by inverse CDF (CDF x**a, so x = u**(1/a)), drawn from ``generator`` so a
    seeded run draws the same t on resume (torch's Beta sampler takes no generator)."""
    if b != 1.0:
        raise NotImplementedError("seeded Beta sampling is implemented for b == 1 (DiT4DiT's Beta(1.5, 1.0))")
    u = torch.rand(n, generator=generator)
    return u.pow(1.0 / a)


# --- checkpoints -----------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_policy_files(policy: MiniPolicy, directory: Path, extra: Mapping[str, Any] | None = None) -> None:
    """Write weights, config and statistics into an existing (temporary) directory."""
    from safetensors.torch import save_file

    directory = Path(directory)
    state = {k: v.detach().cpu().contiguous() for k, v in _unwrap(policy).state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE))
    p = _unwrap(policy)
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "policy": p.cfg.to_dict(),
        "weights": {"file": WEIGHTS_FILE, "bytes": (directory / WEIGHTS_FILE).stat().st_size, "sha256": _sha256(directory / WEIGHTS_FILE)},
        "parameters": p.parameter_counts(),
    }
    if extra:
        manifest.update(extra)
    atomic_write_json(directory / CONFIG_FILE, manifest)
    atomic_write_json(directory / STATS_FILE, p.statistics)


def save_policy(policy: MiniPolicy, directory: str | os.PathLike, extra: Mapping[str, Any] | None = None) -> Path:
    """Save ``model.safetensors`` + ``config.json`` + ``dataset_statistics.json`` into
    ``directory``, built under a temporary name and renamed into place (a crash leaves the old
    directory or the new one, never half of one)."""
    with atomic_dir(directory) as tmp:
        write_policy_files(policy, tmp, extra)
    return Path(directory)


def _unwrap(m: nn.Module) -> MiniPolicy:
    return getattr(m, "module", m)


def read_checkpoint_config(directory: str | os.PathLike) -> dict:
    d = Path(directory)
    cfg_path = d / CONFIG_FILE
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory {d} does not exist; pass a directory that holds {WEIGHTS_FILE} and {CONFIG_FILE}.")
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path} is missing; {d} is not a checkpoint written by tutorial_utils.policy.")
    try:
        manifest = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path} is corrupted ({exc}); use another checkpoint (for example checkpoints/last or a step_* one).") from None
    if manifest.get("format") != CHECKPOINT_FORMAT or "policy" not in manifest:
        raise CheckpointError(
            f"{cfg_path}: format {manifest.get('format')!r} is not {CHECKPOINT_FORMAT!r}; this is not a mini-policy "
            "checkpoint (a DiT4DiT checkpoint is served by the dit4dit backend)."
        )
    return manifest


def load_state_dict_checked(directory: str | os.PathLike, verify: bool = True) -> tuple[dict, dict]:
    """(state_dict, manifest) of a checkpoint directory, checked against its manifest."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    manifest = read_checkpoint_config(d)
    wpath = d / WEIGHTS_FILE
    if not wpath.is_file():
        raise CheckpointError(f"{wpath} is missing; the checkpoint is incomplete. Use another one (checkpoints/last, a step_* one).")
    info = manifest.get("weights", {})
    if verify and info:
        size = wpath.stat().st_size
        if size != info.get("bytes"):
            raise CheckpointError(
                f"{wpath} is corrupted: {size} bytes, {CONFIG_FILE} says {info.get('bytes')}. "
                "Use another checkpoint (checkpoints/last, best or a step_* one) or retrain."
            )
        digest = _sha256(wpath)
        if digest != info.get("sha256"):
            raise CheckpointError(
                f"{wpath} is corrupted: sha256 {digest[:12]}... differs from {CONFIG_FILE}'s {str(info.get('sha256'))[:12]}... "
                "Use another checkpoint (checkpoints/last, best or a step_* one) or retrain."
            )
    try:
        state = load_file(str(wpath))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{wpath} cannot be read as safetensors ({exc}); the file is corrupted. Use another checkpoint.") from None
    return state, manifest


def load_weights_into(policy: MiniPolicy, directory: str | os.PathLike) -> dict:
    """Load a checkpoint's weights into an existing policy; the configs must match."""
    state, manifest = load_state_dict_checked(directory)
    p = _unwrap(policy)
    theirs = manifest["policy"]
    ours = p.cfg.to_dict()
    diff = {k: (theirs.get(k), v) for k, v in ours.items() if theirs.get(k) != v}
    if diff:
        pretty = ", ".join(f"{k}: checkpoint {a!r} vs model {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(
            f"{Path(directory) / CONFIG_FILE} is from a different model config ({pretty}). "
            "Build the model with the checkpoint's config (load_policy reads it for you), or "
            "train from scratch with pretrained_checkpoint=''."
        )
    own = p.state_dict()
    bad = [k for k in own if k not in state or tuple(state[k].shape) != tuple(own[k].shape)]
    extra = [k for k in state if k not in own]
    if bad or extra:
        raise CheckpointError(
            f"{Path(directory) / WEIGHTS_FILE} does not fit the model: {len(bad)} missing/mismatched tensors "
            f"(e.g. {bad[:3]}), {len(extra)} unexpected (e.g. {extra[:3]}). It was written by a different model; retrain."
        )
    p.load_state_dict(state)
    return manifest


def load_policy(checkpoint_dir: str | os.PathLike, device: str = "cpu") -> MiniPolicy:
    """A ready-to-serve policy from a checkpoint directory (eval mode, on ``device``)."""
    d = Path(checkpoint_dir)
    manifest = read_checkpoint_config(d)
    cfg = PolicyConfig.from_dict(manifest["policy"], source=str(d / CONFIG_FILE))
    stats = read_statistics(d / STATS_FILE)
    policy = MiniPolicy(cfg, stats)
    load_weights_into(policy, d)
    return policy.to(device).eval()


# --- serving -------------------------------------------------------------------------------------


def load_serving_policy(checkpoint: str | os.PathLike, device: str = "cpu", replan_steps: int | None = None,
                        gripper: str | None = None, seed: int | None = 0, **_: Any):
    """The trained mini policy behind ``tutorial_utils.policies.Policy`` (registry name ``mini``).

    ``infer(obs)`` reads the openpi LIBERO keys (``observation/image``,
    ``observation/wrist_image``, ``observation/state``, ``prompt``) and returns
    ``{"actions": (8, 7) float32}`` in robot units. ``replan_steps`` defaults to the whole
    chunk (DiT4DiT executes all 8). ``seed`` fixes the initial noise of each call (None: random).
    """
    from tutorial_utils.policies import Policy

    policy = load_policy(checkpoint, device=device)
    manifest = read_checkpoint_config(checkpoint)
    data = manifest.get("dataset", {}) if isinstance(manifest.get("dataset"), dict) else {}

    class MiniServingPolicy(Policy):
        name = "mini"

        def __init__(self):
            self.policy = policy
            self.checkpoint = str(checkpoint)

        @property
        def metadata(self) -> dict[str, Any]:
            h = policy.cfg.action_horizon
            return {
                **super().metadata,
                "image_size": data.get("image_size") or policy.cfg.image_size,
                "action_horizon": h,
                "replan_steps": int(replan_steps or h),
                "gripper": gripper or data.get("gripper", "dataset"),
                "checkpoint": self.checkpoint,
            }

        def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
            actions = policy.predict_action(
                obs["observation/image"], obs["observation/wrist_image"], obs["observation/state"],
                str(obs.get("prompt", "")), seed=seed,
            )
            return {"actions": actions}

        def normalize_actions(self, actions) -> np.ndarray:
            """Robot units -> the normalised space of ``dataset_statistics.json`` (what a
            DiT4DiT client expects under ``data.normalized_actions``; it un-normalises itself)."""
            return policy.normalizer.normalize(np.asarray(actions, dtype=np.float32)).astype(np.float32)

    return MiniServingPolicy()
