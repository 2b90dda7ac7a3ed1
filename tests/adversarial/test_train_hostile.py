"""Training and the served policy against unlucky runs and hostile inputs: two training
processes on one output folder, a kill -9 in the middle of a checkpoint save, NaN in the
data, and NaN / wrongly typed observations sent to a trained policy.

Victims of kill -9 run in a child Python started by the test and killed by its process id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import TINY_MINI, accelerate_two_processes, wait_for
from tutorial_utils import policies
from tutorial_utils.errors import TutorialError
from tutorial_utils.policies.base import ObservationError, observation_to_batch
from tutorial_utils.train.checkpoints import LOCK_FILE, OutputDirInUse, lock_output_dir
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import ArraySource, synthetic_source
from tutorial_utils.train.loop import NonFiniteLoss, train

torch.set_num_threads(1)
PY = sys.executable
TINY = TINY_MINI
VICTIM = textwrap.dedent("""
    import sys, json, torch
    torch.set_num_threads(1)
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.data import synthetic_source
    from tutorial_utils.train.loop import train
    src = synthetic_source(n_episodes=5, length=16, image_size=32)
    train(TrainConfig.from_overrides(json.loads(sys.argv[1])), source=src)
""")


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=5, length=16, image_size=32)


def _cfg(out: Path, **kw) -> TrainConfig:
    return TrainConfig.from_overrides({**TINY, "output_dir": str(out), **kw})


def _victim(tmp_path: Path, kv: dict, env: dict | None = None) -> subprocess.Popen:
    script = tmp_path / "victim.py"
    script.write_text(VICTIM)
    return subprocess.Popen(
        [PY, str(script), json.dumps(kv)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _kill_9(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


# --- one training process per output folder -------------------------------------------------------


def test_a_second_training_process_on_one_output_dir_fails_at_once_naming_the_holder(tmp_path, source):
    out = tmp_path / "run"
    kv = {**TINY, "output_dir": str(out), "steps": 100_000, "log_freq": 1, "save_freq": 0}
    proc = _victim(tmp_path, kv)
    metrics = out / "metrics.jsonl"
    try:
        assert wait_for(lambda: metrics.is_file() and metrics.stat().st_size > 0, proc=proc)
        t0 = time.time()
        with pytest.raises(OutputDirInUse, match=rf"in use by another training process \(pid {proc.pid} on ") as info:
            train(_cfg(out, steps=4, resume=True), source=source)
        assert time.time() - t0 < 30  # at once, not after building a model
        assert isinstance(info.value, TutorialError) and "new output_dir" in str(info.value)
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == proc.pid
    finally:
        _kill_9(proc)
    # the kernel released the dead holder's lock: the folder can be locked again
    os.close(lock_output_dir(out))


def test_the_lock_is_released_when_training_ends_or_fails(tmp_path, source):
    out = tmp_path / "run"
    train(_cfg(out, steps=1), source=source)
    os.close(lock_output_dir(out))  # released after a finished run
    with pytest.raises(TutorialError, match="resume=true"):  # refused for another reason ...
        train(_cfg(out, steps=1), source=source)
    os.close(lock_output_dir(out))  # ... and released all the same


@pytest.mark.slow
def test_a_locked_output_dir_stops_every_rank_of_an_accelerate_launch(tmp_path):
    """Only the main process takes the lock; the other ranks learn it was refused and stop too
    (no rank hangs in a barrier)."""
    out = tmp_path / "run"
    out.mkdir()
    fd = lock_output_dir(out)
    try:
        script = tmp_path / "victim.py"
        script.write_text(VICTIM)
        kv = {**TINY, "output_dir": str(out), "steps": 4}
        cmd, env = accelerate_two_processes(script, json.dumps(kv))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    finally:
        os.close(fd)
    text = r.stdout + r.stderr
    assert r.returncode != 0 and f"in use by another training process (pid {os.getpid()} on" in text, text[-3000:]
    assert not (out / "train_config.json").exists() and not (out / "metrics.jsonl").exists()


# --- kill -9 during a checkpoint save -------------------------------------------------------------


@pytest.mark.slow
def test_resume_removes_the_temp_folder_a_kill_9_left_mid_save(tmp_path, source):
    out = tmp_path / "run"
    ck = out / "checkpoints"
    kv = {**TINY, "output_dir": str(out), "steps": 100_000, "log_freq": 0, "save_freq": 2}
    proc = _victim(tmp_path, kv, {"TUTORIAL_TRAIN_SAVE_DELAY": "1.0"})
    try:
        assert wait_for(lambda: (ck / "last").exists(), proc=proc)  # step 2 saved
        assert wait_for(lambda: any(p.name.startswith(".step_000004.tmp-") for p in ck.iterdir()), proc=proc)
        # a second process must not touch the live run's save in progress
        with pytest.raises(OutputDirInUse):
            train(_cfg(out, steps=4, resume=True), source=source)
        assert any(p.name.startswith(".step_000004.tmp-") for p in ck.iterdir())
    finally:
        _kill_9(proc)
    stale = [p.name for p in ck.iterdir() if ".tmp-" in p.name]
    assert stale, "the kill left no temp folder: nothing to test"
    res = train(_cfg(out, steps=4, resume=True, save_freq=2), source=source)
    assert res.summary["start_step"] == 2 and res.steps_done == 4
    assert not [p.name for p in ck.iterdir() if ".tmp-" in p.name]
    assert (ck / "last").resolve().name == "step_000004"


# --- non-finite losses ----------------------------------------------------------------------------


def _poisoned(src: ArraySource) -> ArraySource:
    action = src.action.copy()
    action[:] = np.nan  # every window holds NaN
    return ArraySource(
        src.primary, src.wrist, src.state, action, src.frame_episode, src.tasks, src.statistics, "poisoned"
    )


def test_nan_in_the_data_stops_at_the_first_non_finite_loss_keeping_the_last_good_checkpoint(tmp_path, source):
    out = tmp_path / "run"
    good = train(_cfg(out, steps=2, log_freq=1), source=source)
    assert good.steps_done == 2
    with pytest.raises(NonFiniteLoss) as info:
        train(_cfg(out, steps=4, log_freq=1, resume=True), source=_poisoned(source))
    msg = str(info.value)
    assert "non-finite at step 3" in msg and "total_loss" in msg
    assert "NaN or inf in the data" in msg and "learning rate too high" in msg and "optimizer_lr=" in msg
    assert "step_000002" in msg and isinstance(info.value, TutorialError)
    log = (out / "train.log").read_text()
    assert "Non-finite loss at step 3:" in log and "step_000002" in log.split("Non-finite loss at step 3:")[1]
    ck = out / "checkpoints"
    assert (ck / "last").resolve().name == "step_000002" and not (ck / "step_000003").exists()
    policies.load(ck / "last")  # still loadable
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]  # no NaN row
    os.close(lock_output_dir(out))  # the failed run released the folder


def test_nan_from_the_first_step_names_no_checkpoint(tmp_path, source):
    out = tmp_path / "fresh"
    with pytest.raises(NonFiniteLoss, match=r"non-finite at step 1 .*none \(no checkpoint was saved"):
        train(_cfg(out, steps=3, save_freq=1), source=_poisoned(source))
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    assert not (out / "summary.json").exists()


# --- the served policy's input --------------------------------------------------------------------


def _obs(**kw) -> dict:
    rng = np.random.default_rng(0)
    obs = {
        "observation/image": rng.integers(0, 255, (32, 32, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 255, (32, 32, 3), dtype=np.uint8),
        "observation/state": rng.normal(size=8).astype(np.float32),
        "prompt": "pick up the bowl",
    }
    return {**obs, **kw}


@pytest.mark.parametrize(
    ("bad", "key", "what"),
    [
        ({"observation/state": np.array([0, 0, np.nan, 0, 0, 0, 0, 0], np.float32)}, "observation/state", "NaN or inf"),
        ({"observation/state": np.array([np.inf] * 8)}, "observation/state", "NaN or inf"),
        ({"observation/state": np.array(["a"] * 8)}, "observation/state", "must be 8 numbers"),
        ({"observation/image": np.zeros((32, 32, 3), np.float32)}, "observation/image", "must be uint8"),
        ({"observation/wrist_image": np.zeros((32, 32, 3), np.int64)}, "observation/wrist_image", "must be uint8"),
        ({"observation/image": np.zeros((32, 32), np.uint8)}, "observation/image", r"\(H, W, 3\)"),
    ],
)
def test_observation_to_batch_refuses_naming_the_key(bad, key, what):
    with pytest.raises(ObservationError, match=f"{key}.*{what}") as info:
        observation_to_batch(_obs(**bad))
    assert isinstance(info.value, ValueError) and isinstance(info.value, TutorialError)


def test_missing_key_is_named():
    obs = _obs()
    del obs["observation/wrist_image"]
    with pytest.raises(ObservationError, match="no observation/wrist_image"):
        observation_to_batch(obs)


def test_a_served_trained_policy_refuses_nan_state_instead_of_returning_nan_actions(tmp_path, source):
    train(_cfg(tmp_path / "run", steps=1), source=source)
    served = policies.make_policy("mini", checkpoint=str(tmp_path / "run" / "checkpoints" / "last"))
    ok = served.infer(_obs())["actions"]
    assert np.isfinite(ok).all()
    with pytest.raises(ObservationError, match=r"observation/state.*NaN or inf at index \[2\]"):
        served.infer(_obs(**{"observation/state": np.array([0, 0, np.nan, 0, 0, 0, 0, 0], np.float32)}))
