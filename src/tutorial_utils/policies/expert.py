"""The scripted LIBERO expert (:mod:`tutorial_utils.sim.expert`) behind the serving interface."""

from __future__ import annotations

from typing import Any

from tutorial_utils.policies.base import PRIVILEGED_KEY, Policy


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
            from tutorial_utils.sim.expert import ScriptedExpert

            self._expert = ScriptedExpert(**self._kwargs)
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


def make_expert(checkpoint: str | None = None, **kw: Any) -> Policy:
    return ExpertPolicy(**kw)
