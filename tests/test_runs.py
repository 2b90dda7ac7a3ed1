"""tutorial_utils.runs: the registry, control (stop, pause, resume, rollback, SIGUSR1),
checkpoints (keep-last-N, mark best) and export, with the bad inputs and faults of issue 14.

Every run is the tiny ``mlp`` family on the in-memory synthetic source: a few steps each."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import TINY_MLP_RUN
from tutorial_utils import jobs, policies
from tutorial_utils.errors import ConfigError
from tutorial_utils.runs import checkpoints as rck
from tutorial_utils.runs import control, registry
from tutorial_utils.runs.cli import main as runs_cli
from tutorial_utils.runs.export import BundleError, ExportError, export, verify
from tutorial_utils.train.checkpoints import CheckpointNotFound, step_dir_name
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source
from tutorial_utils.train.loop import train

torch.set_num_threads(1)

BASE = {**TINY_MLP_RUN, "augment_shift": 0, "optimizer_lr": 3e-3}


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=5, length=12, image_size=16)


def _cfg(path, **kw) -> TrainConfig:
    return TrainConfig.from_overrides({**BASE, "output_dir": str(path), **kw})


def _at(step_wanted, action):
    def on_step(step, loss):
        if step == step_wanted:
            action()

    return on_step


def _rows(runs_dir) -> dict[str, dict]:
    return {r["run_id"]: r for r in registry.list_runs(runs_dir)}


# --- control: stop, resume, pause, parameter changes -------------------------------------------------


def test_stop_by_control_file_then_resume_is_exact(tmp_path, source):
    full = train(_cfg(tmp_path / "full", steps=12), source=source)
    run = tmp_path / "part"
    part = train(_cfg(run, steps=12), source=source, on_step=_at(5, lambda: control.stop(run)))
    assert part.stopped_by == "control:stop" and part.steps_done == 5
    state = json.loads((run / "checkpoints/last/training_state.json").read_text())
    assert state["step"] == 5 and state["reason"] == "control:stop"
    assert json.loads((run / "control.json").read_text())["acknowledged"]["step"] == 5
    row = _rows(tmp_path)["part"]
    assert (row["state"], row["step"], row["total"], row["job"]) == ("stopped", 5, 12, "train")
    assert row["bytes"] > 0 and row["best"] is not None and row["wall_s"] > 0
    with pytest.raises(registry.RunBusy, match="stopped, not running"):
        control.stop(run)  # nothing reads the file now

    rest = control.resume(run, source=source)
    assert [s for s, _ in rest.losses] == list(range(6, 13))
    assert part.losses + rest.losses == full.losses  # bit-identical
    assert _rows(tmp_path)["part"]["state"] == "finished"
    cfg = json.loads((run / "train_config.json").read_text())
    assert cfg["changes"] == [] and [r["step"] for r in cfg["resumes"]] == [5]
    status = jobs.read_status(run)["training"]
    assert status["state"] == "finished" and status["pid"] == os.getpid() and status["step"] == 12


def test_pause_shows_in_list_runs_and_resume_changes_only_allowed_parameters(tmp_path, source):
    run = tmp_path / "p"
    res = train(_cfg(run, steps=6), source=source, on_step=_at(3, lambda: control.pause(run)))
    assert res.stopped_by == "control:pause" and res.summary["state"] == "paused"
    row = _rows(tmp_path)["p"]
    assert (row["state"], row["step"], row["total"]) == ("paused", 3, 6)

    with pytest.raises(ConfigError, match="changes batch_size") as info:
        control.resume(run, source=source, batch_size=2)
    assert "optimizer_lr" in str(info.value)  # names what may change
    with pytest.raises(ConfigError, match="policy.hidden_dim"):
        control.resume(run, source=source, hidden_dim=32)
    assert _rows(tmp_path)["p"]["state"] == "paused"  # a refused resume changes nothing

    rest = control.resume(run, source=source, optimizer_lr=1e-3, steps=8)
    assert rest.steps_done == 8 and rest.summary["start_step"] == 3
    changes = json.loads((run / "train_config.json").read_text())["changes"]
    assert sorted((c["name"], c["step"], c["old"], c["new"]) for c in changes) == [
        ("optimizer_lr", 3, 3e-3, 1e-3),
        ("steps", 3, 6, 8),
    ]
    lr4 = next(r["lr"] for r in registry.read_metrics(run) if r["step"] == 4 and "lr" in r)
    factor = 0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi * 3 / 8))  # the new peak on the new 8-step cosine
    assert lr4 == pytest.approx(1e-3 * factor)


def test_sigusr1_stops_with_a_checkpoint(tmp_path, source):
    run = tmp_path / "u"
    res = train(_cfg(run, steps=6), source=source, on_step=_at(2, lambda: os.kill(os.getpid(), signal.SIGUSR1)))
    assert res.stopped_by == "SIGUSR1" and res.steps_done == 2
    assert (run / "checkpoints/last").resolve().name == "step_000002"
    assert _rows(tmp_path)["u"]["state"] == "stopped"


def test_a_control_file_with_garbage_is_ignored_with_a_warning(tmp_path, source, capsys):
    run = tmp_path / "g"

    def scribble(step, loss):
        if step == 2:
            (run / "control.json").write_text("{not json")
        if step == 4:
            (run / "control.json").write_text(json.dumps({"command": "explode"}))

    res = train(_cfg(run, steps=6), source=source, on_step=scribble)
    assert res.stopped_by is None and res.steps_done == 6
    log = (run / "train.log").read_text()
    assert "control.json is not JSON" in log and "'explode' is not one of stop, pause" in log


def test_an_old_command_does_not_stop_the_resumed_run(tmp_path, source):
    run = tmp_path / "o"
    train(_cfg(run, steps=4), source=source, on_step=_at(2, lambda: control.pause(run)))
    res = control.resume(run, source=source)  # control.json still says pause (acknowledged)
    assert res.stopped_by is None and res.steps_done == 4


# --- rollback, resume_from ------------------------------------------------------------------------------


def test_rollback_forks_a_new_run_and_resume_from_an_earlier_step(tmp_path, source):
    run = tmp_path / "r"
    full = train(_cfg(run, steps=12), source=source)
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [step_dir_name(s) for s in (4, 8, 12)]

    with pytest.raises(CheckpointNotFound, match="step_000004, step_000008, step_000012") as info:
        control.rollback(run, "step_000099")
    assert isinstance(info.value, LookupError)
    with pytest.raises(CheckpointNotFound, match="only the weights"):
        control.rollback(run, "best")

    fork = control.rollback(run, "step_000004")
    assert fork != run and (fork / "checkpoints/last").resolve().name == "step_000004"
    assert (run / "checkpoints/step_000012").is_dir() and (run / "checkpoints/last").resolve().name == "step_000012"
    assert json.loads((fork / "train_config.json").read_text())["forked_from"]["step"] == 4
    assert max(r["step"] for r in registry.read_metrics(fork)) == 4
    assert _rows(tmp_path)[fork.name]["state"] == "created"
    rest = control.resume(fork, source=source)
    assert rest.losses == full.losses[4:]  # the fork continues exactly

    again = control.resume(run, resume_from="step_000008", source=source)  # in place: 12 is discarded
    assert again.summary["start_step"] == 8 and again.losses == full.losses[8:]
    with pytest.raises(CheckpointNotFound):
        control.resume(run, resume_from="step_000099", source=source)


# --- registry: delete, stale, copy, metrics ------------------------------------------------------------


def _fake_running(path, pid: int, age_s: float = 0.0) -> None:
    path.mkdir(parents=True)
    updated = (dt.datetime.now() - dt.timedelta(seconds=age_s)).isoformat(timespec="milliseconds")
    jobs.update_status(
        path, training={"state": "running", "pid": pid, "host": socket.gethostname(), "updated": updated}
    )
    (path / "blob.bin").write_bytes(b"x" * 5000)


def test_delete_refuses_a_running_run_and_reports_the_space_freed(tmp_path, source):
    _fake_running(tmp_path / "live", os.getpid())
    with pytest.raises(registry.RunBusy, match="is running"):
        registry.delete("live", tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _fake_running(tmp_path / "gone", dead.pid)
    _fake_running(tmp_path / "silent", os.getpid(), age_s=jobs.STALE_AFTER_S + 5)
    rows = _rows(tmp_path)
    assert (rows["live"]["state"], rows["gone"]["state"], rows["silent"]["state"]) == ("running", "stale", "stale")
    freed = registry.delete("gone", tmp_path)
    assert freed >= 5000 and not (tmp_path / "gone").exists()

    run = tmp_path / "t"  # a real training process holds its run
    refused = []

    def try_delete(step, loss):
        if step == 1:
            with pytest.raises(registry.RunBusy):
                registry.delete(run)
            refused.append(step)

    train(_cfg(run, steps=2, eval_freq=0), source=source, on_step=try_delete)
    assert refused == [1] and registry.delete(run) > 0 and not run.exists()
    with pytest.raises(registry.RunNotFound):
        registry.delete(tmp_path / "nope")


def test_copy_a_training_run_and_a_job_run(tmp_path, source):
    run = tmp_path / "c"
    train(_cfg(run, steps=2, eval_freq=0), source=source)
    new = registry.copy(run, steps=3, optimizer_lr=1e-3)
    assert new.parent == tmp_path and _rows(tmp_path)[new.name]["state"] == "created"
    with pytest.raises(ConfigError, match="unknown parameter 'stepz'"):
        registry.copy(run, stepz=3)
    res = registry.start(new, source=source)
    assert res.steps_done == 3 and res.summary["steps"] == 3
    assert registry.show(new)["copied_from"]["run"] == "c" and registry.train_config(new).optimizer_lr == 1e-3
    with pytest.raises(registry.RunBusy, match="started already"):
        registry.start(new, source=source)

    job_run = tmp_path / "j"
    job_run.mkdir()
    jobs.update_status(
        job_run,
        job="train",
        notebook="notebooks/jobs/train.md",
        state="succeeded",
        parameters={"steps": 2, "policy": "mlp", "run_dir": str(job_run)},
    )
    copied = json.loads((registry.copy(job_run, steps=5) / "copy.json").read_text())
    assert copied["kind"] == "job" and copied["parameters"]["steps"] == 5 and "run_dir" not in copied["parameters"]
    with pytest.raises(ConfigError, match="unknown parameter"):
        registry.copy(job_run, no_such_parameter=1)


def test_a_truncated_metrics_line_is_skipped(tmp_path, source):
    run = tmp_path / "m"
    train(_cfg(run, steps=4, eval_freq=0), source=source)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines.insert(2, lines[2][:17])  # a line cut short in the middle of the file
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="line 3"):
        rows = registry.read_metrics(run)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    with pytest.warns(UserWarning):
        assert registry.show(run)["metrics_tail"][-1]["step"] == 4


# --- checkpoints ---------------------------------------------------------------------------------------------


def test_keep_last_keeps_last_and_best_and_mark_best_by_hand(tmp_path, source):
    run = tmp_path / "k"
    train(_cfg(run, steps=8, save_freq=1, eval_freq=2, keep_last=2), source=source)
    root = run / "checkpoints"
    best = json.loads((root / "best/config.json").read_text())["step"]
    kept = {p.name for p in root.glob("step_*")}
    assert kept == {"step_000007", "step_000008", step_dir_name(best)}
    assert (root / "last").resolve().name == "step_000008" and (root / "best/model.safetensors").is_file()

    rows = {r["name"]: r for r in rck.list_checkpoints(run)}
    assert rows["step_000008"]["is_last"] and rows["best"]["is_best"] and rows[step_dir_name(best)]["is_best"]
    assert rows["step_000008"]["bytes"] > 0 and "val_action_mae" in rows["step_000008"]
    assert rows["step_000008"]["reason"] == "final" and rows["step_000007"]["resumable"]

    rck.mark_best(run, "step_000007")
    marked = json.loads((root / "best/config.json").read_text())["best"]
    assert marked["by"] == "hand" and marked["step"] == 7
    assert rck.prune(run, 1) == sorted(kept - {"step_000007", "step_000008"})  # the old best's step_* may go now
    assert {p.name for p in root.glob("step_*")} == {"step_000007", "step_000008"}
    control.resume(run, source=source, steps=10)  # validation improves or not: best stays the hand-marked one
    assert json.loads((root / "best/config.json").read_text())["best"]["from"] == "step_000007"

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"total_episodes": 10, "total_successes": 7, "success_rate": 0.7}))
    rck.attach_results(run, "best", results)
    ev = {r["name"]: r for r in rck.list_checkpoints(run)}["best"]
    assert ev["success_rate"] == 0.7 and ev["episodes"] == 10 and 0.39 < ev["ci95"][0] < 0.7 < ev["ci95"][1] < 0.92


# --- export -----------------------------------------------------------------------------------------


def test_export_bundle_parity_verify_and_serve(tmp_path, source):
    run = tmp_path / "e"
    train(_cfg(run, steps=4), source=source)
    bundle = tmp_path / "bundle"
    m = export(run / "checkpoints/last", bundle)
    assert m["family"] == "mlp" and m["step"] == 4 and m["parity"]["max_abs_diff"] <= 1e-6
    assert m["parity"]["data"] == "a seeded random batch"  # an in-memory source: no dataset on disk
    assert set(m["files"]) == {"model.safetensors", "config.json", "dataset_statistics.json"}
    assert m["packages"]["torch"] and m["schema"]["served"]["output"]["actions"]["shape"] == [8, 7]
    assert "val_action_mae" in m["metrics"]
    assert verify(bundle)["step"] == 4

    served = policies.make_policy("mlp", checkpoint=str(bundle))  # what `serve --checkpoint BUNDLE` does
    obs = {
        "observation/image": np.zeros((16, 16, 3), np.uint8),
        "observation/wrist_image": np.zeros((16, 16, 3), np.uint8),
        "observation/state": np.zeros(8, np.float32),
        "prompt": "x",
    }
    assert served.infer(obs)["actions"].shape == (8, 7) and served.metadata["checkpoint"] == "bundle"

    with pytest.raises(ExportError, match="not empty"):
        export(run / "checkpoints/last", bundle)
    assert verify(bundle)  # the refused export left it as it was

    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    data = bytearray((bad / "dataset_statistics.json").read_bytes())
    data[len(data) // 2] ^= 1
    (bad / "dataset_statistics.json").write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"dataset_statistics\.json changed \(sha256"):
        verify(bad)


def test_export_parity_runs_on_the_runs_validation_episodes(tmp_path):
    """A run trained on a dataset folder: parity is checked on frames of its held-out episodes,
    the same windows its validation reads, and the manifest says so."""
    from tutorial_utils.runs.export import validation_batch
    from tutorial_utils.train.job import resolve_dataset

    root = resolve_dataset("synthetic", tmp_path)
    run = tmp_path / "v"
    train(TrainConfig.from_overrides({**BASE, "output_dir": str(run), "dataset": str(root), "steps": 2}))
    m = export(run / "checkpoints/last", tmp_path / "bundle")
    assert "validation episodes of dataset" in m["parity"]["data"] and m["parity"]["max_abs_diff"] <= 1e-6
    batch, what = validation_batch(run / "checkpoints/last", policies.load(run / "checkpoints/last"), n=3)
    assert what.startswith("3 frames of the 1 validation episodes") and len(batch["task"]) == 3
    assert validation_batch(tmp_path / "bundle", policies.load(tmp_path / "bundle")) is None  # not in a run


def test_cli(tmp_path, source, capsys):
    run = tmp_path / "cli"
    train(_cfg(run, steps=2, eval_freq=0, save_freq=1), source=source)
    capsys.readouterr()
    assert runs_cli(["--runs-dir", str(tmp_path), "list"]) == 0
    assert "cli" in capsys.readouterr().out
    assert runs_cli(["--runs-dir", str(tmp_path), "checkpoints", "cli"]) == 0
    assert "step_000002" in capsys.readouterr().out
    assert runs_cli(["--runs-dir", str(tmp_path), "export", "cli:last", str(tmp_path / "b")]) == 0
    assert runs_cli(["verify", str(tmp_path / "b")]) == 0
    assert runs_cli(["--runs-dir", str(tmp_path), "stop", "cli"]) == 2
    assert "not running" in capsys.readouterr().err
    assert runs_cli(["--runs-dir", str(tmp_path), "delete", "cli"]) == 0
    assert "freed" in capsys.readouterr().out and not run.exists()


# --- other processes: the CLI against a running run, SIGKILL, DDP (slow) -------------------------------------

SCRIPT = """
import json, os, sys, torch
torch.set_num_threads(1)
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source
from tutorial_utils.train.loop import train
res = train(TrainConfig.from_overrides(json.loads(sys.argv[1])), source=synthetic_source(n_episodes=5, length=12, image_size=16))
# one write per line: two ranks share the pipe, and print() writes its pieces separately
os.write(1, f"STOPPED_BY {res.stopped_by} {res.steps_done}\\n".encode())
"""


def _script(tmp_path):
    p = tmp_path / "run_train.py"
    p.write_text(SCRIPT)
    return p


def _launch(tmp_path, run, **kw):
    kv = {**BASE, "output_dir": str(run), "steps": 100_000, "eval_freq": 0, **kw}
    return subprocess.Popen(
        [sys.executable, str(_script(tmp_path)), json.dumps(kv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_stop_from_another_process_with_the_cli_and_a_sigkill_reads_stale(tmp_path, source, capsys):
    from helpers import wait_for

    run = tmp_path / "cli_stop"
    proc = _launch(tmp_path, run, save_freq=0)
    try:
        assert wait_for(lambda: registry.run_state(run) == "running", proc=proc)
        assert runs_cli(["--runs-dir", str(tmp_path), "stop", "cli_stop", "--wait", "--timeout", "60"]) == 0
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    step = json.loads((run / "checkpoints/last/training_state.json").read_text())["step"]
    assert f"STOPPED_BY control:stop {step}" in out and registry.run_state(run) == "stopped"
    assert f"stopped at step {step}" in capsys.readouterr().out

    run = tmp_path / "killed"
    proc = _launch(tmp_path, run, save_freq=2)
    try:
        assert wait_for(lambda: (run / "checkpoints/last").exists(), proc=proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert _rows(tmp_path)["killed"]["state"] == "stale"  # the heartbeat's process is gone
    last = json.loads((run / "checkpoints/last/training_state.json").read_text())["step"]
    res = control.resume(run, source=source, steps=last + 2)
    assert res.summary["start_step"] == last and res.steps_done == last + 2
    assert registry.run_state(run) == "finished"


@pytest.mark.slow
def test_pause_by_control_file_under_accelerate_two_processes(tmp_path):
    from helpers import accelerate_two_processes, wait_for

    run = tmp_path / "ddp"
    kv = {**BASE, "output_dir": str(run), "steps": 100_000, "eval_freq": 0, "save_freq": 0, "batch_size": 2}
    cmd, env = accelerate_two_processes(_script(tmp_path), json.dumps(kv))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        metrics = run / "metrics.jsonl"
        assert wait_for(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 3, timeout=180, proc=proc)
        control.pause(run)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    state = json.loads((run / "checkpoints/last/training_state.json").read_text())
    assert state["reason"] == "control:pause" and state["world_size"] == 2, out[-3000:]
    assert out.count(f"STOPPED_BY control:pause {state['step']}") == 2  # both ranks, the same step
    assert registry.run_state(run) == "paused"


def test_two_controllers_at_once_leave_one_consistent_stop(tmp_path, source):
    """A stop and a pause sent at the same moment by two controllers: the control file is never
    half-written, the loop acts on one of them at one step, and the checkpoint it leaves loads."""
    import threading

    run = tmp_path / "two"
    sent = threading.Barrier(2)
    results: list = []

    def controller(command):
        sent.wait()
        results.append(control.send(run, command))

    def at_step_3(step, loss):
        if step == 3:
            threads = [threading.Thread(target=controller, args=(c,)) for c in ("stop", "pause")]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    res = train(_cfg(run, steps=10_000), source=source, on_step=at_step_3)
    assert len(results) == 2 and {r["command"] for r in results} == {"stop", "pause"}
    assert res.stopped_by in ("control:stop", "control:pause") and res.steps_done == 3  # read in the same step
    assert json.loads((run / "control.json").read_text())["command"] in ("stop", "pause")
    assert policies.load(run / "checkpoints" / "last") is not None


def test_export_on_a_full_disk_leaves_nothing(tmp_path, source, small_disk):
    from helpers import fill
    from tutorial_utils.errors import DiskFull

    run = tmp_path / "full"
    train(_cfg(run, steps=2), source=source)
    fill(small_disk, leave=4096)
    with pytest.raises(DiskFull):
        export(run / "checkpoints/last", small_disk / "bundle")
    assert not (small_disk / "bundle").exists()
    assert not [p.name for p in small_disk.iterdir() if p.name.startswith(".bundle")]
