"""LeRobot's own training loop on one of our recordings, for a row beside our trainer's.

``python -m tutorial_utils lerobot-train --dataset DIR --output-dir DIR [--policy act] [--steps N]
[--batch-size B] [--lr LR] [--seed S]``:

1. copies the recording (LeRobot v2.1) and converts the copy to LeRobot's current dataset format
   (v3.0) with LeRobot's own converter, on the local folder (nothing from the Hub). LeRobot trains
   on the images as they are stored (it does not resize), so when the cameras are not the family's
   ``image_size`` the copy is written at that size through the package's one resize
   (:func:`tutorial_utils.data.images.resize`): the pixels our trainer and our server give the model;
2. runs LeRobot's training script (``lerobot.scripts.lerobot_train``, unchanged) on it, with the
   family's model parameters passed as ``--policy.<name>=<value>``, so both trainers build the same
   model. The learning rate is ours for every parameter (LeRobot's ACT would use a ten times lower
   one, meant for a pretrained backbone); schedule, gradient clipping and augmentation are
   LeRobot's own. Its log goes to ``<output-dir>/lerobot_train.log``;
3. loads LeRobot's last ``pretrained_model`` into our adapter
   (:func:`tutorial_utils.policies.lerobot.from_lerobot_pretrained`) and saves it as
   ``<output-dir>/checkpoints/last``, a checkpoint our server serves and the evaluate job evaluates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tutorial_utils.errors import ConfigError

#: LeRobot's training script, after the project's torchvision workaround (without it the script dies
#: importing torchvision: "operator torchvision::nms does not exist", the CUDA wheel's ops library
#: beside the CPU torch; policies/_torchvision.py)
LEROBOT_TRAIN = (
    "import sys; from tutorial_utils.policies._torchvision import ensure_importable; ensure_importable(); "
    "from lerobot.scripts.lerobot_train import main; sys.argv = ['lerobot_train', *sys.argv[1:]]; main()"
)
SUMMARY_FILE = "lerobot_train.json"


def _flag(value: Any) -> str:
    """A value as LeRobot's command line (draccus) reads it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_flag(v) for v in value) + "]"
    return str(value)


def resized_copy(dataset: str | os.PathLike, dest: str | os.PathLike, size: int) -> Path:
    """A copy of the v2.1 recording ``dataset`` at ``dest`` whose cameras are ``size`` x ``size``
    (every frame through :func:`tutorial_utils.data.images.resize`), with its modality file,
    recording manifest and statistics."""
    import numpy as np
    from tqdm.auto import tqdm

    from tutorial_utils.data.images import resize
    from tutorial_utils.data.reader import LeRobotDataset
    from tutorial_utils.data.schema import read_info
    from tutorial_utils.data.stats import compute_all
    from tutorial_utils.data.writer import LeRobotWriter

    src, dest = Path(dataset), Path(dest)
    ds = LeRobotDataset(src, verify_videos=False)
    info = read_info(src)
    features = {k: {kk: vv for kk, vv in v.items() if kk != "info"} for k, v in info["features"].items()}
    for key in ds.video_keys:
        features[key]["shape"] = [size, size, 3]
    writer = LeRobotWriter(dest, features=features, fps=info["fps"], robot_type=info.get("robot_type"))
    try:
        for ep in tqdm(range(ds.num_episodes), desc=f"cameras to {size}x{size}", unit="episode"):
            low = ds._lowdim(ep)
            frames = {k: np.asarray(low[k]) for k in writer._data_keys}
            for key in ds.video_keys:
                frames[key] = np.stack([resize(ds.frame(ep, key, i), size) for i in range(int(ds.lengths[ep]))])
            writer.add_episode(frames, ds.tasks[int(low["task_index"][0])])
        writer.finalize()
    finally:
        writer.close()
    for name in ("modality.json", "record_manifest.json"):
        if (src / "meta" / name).is_file():
            shutil.copy2(src / "meta" / name, dest / "meta" / name)
    compute_all(dest)
    return dest


