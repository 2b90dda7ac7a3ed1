"""The datasets this project writes load in LeRobot 0.3.3 (its own loader, in a subprocess).

LeRobot 0.3.3 and the parts of its dataset loader that requirements.txt lacks are installed by
``make setup`` into .lerobot03/ (requirements-lerobot03.txt); tests/lerobot03_load.py says what the
loader checks and what it cannot check here (video decoding).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.data.stats import load_columns
from tutorial_utils.data.synth import generate_dataset

REPO = Path(__file__).resolve().parents[1]
LEROBOT03 = REPO / ".lerobot03"
SCRIPT = Path(__file__).with_name("lerobot03_load.py")


def load_with_lerobot(root: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    if not (LEROBOT03 / "lerobot").is_dir():
        pytest.fail(f"{LEROBOT03} is missing: run `make setup` (it installs requirements-lerobot03.txt there)")
    env = dict(
        os.environ, PYTHONPATH=str(LEROBOT03), HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"
    )
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(root)], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_lerobot_03_loads_our_dataset(tmp_path):
    root = generate_dataset(tmp_path / "d", n_episodes=4, mean_length=15, image_size=32)
    proc = load_with_lerobot(root, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = LeRobotDataset(root)
    assert got["lerobot"] == "0.3.3" and got["version"] == "2.1" and got["fps"] == ours.fps == 20
    assert got["num_episodes"] == got["total_episodes"] == ours.num_episodes == 4
    assert got["num_frames"] == got["total_frames"] == len(ours)
    assert got["video_keys"] == list(ours.video_keys)
    ends = np.cumsum(ours.lengths).tolist()
    assert got["episode_to"] == ends and got["episode_from"] == [0] + ends[:-1]
    assert got["first_row_shapes"]["observation.state"] == [8] and got["first_row_shapes"]["action"] == [7]
    assert {int(k): v for k, v in got["tasks"].items()} == ours.tasks
    # LeRobot aggregates meta/episodes_stats.jsonl: it must agree with the frames themselves
    action = load_columns(root)["action"]
    np.testing.assert_allclose(got["stats_action"]["min"], action.min(0), rtol=1e-6)
    np.testing.assert_allclose(got["stats_action"]["max"], action.max(0), rtol=1e-6)
    np.testing.assert_allclose(got["stats_action"]["mean"], action.mean(0, dtype=np.float64), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["stats_action"]["std"], action.std(0, dtype=np.float64), rtol=1e-4, atol=1e-6)
    assert got["subset_frames"] == ours.lengths[0] + ours.lengths[-1]


@pytest.mark.slow
def test_lerobot_03_rejects_broken_timestamps(tmp_path):
    """The same check fails where LeRobot would: timestamps that do not advance by 1/fps."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = generate_dataset(tmp_path / "d", n_episodes=2, mean_length=10, image_size=32)
    path = root / "data/chunk-000/episode_000001.parquet"
    table = pq.read_table(path)
    ts = table.column("timestamp").to_numpy().copy()
    ts[3:] += 0.5
    pq.write_table(
        table.set_column(table.column_names.index("timestamp"), "timestamp", pa.array(ts, pa.float32())), path
    )
    proc = load_with_lerobot(root, tmp_path)
    assert proc.returncode != 0
    assert "timestamps" in proc.stderr.lower(), proc.stderr[-3000:]
