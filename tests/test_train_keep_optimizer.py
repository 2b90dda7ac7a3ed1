"""``keep_optimizer=last``: only the newest step_* checkpoint keeps the optimizer state; resuming
from it stays exact, resuming from an older one is refused with the reason and the way out."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from helpers import TINY_MINI
from tutorial_utils.errors import ConfigError
from tutorial_utils.policies import load as load_policy
from tutorial_utils.train.checkpoints import TRAIN_STATE_FILE, TRAIN_STATE_JSON, has_optimizer_state
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source
from tutorial_utils.train.loop import train

KW = dict(steps=8, batch_size=3, log_freq=1, eval_freq=0, save_freq=2, seed=5)


def cfg(tmp_path, name, **kw) -> TrainConfig:
    return TrainConfig.from_overrides({**TINY_MINI, "output_dir": str(tmp_path / name), **KW, **kw})


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=4, length=10, image_size=32)


def _state(path):
    return torch.load(path / TRAIN_STATE_FILE, map_location="cpu", weights_only=True)


def test_last_keeps_the_optimizer_only_in_the_newest_checkpoint_and_resumes_exactly(tmp_path, source):
    full = train(cfg(tmp_path, "full"), source=source)
    root_full = tmp_path / "full/checkpoints"
    assert all(has_optimizer_state(root_full / f"step_00000{s}") for s in (2, 4, 6, 8))  # the default: all

    def stop_at_4(step, loss):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler finishes the step, saves and stops

    part = train(cfg(tmp_path, "part", keep_optimizer="last"), source=source, on_step=stop_at_4)
    root = tmp_path / "part/checkpoints"
    assert part.steps_done == 4 and (root / "last").resolve().name == "step_000004"
    assert "optimizer" in _state(root / "step_000004") and has_optimizer_state(root / "step_000004")
    old = root / "step_000002"
    assert "optimizer" not in _state(old) and not has_optimizer_state(old)
    assert set(_state(old)) == {"scheduler", "torch_rng"}  # the rest of the training state stays
    assert json.loads((old / TRAIN_STATE_JSON).read_text())["optimizer"] is False
    assert (old / TRAIN_STATE_FILE).stat().st_size < (root_full / "step_000002" / TRAIN_STATE_FILE).stat().st_size / 2
    load_policy(old)  # still a policy: served, evaluated, used as pretrained_checkpoint

    rest = train(cfg(tmp_path, "part", resume=True, keep_optimizer="last"), source=source)
    assert part.losses + rest.losses == full.losses  # bit-identical, as with every optimizer state kept
    assert [p.name for p in sorted(root.glob("step_*")) if has_optimizer_state(p)] == ["step_000008"]

    with pytest.raises(ConfigError, match=r"step_000004 .*holds no optimizer state.*keep_optimizer=last.*step_000008"):
        train(cfg(tmp_path, "part", resume_from="step_000004", keep_optimizer="last"), source=source)
    # nothing was discarded by the refused resume
    assert (root / "step_000006").is_dir() and (root / "last").resolve().name == "step_000008"


def test_keep_optimizer_accepts_only_all_or_last(tmp_path):
    with pytest.raises(ConfigError, match="keep_optimizer='some'.*all or last"):
        cfg(tmp_path, "x", keep_optimizer="some").check()