def convert(dataset: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """A copy of ``dataset`` converted to LeRobot's v3.0 format at ``dest`` (returned)."""
    from tutorial_utils.policies._torchvision import ensure_importable

    ensure_importable()
    from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset

    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(dataset, dest)
    convert_dataset(dest.name, root=dest.parent, push_to_hub=False)  # a local folder: no Hub download or push
    return dest


def _log_freq(steps: int) -> int:
    return max(1, min(25, steps))


def lerobot_args(model, converted: Path, out: Path, steps: int, batch_size: int, lr: float, seed: int) -> list[str]:
    """LeRobot's training flags for ``model``'s family and parameters."""
    args = [f"--policy.type={model.lerobot_type}", "--policy.device=cpu", "--policy.push_to_hub=false"]
    args += [f"--policy.{k}={_flag(v)}" for k, v in model.cfg.lerobot_kwargs().items()]
    args += [f"--policy.optimizer_lr={lr}"]
    if hasattr(model.lerobot_config, "optimizer_lr_backbone"):
        args += [f"--policy.optimizer_lr_backbone={lr}"]
    args += [f"--dataset.repo_id={converted.name}", f"--dataset.root={converted}", "--dataset.video_backend=torchcodec"]
    args += [f"--steps={steps}", f"--batch_size={batch_size}", "--num_workers=1", f"--seed={seed}"]
    args += [
        f"--save_freq={steps}",
        f"--log_freq={_log_freq(steps)}",
        "--eval_freq=0",
        "--wandb.enable=false",
        f"--output_dir={out}",
    ]
    return args


def train(
    dataset: str | os.PathLike,
    output_dir: str | os.PathLike,
    policy: str = "act",
    steps: int = 1000,
    batch_size: int = 16,
    lr: float | None = None,
    seed: int = 42,
    config: dict | None = None,
) -> dict[str, Any]:
    """Train ``policy`` with LeRobot's own loop on ``dataset``; returns (and writes) the summary."""
    from tutorial_utils import paths, policies
    from tutorial_utils.policies.lerobot import LeRobotPolicy, from_lerobot_pretrained
    from tutorial_utils.train.data import _in_data, open_dataset

    root = _in_data(dataset)
    source = open_dataset(root, run_dir=None)
    model = policies.make(policy, config, source.statistics)
    if not isinstance(model, LeRobotPolicy):
        raise ConfigError(
            f"policy={policy!r}: LeRobot's training loop trains LeRobot's families (act, diffusion, vqbet)"
        )
    if not model.uses_state:
        raise ConfigError(
            f"policy {policy!r} with use_state=false: LeRobot's script feeds the model every feature the dataset "
            "has, the state included; train the cameras-only variant with our trainer"
        )
    if getattr(model.cfg, "state_dropout", 0.0):
        raise ConfigError(
            f"policy {policy!r} with state_dropout={model.cfg.state_dropout}: LeRobot's script has no state "
            "dropout; train that variant with our trainer (python -m tutorial_utils train ...)"
        )
    side = int(source.image_shape[0] if source.image_shape[-1] == 3 else source.image_shape[-1])
    resize_to = None if side == model.image_size else int(model.image_size)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    given = root
    if resize_to is not None:  # the copy LeRobot reads, at the model's size (kept beside the run: v2.1)
        resized = out / "resized" / root.name
        if resized.exists():
            shutil.rmtree(resized)
        given = resized_copy(root, resized, resize_to)
    converted = convert(given, out / "lerobot_dataset" / root.name)
    t_convert = time.monotonic() - t0
    if lr is None:  # the family's recipe, as this book's trainer would use it
        from tutorial_utils.train.config import family_recipe

        lr = family_recipe(type(model).name)["optimizer_lr"]
    lr = float(lr)
    train_dir = out / "lerobot"
    if train_dir.exists():  # LeRobot refuses an existing output directory without resume
        shutil.rmtree(train_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-c", LEROBOT_TRAIN, *lerobot_args(model, converted, train_dir, steps, batch_size, lr, seed)]
    t1 = time.monotonic()
    with open(out / "lerobot_train.log", "w", encoding="utf-8") as log:
        run = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, text=True)
    t_train = time.monotonic() - t1
    if run.returncode != 0:
        tail = (out / "lerobot_train.log").read_text(encoding="utf-8", errors="replace")[-2000:]
        raise RuntimeError(
            f"LeRobot's training script failed (exit {run.returncode}); {out}/lerobot_train.log ends:\n{tail}"
        )
    pretrained = train_dir / "checkpoints" / "last" / "pretrained_model"
    ours = from_lerobot_pretrained(pretrained, source.statistics, family=policy)
    checkpoint = out / "checkpoints" / "last"
    ours.save(checkpoint)
    summary = {
        "kind": "lerobot_train",
        "policy": policy,
        "dataset": root.name,
        "cameras": f"{side}x{side}" + (f", resized to {resize_to}x{resize_to} for LeRobot" if resize_to else ""),
        "steps": steps,
        "batch_size": batch_size,
        "learning_rate": lr,
        "seed": seed,
        "convert_s": round(t_convert, 1),
        "train_s": round(t_train, 1),
        "losses": _losses(out / "lerobot_train.log", _log_freq(steps), steps),
        "checkpoint": paths.for_book(os.fspath(checkpoint)),
        "command": paths.for_book("lerobot.scripts.lerobot_train " + " ".join(cmd[3:])),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary


def _losses(log: Path, log_freq: int, steps: int) -> list[list[float]]:
    """``[[step, loss], ...]`` from LeRobot's training log: one ``loss:`` line every ``log_freq``
    steps (its own ``step:`` field is rounded, ``1K`` for 1000-1099, so the step is counted here)."""
    import re

    losses = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = re.search(r"\bstep:\S+ .*?\bloss:([0-9.eE+-]+)", line)
        if m:
            losses.append(float(m.group(1)))
    return [[min(steps, (i + 1) * log_freq), v] for i, v in enumerate(losses)]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils lerobot-train",
        description="Train a LeRobot family with LeRobot's own training loop on one of our recordings (converted to "
        "LeRobot's v3.0 format), and save the result as a checkpoint our server serves.",
    )
    ap.add_argument("--dataset", required=True, help="our LeRobot v2.1 recording (a folder or a name under data/)")
    ap.add_argument("--output-dir", required=True, help="where the converted copy, LeRobot's run and our checkpoint go")
    ap.add_argument("--policy", default="act", help="a LeRobot family: act, diffusion, vqbet")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the family's, as the zoo uses)")
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args(argv)
    try:
        s = train(a.dataset, a.output_dir, a.policy, a.steps, a.batch_size, a.lr, a.seed)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    print(
        f"LeRobot's loop trained {s['policy']} for {s['steps']} steps in {s['train_s'] / 60:.1f} min; "
        f"checkpoint {s['checkpoint']}"
    )
    return 0
