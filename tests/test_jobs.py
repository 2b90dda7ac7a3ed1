import json
import subprocess
import sys

import pytest
import yaml

from conftest import write_notebook
from tutorial_utils import jobs


@pytest.fixture
def job_nb(tmp_path):
    return write_notebook(
        tmp_path / "jobs" / "square.md",
        [
            ("md", "# Square a number"),
            (
                "code",
                "from pathlib import Path\nout = Path(run_dir) / 'result.json'\nout.write_text(str(n * n))\nprint('squared', n)",
            ),
        ],
        params="from tutorial_utils.profiles import pick\n\nn = pick(ci=3, cpu=30)\nrun_dir = ''",
    )


def test_run_notebook_makes_a_self_describing_run(job_nb, runs_dir):
    res = jobs.run_notebook(job_nb, {"n": 7})
    assert res.run_dir.parent == runs_dir
    assert (res.run_dir / "result.json").read_text() == "49"
    params = yaml.safe_load((res.run_dir / "params.yaml").read_text())
    assert params["parameters"]["n"] == 7 and params["profile"] == "ci"
    status = json.loads((res.run_dir / "status.json").read_text())
    assert status["state"] == "succeeded" and status["job"] == "square" and status["wall_s"] > 0
    executed = json.loads(res.executed.read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in executed["cells"])
    assert "squared 7" in (res.run_dir / "job.log").read_text()


def test_defaults_come_from_the_profile(job_nb, runs_dir, monkeypatch):
    res = jobs.run_notebook(job_nb)
    assert (res.run_dir / "result.json").read_text() == "9"
    monkeypatch.setenv("TUTORIAL_PROFILE", "cpu")
    res = jobs.run_notebook(job_nb)
    assert (res.run_dir / "result.json").read_text() == "900"


def test_reuse_returns_the_finished_run(job_nb, runs_dir):
    first = jobs.run_notebook(job_nb, {"n": 2}, reuse=True)
    again = jobs.run_notebook(job_nb, {"n": 2}, reuse=True)
    other = jobs.run_notebook(job_nb, {"n": 4}, reuse=True)
    assert again.reused and again.run_dir == first.run_dir
    assert not other.reused and other.run_dir != first.run_dir


def test_unknown_parameter_is_named(job_nb, runs_dir):
    with pytest.raises(jobs.JobError, match=r"unknown parameter\(s\) nn\. This job's parameters are: n, run_dir"):
        jobs.run_notebook(job_nb, {"nn": 1})
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_missing_notebook_is_a_clear_error(runs_dir):
    with pytest.raises(jobs.JobError, match="job notebook 'nope.md' not found.*Known jobs"):
        jobs.run_notebook("nope.md")


