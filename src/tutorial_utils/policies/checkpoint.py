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
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tutorial_utils.io import SmallFileError, atomic_dir, atomic_write_json, read_small, sha256_file
from tutorial_utils.policies.base import CheckpointError
from tutorial_utils.policies.normalize import STATS_FILE, read_statistics

#: the types of a checkpoint's config.json keys the loader relies on
CONFIG_SCHEMA = {"format": str, "family": str, "policy": dict, "weights": dict, "step": (int, type(None))}
#: an exported bundle's manifest (runs.export writes it; loading a bundle checks it first)
MANIFEST_FILE = "manifest.json"
BUNDLE_FORMAT = "tutorial_utils.bundle"
MANIFEST_SCHEMA = {
    "format": str,
    "version": int,
    "family": str,
    "step": (int, type(None)),
    "files": dict,
    "parity": dict,
    "metrics": dict,
    "schema": dict,
    "packages": dict,
}
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
        manifest = read_small(
            cfg_path,
            schema=CONFIG_SCHEMA,
            fix="use another checkpoint (for example checkpoints/last or a step_* one), or export it again",
        )
    except SmallFileError as exc:
        raise CheckpointError(f"{cfg_path} is corrupted: {exc}") from None
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


def _defaults(config_class: type) -> dict:
    """The value a checkpoint that does not name a field was trained with: the field's
    ``written_before`` value (a family's config class may map a field added later, whose default
    differs from what older checkpoints used, e.g. Diffusion's ``prediction_type``), else its default."""
    try:
        out = dataclasses.asdict(config_class())
    except TypeError:  # a config with a required field: no defaults to fall back on
        out = {}
    return {**out, **dict(getattr(config_class, "written_before", None) or {})}


def stored_policy_config(config_class: type, stored: dict) -> dict:
    """A checkpoint's ``policy`` block with the fields it predates filled in (:func:`_defaults`)."""
    legacy = dict(getattr(config_class, "written_before", None) or {})
    return {**{k: v for k, v in legacy.items() if k not in stored}, **stored}


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
    # a parameter added to the family after the checkpoint was written is absent from its config.json:
    # the checkpoint was trained with that parameter's default
    defaults = _defaults(type(p.cfg))
    diff = {k: (theirs.get(k, defaults.get(k)), v) for k, v in ours.items() if theirs.get(k, defaults.get(k)) != v}
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
    if (d / MANIFEST_FILE).exists() or (d / MANIFEST_FILE).is_symlink():  # a bundle: its files are checked first
        verify_bundle(d)
    manifest = read_checkpoint_config(d)
    if family.name != manifest["family"]:
        raise CheckpointError(
            f"{d / CONFIG_FILE} is a {manifest['family']!r} checkpoint, not {family.name!r}; "
            "load it with tutorial_utils.policies.load(dir), which picks the family for you."
        )
    try:
        cfg = params.from_mapping(
            family.config_class, stored_policy_config(family.config_class, manifest["policy"]), str(d / CONFIG_FILE)
        )
    except params.ConfigError as exc:
        raise CheckpointError(
            f"{d / CONFIG_FILE}: {exc} The checkpoint was written by another version of the "
            f"{family.name!r} family; retrain, or load it with the version that wrote it."
        ) from None
    stats = read_statistics(d / STATS_FILE)
    _check_model_size(family, cfg, stats, d)
    policy = family(cfg, stats)
    load_weights_into(policy, d)
    return policy.to(device).eval()


#: the families whose model is built on the meta device first (cheap to build twice, no pretrained parts)
_META_CHECKED = ("mini", "mlp")


