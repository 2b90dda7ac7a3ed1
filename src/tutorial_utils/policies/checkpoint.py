"""Policy checkpoints, one format for every trainable family.

A checkpoint is a directory: ``model.safetensors`` (the weights), ``config.json`` (the format,
the family's registry name, its config, a size + sha256 manifest of the weights, parameter
counts, and whatever the trainer adds: dataset, step, validation) and
``dataset_statistics.json``. It is written under a temporary name and renamed into place, so a
crash leaves the old directory or the new one, never half of one. ``load_policy(dir)`` finds the
family through the registry and returns a ready model.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tutorial_utils.io import atomic_dir, atomic_write_json, sha256_file
from tutorial_utils.policies.base import CheckpointError
from tutorial_utils.policies.normalize import STATS_FILE, read_statistics

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CHECKPOINT_FORMAT = "tutorial_utils.policy"
CHECKPOINT_VERSION = 2
#: version 1 was the mini DiT's own format (no family key); it reads as family "mini"
LEGACY_FORMATS = {"tutorial_utils.mini_dit4dit": "mini"}


def write_policy_files(policy, directory: Path, extra: Mapping[str, Any] | None = None) -> None:
    """Write weights, config and statistics into an existing (temporary) directory."""
    from safetensors.torch import save_file

    directory = Path(directory)
    state = {k: v.detach().cpu().contiguous() for k, v in _unwrap(policy).state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE))
    p = _unwrap(policy)
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "family": p.name,
        "policy": dataclasses.asdict(p.cfg),
        "weights": {
            "file": WEIGHTS_FILE,
            "bytes": (directory / WEIGHTS_FILE).stat().st_size,
            "sha256": sha256_file(directory / WEIGHTS_FILE),
        },
        "parameters": p.parameter_counts(),
    }
    if extra:
        manifest.update(extra)
    atomic_write_json(directory / CONFIG_FILE, manifest)
    atomic_write_json(directory / STATS_FILE, p.statistics)


def save_policy(policy, directory: str | os.PathLike, extra: Mapping[str, Any] | None = None) -> Path:
    """Save ``model.safetensors`` + ``config.json`` + ``dataset_statistics.json`` into
    ``directory``, built under a temporary name and renamed into place (a crash leaves the old
    directory or the new one, never half of one)."""
    with atomic_dir(directory) as tmp:
        write_policy_files(policy, tmp, extra)
    return Path(directory)


def _unwrap(m):
    return getattr(m, "module", m)


def read_checkpoint_config(directory: str | os.PathLike) -> dict:
    d = Path(directory)
    cfg_path = d / CONFIG_FILE
    if not d.is_dir():
        raise CheckpointError(
            f"checkpoint directory {d} does not exist; pass a directory that holds {WEIGHTS_FILE} and {CONFIG_FILE}."
        )
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path} is missing; {d} is not a checkpoint written by tutorial_utils.policies.")
    try:
        manifest = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{cfg_path} is corrupted ({exc}); use another checkpoint (for example checkpoints/last or a step_* one)."
        ) from None
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt in LEGACY_FORMATS and "policy" in manifest:
        manifest.setdefault("family", LEGACY_FORMATS[fmt])
    elif fmt != CHECKPOINT_FORMAT or "policy" not in manifest or "family" not in manifest:
        raise CheckpointError(
            f"{cfg_path}: format {fmt!r} is not {CHECKPOINT_FORMAT!r} with a 'family' and a 'policy' config; "
            "this is not a checkpoint written by tutorial_utils.policies (a DiT4DiT checkpoint is served by the "
            "dit4dit backend)."
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
        raise CheckpointError(
            f"{wpath} is missing; the checkpoint is incomplete. Use another one (checkpoints/last, a step_* one)."
        )
    info = manifest.get("weights", {})
    if verify and info:
        size = wpath.stat().st_size
        if size != info.get("bytes"):
            raise CheckpointError(
                f"{wpath} is corrupted: {size} bytes, {CONFIG_FILE} says {info.get('bytes')}. "
                "Use another checkpoint (checkpoints/last, best or a step_* one) or retrain."
            )
        digest = sha256_file(wpath)
        if digest != info.get("sha256"):
            raise CheckpointError(
                f"{wpath} is corrupted: sha256 {digest[:12]}... differs from {CONFIG_FILE}'s {str(info.get('sha256'))[:12]}... "
                "Use another checkpoint (checkpoints/last, best or a step_* one) or retrain."
            )
    try:
        state = load_file(str(wpath))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{wpath} cannot be read as safetensors ({exc}); the file is corrupted. Use another checkpoint."
        ) from None
    return state, manifest


def load_weights_into(policy, directory: str | os.PathLike) -> dict:
    """Load a checkpoint's weights into an existing policy; the configs must match."""
    state, manifest = load_state_dict_checked(directory)
    p = _unwrap(policy)
    theirs = manifest["policy"]
    if manifest["family"] != p.name:
        raise CheckpointError(
            f"{Path(directory) / CONFIG_FILE} is a {manifest['family']!r} checkpoint; the model is {p.name!r}. "
            "Load it with tutorial_utils.policies.load(dir), which picks the family for you."
        )
    ours = dataclasses.asdict(p.cfg)
    diff = {k: (theirs.get(k), v) for k, v in ours.items() if theirs.get(k) != v}
    if diff:
        pretty = ", ".join(f"{k}: checkpoint {a!r} vs model {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(
            f"{Path(directory) / CONFIG_FILE} is from a different model config ({pretty}). "
            "Build the model with the checkpoint's config (load_policy reads it for you), or "
            "train from scratch with pretrained_checkpoint=None."
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


def load_policy(checkpoint_dir: str | os.PathLike, family: type, device: str = "cpu"):
    """A ready model of ``family`` (eval mode, on ``device``) from a checkpoint directory; the
    family written in ``config.json`` must match (``tutorial_utils.policies.load`` picks it)."""
    from tutorial_utils import params

    d = Path(checkpoint_dir)
    manifest = read_checkpoint_config(d)
    if family.name != manifest["family"]:
        raise CheckpointError(
            f"{d / CONFIG_FILE} is a {manifest['family']!r} checkpoint, not {family.name!r}; "
            "load it with tutorial_utils.policies.load(dir), which picks the family for you."
        )
    try:
        cfg = params.from_mapping(family.config_class, manifest["policy"], str(d / CONFIG_FILE))
    except params.ConfigError as exc:
        raise CheckpointError(
            f"{d / CONFIG_FILE}: {exc} The checkpoint was written by another version of the "
            f"{family.name!r} family; retrain, or load it with the version that wrote it."
        ) from None
    policy = family(cfg, read_statistics(d / STATS_FILE))
    load_weights_into(policy, d)
    return policy.to(device).eval()
