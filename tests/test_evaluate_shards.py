"""Evaluation split over shards and worker processes, and merged back as one process reports it.

The client loop runs against a fake env (no MuJoCo) in this process for shards, and in worker
processes started by the real coordinator (a worker command that installs the same fake env).
Two workers against one on real LIBERO: ``tests/test_benchmarks_smoke.py``'s eval-workers test
(the benchmark's runs are the comparison: one real-LIBERO pair in the suite, not two).
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from itertools import product
from pathlib import Path

import numpy as np
import pytest

import helpers
from tutorial_utils import logs
from tutorial_utils.errors import ConfigError, TutorialError
from tutorial_utils.evaluate import parallel
from tutorial_utils.evaluate import shards as S
from tutorial_utils.evaluate.loop import EvalConfig, run_evaluation
from tutorial_utils.params import from_mapping
from tutorial_utils.policies import base as policies
from tutorial_utils.serve.server import ServerThread, free_port

# --- the split ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tasks,trials", [(10, 10), (3, 2), (1, 1), (7, 3)])
def test_split_covers_every_pair_once(tasks, trials):
    plan = S.episode_plan(range(tasks), trials)
    assert plan[:2] == [(0, 0), (0, 1)] if trials > 1 else plan[:1] == [(0, 0)]
    for num_shards, workers in product((1, 2, 3, 4, 7, 16), (1, 2, 3)):
        seen = []
        for shard in range(num_shards):
            mine = S.split(plan, shard, num_shards)
            parts = [S.split(mine, k, workers) for k in range(workers)]
            assert [p for part in parts for p in part] == mine  # workers cut the shard in order
            seen += mine
            sizes = [len(S.split(plan, s, num_shards)) for s in range(num_shards)]
            assert max(sizes) - min(sizes) <= 1
        assert seen == plan, (num_shards, workers)  # every pair exactly once, in plan order


def test_split_is_contiguous_and_numbers_count_in_the_whole_plan():
    plan = S.episode_plan([2, 5, 7], 2)
    assert S.split(plan, 0, 2) == [(2, 0), (2, 1), (5, 0)] and S.split(plan, 1, 2) == [(5, 1), (7, 0), (7, 1)]
    assert S.group_by_task(S.split(plan, 1, 2)) == {5: [1], 7: [0, 1]}
    assert S.episode_numbers([2, 5, 7], 2)[(5, 1)] == 4
    assert S.split(plan, 0, 8) == [] and S.split(plan, 7, 8) == [(7, 1)]  # fewer pairs than parts


@pytest.mark.parametrize(
    "values,match",
    [
        ({"shard": 2, "num_shards": 2}, r"shard=2 with num_shards=2: shards are numbered 0\.\.1"),
        ({"shard": -1, "num_shards": 3}, r"shard=-1"),
        ({"num_shards": 0}, r"num_shards=0 must be an integer >= 1"),
        ({"workers": 0}, r"workers=0 must be an integer >= 1"),
    ],
)
def test_bad_shard_is_a_teaching_error(values, match):
    with pytest.raises(ConfigError, match=match) as exc:
        from_mapping(EvalConfig, values)
    assert isinstance(exc.value, TutorialError) and "-p shard" in str(exc.value)
    if "shard" in values and values.get("num_shards") == 2:
        assert "--array=0-1" in str(exc.value)


# --- a fake env: success depends on the task and the init state --------------------------------------


class FakeEnv(helpers.FakeEnv):
    """Three init states per task, each with its own goal, so one task mixes successes and failures
    and a wrong init state would show in the results."""

    GOALS = {0: (3.0, 1e9, 3.0), 1: (1e9, 2.0, 1e9), 2: (4.0, 4.0, 4.0)}

    def __init__(self, task_id, size=32):
        super().__init__(task_id, goal=1e9, size=size, goals=self.GOALS, num_init_states=3)

    def images(self, obs, scale: float = 20.0):
        return super().images(obs, scale)


class OnePolicy(policies.Policy):
    """Stateless: chunks of 2 actions moving x by 1 (the answer does not depend on request order)."""

    name = "one"

    @property
    def metadata(self):
        return {**super().metadata, "image_size": 16, "action_horizon": 2, "replan_steps": 2}

    def infer(self, obs):
        a = np.zeros((2, 7), np.float32)
        a[:, 0] = 1.0
        a[:, 6] = -1.0
        return {"actions": a}


@pytest.fixture
def fake_env(monkeypatch):
    from tutorial_utils.sim import libero_env

    monkeypatch.setattr(libero_env, "make_env", lambda suite, task_id, **kw: FakeEnv(task_id))


@pytest.fixture
def server():
    with ServerThread(OnePolicy()) as srv:
        yield srv


def _cfg(port, out, **kw):
    base = dict(task_ids="0-2", trials_per_task=3, port=port, max_steps=5, connect_timeout=5, output_dir=str(out))
    return from_mapping(EvalConfig, {**base, **kw})


def _run(cfg, capsys):
    res = run_evaluation(cfg)
    return res, capsys.readouterr().out


def test_two_shards_merge_to_the_one_process_run(tmp_path, fake_env, server, capsys):
    one, one_log = _run(_cfg(server.port, tmp_path / "one"), capsys)
    assert one["total_episodes"] == 9 and 0 < one["total_successes"] < 9
    assert S.render_log(one) == one_log.splitlines()  # the renderer prints what the loop prints
    assert json.loads((tmp_path / "one" / "results.json").read_text())["pairs"][4] == [1, 1]

    parts = []
    for shard in (0, 1):
        res, log = _run(_cfg(server.port, tmp_path / f"s{shard}", shard=shard, num_shards=2), capsys)
        (tmp_path / f"s{shard}" / "eval_libero_spatial.log").write_text(log)
        (tmp_path / f"s{shard}" / "server.log").write_text(f"server of shard {shard}\n")
        parts.append((res, log))
    # shard 0: task 0's trials and task 1 trial 0; shard 1 goes on with task 1 trial 1, numbered 5
    assert parts[0][0]["pairs"] == [[0, 0], [0, 1], [0, 2], [1, 0]]
    assert parts[1][1].splitlines()[:2] == ["Task: fake task 1", "Starting episode 5..."]
    assert parts[1][0]["total_episodes"] == 5

    dest, merged = parallel.merge_dirs([tmp_path / "s1", tmp_path / "s0"], tmp_path / "merged")
    assert helpers.comparable_results(merged) == helpers.comparable_results(one)
    assert merged["config"]["num_shards"] == 1 and [p["shard"] for p in merged["parts"]] == [1, 0]
    text = (dest / "eval_libero_spatial.log").read_text()
    assert text == one_log  # same lines, same order, running totals recomputed
    assert logs.parse_eval_log(text)["total_rate"] == one["success_rate"]
    saved = json.loads((dest / "results.json").read_text())
    for t in saved["tasks"]:
        for e in t["episodes"]:
            assert (dest / e["video"]).stat().st_size > 0 and e["video"].startswith("videos/")
    assert "server of shard 0" in (dest / "server.log").read_text()
    assert logs.diagnose(dest).signs["total success rate"]
    # a run like any other: `job list` / `runs list` show it as a finished evaluation
    status = json.loads((dest / "status.json").read_text())
    assert status["job"] == "evaluate_merged" and status["state"] == "succeeded"
    assert status["success_signs"]["episodes"] == one["total_episodes"] and len(status["parts"]) == 2
    from tutorial_utils import jobs

    assert jobs.run_state(status) == "succeeded"


def test_merge_refuses_mismatched_missing_repeated_and_unfinished_parts(tmp_path, fake_env, server, capsys):
    for shard in (0, 1):
        _run(_cfg(server.port, tmp_path / f"s{shard}", shard=shard, num_shards=2, videos=False), capsys)
    _run(_cfg(server.port, tmp_path / "other", shard=1, num_shards=2, videos=False, seed=8), capsys)
    with pytest.raises(S.ShardError, match=r"config key 'seed' is 8, but 7") as exc:
        parallel.merge_dirs([tmp_path / "s0", tmp_path / "other"], tmp_path / "m1")
    assert "other/results.json" in str(exc.value)
    # the key may be waived by name
    _, merged = parallel.merge_dirs([tmp_path / "s0", tmp_path / "other"], tmp_path / "m2", ignore=("seed",))
    assert merged["total_episodes"] == 9
    with pytest.raises(S.ShardError, match=r"5 episode\(s\) missing .*task 1 trial 1"):
        parallel.merge_dirs([tmp_path / "s0"], tmp_path / "m3")
    shutil.copytree(tmp_path / "s0", tmp_path / "s0copy")
    with pytest.raises(S.ShardError, match="task 0 trial 0 was run twice"):
        parallel.merge_dirs([tmp_path / "s0", tmp_path / "s0copy", tmp_path / "s1"], tmp_path / "m4")
    res = json.loads((tmp_path / "s0copy" / "results.json").read_text())
    res["finished"] = False
    (tmp_path / "s0copy" / "results.json").write_text(json.dumps(res))
    with pytest.raises(S.ShardError, match="did not finish"):
        parallel.merge_dirs([tmp_path / "s0copy", tmp_path / "s1"], tmp_path / "m5")
    with pytest.raises(S.ShardError, match="results.json not found"):
        parallel.merge_dirs([tmp_path / "s0", tmp_path], tmp_path / "m6")
    with pytest.raises(S.ShardError, match="already holds evaluation results"):
        parallel.merge_dirs([tmp_path / "s0", tmp_path / "s1"], tmp_path / "m2")
    # the CLI prints the teaching error and exits with 2; a good merge prints the table
    from tutorial_utils.evaluate.cli import main

    assert main(["merge", str(tmp_path / "s0"), "--out", str(tmp_path / "m7")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m8")]) == 0
    assert "merged 2 parts" in capsys.readouterr().out


def test_run_evaluation_alone_refuses_workers(tmp_path, fake_env):
    with pytest.raises(ConfigError, match="parallel.evaluate"):
        run_evaluation(_cfg(free_port(), tmp_path, workers=2))


# --- worker processes (the real coordinator; the workers use the fake env) ---------------------------

WORKER_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from tutorial_utils.sim import libero_env
from test_evaluate_shards import FakeEnv
libero_env.make_env = lambda suite, task_id, **kw: FakeEnv(task_id)
from tutorial_utils.evaluate.parallel import worker_main
raise SystemExit(worker_main(["worker", sys.argv[1]]))
"""


