"""tutorial_utils.runs.health: each finding triggers on a run crafted to have the problem and
stays quiet on a healthy one; the "loss falls but success is 0" checklist; status.json and the CLI.

The runs are written by :func:`helpers.make_run` (also used by test_runs_compare.py): the files the training
loop writes (train_config.json, metrics.jsonl rows, status.json, checkpoints, statistics, a
dataset's meta/), with the values each test needs."""

from __future__ import annotations

import datetime as dt
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import STATS, decaying, make_run, results
from tutorial_utils import jobs
from tutorial_utils.io import dir_size
from tutorial_utils.runs import health
from tutorial_utils.runs.cli import main as runs_cli


def _now(**delta) -> str:
    return (dt.datetime.now() - dt.timedelta(**delta)).isoformat(timespec="milliseconds")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _codes(d: Path, **kw) -> list[str]:
    return health.diagnose(d, **kw).codes()


# --- a healthy run -----------------------------------------------------------------------------------


def test_a_healthy_run_has_no_finding_and_its_checklist_passes(tmp_path):
    d = make_run(tmp_path)
    diag = health.diagnose(d, free_bytes=10**12)
    assert diag.findings == [] and diag.ok and diag.state == "finished"
    status = {c.name: c.status for c in diag.checklist}
    assert status == {
        "normalisation statistics": "pass",
        "gripper sign": "pass",
        "camera keys": "pass",
        "image orientation": "unknown",
    }
    assert all(c.checked for c in diag.checklist)  # each says what it looked at
    # a running run with a fresh heartbeat and plenty of disk: still nothing
    live = {"state": "running", "step": 20, "total": 40, "pid": __import__("os").getpid()}
    d2 = make_run(tmp_path, "live", training={**live, "host": socket.gethostname(), "updated": _now()})
    assert health.diagnose(d2, free_bytes=10**12).findings == []


# --- each finding ----------------------------------------------------------------------------------------


def test_stale_heartbeat_and_dead_process(tmp_path):
    dead = make_run(
        tmp_path,
        "dead",
        training={
            "state": "running",
            "step": 7,
            "total": 20,
            "pid": _dead_pid(),
            "host": socket.gethostname(),
            "updated": _now(),
        },
    )
    (f,) = [f for f in health.diagnose(dead).findings if f.code == "stale"]
    assert f.severity == "error" and "is gone" in f.message and "runs resume dead" in f.fix
    old = make_run(
        tmp_path,
        "old",
        training={
            "state": "running",
            "step": 7,
            "total": 20,
            "pid": 1,
            "host": "other-host",
            "updated": _now(seconds=600),
        },
    )
    (f,) = [f for f in health.diagnose(old).findings if f.code == "stale"]
    assert "heartbeat is 60" in f.message and "other-host" in f.message


def test_non_finite_loss_in_the_rows_and_from_the_loop(tmp_path):
    d = make_run(tmp_path, "nan", losses=[*decaying(10), float("nan"), *decaying(5)])
    (f,) = [f for f in health.diagnose(d).findings if f.code == "non_finite_loss"]
    assert "step 11" in f.message and "optimizer_lr" in f.fix
    err = {"state": "failed", "step": 9, "total": 20, "error": "NonFiniteLoss: the loss became non-finite at step 9"}
    d2 = make_run(tmp_path, "raised", training=err)
    assert "non_finite_loss" in _codes(d2)


def test_diverging_loss_is_found_a_noisy_falling_one_is_not(tmp_path):
    up = decaying(30, 1.0, 0.2) + [0.2 * 1.15**i for i in range(1, 16)]  # falls, then climbs back above the start
    (f,) = [f for f in health.diagnose(make_run(tmp_path, "up", losses=up)).findings if f.code == "diverging_loss"]
    assert f.severity == "error" and "rose from its minimum" in f.message and "optimizer_lr" in f.fix
    bump = decaying(30, 1.0, 0.2) + [0.45] * 10  # well above the minimum, below the start: a warning
    assert [f.severity for f in health.diagnose(make_run(tmp_path, "bump", losses=bump)).findings] == ["warning"]
    noisy = [v * (1.3 if i % 2 else 0.7) for i, v in enumerate(decaying(60, 1.0, 0.2))]
    assert "diverging_loss" not in _codes(make_run(tmp_path, "noisy", losses=noisy))
    assert "diverging_loss" not in _codes(make_run(tmp_path, "short", losses=[0.1, 0.5, 0.9]))  # too few rows


