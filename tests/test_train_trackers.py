"""The training loop's trackers: TensorBoard event files and W&B offline runs, read back with each
tool's own reader, hold the same metrics as metrics.jsonl; nothing is written or imported when
they are off; no token reaches their files."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from helpers import TINY_MINI
from tutorial_utils.errors import ConfigError
from tutorial_utils.train import trackers
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source
from tutorial_utils.train.loop import train

torch.set_num_threads(1)

needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason="the tensorboard package is not installed (requirements.txt pins it; `make setup` installs it)",
)
needs_wandb = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None,
    reason="the wandb package is not installed (requirements.txt pins it; `make setup` installs it)",
)
FAKE_TOKENS = {"HF_TOKEN": "hf_" + "FAKEtrackerTOKEN0123456789", "WANDB_API_KEY": "0123456789abcdef" * 2 + "fakekey0"}


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=4, length=12, image_size=32)


def cfg(tmp_path, name="run", **kw) -> TrainConfig:
    base = dict(steps=6, batch_size=2, log_freq=2, eval_freq=3, save_freq=3, system_metrics=False)
    return TrainConfig.from_overrides({**TINY_MINI, **base, "output_dir": str(tmp_path / name), **kw})


def metrics(out) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as {key: [(step, value), ...]} for the numeric keys the trackers mirror."""
    got: dict[str, list] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for k, v in trackers.scalars(row).items():
            got.setdefault(k, []).append((int(row["step"]), v))
    return got


def test_scalars_keep_the_numbers_of_a_row():
    row = {"step": 3, "time": 1.0, "loss": 0.5, "best": True, "sample": "samples/x.json", "val_frames": 4}
    assert trackers.scalars(row) == {"loss": 0.5, "best": 1.0, "val_frames": 4.0}


def test_off_writes_and_imports_nothing(tmp_path, source):
    before = {m for m in ("wandb", "torch.utils.tensorboard") if m in sys.modules}
    res = train(cfg(tmp_path), source=source)
    assert not (res.output_dir / trackers.TENSORBOARD_DIR).exists()
    assert not (res.output_dir / trackers.WANDB_DIR).exists()
    after = {m for m in ("wandb", "torch.utils.tensorboard") if m in sys.modules}
    assert after <= before


def test_a_missing_package_is_a_clear_error_before_training(tmp_path, source, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"wandb=true needs the wandb package.*wandb=false"):
        train(cfg(tmp_path, "w", wandb=True), source=source)
    assert not (tmp_path / "w").exists()  # failed before the run directory was made
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match="tensorboard=true needs the tensorboard package"):
        train(cfg(tmp_path, "t", tensorboard=True), source=source)


@needs_tensorboard
def test_tensorboard_events_hold_the_metrics_and_a_resume_purges_the_later_ones(tmp_path, source):
    train(cfg(tmp_path, tensorboard=True, log_freq=1, save_freq=2), source=source)
    # back to step 2: the events of steps 3..6 are written again, the first ones must not count twice
    res = train(cfg(tmp_path, tensorboard=True, log_freq=1, save_freq=2, resume_from="step_000002"), source=source)
    assert len(list((res.output_dir / trackers.TENSORBOARD_DIR).glob("events.out.tfevents.*"))) == 2
    events = trackers.read_tensorboard(res.output_dir)
    want = metrics(res.output_dir)
    assert {"loss", "lr", "grad_norm", "samples_per_s", "val_action_mae"} <= set(want)
    assert [s for s, _ in want["loss"]] == [1, 2, 3, 4, 5, 6]
    assert set(events) == set(want)
    for tag, rows in want.items():
        got = events[tag]
        assert [s for s, _ in got] == [s for s, _ in rows], tag  # one value per step, none twice
        assert [v for _, v in got] == pytest.approx([v for _, v in rows], rel=1e-6), tag  # float32 in the file


@needs_wandb
def test_wandb_offline_run_holds_the_metrics_and_no_token(tmp_path, source, monkeypatch):
    for k, v in FAKE_TOKENS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    res = train(cfg(tmp_path, wandb=True, wandb_project="tests"), source=source)
    files = trackers.wandb_files(res.output_dir)
    assert len(files) == 1 and files[0].parent.name.startswith("offline-run-")
    history = trackers.read_wandb(files[0])
    want = metrics(res.output_dir)
    got: dict[str, list] = {}
    for row in history:
        for k, v in row.items():
            if not k.startswith("_"):
                got.setdefault(k, []).append((int(row["_step"]), v))
    assert set(got) == set(want)
    for k, rows in want.items():
        assert [s for s, _ in sorted(got[k])] == [s for s, _ in rows], k
        assert [v for _, v in sorted(got[k])] == pytest.approx([v for _, v in rows]), k
    # no token in any file W&B wrote
    for path in (res.output_dir / trackers.WANDB_DIR).rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for value in FAKE_TOKENS.values():
                assert value.encode() not in data, (path, value[:6])
    assert files[0].name == f"run-{trackers.wandb_run_id(res.output_dir, res.output_dir.name)}.wandb"
