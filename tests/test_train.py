"""tutorial_utils.train: config, data order, checkpoints, exact resume, signals, kill -9, DDP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import TINY_MINI, accelerate_two_processes, wait_for
from tutorial_utils.errors import ConfigError
from tutorial_utils.logs import parse_train_log
from tutorial_utils.policies import load as load_policy
from tutorial_utils.policies.base import CheckpointError
from tutorial_utils.policies.mini import MiniPolicy
from tutorial_utils.train.cli import main
from tutorial_utils.train.config import DatasetNotReady, TrainConfig, parameters_table, parse_overrides
from tutorial_utils.train.data import StepBatchSampler, open_dataset, random_shift, split_episodes, synthetic_source
from tutorial_utils.train.job import metrics_table, resolve_dataset, run_job
from tutorial_utils.train.loop import train
from tutorial_utils.train.schedule import lr_factor

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TINY = TINY_MINI


def cfg(tmp_path, name="run", **kw) -> TrainConfig:
    return TrainConfig.from_overrides({**TINY, "output_dir": str(tmp_path / name), **kw})


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=5, length=16, image_size=32)


# --- config -------------------------------------------------------------------------------------


def test_parameters_and_aliases():
    c = TrainConfig.from_overrides(
        [
            "per_device_batch_size=4",
            "trainer.max_train_steps=20",
            "save_interval=7",
            "eval_interval=5",
            "logging_frequency=1",
            "freeze_modules=backbone",
            "save_checkpoint=false",
            "optimizer_lr=3e-4",
            "optimizer_betas=0.9,0.99",
        ]
    )
    assert (c.batch_size, c.steps, c.save_freq, c.eval_freq, c.log_freq) == (4, 20, 7, 5, 1)
    assert c.freeze_list == ["backbone"] and c.save_checkpoint is False and c.optimizer_lr == 3e-4
    assert c.optimizer_betas == (0.9, 0.99)
    table = parameters_table()
    for name in (
        "batch_size",
        "steps",
        "seed",
        "num_workers",
        "eval_freq",
        "log_freq",
        "save_freq",
        "save_checkpoint",
        "optimizer_lr",
        "optimizer_weight_decay",
        "optimizer_grad_clip_norm",
        "scheduler_warmup_steps",
        "scheduler_decay_steps",
        "data_mix",
        "per_device_batch_size",
        "pretrained_checkpoint",
        "freeze_modules",
        "max_train_steps",
        "save_interval",
        "eval_interval",
        "logging_frequency",
    ):
        assert f"`{name}`" in table


def test_unknown_parameter_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown parameter 'batchsize'.*Did you mean batch_size"):
        TrainConfig.from_overrides({"batchsize": 2})
    with pytest.raises(ConfigError, match="expected int"):
        TrainConfig.from_overrides({"steps": "many"})
    with pytest.raises(ConfigError, match="given twice"):
        TrainConfig.from_overrides({"steps": 2, "max_train_steps": 3})
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["steps"])
    assert main(["--output-dir", "/tmp/x", "bogus=1"]) == 2
    assert main(["--output-dir", "/tmp/x", "--trainer.max_train_stepz", "2"]) == 2


def test_random_shift_is_seeded_and_keeps_shapes():
    b = {
        "observation.images.image": torch.randint(0, 255, (3, 16, 16, 3), dtype=torch.uint8),
        "observation.images.wrist_image": torch.zeros(3, 16, 16, 3, dtype=torch.uint8),
    }
    a1 = random_shift(b, 2, torch.Generator().manual_seed(1))
    a2 = random_shift(b, 2, torch.Generator().manual_seed(1))
    assert a1["observation.images.image"].shape == (3, 3, 16, 16) and torch.equal(
        a1["observation.images.image"], a2["observation.images.image"]
    )
    assert float(a1["observation.images.image"].max()) <= 1.0


def test_unknown_module_in_freeze_modules(tmp_path, source):
    with pytest.raises(ConfigError, match="unknown module.*backbone_interface.*backbone.language_encoder"):
        train(cfg(tmp_path, steps=1, freeze_modules="backbone_interface"), source=source)
    with pytest.raises(ConfigError, match="freezes every parameter"):
        train(cfg(tmp_path, "b", steps=1, freeze_modules="backbone,action_model"), source=source)


def test_lr_schedule():
    c = TrainConfig.from_overrides(
        {
            "steps": 100,
            "scheduler_warmup_steps": 10,
            "scheduler_decay_steps": 80,
            "optimizer_lr": 1e-4,
            "scheduler_decay_lr": 1e-5,
        }
    )
    f = [lr_factor(s, c) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[90] == pytest.approx(0.1) and f[99] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))


def test_a_first_phase_runs_at_the_full_rate_and_the_warm_up_starts_after_it():
    """VQ-BeT as LeRobot schedules it: its action-code phase at the full rate, then the warm-up and the
    decay over the steps that remain (the GPT's)."""
    c = TrainConfig.from_overrides(
        {
            "policy": "vqbet",
            "policy.n_vqvae_training_steps": 20,
            "steps": 100,
            "scheduler_warmup_steps": 10,
            "optimizer_lr": 1e-4,
            "scheduler_decay_lr": 0.0,
        }
    )
    f = [lr_factor(s, c) for s in range(100)]
    assert f[:20] == [1.0] * 20 and f[20] == pytest.approx(0.1) and f[29] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[30:], f[31:])) and f[99] < 0.001
    one_phase = TrainConfig.from_overrides({"policy": "mini", "steps": 100, "scheduler_warmup_steps": 10})
    assert lr_factor(0, one_phase) == pytest.approx(0.1)  # a family in one phase warms up from its first step