def test_a_new_loss_after_a_first_phase_is_not_a_diverging_one(tmp_path):
    # VQ-BeT: the VQ-VAE's loss falls for n_vqvae_training_steps, then the GPT's loss (offset loss x 10000)
    # starts thousands of times higher and falls: only the rows after the first phase are judged
    phases = decaying(30, 1.0, 0.2) + decaying(30, 5000.0, 800.0)
    vqbet = {"policy": "vqbet", "policy_config": {"n_vqvae_training_steps": 30}}
    assert "diverging_loss" not in _codes(make_run(tmp_path, "phases", losses=phases, params=vqbet))
    # the same rows read as one loss (a family with one phase) are the alarm this check exists for
    assert "diverging_loss" in _codes(make_run(tmp_path, "one", losses=phases))
    # and a second phase that climbs is still found
    climbs = decaying(30, 1.0, 0.2) + decaying(30, 5000.0, 800.0) + [800.0 * 1.15**i for i in range(1, 16)]
    assert "diverging_loss" in _codes(make_run(tmp_path, "climbs", losses=climbs, params=vqbet))


def test_warmup_longer_than_the_run(tmp_path):
    d = make_run(tmp_path, "warm", params={"scheduler_warmup_steps": 500})
    (f,) = [f for f in health.diagnose(d).findings if f.code == "warmup_longer_than_run"]
    assert "500 >= steps=20" in f.message and "about 2" in f.fix
    assert "warmup_longer_than_run" not in _codes(make_run(tmp_path, "ok", params={"scheduler_warmup_steps": 19}))


def test_data_bound_training(tmp_path):
    d = make_run(tmp_path, "slow_data", wait=0.55)
    (f,) = [f for f in health.diagnose(d).findings if f.code == "data_bound"]
    assert "55%" in f.message and "num_workers=1" in f.message and "num_workers" in f.fix
    # a slow start (workers starting) with a fast rest is not data-bound
    assert "data_bound" not in _codes(make_run(tmp_path, "warmup_wait", wait=[0.9] * 5 + [0.1] * 15))
    assert "data_bound" not in _codes(make_run(tmp_path, "at_limit", wait=0.30))