def _check_model_size(family: type, cfg: Any, stats: Any, d: Path) -> None:
    """Build the model on torch's ``meta`` device (no memory) and compare its size with the
    weights file, so a config with an absurd size (``model_dim: 10**12``) is a teaching error
    instead of an allocation that fails (or succeeds) with a traceback."""
    import torch

    wpath = d / WEIGHTS_FILE
    if family.name not in _META_CHECKED or not wpath.is_file():
        return  # load_weights_into says what is missing; other families build pretrained parts
    try:
        with torch.device("meta"):
            probe = family(cfg, stats)
        need = sum(t.numel() * t.element_size() for t in probe.state_dict().values())
    except Exception:  # a family that cannot be built on meta: the real build and the shape check decide
        return
    have = wpath.stat().st_size
    if need > 2 * have + (1 << 20):
        big = [f"{k}={v}" for k, v in dataclasses.asdict(cfg).items() if isinstance(v, int) and v > 1 << 16]
        raise CheckpointError(
            f"{d / CONFIG_FILE}: its policy config builds a model of {need / 1e9:.3g} GB but {WEIGHTS_FILE} holds "
            f"{have / 1e6:.3g} MB{' (suspect: ' + ', '.join(big) + ')' if big else ''}. The config was changed or "
            "belongs to another checkpoint: use another checkpoint, or export it again."
        )


class BundleError(CheckpointError, ValueError):
    """A bundle whose files do not match its manifest (changed, missing, a symbolic link, or no manifest)."""


def scan_files(folder: Path, skip: tuple[str, ...] = (MANIFEST_FILE,)) -> tuple[dict[str, dict], list[str]]:
    """``({relative path: {bytes, sha256}}, [problems])`` of the regular files under ``folder``
    (links never followed: a symbolic link, a FIFO or a device is a problem, not a file)."""
    import stat

    out, problems = {}, []
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in sorted(dirs + files):
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{rel} is a symbolic link (to {os.readlink(p)}); a bundle holds only regular files")
            elif stat.S_ISREG(st.st_mode):
                if rel not in skip:
                    out[rel] = {"bytes": st.st_size, "sha256": sha256_file(p)}
            elif not stat.S_ISDIR(st.st_mode):
                problems.append(f"{rel} is not a regular file")
    return out, problems


def verify_bundle(bundle: str | os.PathLike) -> dict[str, Any]:
    """Check every file of a bundle against its manifest (size and sha256, types checked, no
    symbolic links); returns the manifest. A :class:`BundleError` names each changed, missing,
    unlisted or linked file."""
    d = Path(bundle)
    path = d / MANIFEST_FILE
    fix = "do not serve it; export the checkpoint again (`python -m tutorial_utils runs export`)"
    if path.is_symlink():
        raise BundleError(
            f"{path} is a symbolic link (to {os.readlink(path)}); a bundle holds only regular files. Fix: {fix}."
        )
    try:
        manifest = read_small(path, schema=MANIFEST_SCHEMA, required=("format", "files"), fix=fix)
    except FileNotFoundError:
        raise BundleError(f"{path} is missing: {d} is not a bundle written by runs.export.") from None
    except SmallFileError as exc:
        raise BundleError(str(exc)) from None
    if manifest["format"] != BUNDLE_FORMAT:
        raise BundleError(f"{path}: format is not {BUNDLE_FORMAT!r}; {d} is not a bundle written by runs.export.")
    listed = manifest["files"]
    for name, info in listed.items():
        bad = (
            "is not a relative path inside the bundle"
            if name.startswith("/") or ".." in Path(name).parts or not name
            else "is not {bytes, sha256}"
            if not isinstance(info, dict)
            or isinstance(info.get("bytes"), bool)
            or not isinstance(info.get("bytes"), int)
            or not isinstance(info.get("sha256"), str)
            else None
        )
        if bad:
            raise BundleError(f"{path} [files.{name[:80]}]: {bad}. Fix: {fix}.")
    present, problems = scan_files(d) if d.is_dir() else ({}, [])
    for name, info in sorted(listed.items()):
        now = present.get(name)
        if now is None:
            if not any(p.startswith(f"{name} ") for p in problems):
                problems.append(f"{name} is missing")
        elif now["bytes"] != info["bytes"]:
            problems.append(f"{name} changed ({now['bytes']} bytes, the manifest says {info['bytes']})")
        elif now["sha256"] != info["sha256"]:
            problems.append(
                f"{name} changed (sha256 {now['sha256'][:12]}..., the manifest says {info['sha256'][:12]}...)"
            )
    problems += [f"{name} is not in the manifest" for name in sorted(set(present) - set(listed))]
    if problems:
        raise BundleError(f"bundle {d} does not match {MANIFEST_FILE}: {'; '.join(problems)}. Fix: {fix}.")
    return manifest