def test_unwritable_run_dir_is_a_clear_error(job_nb, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(jobs.JobError, match="is not writable.*TUTORIAL_RUNS_DIR"):
        jobs.run_notebook(job_nb, {"n": 1}, run_dir=blocker / "run")


def test_failing_cell_raises_and_keeps_the_executed_notebook(tmp_path, runs_dir):
    nb = write_notebook(
        tmp_path / "boom.md",
        [("code", "x = 1"), ("code", "raise ValueError('the data folder is empty')")],
        params="run_dir = ''",
    )
    with pytest.raises(jobs.JobFailed, match="ValueError: the data folder is empty") as info:
        jobs.run_notebook(nb)
    err = info.value
    assert err.executed.is_file()
    assert "the data folder is empty" in err.executed.read_text()
    status = json.loads((err.run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["error"]["ename"] == "ValueError"


@pytest.mark.slow
def test_cli_runs_a_job_and_reports_errors(job_nb, tmp_path):
    env_runs = tmp_path / "cli-runs"
    env = {
        "TUTORIAL_RUNS_DIR": str(env_runs),
        "PATH": str(__import__("pathlib").Path(sys.executable).parent) + ":/usr/bin:/bin",
    }
    ok = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "job", "run", str(job_nb), "-p", "n", "5", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert ok.returncode == 0, ok.stderr
    run_dir = next(env_runs.iterdir())
    assert (run_dir / "result.json").read_text() == "25"
    bad = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "job", "run", str(job_nb), "-p", "m", "5"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 1 and "unknown parameter(s) m" in bad.stderr


def test_a_notebook_that_claims_its_run_dir_runs_under_the_runner(tmp_path, runs_dir):
    """The job notebooks call ``jobs.ensure_run_dir(run_dir, ...)`` themselves; under the runner that
    directory already holds the runner's params.yaml and must be accepted (and only that one)."""
    used = tmp_path / "used"
    used.mkdir()
    (used / "params.yaml").write_text("job: other\n")
    nb = write_notebook(
        tmp_path / "jobs" / "claims.md",
        [
            (
                "code",
                "from pathlib import Path\nfrom tutorial_utils import jobs\n"
                "run_dir = jobs.ensure_run_dir(run_dir, 'claims')\n"
                "(Path(run_dir) / 'ok.txt').write_text('yes')\n"
                "try:\n    jobs.ensure_run_dir(other, 'claims')\nexcept jobs.JobError:\n    print('refused other')",
            ),
        ],
        params=f"run_dir = ''\nother = {str(used)!r}",
    )
    res = jobs.run_notebook(nb)
    assert (res.run_dir / "ok.txt").read_text() == "yes"
    assert "refused other" in (res.run_dir / "job.log").read_text()
    assert jobs.CLAIMED_ENV not in __import__("os").environ


@pytest.mark.slow
def test_the_train_job_notebook_runs_under_the_runner(runs_dir):
    """The real train job (ci profile: 2 steps on the synthetic dataset) through ``job run``."""
    # a family's own parameter is a job parameter too (the train job's extra_parameters in jobs/registry.py)
    res = jobs.run_notebook("notebooks/jobs/train.md", {"policy": "mlp", "hidden_dim": 48, "freeze_modules": ""})
    status = json.loads((res.run_dir / "status.json").read_text())
    assert status["state"] == "succeeded"
    assert (res.run_dir / "train.log").is_file()
    assert json.loads((res.run_dir / "train_config.json").read_text())["policy_config"]["hidden_dim"] == 48


def test_a_family_parameter_of_another_family_names_its_owner(runs_dir):
    with pytest.raises(jobs.JobError, match=r"chunk_size is a parameter of act, not of policy='mini'.*-p policy act"):
        jobs.run_notebook("notebooks/jobs/train.md", {"chunk_size": 16})
    with pytest.raises(jobs.JobParameterError, match="hidden_dim=.*is str"):  # typed by the family's default
        jobs.run_notebook("notebooks/jobs/train.md", {"policy": "mlp", "hidden_dim": "wide"})
    with pytest.raises(jobs.JobError, match="nosuch"):  # an unknown family
        jobs.run_notebook("notebooks/jobs/train.md", {"policy": "nosuch", "hidden_dim": 4})
    assert not runs_dir.exists() or not list(runs_dir.iterdir())  # refused before a run directory was made


def test_heartbeat_beats_until_stopped_and_survives_a_full_disk():
    """The one heartbeat thread (the job runner's and the trainer's): an OSError in a beat is
    retried at the next one, stop() ends the thread."""
    import time as _time

    from tutorial_utils.jobs import Heartbeat

    calls = []

    def beat():
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")

    with Heartbeat(beat, interval=0.01, name="test-heartbeat") as hb:
        deadline = _time.monotonic() + 10
        while len(calls) < 3 and _time.monotonic() < deadline:
            _time.sleep(0.01)
    assert len(calls) >= 3 and not hb._thread.is_alive()
    n = len(calls)
    _time.sleep(0.05)
    assert len(calls) == n  # stopped


def test_cli_parameters_take_tuples_comma_separated_and_keep_strings_as_written():
    from tutorial_utils.jobs import check_parameter_types, cli_parameters

    defaults = {"optimizer_betas": (0.9, 0.95), "task_ids": "0", "steps": 10}
    got = cli_parameters([("optimizer_betas", "0.9,0.999"), ("task_ids", "0,3"), ("steps", "20")], defaults)
    assert got == {"optimizer_betas": [0.9, 0.999], "task_ids": "0,3", "steps": 20}
    assert cli_parameters([("optimizer_betas", "[0.9, 0.99]")], defaults) == {"optimizer_betas": [0.9, 0.99]}
    check_parameter_types("train.md", got, defaults)  # a list passes for a tuple default


def test_papermill_parameter_noise_is_dropped_and_real_warnings_kept():
    """papermill cannot parse ``x = pick(ci=..., cpu=...)``; the runner checks those parameters
    itself, so papermill's warnings about them stay out of the job log; others pass."""
    import logging

    from tutorial_utils.jobs import runner

    f = runner._papermill_noise(["batch_size", "steps"])

    def rec(msg):
        return logging.LogRecord("papermill.translators", logging.WARNING, __file__, 1, msg, None, None)

    assert not f.filter(rec("Unable to parse line 7 'batch_size = pick(ci=2, cpu=16, gpu=64)  # samples'."))
    assert not f.filter(rec("Passed unknown parameter: batch_size"))
    assert f.filter(rec("Passed unknown parameter: bacth_size"))  # a typo stays visible
    assert f.filter(rec("Unable to parse line 3 'a = b = 1'."))  # not ours: kept
    assert f.filter(rec("Executing Cell 3"))


def test_a_parameter_whose_config_takes_none_accepts_null_from_the_command_line():
    """zoo.md's train_minutes is ``float | None`` (None: train ``steps`` steps) but its cpu default is
    a number: ``-p train_minutes null`` is a value; ``-p steps null`` stays a type error."""
    from tutorial_utils import jobs

    nb = jobs.read_notebook(jobs.resolve_notebook("notebooks/jobs/zoo.md"))
    nullable = jobs.nullable_parameters(nb)
    assert "train_minutes" in nullable and "steps" not in nullable
    defaults = {"train_minutes": 10.0, "steps": 2}
    jobs.check_parameter_types("zoo.md", {"train_minutes": None}, defaults, nullable)
    with pytest.raises(jobs.JobParameterError, match="steps=None is None"):
        jobs.check_parameter_types("zoo.md", {"steps": None}, defaults, nullable)
    with pytest.raises(jobs.JobParameterError, match="train_minutes=None"):
        jobs.check_parameter_types("zoo.md", {"train_minutes": None}, defaults)  # without the config's word
