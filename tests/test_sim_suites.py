"""The suite records (tutorial_utils.sim.suites): LIBERO's five, their step limits in one place, and
the promise of the module's docstring, that another benchmark is one runner module plus one
``register`` line, shown by evaluating a served policy on a toy benchmark the test registers."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from tutorial_utils.errors import ConfigError
from tutorial_utils.sim import suites

#: a whole benchmark: two tasks with two starts each, a goal per (task, start); 1e9 is never reached
TOY_RUNNER = """
from helpers import FakeEnv

GOALS = {0: (3.0, 1e9), 1: (2.0, 5.0)}


def make_env(suite, task_id, init_state=0, image_size=32, render_profile="fast", cameras=True):
    return FakeEnv(task_id, size=image_size, goals=GOALS, num_init_states=2)


def num_tasks(suite):
    return len(GOALS)
"""


@pytest.fixture
def toy_suite(tmp_path, monkeypatch):
    (tmp_path / "toy_reach_runner.py").write_text(textwrap.dedent(TOY_RUNNER))
    monkeypatch.syspath_prepend(str(tmp_path))
    suite = suites.register(suites.Suite("toy_reach", runner="toy_reach_runner", max_steps=8))
    yield suite
    suites.unregister(suite.name)
    assert "toy_reach" not in suites.names()


def test_libero_suites_are_records_with_upstreams_step_limits():
    from tutorial_utils.sim import libero_env

    assert suites.LIBERO == ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
    assert libero_env.SUITES == suites.LIBERO
    assert libero_env.MAX_STEPS == {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
                                    "libero_10": 520, "libero_90": 400}  # fmt: skip
    assert all(suites.get(n).runner == suites.LIBERO_RUNNER for n in suites.LIBERO)
    np.testing.assert_array_equal(libero_env.SETTLE_ACTION, suites.OPEN_STILL)


def test_bad_suites_are_refused_with_the_known_names():
    with pytest.raises(ConfigError, match="suite='libero_100': use one of libero_spatial, libero_object"):
        suites.get("libero_100")
    with pytest.raises(ConfigError, match="registered already"):
        suites.register(suites.Suite("libero_spatial", runner="elsewhere", max_steps=220))
    with pytest.raises(ConfigError, match="max_steps=0"):
        suites.register(suites.Suite("zero", runner="x", max_steps=0))
    assert "zero" not in suites.names()
    missing = suites.Suite("nowhere", runner="no_such_runner_module", max_steps=5)
    with pytest.raises(ConfigError, match="its runner 'no_such_runner_module' cannot be imported"):
        missing.num_tasks()


def test_another_benchmark_is_one_runner_and_one_record(tmp_path, toy_suite):
    """The evaluation job's own loop, a real server and client, on a benchmark it has never heard of:
    the suite's step limit ends the failing episode, its task count makes "all" tasks, and the
    results carry its name."""
    from tutorial_utils.evaluate.loop import EvalConfig, run_evaluation
    from tutorial_utils.policies import base as policies
    from tutorial_utils.serve.server import ServerThread

    class Forward(policies.Policy):
        name = "forward"

        @property
        def metadata(self):
            return {**super().metadata, "image_size": 32, "action_horizon": 4, "gripper": "robosuite"}

        def infer(self, obs):
            return {"actions": np.tile(np.array([1.0, 0, 0, 0, 0, 0, -1.0], np.float32), (4, 1))}

    with ServerThread(Forward()) as srv:
        cfg = EvalConfig(
            suite="toy_reach", task_ids="all", trials_per_task=2, port=srv.port, output_dir=str(tmp_path),
            videos=False, connect_timeout=5, num_steps_wait=0, env_image_size=32,
        )  # fmt: skip
        cfg.check()
        res = run_evaluation(cfg)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["suite"] == "toy_reach" and res["total_successes"] == 3 and res["total_episodes"] == 4
    steps = {(t["task_id"], e["init_state"]): (e["success"], e["steps"]) for t in saved["tasks"] for e in t["episodes"]}
    assert steps == {(0, 0): (True, 3), (0, 1): (False, 8), (1, 0): (True, 2), (1, 1): (True, 5)}
