"""The ``Policy`` interface every served policy implements, and a registry by name.

A policy takes one observation in the openpi LIBERO keys (``observation/image``,
``observation/wrist_image`` (HxWx3 uint8, already flipped 180 degrees), ``observation/state``
(8,), ``prompt``; plus ``privileged`` when its metadata asks for it) and returns
``{"actions": (H, 7) float32, ...}``: a chunk of H end-effector delta actions.

Its ``metadata`` (sent to every client on connect) tells the evaluation client how to drive it:

=====================  ==========================================================================
``policy``             the registry name
``image_size``         square input size the client resizes to (``None``: any size)
``action_horizon``     H, the chunk length
``replan_steps``       how many actions of each chunk the client executes before asking again
``gripper``            ``"robosuite"`` (-1 open, +1 close) or ``"dataset"`` (1 open, 0 close)
``needs_privileged``   the client adds ``privileged`` (simulator state) to the observation
=====================  ==========================================================================

Registry: ``expert`` (the scripted LIBERO expert, privileged), ``zero`` (a do-nothing policy
for tests and the chapter's live round trip), ``mini`` (the trained mini DiT, from
``tutorial_utils.policy``) and ``dit4dit`` (the official checkpoint; GPU checkout only).
"""

from __future__ import annotations

import abc
from typing import Any, Callable

PRIVILEGED_KEY = "privileged"


class PolicyUnavailable(RuntimeError):
    """The policy cannot be built here (module not written yet, missing checkout or checkpoint)."""


class Policy(abc.ABC):
    """``infer(obs) -> {"actions": (H, 7) float32}``, ``metadata``, ``reset()``."""

    name = "policy"

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "image_size": 224,
            "action_horizon": 1,
            "replan_steps": 1,
            "gripper": "robosuite",
            "needs_privileged": False,
        }

    @abc.abstractmethod
    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """One observation -> ``{"actions": (H, 7) float32, ...}``."""

    def reset(self) -> None:
        """Forget any per-episode state."""


class ZeroPolicy(Policy):
    """Holds still with the gripper open: a stand-in for wiring tests and the live demo."""

    name = "zero"

    def __init__(self, horizon: int = 8, image_size: int | None = 224):
        self.horizon = horizon
        self.image_size = image_size

    @property
    def metadata(self) -> dict[str, Any]:
        return {**super().metadata, "image_size": self.image_size, "action_horizon": self.horizon, "replan_steps": self.horizon}

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        actions = np.zeros((self.horizon, 7), np.float32)
        actions[:, 6] = -1.0
        return {"actions": actions}


class ExpertPolicy(Policy):
    """The scripted LIBERO expert behind the policy interface.

    It reads privileged simulator state, which the evaluation client sends under
    ``obs["privileged"]`` because ``metadata["needs_privileged"]`` is true:
    ``{"episode_id": str, "task_info": {...}, "obs": {...}}``. A new ``episode_id`` starts a
    fresh controller, reset with that episode's ``task_info``. One action per request (horizon 1).
    """

    name = "expert"

    def __init__(self, **expert_kwargs: Any):
        self._kwargs = expert_kwargs
        self._expert = None
        self._episode: str | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        return {**super().metadata, "needs_privileged": True}

    def _controller(self):
        if self._expert is None:
            try:
                from tutorial_utils import expert as _expert_mod
            except ImportError as exc:
                raise PolicyUnavailable(f"the scripted expert (tutorial_utils.expert) cannot be imported: {exc}") from None
            self._expert = _expert_mod.make_expert(**self._kwargs) if hasattr(_expert_mod, "make_expert") else _expert_mod.ScriptedExpert(**self._kwargs)
        return self._expert

    def reset(self) -> None:
        self._episode = None

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        priv = obs.get(PRIVILEGED_KEY)
        if not isinstance(priv, dict) or "obs" not in priv:
            raise ValueError(
                "the expert policy needs privileged simulator state: the request has no "
                f"'{PRIVILEGED_KEY}' map with 'obs' (and 'episode_id', 'task_info'). The evaluation client sends it "
                "when the server's metadata says needs_privileged=True; other clients cannot drive the expert."
            )
        episode = str(priv.get("episode_id", ""))
        if episode != self._episode:
            # a fresh controller per episode: nothing from the last episode can leak into this one
            self._expert = None
            self._controller().reset(priv.get("task_info") or {})
            self._episode = episode
        ctrl = self._controller()
        action = np.asarray(ctrl.act(priv["obs"]), dtype=np.float32).reshape(1, 7)
        return {"actions": action}


# --- registry ----------------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register(name: str, factory: Callable[..., Policy]) -> None:
    """Add a policy factory ``factory(checkpoint=None, **kwargs) -> Policy`` under ``name``."""
    _REGISTRY[name] = factory


def available() -> list[str]:
    return sorted(_REGISTRY)


def make_policy(name: str, checkpoint: str | None = None, **kwargs: Any) -> Policy:
    """Build the policy registered as ``name``; a clear error for unknown or unavailable ones."""
    if name not in _REGISTRY:
        raise PolicyUnavailable(f"unknown policy {name!r}; registered policies: {', '.join(available())}")
    return _REGISTRY[name](checkpoint=checkpoint, **kwargs)


def _make_zero(checkpoint: str | None = None, **kw: Any) -> Policy:
    return ZeroPolicy(**kw)


def _make_expert(checkpoint: str | None = None, **kw: Any) -> Policy:
    return ExpertPolicy(**kw)


def _make_mini(checkpoint: str | None = None, **kw: Any) -> Policy:
    try:
        from tutorial_utils import policy as mini
    except ImportError as exc:
        raise PolicyUnavailable(
            f"policy 'mini' is not available yet: tutorial_utils.policy cannot be imported ({exc}). "
            "It arrives with the mini DiT training stage; until then serve policy='expert'."
        ) from None
    loader = getattr(mini, "load_serving_policy", None)
    if loader is None:
        raise PolicyUnavailable(
            "policy 'mini' is not available yet: tutorial_utils.policy has no load_serving_policy(checkpoint) "
            "returning an object with infer(obs), metadata and reset()."
        )
    if not checkpoint:
        raise PolicyUnavailable("policy 'mini' needs a checkpoint: pass checkpoint=<run_dir>/checkpoints/last (job parameter `checkpoint`, CLI --checkpoint).")
    return loader(checkpoint, **kw)


def _make_dit4dit(checkpoint: str | None = None, **kw: Any) -> Policy:
    raise PolicyUnavailable(
        "policy 'dit4dit' needs the GPU checkout: the official DiT4DiT server "
        "(deployment/model_server/server_policy.py, with config.yaml and dataset_statistics.json at "
        "<checkpoint>.parents[1]) runs there. Start it on the GPU machine and point the evaluation client "
        "at its port with protocol='dit4dit'; it is not served from this package."
    )


register("zero", _make_zero)
register("expert", _make_expert)
register("mini", _make_mini)
register("dit4dit", _make_dit4dit)