@pytest.fixture
def fake_workers(tmp_path, monkeypatch):
    script = tmp_path / "fake_worker.py"
    script.write_text(textwrap.dedent(WORKER_SCRIPT.format(tests=str(Path(__file__).parent))))
    monkeypatch.setattr(parallel, "worker_command", lambda f: [sys.executable, str(script), str(f)])


@pytest.mark.slow
def test_two_workers_report_as_one_process(tmp_path, fake_env, fake_workers, server, capsys):
    one, one_log = _run(_cfg(server.port, tmp_path / "one"), capsys)
    res = parallel.evaluate(_cfg(server.port, tmp_path / "two", workers=2), poll_s=0.1)
    two_log = capsys.readouterr().out
    assert two_log == one_log
    assert helpers.comparable_results(res) == helpers.comparable_results(one) and res["finished"]
    assert json.loads((tmp_path / "two" / "results.json").read_text())["config"]["workers"] == 2
    w1 = tmp_path / "two" / "workers" / "w1"
    assert json.loads((w1 / "worker.json").read_text())["pairs"] == [[1, 1], [1, 2], [2, 0], [2, 1], [2, 2]]
    assert (w1 / "eval_libero_spatial.log").read_text().splitlines()[1] == "Starting episode 5..."
    videos = sorted(p.name for p in (tmp_path / "two" / "videos").iterdir())
    assert videos == sorted(p.name for p in (tmp_path / "one" / "videos").iterdir()) and len(videos) == 9