def test_data_order_is_a_function_of_seed_and_step_and_ranks_split_the_global_batch():
    idx = np.arange(10, 33)
    one = StepBatchSampler(idx, 4, 12, seed=3)
    batches = list(one)
    assert list(StepBatchSampler(idx, 4, 12, seed=3, start=5)) == batches[5:]
    seen = [i for b in batches[:6] for i in b]
    assert sorted(seen[:23]) == list(idx)  # first epoch covers every frame once
    r0, r1 = (StepBatchSampler(idx, 2, 12, seed=3, rank=r, world=2) for r in (0, 1))
    assert [a + b for a, b in zip(r0, r1)] == batches


# --- training runs ------------------------------------------------------------------------------


def test_validation_episodes_are_spread_over_the_dataset_not_its_end():
    # 10 tasks x 5 episodes, written task by task: the held-out episodes must not remove a task
    frame_episode = np.repeat(np.arange(50), 3)
    train_idx, val_idx, val_eps = split_episodes(frame_episode, 0.1)
    assert len(val_eps) == 5 and len({e // 5 for e in val_eps}) == 5
    assert len(set(frame_episode[train_idx] // 5)) == 10  # every task keeps training data
    assert set(frame_episode[val_idx]) == set(val_eps) and not set(train_idx) & set(val_idx)
    assert split_episodes(np.array([0, 0, 1, 1]), 0.1)[2] == [1]  # at least one, never all
    assert split_episodes(np.array([0, 0, 1]), 0.0)[2] == []


def test_train_writes_a_self_describing_run(tmp_path, source, monkeypatch):
    monkeypatch.delenv("KEEP_FINAL_MODEL", raising=False)
    res = train(
        cfg(tmp_path, steps=6, batch_size=2, log_freq=1, eval_freq=3, save_freq=3, freeze_modules="backbone"),
        source=source,
    )
    out = res.output_dir
    for f in ("train_config.json", "dataset_statistics.json", "train.log", "metrics.jsonl", "summary.json"):
        assert (out / f).is_file(), f
    log = parse_train_log(out / "train.log")
    assert log["total_params"] == res.summary["parameters"]["total"] > log["trainable_params"] > 0
    assert (
        log["frozen_params"] > 0 and log["total_steps"] == 6 and [s["step"] for s in log["steps"]] == [1, 2, 3, 4, 5, 6]
    )
    assert "action_dit_loss" in log["steps"][0]["losses"] and log["final_model"].endswith("final_model")
    text = (out / "train.log").read_text()
    assert "Removed final_model" in text and not (out / "final_model").exists()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    val_rows = [r for r in rows if "val_action_mae" in r]
    assert len(train_rows) == 6 and {"lr", "grad_norm", "samples_per_s", "data_wait_share"} <= set(train_rows[0])
    assert [r["step"] for r in val_rows] == [3, 6]
    ck = out / "checkpoints"
    assert (ck / "last").is_symlink() and (ck / "last").resolve().name == "step_000006"
    assert (ck / "step_000003").is_dir() and (ck / "best").is_dir()
    pol = load_policy(ck / "best")
    assert pol.predict_action(
        np.zeros((32, 32, 3), np.uint8), np.zeros((32, 32, 3), np.uint8), np.zeros(8), "x"
    ).shape == (8, 7)
    # the frozen backbone did not move
    torch.manual_seed(TrainConfig.from_overrides({**TINY}).seed)  # train() builds the policy right after seeding
    init = MiniPolicy(TrainConfig.from_overrides({**TINY}).policy_config, source.statistics)
    last = load_policy(ck / "last")
    for (n, a), (_, b) in zip(init.backbone.state_dict().items(), last.backbone.state_dict().items()):
        assert torch.equal(a, b), n
    # a second run into the same directory is refused; nothing is overwritten
    with pytest.raises(ConfigError, match="resume=true"):
        train(cfg(tmp_path, steps=6), source=source)


def test_keep_final_model(tmp_path, source, monkeypatch):
    monkeypatch.setenv("KEEP_FINAL_MODEL", "1")
    res = train(cfg(tmp_path, steps=2, batch_size=1, save_checkpoint=False), source=source)
    assert (res.output_dir / "final_model" / "model.safetensors").is_file()
    assert not (res.output_dir / "checkpoints").exists()
    load_policy(res.output_dir / "final_model")


def test_resume_is_exact(tmp_path, source):
    kw = dict(steps=8, batch_size=3, log_freq=1, eval_freq=0, save_freq=100, seed=5)
    full = train(cfg(tmp_path, "full", **kw), source=source)

    def stop_at_4(step, loss):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler finishes the step, saves and stops

    part = train(cfg(tmp_path, "part", **kw), source=source, on_step=stop_at_4)
    assert part.stopped_by == "SIGTERM" and part.steps_done == 4
    assert (tmp_path / "part/checkpoints/last").resolve().name == "step_000004"
    rest = train(cfg(tmp_path, "part", resume=True, **kw), source=source)
    assert [s for s, _ in rest.losses] == [5, 6, 7, 8]
    assert part.losses + rest.losses == full.losses  # bit-identical
    rows = [json.loads(x) for x in (tmp_path / "part/metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["loss"] for r in rows] == [v for _, v in full.losses]
    a = load_policy(tmp_path / "full/checkpoints/last")
    b = load_policy(tmp_path / "part/checkpoints/last")
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), n


def test_pretrained_checkpoint_from_a_different_config(tmp_path, source):
    res = train(cfg(tmp_path, steps=1, batch_size=1), source=source)
    ck = res.output_dir / "checkpoints" / "last"
    train(cfg(tmp_path, "ft", steps=1, batch_size=1, pretrained_checkpoint=str(ck)), source=source)
    with pytest.raises(CheckpointError, match="different model config"):
        train(cfg(tmp_path, "bad", steps=1, model_dim=64, pretrained_checkpoint=str(ck)), source=source)


# --- datasets -----------------------------------------------------------------------------------


def test_dataset_without_modality_or_statistics(tmp_path):
    root = tmp_path / "ds"
    with pytest.raises(DatasetNotReady, match="not a LeRobot v2.1 dataset.*dataset generate"):
        open_dataset(root)
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text("{}")
    with pytest.raises(DatasetNotReady, match="modality.json is missing.*build_modality"):
        open_dataset(root)
    (root / "meta" / "modality.json").write_text("{}")
    with pytest.raises(DatasetNotReady, match="stats_gr00t.json is missing.*tutorial_utils dataset stats"):
        open_dataset(root)
    assert main(["--dataset", str(root), "--output-dir", str(tmp_path / "out"), "steps=1"]) == 2


def test_two_step_smoke_test_on_a_lerobot_dataset(tmp_path, capsys):
    """The smoke test of the chapter: steps 2, batch 1, on a real v2.1 dataset through the CLI."""
    from tutorial_utils.data import modality, stats, synth

    root = synth.generate_dataset(tmp_path / "ds", n_episodes=3, mean_length=12, image_size=32)
    modality.build_modality(root)
    stats.compute_all(root)
    out = tmp_path / "run"
    rc = main(
        [
            "--dataset",
            str(root),
            "--output-dir",
            str(out),
            "steps=2",
            "batch_size=1",
            "logging_frequency=1",
            "image_size=32",
            "model_dim=32",
            "num_heads=2",
            "action_depth=1",
            "num_workers=0",
            "progress=false",
        ]
    )
    assert rc == 0
    log = parse_train_log(out / "train.log")
    assert [s["step"] for s in log["steps"]] == [1, 2] and log["final_model"]
    assert (out / "dataset_statistics.json").is_file()


# --- processes: SIGTERM, kill -9, accelerate ------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import sys, json, torch
    torch.set_num_threads(1)
    from tutorial_utils.errors import ConfigError
    from tutorial_utils.train.config import DatasetNotReady, TrainConfig, parameters_table, parse_overrides
    from tutorial_utils.train.data import StepBatchSampler, open_dataset, random_shift, split_episodes, synthetic_source
    from tutorial_utils.train.loop import train
    from tutorial_utils.train.schedule import lr_factor
    from tutorial_utils.train.cli import main
    from tutorial_utils.train.job import metrics_table, resolve_dataset, run_job
    src = synthetic_source(n_episodes=5, length=16, image_size=32)
    kv = json.loads(sys.argv[1])
    res = train(TrainConfig.from_overrides(kv), source=src)
    sys.exit(128 + 15 if res.stopped_by == "SIGTERM" else 0)
""")


def _script(tmp_path) -> Path:
    p = tmp_path / "run_train.py"
    p.write_text(SCRIPT)
    return p


@pytest.mark.slow
def test_sigterm_stops_cleanly_with_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    kv = {
        **TINY,
        "output_dir": str(out),
        "steps": 100000,
        "batch_size": 1,
        "log_freq": 1,
        "eval_freq": 0,
        "save_freq": 0,
    }
    proc = subprocess.Popen(
        [PY, str(_script(tmp_path)), json.dumps(kv)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert wait_for(
            lambda: (out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size > 0, proc=proc
        )
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, stdout
    assert "Training stopped by SIGTERM" in stdout and "resume=true" in stdout
    state = json.loads((out / "checkpoints/last/training_state.json").read_text())
    assert 0 < state["step"] < 100000 and state["reason"] == "SIGTERM"
    load_policy(out / "checkpoints/last")


@pytest.mark.slow
def test_kill_9_during_a_checkpoint_write_keeps_the_previous_last(tmp_path, source):
    out = tmp_path / "run"
    kv = {
        **TINY,
        "output_dir": str(out),
        "steps": 100000,
        "batch_size": 1,
        "log_freq": 0,
        "eval_freq": 0,
        "save_freq": 2,
    }
    env = {**os.environ, "TUTORIAL_TRAIN_SAVE_DELAY": "1.0"}
    proc = subprocess.Popen(
        [PY, str(_script(tmp_path)), json.dumps(kv)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ck = out / "checkpoints"
    try:
        assert wait_for(lambda: (ck / "last").exists(), proc=proc)  # the first save is complete
        assert wait_for(
            lambda: any(p.name.startswith(".step_000004") for p in ck.iterdir()), proc=proc
        )  # second one mid-write
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert (ck / "last").resolve().name == "step_000002" and not (ck / "step_000004").exists()
    load_policy(ck / "last")
    res = train(TrainConfig.from_overrides({**kv, "steps": 4, "resume": True}), source=source)
    assert res.summary["start_step"] == 2 and res.steps_done == 4


def _accelerate_two_processes(tmp_path, kv):
    """The `accelerate launch` command line (2 CPU processes, DDP) for the training script, and its env."""
    return accelerate_two_processes(_script(tmp_path), json.dumps(kv))


@pytest.mark.slow
def test_accelerate_launch_two_processes(tmp_path):
    out = tmp_path / "run"
    kv = {**TINY, "output_dir": str(out), "steps": 4, "batch_size": 2, "log_freq": 1, "eval_freq": 2, "save_freq": 2}
    cmd, env = _accelerate_two_processes(tmp_path, kv)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps_done"] == 4
    log = parse_train_log(out / "train.log")
    assert [s["step"] for s in log["steps"]] == [1, 2, 3, 4] and log["final_model"]
    assert r.stdout.count("Training complete") == 1  # only the main process logs
    load_policy(out / "checkpoints/last")


@pytest.mark.slow
def test_accelerate_two_processes_with_accumulation_and_ema(tmp_path):
    """DDP with 2 batches per step (the first without the all-reduce) and the EMA on both ranks."""
    out = tmp_path / "run"
    kv = {**TINY, "output_dir": str(out), "steps": 3, "batch_size": 2, "log_freq": 1, "eval_freq": 3, "save_freq": 3}
    cmd, env = _accelerate_two_processes(tmp_path, {**kv, "grad_accum_steps": 2, "ema_decay": 0.9})
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps_done"] == 3 and summary["grad_accum_steps"] == 2
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    n_train = json.loads((out / "train_config.json").read_text())["dataset"]["train_frames"]
    assert rows[-1]["epoch"] == pytest.approx(3 * (2 * 2 * 2) / n_train)  # steps x (batch x accum x ranks)
    state = torch.load(out / "checkpoints/last/training_state.pt", weights_only=True)
    assert state["ema"]["updates"] == 3
    load_policy(out / "checkpoints/last")


@pytest.mark.slow
def test_sigterm_under_accelerate_stops_both_processes_at_the_same_step_with_a_checkpoint(tmp_path):
    """SIGTERM to the launcher reaches both ranks; they agree on the step (a reduced flag), the
    main process saves a loadable `last`."""
    out = tmp_path / "run"
    kv = {
        **TINY,
        "output_dir": str(out),
        "steps": 100000,
        "batch_size": 1,
        "log_freq": 1,
        "eval_freq": 0,
        "save_freq": 0,
    }
    cmd, env = _accelerate_two_processes(tmp_path, kv)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        metrics = out / "metrics.jsonl"
        assert wait_for(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 3, timeout=180, proc=proc)
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Training stopped by SIGTERM" in stdout, stdout[-3000:]
    assert stdout.count("Training stopped by SIGTERM") == 1  # the main process reports it once
    state = json.loads((out / "checkpoints/last/training_state.json").read_text())
    assert 3 <= state["step"] < 100000 and state["reason"] == "SIGTERM" and state["world_size"] == 2
    load_policy(out / "checkpoints/last")


def test_job_helpers(tmp_path, source):
    with pytest.raises(DatasetNotReady, match="record_demos"):
        resolve_dataset("no_such_dataset", tmp_path)
    train(cfg(tmp_path, steps=4, batch_size=1, log_freq=1, eval_freq=2, save_checkpoint=False), source=source)
    rows = metrics_table(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and "val_action_mae" in rows[1] and "loss" in rows[1]
    assert [r["step"] for r in metrics_table(tmp_path / "run", every=3)] == [1, 4]
    assert main(["--list-params"]) == 0


def test_run_job_writes_missing_metadata_and_status(tmp_path):
    from tutorial_utils import jobs
    from tutorial_utils.data.synth import generate_dataset

    root = generate_dataset(tmp_path / "ds", n_episodes=2, mean_length=10, image_size=32)
    assert not (root / "meta" / "modality.json").exists()
    small = {k: v for k, v in TINY.items()}
    res = run_job(tmp_path / "run", dataset=str(root), steps=2, batch_size=1, log_freq=1, **small)
    assert res.steps_done == 2 and (root / "meta" / "modality.json").is_file()
    status = jobs.read_status(tmp_path / "run")
    assert status["success_signs"] == {"parameters counted": True, "first loss line": True, "training complete": True}


def test_time_limit_finishes_the_run(tmp_path, source):
    res = train(cfg(tmp_path, steps=10_000, batch_size=1, log_freq=0, eval_freq=0, time_limit_min=0.02), source=source)
    assert res.summary["time_limited"] and 0 < res.steps_done < 10_000
    text = (res.output_dir / "train.log").read_text()
    assert "Time limit of 0.02 min reached" in text and "Training complete" in text
    assert res.summary["best"]["step"] == res.steps_done  # a last validation at the stop
    load_policy(res.output_dir / "checkpoints" / "last")


# --- the trainer's speed options: accumulation, EMA, precision, compile, workers ------------------


def _stop_at(n):
    def hook(step, loss):
        if step == n:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler finishes the step, saves and stops

    return hook


def _weights(path):
    return {k: v.clone() for k, v in load_policy(path).state_dict().items()}


def _same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_grad_accumulation_resume_is_exact(tmp_path, source):
    kw = dict(steps=6, batch_size=2, grad_accum_steps=3, log_freq=1, eval_freq=0, save_freq=100, seed=3)
    full = train(cfg(tmp_path, "full", **kw), source=source)
    part = train(cfg(tmp_path, "part", **kw), source=source, on_step=_stop_at(3))
    assert part.steps_done == 3
    rest = train(cfg(tmp_path, "part", resume=True, **kw), source=source)
    assert [s for s, _ in rest.losses] == [4, 5, 6]
    assert part.losses + rest.losses == full.losses  # bit-identical
    _same_weights(_weights(tmp_path / "full/checkpoints/last"), _weights(tmp_path / "part/checkpoints/last"))
    assert full.summary["grad_accum_steps"] == 3
    # the throughput counts the samples of every micro-batch: 2 x 3 per optimisation step
    row = [json.loads(x) for x in (tmp_path / "full/metrics.jsonl").read_text().splitlines() if '"loss"' in x][-1]
    assert row["epoch"] == pytest.approx(6 * 6 / len(split_episodes(source.frame_episode, 0.1)[0]))
    # a resume cannot change how many batches make a step (the data order would differ)
    with pytest.raises(ConfigError, match="grad_accum_steps"):
        train(cfg(tmp_path, "part", resume=True, **{**kw, "steps": 8, "grad_accum_steps": 2}), source=source)


def test_grad_accumulation_of_two_half_batches_is_the_full_batch(tmp_path):
    """mlp has no noise and, with one action per window, no padding: 2 accumulated batches of 4
    give the gradient of one batch of 8 (the same 8 frames: the data order is per micro-batch)."""
    src = synthetic_source(n_episodes=4, length=12, image_size=16)
    base = dict(
        policy="mlp",
        action_horizon=1,
        hidden_dim=16,
        augment_shift=0,
        num_workers=0,
        progress=False,
        steps=1,
        eval_freq=0,
        log_freq=1,
        save_checkpoint=False,
        scheduler_warmup_steps=0,
        optimizer_grad_clip_norm=0.0,
        val_fraction=0.0,
        keep_final_model=True,
    )
    one = train(TrainConfig.from_overrides({**base, "batch_size": 8, "output_dir": str(tmp_path / "a")}), source=src)
    two = train(
        TrainConfig.from_overrides({**base, "batch_size": 4, "grad_accum_steps": 2, "output_dir": str(tmp_path / "b")}),
        source=src,
    )
    assert one.losses[0][1] == pytest.approx(two.losses[0][1], rel=1e-6)

    def grad_norm(name):
        return [json.loads(x)["grad_norm"] for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    assert grad_norm("a") == pytest.approx(grad_norm("b"), rel=1e-5)  # the mean gradient, not the sum
    wa, wb = _weights(tmp_path / "a/final_model"), _weights(tmp_path / "b/final_model")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_ema_is_validated_served_and_resumed_exactly(tmp_path, source):
    kw = dict(steps=8, batch_size=3, log_freq=1, eval_freq=4, save_freq=4, seed=5, ema_decay=0.9)
    full = train(cfg(tmp_path, "full", **kw), source=source)
    part = train(cfg(tmp_path, "part", **kw), source=source, on_step=_stop_at(4))
    rest = train(cfg(tmp_path, "part", resume=True, **kw), source=source)
    assert part.losses + rest.losses == full.losses  # the raw weights came back on resume

    def rows(name):
        return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    val = lambda name: [(r["step"], r["val_action_mae"]) for r in rows(name) if "val_action_mae" in r]  # noqa: E731
    assert val("full") == val("part") and len(val("full")) == 2  # the same average continued
    last = tmp_path / "full/checkpoints/last"
    _same_weights(_weights(last), _weights(tmp_path / "part/checkpoints/last"))
    state = torch.load(last / "training_state.pt", weights_only=True)
    served = _weights(last)
    # the policy files hold the average, training_state.pt the raw weights and the average
    assert state["ema"]["updates"] == 8 and state["ema"]["decay"] == 0.9
    moved = 0
    for name, value in state["ema"]["shadow"].items():
        assert torch.equal(served[name], value), name
        moved += not torch.equal(state["raw_weights"][name], value)
    assert moved > 0
    # validation scored the average: the served weights give the logged error
    from tutorial_utils.train.validation import Validator

    c = cfg(tmp_path, "x", **kw)
    pol = load_policy(last)
    _, val_idx, _ = split_episodes(source.frame_episode, c.val_fraction)
    again = Validator(source, val_idx, c, pol.action_horizon, pol.image_size)(pol)
    assert again["val_action_mae"] == pytest.approx(val("full")[-1][1], rel=1e-5)
    # without EMA nothing of it is saved
    plain = train(cfg(tmp_path, "plain", steps=2, batch_size=2, save_freq=2), source=source)
    st = torch.load(plain.output_dir / "checkpoints/last/training_state.pt", weights_only=True)
    assert "ema" not in st and "raw_weights" not in st


def test_ema_update_rule():
    from tutorial_utils.train.speed import EMA

    m = torch.nn.Linear(2, 1)
    with torch.no_grad():
        m.weight.fill_(0.0)
        m.bias.fill_(0.0)
    ema = EMA(m, 0.99)
    with torch.no_grad():
        m.weight.fill_(1.0)
    ema.update(m)  # decay_0 = min(0.99, 1/10) = 0.1: 0.9 of the new weights
    assert torch.allclose(ema.shadow[0], torch.full((1, 2), 0.9))
    ema.update(m)  # decay_1 = 2/11
    assert torch.allclose(ema.shadow[0], torch.full((1, 2), 0.9 * 2 / 11 + 9 / 11))
    with ema.applied(m):
        assert torch.allclose(m.weight, ema.shadow[0])
    assert torch.equal(m.weight, torch.ones(1, 2))  # the raw weights are back


def test_resume_of_a_run_without_ema_refuses_to_start_one(tmp_path, source):
    kw = dict(steps=4, batch_size=2, save_freq=2)
    train(cfg(tmp_path, "r", **kw), source=source, on_step=_stop_at(2))
    with pytest.raises(ConfigError, match="ema_decay"):
        train(cfg(tmp_path, "r", resume=True, ema_decay=0.9, **kw), source=source)


def test_speed_settings_resolve_and_are_recorded(tmp_path, source):
    from tutorial_utils.train.speed import MAX_AUTO_WORKERS, auto_workers, resolve

    assert auto_workers(cores=2) == 1 and auto_workers(cores=16) == MAX_AUTO_WORKERS
    assert auto_workers(cores=16, processes=4) == 3 and auto_workers(cores=1) == 1
    c = cfg(tmp_path, num_workers=None)
    on_cpu, on_gpu = resolve(c, "cpu"), resolve(c, "cuda")
    assert (on_cpu.precision, on_cpu.pin_memory) == ("fp32", False)
    assert (on_gpu.precision, on_gpu.pin_memory) == ("bf16", True)
    assert resolve(cfg(tmp_path, precision="fp32", pin_memory=False), "cuda").precision == "fp32"
    assert on_cpu.num_workers == auto_workers()
    for bad in ({"precision": "fp16"}, {"grad_accum_steps": 0}, {"ema_decay": 1.0}, {"num_workers": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            cfg(tmp_path, **bad)
    assert TrainConfig.from_overrides({"gradient_accumulation_steps": 4}).grad_accum_steps == 4
    res = train(cfg(tmp_path, "w", steps=2, batch_size=2, num_workers=1), source=source)
    saved = json.loads((res.output_dir / "train_config.json").read_text())
    assert saved["resolved"]["num_workers"] == 1 and saved["resolved"]["precision"] == "fp32"
    assert "1 loader workers" in (res.output_dir / "train.log").read_text()


def test_bf16_autocast_on_cpu_trains_and_changes_the_numbers(tmp_path, source):
    kw = dict(steps=3, batch_size=2, log_freq=1, eval_freq=0, save_checkpoint=False)
    fp32 = train(cfg(tmp_path, "fp32", **kw), source=source)
    bf16 = train(cfg(tmp_path, "bf16", precision="bf16", **kw), source=source)
    assert all(np.isfinite(v) for _, v in bf16.losses)
    assert bf16.losses != fp32.losses  # the forward did run in bf16
    assert bf16.losses[0][1] == pytest.approx(fp32.losses[0][1], rel=0.05)
    assert bf16.summary["resolved"]["precision"] == "bf16"


@pytest.mark.slow
def test_compiled_step_trains_resumes_exactly_and_keeps_checkpoint_names(tmp_path, source):
    """aot_eager traces the same graphs as the default backend without generating code (seconds on
    a CPU); the mini family compiles its backbone and action model in place."""
    kw = dict(steps=4, batch_size=2, log_freq=1, eval_freq=2, save_freq=2, seed=2)
    plain = train(cfg(tmp_path, "plain", **kw), source=source)
    kwc = dict(kw, torch_compile=True, compile_backend="aot_eager")
    full = train(cfg(tmp_path, "full", **kwc), source=source)
    np.testing.assert_allclose([v for _, v in full.losses], [v for _, v in plain.losses], rtol=1e-4)
    saved = json.loads((full.output_dir / "train_config.json").read_text())
    assert saved["resolved"]["compiled"] == ["backbone", "action_model"]
    part = train(cfg(tmp_path, "part", **kwc), source=source, on_step=_stop_at(2))
    rest = train(cfg(tmp_path, "part", resume=True, **kwc), source=source)
    assert part.losses + rest.losses == full.losses
    a = load_policy(tmp_path / "full/checkpoints/last")  # no _orig_mod. prefixes: loads as usual
    assert set(a.state_dict()) == set(load_policy(tmp_path / "plain/checkpoints/last").state_dict())


def test_each_family_trains_with_its_own_recipe_unless_given_other_values(monkeypatch):
    from tutorial_utils.train.config import RECIPE, family_recipe

    monkeypatch.setenv("TUTORIAL_PROFILE", "cpu")
    act = TrainConfig.from_overrides({"policy": "act"})
    assert (act.optimizer_lr, act.optimizer_grad_clip_norm, act.scheduler_warmup_steps, act.augment_shift) == (
        1e-4,
        10.0,
        0,
        0,
    )
    assert tuple(act.optimizer_betas) == (0.9, 0.999) and act.scheduler_decay_lr == 1e-4
    mini = TrainConfig.from_overrides({"policy": "mini"})  # no recipe of its own: the book's (DiT4DiT's)
    assert mini.optimizer_lr == RECIPE["optimizer_lr"]["cpu"] == 3e-4 and mini.scheduler_warmup_steps == 200
    assert tuple(mini.optimizer_betas) == (0.9, 0.95) and mini.augment_shift == 4
    assert TrainConfig.from_overrides({"policy": "diffusion"}).optimizer_lr == 1e-4
    # a value given to the job wins over the family's
    given = TrainConfig.from_overrides({"policy": "act", "optimizer_betas": "0.9,0.95", "augment_shift": "4"})
    assert tuple(given.optimizer_betas) == (0.9, 0.95) and given.augment_shift == 4 and given.optimizer_lr == 1e-4
    # another family from a base: the base family's own values go, the ones given to it stay
    moved = TrainConfig.from_overrides(
        {"policy": "act"}, base=TrainConfig.from_overrides({"policy": "mini", "seed": 3})
    )
    assert moved.optimizer_lr == 1e-4 and moved.augment_shift == 0 and moved.seed == 3
    kept = TrainConfig.from_overrides({"policy": "act"}, base=TrainConfig.from_overrides({"optimizer_lr": 5e-5}))
    assert kept.optimizer_lr == 5e-5
    assert family_recipe("tdmpc")["optimizer_weight_decay"] == 0.0
    monkeypatch.setenv("TUTORIAL_PROFILE", "ci")
    assert TrainConfig().optimizer_lr == 1e-4 and TrainConfig().scheduler_warmup_steps == 0
