"""The scripted LIBERO expert (:mod:`tutorial_utils.sim.expert`) behind the serving interface."""

from __future__ import annotations

from typing import Any

from tutorial_utils.policies.base import PRIVILEGED_KEY, Policy


class ExpertPolicy(Policy):
    """The scripted LIBERO expert behind the policy interface.

    It reads privileged simulator state, which the evaluation client sends under
    ``obs["privileged"]`` because ``metadata["needs_privileged"]`` is true:
    ``{"episode_id": str, "task_info": {...}, "obs": {...}}``. A new ``episode_id`` starts a
    fresh controller, reset with that episode's ``task_info``; each episode keeps its own
    controller (the most recent :data:`MAX_EPISODES`), so several clients evaluating at once
    (``workers``) never reset each other's. One action per request (horizon 1).
    """

    #: controllers kept at once: more than any number of worker processes one server serves
    MAX_EPISODES = 64

    name = "expert"

    def __init__(self, **expert_kwargs: Any):
        from collections import OrderedDict

        self._kwargs = expert_kwargs
        self._controllers: OrderedDict[str, Any] = OrderedDict()

    @property
    def metadata(self) -> dict[str, Any]:
        return {**super().metadata, "needs_privileged": True}

    def _controller(self, episode: str, task_info: dict):
        ctrl = self._controllers.get(episode)
        if ctrl is None:
            # a fresh controller per episode: nothing from another episode can leak into this one
            from tutorial_utils.sim.expert import ScriptedExpert

            ctrl = ScriptedExpert(**self._kwargs)
            ctrl.reset(task_info)
            self._controllers[episode] = ctrl
            while len(self._controllers) > self.MAX_EPISODES:
                self._controllers.popitem(last=False)
        self._controllers.move_to_end(episode)
        return ctrl

    def reset(self) -> None:
        self._controllers.clear()

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        priv = obs.get(PRIVILEGED_KEY)
        if not isinstance(priv, dict) or "obs" not in priv:
            raise ValueError(
                "the expert policy needs privileged simulator state: the request has no "
                f"'{PRIVILEGED_KEY}' map with 'obs' (and 'episode_id', 'task_info'). The evaluation client sends it "
                "when the server's metadata says needs_privileged=True; other clients cannot drive the expert."
            )
        ctrl = self._controller(str(priv.get("episode_id", "")), priv.get("task_info") or {})
        action = np.asarray(ctrl.act(priv["obs"]), dtype=np.float32).reshape(1, 7)
        return {"actions": action}


def make_expert(checkpoint: str | None = None, **kw: Any) -> Policy:
    return ExpertPolicy(**kw)