def test_disk_shortfall_before_the_next_checkpoint(tmp_path):
    stopped = {"state": "stopped", "step": 20, "total": 100, "stopped_by": "SIGTERM"}
    d = make_run(tmp_path, "disk", training=stopped, params={"steps": 100})  # saves left at 30..90 and 100
    size = dir_size(d / "checkpoints" / "step_000020")
    (f,) = [f for f in health.diagnose(d, free_bytes=size // 2).findings if f.code == "disk_shortfall"]
    assert f.severity == "error" and "next checkpoint (step 30) does not fit" in f.message and "8 save(s)" in f.message
    (f,) = [f for f in health.diagnose(d, free_bytes=4 * size).findings if f.code == "disk_shortfall"]
    assert f.severity == "warning" and "fills at about step 60" in f.message
    assert "disk_shortfall" not in _codes(d, free_bytes=20 * size)
    # keep_last=2 deletes an old checkpoint after each save: one more checkpoint's space is enough
    kept = make_run(tmp_path, "kept", training=stopped, params={"steps": 100, "keep_last": 2})
    assert "disk_shortfall" not in _codes(kept, free_bytes=2 * size)
    # a finished run saves nothing more
    assert "disk_shortfall" not in _codes(make_run(tmp_path, "done"), free_bytes=0)


def test_loss_falls_but_success_is_zero_runs_the_checklist(tmp_path):
    d = make_run(tmp_path, "zero")
    results(d / "evaluations" / "step_000020" / "results.json", 0, 10)
    diag = health.diagnose(d)
    (f,) = [f for f in diag.findings if f.code == "loss_falls_success_0"]
    assert (
        "0 of 10 episodes" in f.message and "no checked item failed" in f.message and "image orientation" in f.message
    )
    ok = make_run(tmp_path, "some")
    results(ok / "evaluations" / "step_000020" / "results.json", 3, 10)
    assert "loss_falls_success_0" not in _codes(ok)
    flat = make_run(tmp_path, "flat", losses=[0.5] * 20)  # the loss did not fall: another problem
    results(flat / "evaluations" / "step_000020" / "results.json", 0, 10)
    assert "loss_falls_success_0" not in _codes(flat)


def test_the_checklist_fails_what_is_wrong(tmp_path):
    bad_stats = json.loads(json.dumps(STATS))
    bad_stats["franka"]["action"]["max"][1] = bad_stats["franka"]["action"]["min"][1] + 1e-6  # y: noise only
    bad_stats["franka"]["action"]["min"][6] = 0.0  # a 0/1 gripper
    d = make_run(
        tmp_path, "bad", stats=bad_stats, cameras=("observation.images.front", "observation.images.wrist_image")
    )
    results(d / "evaluations" / "step_000020" / "results.json", 0, 5, gripper="robosuite")
    diag = health.diagnose(d)
    items = {c.name: c for c in diag.checklist}
    assert items["normalisation statistics"].status == "fail" and "dims [1]" in items["normalisation statistics"].detail
    assert items["gripper sign"].status == "fail"
    assert (
        "spans [0, 1]" in items["gripper sign"].detail and "served gripper 'robosuite'" in items["gripper sign"].detail
    )
    assert items["camera keys"].status == "fail" and "observation.images.front" in items["camera keys"].detail
    (f,) = [f for f in diag.findings if f.code == "loss_falls_success_0"]
    assert "FAILED normalisation statistics, gripper sign, camera keys" in f.message
    # one constant dim is noted; all of them constant is statistics of nothing
    still = json.loads(json.dumps(STATS))
    still["franka"]["action"]["max"][5] = still["franka"]["action"]["min"][5]
    (c,) = [
        c for c in health.diagnose(make_run(tmp_path, "one_still", stats=still)).checklist if "statistics" in c.name
    ]
    assert c.status == "pass" and "dims [5] are constant" in c.detail
    still["franka"]["action"]["max"][:6] = still["franka"]["action"]["min"][:6]
    (c,) = [
        c for c in health.diagnose(make_run(tmp_path, "all_still", stats=still)).checklist if "statistics" in c.name
    ]
    assert c.status == "fail" and "every normalised action dim is constant" in c.detail
    # no statistics and no dataset: the items say they could not check
    gone = make_run(tmp_path, "gone", stats=None)
    __import__("shutil").rmtree(gone / "dataset")
    items = {c.name: c.status for c in health.diagnose(gone).checklist}
    assert items["normalisation statistics"] == "unknown" and items["camera keys"] == "unknown"


def _scene(size: int) -> np.ndarray:
    """A LIBERO-like first frame: a dark wall above, a bright table below, a bowl on the left."""
    img = np.zeros((64, 64, 3), np.uint8)
    img[:32] = np.linspace(20, 90, 32, dtype=np.uint8)[:, None, None]
    img[32:] = 200
    img[40:52, 8:24] = 40
    return np.repeat(np.repeat(img, size // 64, 0), size // 64, 1)


def test_image_orientation_compares_training_and_evaluation_frames(tmp_path):
    from tutorial_utils.data.video import encode_video

    def run_with_eval(name: str, eval_frame: np.ndarray) -> Path:
        d = make_run(tmp_path, name)
        cam = d / "dataset" / "videos" / "chunk-000" / "observation.images.image"
        encode_video(cam / "episode_000000.mp4", np.stack([_scene(64)] * 2), fps=10)
        ev = tmp_path / f"{name}_eval"
        encode_video(ev / "videos" / "task00_ep00.mp4", np.stack([eval_frame] * 2), fps=10)
        res = results(ev / "results.json", 1, 2)
        data = json.loads(res.read_text())
        (d / "evaluations" / "step_000020").mkdir(parents=True)
        data["config"] = {"output_dir": str(ev)}
        (d / "evaluations" / "step_000020" / "results.json").write_text(json.dumps(data))
        return d

    upright = {c.name: c for c in health.diagnose(run_with_eval("up", _scene(128))).checklist}["image orientation"]
    assert upright.status == "pass" and "same way up" in upright.detail and "1 training video(s)" in upright.checked
    flipped = run_with_eval("flip", np.ascontiguousarray(_scene(128)[::-1, ::-1]))
    check = {c.name: c for c in health.diagnose(flipped).checklist}["image orientation"]
    assert check.status == "fail" and "upside down" in check.detail and "evaluation video(s)" in check.checked


# --- status.json and the CLI -----------------------------------------------------------------------


def test_record_writes_the_diagnosis_into_status_json(tmp_path):
    d = make_run(tmp_path, "warm", params={"scheduler_warmup_steps": 500})
    health.record(d)
    status = jobs.read_status(d)
    assert status["training"]["state"] == "finished"  # merged, not replaced
    assert [f["code"] for f in status["health"]["findings"]] == ["warmup_longer_than_run"]
    assert status["health"]["ok"] and len(status["health"]["checklist"]) == 4


def test_cli_diagnose(tmp_path, capsys):
    d = make_run(tmp_path, "nan", losses=[*decaying(10), float("inf")])
    assert runs_cli(["diagnose", str(d), "--write"]) == 1  # an error finding
    out = capsys.readouterr().out
    assert "[error] non_finite_loss" in out and "fix:" in out and "checklist" in out
    assert jobs.read_status(d)["health"]["ok"] is False
    assert runs_cli(["diagnose", str(make_run(tmp_path, "fine")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
    assert runs_cli(["diagnose", str(tmp_path / "nope")]) == 2
    assert "no run" in capsys.readouterr().err


@pytest.mark.slow
def test_a_real_tiny_run_is_healthy(tmp_path):
    """The loop's own files (metrics rows, status.json, checkpoints, statistics) read as healthy."""
    torch = pytest.importorskip("torch")
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.data import synthetic_source
    from tutorial_utils.train.loop import train

    torch.set_num_threads(1)
    from helpers import TINY_MLP_RUN

    base = {**TINY_MLP_RUN, "steps": 8}
    source = synthetic_source(n_episodes=5, length=12, image_size=16)
    train(TrainConfig.from_overrides({**base, "output_dir": str(tmp_path / "real")}), source=source)
    diag = health.diagnose(tmp_path / "real", free_bytes=10**12)
    quiet = ("stale", "non_finite_loss", "warmup_longer_than_run", "disk_shortfall", "loss_falls_success_0")
    assert not set(diag.codes()) & set(quiet), diag.text()
    assert {c.name: c.status for c in diag.checklist}["normalisation statistics"] == "pass"
    warm = {**base, "output_dir": str(tmp_path / "warm"), "scheduler_warmup_steps": 50}
    train(TrainConfig.from_overrides(warm), source=source)
    assert "warmup_longer_than_run" in health.diagnose(tmp_path / "warm").codes()
    # the training process found it itself while it trained: once in train.log (validations at
    # steps 4 and 8), with its fix, and in status.json
    # (data_bound depends on how busy the machine is, so it is left out of what these lines must be)
    lines = [
        x
        for x in (tmp_path / "warm" / "train.log").read_text().splitlines()
        if x.startswith("Health check") and "] data_bound:" not in x
    ]
    assert len(lines) == 1 and "step 4: [warning] warmup_longer_than_run" in lines[0] and "Fix: set" in lines[0], lines
    recorded = jobs.read_status(tmp_path / "warm")["health"]
    assert recorded["by"] == "the training process at step 8"
    assert [f["code"] for f in recorded["findings"] if f["code"] != "data_bound"] == ["warmup_longer_than_run"]
    healthy_log = (tmp_path / "real" / "train.log").read_text()
    assert not any(f"] {code}:" in healthy_log for code in quiet), healthy_log
