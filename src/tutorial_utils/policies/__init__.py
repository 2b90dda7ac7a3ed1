"""Policy families and the registry that names them.

A family is one module in this folder and one :func:`register` line below. Two kinds:

- trainable families (a :class:`~tutorial_utils.policies.trainable.TrainablePolicy`): ``mini`` (the
  small flow-matching DiT) and ``mlp`` (a two-layer behaviour-cloning baseline, the worked
  example of the seam). Training, serving, evaluation and checkpoints use them through
  :func:`make`, :func:`load` and :func:`make_policy` and never name a family;
- serving-only policies (a factory ``factory(checkpoint=None, **kw) -> Policy``): ``zero``
  (holds still), ``expert`` (the scripted LIBERO expert, privileged state) and ``dit4dit`` (the
  official checkpoint, served from its own checkout on a GPU server).

Targets are ``"module:attribute"`` strings resolved on first use, so importing this package
stays instant (no torch).
"""

from __future__ import annotations

import importlib
from typing import Any

from tutorial_utils.policies.base import Policy, PolicyUnavailable
from tutorial_utils.policies.trainable import TrainablePolicy

_REGISTRY: dict[str, Any] = {}


def register(name: str, target: Any) -> None:
    """Register a family: a TrainablePolicy subclass, a serving factory, or ``"module:attribute"``."""
    _REGISTRY[name] = target


def _resolve(name: str) -> Any:
    if name not in _REGISTRY:
        raise PolicyUnavailable(f"unknown policy {name!r}; registered policies: {', '.join(available())}")
    target = _REGISTRY[name]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = _REGISTRY[name] = getattr(importlib.import_module(module), attr)
    return target


def _is_trainable(target: Any) -> bool:
    return isinstance(target, type) and issubclass(target, TrainablePolicy)


def available() -> list[str]:
    """Every registered name (trainable and serving-only)."""
    return sorted(_REGISTRY)


def trainable() -> list[str]:
    """The names that :func:`make` can build and training can train."""
    return [n for n in available() if _is_trainable(_resolve(n))]


def family(name: str) -> type:
    """The TrainablePolicy class registered as ``name`` (a clear error for serving-only names)."""
    target = _resolve(name)
    if not _is_trainable(target):
        raise PolicyUnavailable(
            f"policy {name!r} is served but not trained here; trainable families: {', '.join(trainable())}"
        )
    return target


def make(name: str, config: Any = None, statistics: Any = None):
    """A new model of family ``name`` from its config (an instance, a ``{name: value}`` mapping
    of overrides, or None for the defaults) and the dataset statistics."""
    return family(name).build(config, statistics)


def load(checkpoint: Any, device: str = "cpu"):
    """A ready model from a checkpoint directory of any trainable family (read from config.json)."""
    from tutorial_utils.policies.checkpoint import load_policy, read_checkpoint_config

    return load_policy(checkpoint, family(read_checkpoint_config(checkpoint)["family"]), device=device)


def make_policy(name: str, checkpoint: str | None = None, **kwargs: Any) -> Policy:
    """The serving :class:`Policy` registered as ``name``; trainable families load ``checkpoint``."""
    target = _resolve(name)
    if not _is_trainable(target):
        return target(checkpoint=checkpoint, **kwargs)
    if not checkpoint:
        raise PolicyUnavailable(
            f"policy {name!r} needs a checkpoint: pass checkpoint=<run_dir>/checkpoints/last "
            "(job parameter `checkpoint`, CLI --checkpoint)."
        )
    from tutorial_utils.policies.checkpoint import read_checkpoint_config

    model = target.load(checkpoint, device=kwargs.pop("device", "cpu"))
    data = read_checkpoint_config(checkpoint).get("dataset")
    if kwargs.get("gripper") is None and isinstance(data, dict) and data.get("gripper"):
        kwargs["gripper"] = data["gripper"]  # the convention of the actions the model was trained on
    return model.serving_policy(checkpoint=str(checkpoint), **kwargs)


def _make_dit4dit(checkpoint: str | None = None, **kw: Any) -> Policy:
    raise PolicyUnavailable(
        "policy 'dit4dit' needs the GPU checkout: the official DiT4DiT server "
        "(deployment/model_server/server_policy.py, with config.yaml and dataset_statistics.json at "
        "<checkpoint>.parents[1]) runs there. Start it on the GPU machine and point the evaluation client "
        "at its port with protocol='dit4dit'; it is not served from this package."
    )


register("zero", "tutorial_utils.policies.base:make_zero")
register("expert", "tutorial_utils.policies.expert:make_expert")
register("dit4dit", _make_dit4dit)
register("mini", "tutorial_utils.policies.mini:MiniPolicy")
register("mlp", "tutorial_utils.policies.mlp:MLPPolicy")
register("act", "tutorial_utils.policies.lerobot:ACTPolicy")
register("diffusion", "tutorial_utils.policies.lerobot:DiffusionPolicy")
register("vqbet", "tutorial_utils.policies.lerobot:VQBeTPolicy")
