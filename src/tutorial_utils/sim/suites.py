"""The benchmark suites the evaluation runs: one :class:`Suite` record each, naming the runner that
builds its environments.

The evaluation loop (:mod:`tutorial_utils.evaluate.loop`) never names a simulator: it asks the
suite for its step limit, its number of tasks, the action that lets a scene settle, and an
environment per task. So another benchmark (a LIBERO variant, a MetaWorld task set, a suite of
your own) is two things:

1. **a runner**: a module with ``make_env(suite, task_id, init_state=0, image_size=128,
   render_profile="fast", cameras=True)`` returning an environment with ``reset(init_state)``,
   ``step(action)``, ``check_success()``, ``images(obs)`` (two HxWx3 uint8 pictures: the main and
   the wrist camera, already in the policy's orientation), ``state_vector(obs)`` (8 floats),
   ``task_language``, ``num_init_states`` and ``close()``; and ``num_tasks(suite)``.
   :mod:`tutorial_utils.sim.libero_env` is LIBERO's runner.
2. **a record**: ``suites.register(Suite(name, runner="my_package.my_runner", max_steps=...))``.

The runner is imported only when an environment is needed, so this module stays light. Actions are
LIBERO's 7 numbers (``evaluate.loop.to_env_action`` clips them); a benchmark with another action
space needs its own conversion there as well.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from tutorial_utils.errors import ConfigError

#: LIBERO's runner module
LIBERO_RUNNER = "tutorial_utils.sim.libero_env"
#: a robosuite action that moves nothing with the gripper open: the steps a scene settles with
OPEN_STILL = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)


@dataclass(frozen=True)
class Suite:
    """One benchmark suite: its name, the module that builds its environments and its episode step
    limit (an episode that has not succeeded by then is a failure)."""

    name: str
    runner: str
    max_steps: int
    settle_action: tuple[float, ...] = OPEN_STILL
    description: str = ""

    def module(self) -> ModuleType:
        try:
            return importlib.import_module(self.runner)
        except ImportError as e:
            raise ConfigError(
                f"suite {self.name!r}: its runner {self.runner!r} cannot be imported ({e}); install what it needs "
                "or register the suite with a runner module that exists"
            ) from e

    def make_env(self, task_id: int, **kwargs):
        """The runner's environment for task ``task_id`` (keywords: ``init_state``, ``image_size``,
        ``render_profile``, ``cameras``)."""
        return self.module().make_env(self.name, int(task_id), **kwargs)

    def num_tasks(self) -> int:
        return int(self.module().num_tasks(self.name))


_SUITES: dict[str, Suite] = {}


def register(suite: Suite) -> Suite:
    """Add ``suite`` (a name already taken by a different record is refused)."""
    if not isinstance(suite.max_steps, int) or suite.max_steps < 1:
        raise ConfigError(f"suite {suite.name!r}: max_steps={suite.max_steps!r} must be a positive integer")
    old = _SUITES.get(suite.name)
    if old is not None and old != suite:
        raise ConfigError(f"suite {suite.name!r} is registered already (runner {old.runner}); pick another name")
    _SUITES[suite.name] = suite
    return suite


def unregister(name: str) -> None:
    _SUITES.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_SUITES)


def get(name: str) -> Suite:
    """The record of suite ``name``; an unknown name is a :class:`ConfigError` that lists the known ones."""
    try:
        return _SUITES[name]
    except KeyError:
        raise ConfigError(f"suite={name!r}: use one of {', '.join(_SUITES)}") from None


# LIBERO's five suites and their episode step limits (docs/FACTS.md, section 5: the limits the
# upstream evaluation scripts use)
for _name, _steps, _what in (
    ("libero_spatial", 220, "the same objects in 10 layouts: which black bowl goes on the plate"),
    ("libero_object", 280, "one layout, 10 different objects to pick and place in the basket"),
    ("libero_goal", 300, "the same objects and layout, 10 different goals"),
    ("libero_10", 520, "10 long-horizon tasks (LIBERO-Long), most of two sub-goals"),
    ("libero_90", 400, "90 short tasks across kitchen, living-room and study scenes"),
):
    register(Suite(_name, LIBERO_RUNNER, _steps, description=_what))
#: LIBERO's suites, in the order above
LIBERO = names()