@pytest.mark.slow
def test_workers_inside_a_shard_report_as_one_process_of_that_shard(tmp_path, fake_env, fake_workers, server, capsys):
    s1, s1_log = _run(_cfg(server.port, tmp_path / "s1", shard=1, num_shards=2), capsys)
    res = parallel.evaluate(_cfg(server.port, tmp_path / "s1w", shard=1, num_shards=2, workers=3), poll_s=0.1)
    assert capsys.readouterr().out == s1_log and helpers.comparable_results(res) == helpers.comparable_results(s1)
    assert sorted(p.name for p in (tmp_path / "s1w" / "workers").iterdir()) == ["w0", "w1", "w2"]


def test_a_failing_worker_stops_the_run_and_shows_its_traceback(tmp_path, fake_workers, capsys):
    cfg = _cfg(free_port(), tmp_path, workers=2, connect_timeout=1)
    with pytest.raises(parallel.WorkerFailed, match=r"worker \d of 2 exited with code 1") as exc:
        parallel.evaluate(cfg, poll_s=0.1)
    out = capsys.readouterr().out
    assert "ServerUnavailable" in out and "Traceback" in out and "Task:" not in out
    assert "eval_libero_spatial.log" in str(exc.value)
    assert logs.parse_eval_log(out)["errors"][-1].startswith("tutorial_utils.serve.protocol.ServerUnavailable")


def test_an_empty_shard_is_a_configuration_error_not_a_failed_setup():
    from tutorial_utils.errors import ConfigError
    from tutorial_utils.evaluate import shards

    assert shards.shard_pairs([0, 1], 1, 1, 2) == [(1, 0)]
    with pytest.raises(ConfigError, match=r"shard=0 with num_shards=3 gets no episode: .* only 2 .*num_shards <= 2"):
        shards.shard_pairs([0, 1], 1, 0, 3)
