"""A bad file met inside a DataLoader worker reaches the user as the project's one-line teaching
error, not as the worker's 59-line traceback in a RuntimeError."""

from __future__ import annotations

from pathlib import Path

import pytest

from tutorial_utils.errors import DatasetError


@pytest.mark.slow
def test_a_truncated_video_in_a_worker_gives_the_teaching_error(tmp_path):
    pytest.importorskip("torch")
    from tutorial_utils.data.synth import generate_dataset
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.job import prepare_metadata
    from tutorial_utils.train.loop import train

    root = generate_dataset(tmp_path / "ds", n_episodes=3, mean_length=12, image_size=32, seed=0)
    prepare_metadata(root)
    video = sorted(Path(root, "videos").rglob("*.mp4"))[0]
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 3])
    cfg = TrainConfig.from_overrides(
        {"dataset": str(root), "output_dir": str(tmp_path / "run"), "steps": 4, "batch_size": 4, "num_workers": 2,
         "image_size": 32, "model_dim": 32, "num_heads": 2, "action_depth": 1, "progress": False, "val_fraction": 0.0}
    )  # fmt: skip
    with pytest.raises(DatasetError) as info:
        train(cfg)
    message = str(info.value)
    assert video.name in message and "Fix:" in message and "DataLoader worker" in message
    assert "Traceback" not in message and len(message.splitlines()) == 1


def test_a_dataset_error_rebuilt_from_a_message_keeps_it():
    err = DatasetError("plain message")
    assert str(err) == "plain message"
    full = DatasetError("x.parquet", "action", "not numbers", "re-record it")
    assert str(full) == "x.parquet [action]: not numbers. Fix: re-record it" and full.key == "action"
