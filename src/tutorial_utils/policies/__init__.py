"""Policy families and the registry that names them.

A family is one module in this folder and one :func:`register` line below. Three kinds:

- trainable families (a :class:`~tutorial_utils.policies.trainable.TrainablePolicy`): ``mini`` (the
  small flow-matching DiT), ``mlp`` (a two-layer behaviour-cloning baseline, the worked
  example of the seam), LeRobot's ``act``, ``diffusion``, ``vqbet`` (``policies/lerobot.py``) and
  ``tdmpc``, ``sac`` (``policies/lerobot_rl.py``: from demonstration windows with a sparse success
  reward; ``tdmpc`` has been trained offline on one task's recorded demonstrations and evaluated in
  LIBERO (chapter 9's positive control), ``sac`` has run only as a 2-step smoke test on a 24-frame
  synthetic source, never on the recorded demonstrations, never evaluated). Training, serving, evaluation and checkpoints use
  them through :func:`make`, :func:`load` and :func:`make_policy` and never name a family; the
  trainer trains all of them but ``sac`` (:func:`trainer_refusal`);
- GPU-server families (:func:`gpu_server`): ``smolvla``, ``pi0``, ``pi05``, ``pi0_fast``, ``openvla``
  have their parameters here, and building or serving one raises :class:`PolicyUnavailable` naming
  the weights, GPU memory, licence, the GPU-server command and how it reaches our LIBERO client
  (SmolVLA's code also builds here on a local stand-in VLM: ``policies/smolvla.py``);
- serving-only policies (a factory ``factory(checkpoint=None, **kw) -> Policy``): ``zero``
  (holds still), ``expert`` (the scripted LIBERO expert, privileged state) and ``dit4dit`` (the
  official checkpoint, served from its own checkout on a GPU server).

Targets are ``"module:attribute"`` strings resolved on first use, so importing this package
stays instant (no torch).
"""

from __future__ import annotations

import importlib
from typing import Any

from tutorial_utils.errors import ConfigError
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


def registered() -> list[str]:
    """Every registered name, in the order it was registered (the book's own families first)."""
    return list(_REGISTRY)


def available() -> list[str]:
    """Every registered name (trainable and serving-only)."""
    return sorted(_REGISTRY)


def trainable() -> list[str]:
    """The names that :func:`make` can build and update here (not the GPU-server families). All but
    ``sac`` train through ``python -m tutorial_utils train`` (``tdmpc`` on the demonstration windows
    its ``training_source`` gives); ``sac`` is updated with its own three optimisers
    (``SACPolicy.update``, ``policies/lerobot_rl.py``), and the trainer refuses it with
    :func:`trainer_refusal`."""
    return [n for n in available() if _is_trainable(_resolve(n)) and not _needs_gpu_server(_resolve(n))]


def trainer_refusal(name: str) -> str:
    """Why ``python -m tutorial_utils train policy=<name>`` cannot train ``name`` (what has run of
    it, what works, where to go), or ``""`` when the trainer trains it. A family says so with a
    ``trainer_refusal`` class attribute (``{families}`` becomes the families the trainer trains)."""
    text = getattr(_resolve(name), "trainer_refusal", "") or ""
    if not text:
        return ""
    ok = [n for n in trainable() if not getattr(_resolve(n), "trainer_refusal", "")]
    return text.replace("{families}", ", ".join(ok))


def _needs_gpu_server(target: Any) -> bool:
    return bool(getattr(target, "needs_gpu_server", False))


def gpu_server() -> list[str]:
    """The families with parameters here whose weights and memory need a GPU server (SmolVLA, Pi0,
    Pi0.5, Pi0-Fast, OpenVLA): building one raises :class:`PolicyUnavailable` with the recipe."""
    return [n for n in available() if _needs_gpu_server(_resolve(n))]


def family(name: str) -> type:
    """The TrainablePolicy class registered as ``name`` (a clear error for serving-only names)."""
    target = _resolve(name)
    if not _is_trainable(target):
        raise PolicyUnavailable(
            f"policy {name!r} is served but not trained here; trainable families: {', '.join(trainable())}"
        )
    return target


def first_phase_steps(name: str, config: Any = None) -> int:
    """Steps of family ``name``'s first training phase under ``config`` (an instance, a mapping of
    overrides or None for the defaults): its ``first_phase_steps`` hook, the one place the schedule,
    the zoo's budget, the health check and the probe read it from."""
    from tutorial_utils.policies.trainable import make_config

    cls = family(name)
    return int(cls.first_phase_steps(make_config(cls, config)))


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
        if kwargs.get("temporal_ensemble") is not None:
            raise ConfigError(
                f"temporal_ensemble_coeff applies to a trained family's chunks; policy {name!r} is not one. "
                "Leave it None (the default) for this policy."
            )
        return target(checkpoint=checkpoint, **kwargs)
    if _needs_gpu_server(target):
        raise PolicyUnavailable(target.recipe())
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
# GPU-server families: their parameters are listed here, building one explains the GPU-server path
register("smolvla", "tutorial_utils.policies.smolvla:SmolVLAPolicy")
register("pi0", "tutorial_utils.policies.lerobot:Pi0Policy")
register("pi05", "tutorial_utils.policies.lerobot:Pi05Policy")
register("pi0_fast", "tutorial_utils.policies.lerobot:Pi0FastPolicy")
register("openvla", "tutorial_utils.policies.lerobot:OpenVLAPolicy")
register("tdmpc", "tutorial_utils.policies.lerobot_rl:TDMPCPolicy")
register("sac", "tutorial_utils.policies.lerobot_rl:SACPolicy")
