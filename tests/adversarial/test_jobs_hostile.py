"""The job runner against careless or unlucky users: wrong parameter types, a reused run
directory, a runner killed with SIGKILL (its run must show as ``stale``, not ``running``
forever), and the heartbeat that tells the two apart.

The runner that is killed runs in its own process group, started by the test and killed by
that group's id.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_notebook
from helpers import wait_for
from tutorial_utils import jobs
from tutorial_utils.errors import ConfigError, TutorialError

PARAMS = "x = 1\nrate = 0.5\nname = 'a'\nflag = False\nlimit = None\nrun_dir = ''"


@pytest.fixture
def typed_nb(tmp_path):
    return write_notebook(
        tmp_path / "typed.md",
        [("code", "from pathlib import Path\nPath(run_dir, 'out.txt').write_text(repr((x, rate, name, flag, limit)))")],
        params=PARAMS,
    )


# --- parameter types ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"x": 2.5}, "x=2.5 is float, but its default 1 is int"),
        ({"x": "3"}, "x='3' is str"),
        ({"x": True}, "x=True is bool"),
        ({"rate": "fast"}, "rate='fast' is str, but its default 0.5 is int or float"),
        ({"name": 7}, "name=7 is int, but its default 'a' is str"),
        ({"flag": 1}, "flag=1 is int, but its default False is bool"),
        ({"x": None}, "x=None is None"),
    ],
)
def test_wrong_parameter_type_is_an_error_naming_the_parameter(typed_nb, runs_dir, params, named):
    with pytest.raises(jobs.JobParameterError, match="wrong parameter type") as info:
        jobs.run_notebook(typed_nb, params)
    assert named in str(info.value)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, TutorialError)
    assert isinstance(info.value, jobs.JobError)  # the CLI's `error:` path
    assert not runs_dir.exists() or not any(runs_dir.iterdir())  # nothing was started


def test_compatible_types_run(typed_nb, runs_dir):
    res = jobs.run_notebook(typed_nb, {"x": 3, "rate": 2, "name": "b", "flag": True, "limit": 2.5})
    assert (res.run_dir / "out.txt").read_text() == "(3, 2, 'b', True, 2.5)"
    res = jobs.run_notebook(typed_nb, {"limit": "anything", "rate": 1.5})
    assert (res.run_dir / "out.txt").read_text() == "(1, 1.5, 'a', False, 'anything')"


@pytest.mark.slow
def test_cli_refuses_a_float_for_an_int_and_keeps_text_for_a_string(typed_nb, tmp_path):
    env = {**os.environ, "TUTORIAL_RUNS_DIR": str(tmp_path / "runs")}
    base = [sys.executable, "-m", "tutorial_utils", "job", "run", str(typed_nb), "--quiet"]
    bad = subprocess.run([*base, "-p", "x", "2.5"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "x=2.5 is float, but its default 1 is int" in bad.stderr
    ok = subprocess.run([*base, "-p", "name", "0", "-p", "x", "4"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    run = next((tmp_path / "runs").iterdir())
    assert (run / "out.txt").read_text() == "(4, 0.5, '0', False, None)"  # "0" for a string parameter


# --- run directories -------------------------------------------------------------------------------


def test_a_run_directory_that_holds_a_run_is_refused(typed_nb, tmp_path, runs_dir):
    run = tmp_path / "run"
    first = jobs.run_notebook(typed_nb, {"x": 5}, run_dir=run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(jobs.JobError, match=r"already holds a run \(params.yaml, status.json\).*new --run-dir"):
        jobs.run_notebook(typed_nb, {"x": 6}, run_dir=run)
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after == before and (first.run_dir / "out.txt").read_text().startswith("(5,")
    # a status.json alone (a run killed before its params were written) is a run too
    other = tmp_path / "other"
    other.mkdir()
    (other / jobs.STATUS_FILE).write_text('{"state": "running"}')
    with pytest.raises(jobs.JobError, match=r"already holds a run \(status.json\)"):
        jobs.run_notebook(typed_nb, run_dir=other)
    assert json.loads((other / jobs.STATUS_FILE).read_text()) == {"state": "running"}
    # an empty existing folder is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    assert jobs.run_notebook(typed_nb, run_dir=empty).run_dir == empty.resolve()


@pytest.mark.slow
def test_cli_refuses_an_existing_run_dir(typed_nb, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / jobs.PARAMS_FILE).write_text("job: other\n")
    r = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "job", "run", str(typed_nb), "--run-dir", str(run), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "already holds a run" in r.stderr
    assert (run / jobs.PARAMS_FILE).read_text() == "job: other\n" and not (run / "typed.ipynb").exists()


# --- heartbeat and stale runs ----------------------------------------------------------------------


def test_heartbeat_is_refreshed_while_the_job_runs(tmp_path, runs_dir, monkeypatch):
    monkeypatch.setattr(jobs.records, "HEARTBEAT_S", 0.2)
    nb = write_notebook(
        tmp_path / "beat.md",
        [
            (
                "code",
                "import json, time\nfrom pathlib import Path\nf = Path(run_dir, 'status.json')\n"
                "seen = set()\nfor _ in range(15):\n    seen.add(json.loads(f.read_text())['updated'])\n"
                "    time.sleep(0.1)\nPath(run_dir, 'beats.txt').write_text(str(len(seen)))",
            )
        ],
        params="run_dir = ''",
    )
    res = jobs.run_notebook(nb)
    assert int((res.run_dir / "beats.txt").read_text()) >= 3  # the heartbeat moved while the cell ran
    st = jobs.read_status(res.run_dir)
    assert st["state"] == "succeeded" and st["pid"] == os.getpid() and st["host"] == socket.gethostname()
    assert jobs.list_runs(runs_dir)[0]["state"] == "succeeded"


def test_run_state_from_pid_and_heartbeat():
    now = dt.datetime.now().isoformat(timespec="milliseconds")
    old = (dt.datetime.now() - dt.timedelta(seconds=jobs.STALE_AFTER_S + 5)).isoformat(timespec="milliseconds")
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert jobs.run_state({"state": "running", "pid": os.getpid(), "host": host, "updated": now}) == "running"
    assert jobs.run_state({"state": "running", "pid": dead.pid, "host": host, "updated": now}) == "stale"
    assert jobs.run_state({"state": "running", "pid": 1, "host": "elsewhere", "updated": old}) == "stale"
    assert jobs.run_state({"state": "running", "pid": 1, "host": "elsewhere", "updated": now}) == "running"
    assert jobs.run_state({"state": "succeeded", "pid": dead.pid, "host": host, "updated": old}) == "succeeded"


def test_sigkilled_runner_shows_as_stale(tmp_path):
    nb = write_notebook(tmp_path / "sleepy.md", [("code", "import time\ntime.sleep(300)")], params="run_dir = ''")
    runs = tmp_path / "runs"
    env = {**os.environ, "TUTORIAL_RUNS_DIR": str(runs)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tutorial_utils", "job", "run", str(nb), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        assert wait_for(lambda: runs.is_dir() and any(runs.glob("*/sleepy.ipynb")), proc=proc)
        run = next(runs.iterdir())
        st = jobs.read_status(run)
        assert st["state"] == "running" and st["pid"] == proc.pid and {"host", "updated"} <= set(st)
        assert [r["state"] for r in jobs.list_runs(runs)] == ["running"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert jobs.read_status(run)["state"] == "running"  # what the killed runner left behind ...
    assert [r["state"] for r in jobs.list_runs(runs)] == ["stale"]  # ... is shown as stale
    listed = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "job", "list"], capture_output=True, text=True, env=env
    )
    assert listed.returncode == 0 and run.name in listed.stdout
    line = next(x for x in listed.stdout.splitlines() if run.name in x)
    assert " stale " in f"{line} " and "running" not in line and "stale: the run's process is gone" in listed.stdout


def test_heartbeat_and_job_updates_never_lose_each_other(tmp_path, runs_dir, monkeypatch):
    """The heartbeat (runner) and update_status (kernel) both merge into status.json."""
    monkeypatch.setattr(jobs.records, "HEARTBEAT_S", 0.01)
    nb = write_notebook(
        tmp_path / "busy.md",
        [
            (
                "code",
                "from tutorial_utils import jobs\nfor i in range(150):\n    jobs.update_status(run_dir, **{f'k{i}': i})",
            )
        ],
        params="run_dir = ''",
    )
    res = jobs.run_notebook(nb)
    st = jobs.read_status(res.run_dir)
    assert all(st.get(f"k{i}") == i for i in range(150)) and st["state"] == "succeeded"
    assert not list(Path(res.run_dir).glob(".status.json.*"))  # no temp file left behind
