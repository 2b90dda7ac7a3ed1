"""Load a LeRobot v2.1 dataset with LeRobot 0.3.3's own loader and print what it saw as JSON.

Run by tests/test_data_lerobot_compat.py in a subprocess with ``PYTHONPATH=.lerobot03`` (LeRobot 0.3.3
and its dataset dependencies, installed by ``make setup``)::

    PYTHONPATH=.lerobot03 .venv/bin/python tests/lerobot03_load.py DATASET_ROOT

What LeRobot does here: reads meta/info.json (version check), episodes.jsonl, tasks.jsonl and
episodes_stats.jsonl (aggregated into dataset stats), loads every parquet through HF ``datasets``
with the features built from info.json, checks that all episode files exist, and checks that
the timestamps advance by 1/fps inside each episode. What it cannot do here: decode the videos.
LeRobot 0.3.3 decodes with torchvision, and PyPI's torchvision does not import beside this
project's torch 2.13 CPU build, so a bare module stands in for ``import torchvision`` and no
frame is decoded (tests/test_data_format.py checks the video timestamps against LeRobot's rule).
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path


def _torchvision_import_only() -> None:
    try:
        import torchvision  # noqa: F401

        return
    except Exception:  # noqa: BLE001 - missing, or the operator error beside torch 2.13
        pass
    for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[name]
    for name in ("torchvision", "torchvision.io", "torchvision.transforms", "torchvision.transforms.v2"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)


def main(root: Path) -> dict:
    _torchvision_import_only()
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/check", root=root, download_videos=False)
    first = ds.hf_dataset[0]
    sub = LeRobotDataset("local/check", root=root, episodes=[0, ds.num_episodes - 1], download_videos=False)
    return {
        "lerobot": getattr(lerobot, "__version__", None),
        "version": str(ds.meta._version),
        "fps": ds.fps,
        "robot_type": ds.meta.robot_type,
        "total_episodes": ds.meta.total_episodes,
        "total_frames": ds.meta.total_frames,
        "num_episodes": ds.num_episodes,
        "num_frames": ds.num_frames,
        "video_keys": ds.meta.video_keys,
        "columns": list(ds.hf_dataset.column_names),
        "episode_from": ds.episode_data_index["from"].tolist(),
        "episode_to": ds.episode_data_index["to"].tolist(),
        "first_row_shapes": {k: list(getattr(v, "shape", [])) for k, v in first.items()},
        "tasks": ds.meta.tasks,
        "stats_action": {k: ds.meta.stats["action"][k].tolist() for k in ("min", "max", "mean", "std")},
        "subset_frames": sub.num_frames,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
