"""Training loop of the mini DiT4DiT policy: config, data, checkpoints, resume, metrics.

One place lists every parameter (:data:`TrainConfig`'s fields, printed by
``python -m tutorial_utils train --list-params`` and :func:`parameters_table`): the training
platform's names (``batch_size``, ``steps``, ``seed``, ``num_workers``, ``eval_freq``,
``log_freq``, ``save_freq``, ``save_checkpoint``, ``optimizer_*``, ``scheduler_*``) are the
canonical ones; DiT4DiT's overrides are aliases (:data:`ALIASES`: ``per_device_batch_size``
-> ``batch_size``, ``max_train_steps`` -> ``steps`` ...; ``trainer.`` / ``datasets.vla_data.``
prefixes are accepted, so a DiT4DiT command line reads the same).

A run directory (``output_dir``) is self-describing::

    train_config.json          every parameter as resolved, plus the policy config
    dataset_statistics.json    the normalisation the policy uses (DiT4DiT's name and place)
    train.log                  the DiT4DiT-format log lines (tutorial_utils.logs constants)
    metrics.jsonl              one row per log step (loss, lr, grad norm, samples/s, data wait)
                               and per eval step (validation action error on held-out episodes)
    checkpoints/step_000100/   policy files + training_state.pt/json (optimizer, scheduler, RNG)
    checkpoints/last ->        relative symlink to the newest step_* (replaced atomically)
    checkpoints/best/          the policy with the lowest validation action error
    summary.json               what happened: steps, losses, throughput, sizes, stop reason

Resume (``resume=true``) restores model, optimizer, scheduler, RNG and step; the data order and
the flow-matching noise are pure functions of (seed, step), so a resumed run's losses equal the
uninterrupted run's. SIGINT/SIGTERM stop after the current step with a checkpoint. Runs as
plain Python or under ``accelerate launch --num_processes N`` (DDP; each rank reads its own
slice of every global batch).

CLI: ``python -m tutorial_utils train --dataset DIR --output-dir DIR key=value ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from tutorial_utils import logs as L
from tutorial_utils.io import atomic_dir, atomic_write_json, atomic_write_text, read_jsonl

TRAIN_STATE_FILE = "training_state.pt"
TRAIN_STATE_JSON = "training_state.json"
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"
CONFIG_FILE = "train_config.json"
SUMMARY_FILE = "summary.json"


class ConfigError(ValueError):
    """A bad training parameter (unknown name, wrong type, unknown module to freeze)."""


class DatasetNotReady(ValueError):
    """The dataset lacks what training needs (modality.json, statistics)."""


def _p(default: Any, help: str, group: str = "training") -> Any:
    return field(default=default, metadata={"help": help, "group": group})


@dataclass
class TrainConfig:
    """Every training parameter. Platform names are canonical; DiT4DiT names are aliases."""

    # data and run
    dataset: str = _p("", "LeRobot v2.1 dataset directory (with meta/modality.json and statistics). "
                          "Alias data_mix: a name under data/ or a path.", "data")
    output_dir: str = _p("", "run directory: logs, metrics, checkpoints (a fresh one per run)", "data")
    run_id: str = _p("", "experiment id printed in `[Exp: id]` lines (default: output_dir's name)", "data")
    val_fraction: float = _p(0.1, "share of episodes held out for the validation action error "
                                  "(at least one episode when the dataset has two or more)", "data")
    val_samples: int = _p(64, "held-out frames scored at each evaluation (evenly spaced)", "data")
    data_cache_mb: int = _p(1024, "decoded-video cache per data process, MB (whole episodes are decoded once)", "data")
    # the training platform's parameters
    batch_size: int = _p(8, "samples per step per process (alias per_device_batch_size). 1-32; larger is "
                            "steadier but needs more memory")
    steps: int = _p(10_000, "total optimisation steps (alias max_train_steps). Start near 10k and adjust "
                            "from the validation curve")
    seed: int = _p(1000, "seed of the weights, the data order and the noise: same seed, same run")
    num_workers: int = _p(1, "DataLoader worker processes (0: load in the main process). 1/2 to 1x the CPU cores")
    eval_freq: int = _p(1000, "evaluate the validation action error every N steps (alias eval_interval; "
                              "about 10% of steps; 0: only at the end)")
    log_freq: int = _p(10, "print the loss line and write a metrics row every N steps (alias "
                           "logging_frequency; 10-100)")
    save_freq: int = _p(3000, "save a checkpoint every N steps (alias save_interval; about 30% of steps)")
    time_limit_min: float = _p(0.0, "stop after this many minutes of training and finish as if `steps` were reached "
                                     "(checkpoint, final_model); a budget for the CPU chain. 0: no limit")
    save_checkpoint: bool = _p(True, "write checkpoints (step_*, last, best); off: only final_model")
    optimizer_lr: float = _p(1e-4, "peak learning rate of AdamW (1e-5..1e-4; lower when fine-tuning)", "optimizer")
    optimizer_weight_decay: float = _p(1e-4, "AdamW weight decay (0.0..0.01)", "optimizer")
    optimizer_grad_clip_norm: float = _p(1.0, "clip the gradient norm to this (1.0); 0 disables", "optimizer")
    optimizer_betas: tuple = _p((0.9, 0.95), "AdamW betas, e.g. 0.9,0.95 (DiT4DiT)", "optimizer")
    scheduler_warmup_steps: int = _p(500, "linear warm-up steps from 0 to optimizer_lr (5-10% of steps)", "scheduler")
    scheduler_decay_steps: int = _p(0, "cosine decay steps after warm-up down to scheduler_decay_lr "
                                       "(80-90% of steps; 0: all remaining steps)", "scheduler")
    scheduler_decay_lr: float = _p(1e-5, "learning rate at the end of the decay (held afterwards)", "scheduler")
    augment_shift: int = _p(4, "random image shift of up to N pixels (at image_size) while training, a cheap "
                               "augmentation that helps closed-loop control; 0: off")
    # DiT4DiT-style
    pretrained_checkpoint: str = _p("", "start from this policy checkpoint directory (same model config)", "dit4dit")
    freeze_modules: str = _p("", "comma-separated modules not to train, e.g. backbone or "
                                 "backbone.language_encoder (see --list-modules)", "dit4dit")
    resume: bool = _p(False, "continue the run in output_dir from checkpoints/last (exact: same losses)", "dit4dit")
    keep_final_model: bool = _p(False, "keep output_dir/final_model (env KEEP_FINAL_MODEL=1 does the same); "
                                       "by default it is removed after its size is reported", "dit4dit")
    # model
    image_size: int = _p(64, "camera images are resized to this square size", "model")
    model_dim: int = _p(128, "token width of the encoders and the DiT head", "model")
    num_heads: int = _p(4, "attention heads", "model")
    action_depth: int = _p(4, "DiT blocks in the action head", "model")
    language_layers: int = _p(1, "transformer layers of the instruction encoder", "model")
    action_horizon: int = _p(8, "actions per predicted chunk (DiT4DiT: 8)", "model")
    num_inference_steps: int = _p(4, "Euler steps from noise to actions at inference (DiT4DiT: 4)", "model")
    # machine
    device: str = _p("auto", "auto, cpu or cuda (under accelerate launch: what accelerate picks)", "machine")
    num_threads: int = _p(0, "torch CPU threads per process (0: torch's default)", "machine")
    progress: bool = _p(True, "show a tqdm progress bar with ETA (on stderr)", "machine")

    # ---------------------------------------------------------------------------------------
    @classmethod
    def fields_info(cls) -> list[dict]:
        rows = []
        inv: dict[str, list[str]] = {}
        for a, c in ALIASES.items():
            inv.setdefault(c, []).append(a)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            rows.append({"name": f.name, "type": _type_name(f), "default": default, "group": f.metadata.get("group"),
                         "aliases": inv.get(f.name, []), "help": f.metadata.get("help", "")})
        return rows

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any] | Sequence[str] = (), base: "TrainConfig | None" = None) -> "TrainConfig":
        """A config from ``{name: value}`` or ``["name=value", ...]``; values may be strings."""
        if not isinstance(overrides, Mapping):
            overrides = parse_overrides(overrides)
        cfg = dataclasses.replace(base) if base is not None else cls()
        types = {f.name: f for f in dataclasses.fields(cls)}
        seen: dict[str, str] = {}
        for raw_key, value in overrides.items():
            key = canonical_name(raw_key)
            if key in seen and seen[key] != raw_key:
                raise ConfigError(f"parameter {key!r} given twice (as {seen[key]!r} and {raw_key!r}); keep one.")
            seen[key] = raw_key
            setattr(cfg, key, _coerce(types[key], value, raw_key))
        cfg.check()
        return cfg

    def check(self) -> None:
        pos = ["batch_size", "steps", "val_samples", "image_size", "model_dim", "num_heads", "action_depth",
               "action_horizon", "num_inference_steps"]
        for name in pos:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("num_workers", "eval_freq", "log_freq", "save_freq", "scheduler_warmup_steps",
                     "scheduler_decay_steps", "num_threads", "language_layers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction={self.val_fraction} must be in [0, 1)")
        if self.optimizer_lr <= 0:
            raise ConfigError(f"optimizer_lr={self.optimizer_lr} must be > 0 (1e-5..1e-4 is typical)")
        if self.device not in ("auto", "cpu", "cuda", "mps"):
            raise ConfigError(f"device={self.device!r}: use auto, cpu, cuda or mps")
        if self.model_dim % self.num_heads:
            raise ConfigError(f"model_dim={self.model_dim} must be divisible by num_heads={self.num_heads}")
        if self.image_size % 16:
            raise ConfigError(f"image_size={self.image_size} must be a multiple of 16")

    def policy_config(self):
        from tutorial_utils.policy import PolicyConfig

        return PolicyConfig(image_size=self.image_size, model_dim=self.model_dim, num_heads=self.num_heads,
                            action_depth=self.action_depth, language_layers=self.language_layers,
                            action_horizon=self.action_horizon, num_inference_steps=self.num_inference_steps)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def freeze_list(self) -> list[str]:
        return [m.strip() for m in str(self.freeze_modules).split(",") if m.strip()]


#: DiT4DiT's override names -> the canonical parameter.
ALIASES: dict[str, str] = {
    "data_mix": "dataset",
    "per_device_batch_size": "batch_size",
    "max_train_steps": "steps",
    "save_interval": "save_freq",
    "eval_interval": "eval_freq",
    "logging_frequency": "log_freq",
    "env_eval_freq": "eval_freq",  # LeRobot >= 0.6's name
    "num_train_steps": "steps",
}
_PREFIXES = ("trainer.", "datasets.vla_data.", "framework.", "optimizer.", "scheduler.")


def canonical_name(key: str) -> str:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    k = str(key).strip().lstrip("-").replace("-", "_")
    for pre in _PREFIXES:
        if k.startswith(pre) and k[len(pre):] in names | set(ALIASES):
            k = k[len(pre):]
    k = ALIASES.get(k, k)
    if k not in names:
        import difflib

        close = difflib.get_close_matches(k, sorted(names | set(ALIASES)), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"unknown training parameter {key!r}.{hint} Known parameters: "
            f"`python -m tutorial_utils train --list-params` (aliases: {', '.join(sorted(ALIASES))})."
        )
    return k


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (for example steps=100 or trainer.max_train_steps=100)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _type_name(f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return str(t)


def _coerce(f: dataclasses.Field, value: Any, key: str) -> Any:
    t = _type_name(f)
    try:
        if t == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(value)
        if t == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(float(value)) if isinstance(value, str) and ("e" in value.lower() or "." in value) else int(value)
        if t == "float":
            return float(value)
        if t == "tuple":
            if isinstance(value, (list, tuple)):
                return tuple(float(v) for v in value)
            return tuple(float(v) for v in str(value).strip("[]()").split(",") if v.strip())
        if t == "str":
            if isinstance(value, (list, tuple)):
                return ",".join(map(str, value))
            return "" if value is None else str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"parameter {key}={value!r}: expected {t}") from None
    return value


def parameters_table() -> str:
    """Markdown table of every parameter, its default, aliases and meaning (the one list)."""
    lines = ["| parameter | default | aliases | meaning |", "|---|---|---|---|"]
    for r in TrainConfig.fields_info():
        lines.append(f"| `{r['name']}` | `{r['default']!r}` | {', '.join(f'`{a}`' for a in r['aliases'])} | {r['help']} |")
    return "\n".join(lines)


# --- data ----------------------------------------------------------------------------------------


class ArraySource:
    """Frames in memory (tests, benchmarks): the same windows the LeRobot source gives.

    ``primary``/``wrist`` (N,H,W,3) uint8, ``state`` (N,8), ``action`` (N,7), ``episode_index``
    (N,) with each episode's frames contiguous, ``tasks`` one string per frame or per episode.
    """

    def __init__(self, primary, wrist, state, action, episode_index, tasks, statistics: dict, name: str = "arrays"):
        self.primary, self.wrist = np.asarray(primary, np.uint8), np.asarray(wrist, np.uint8)
        self.state, self.action = np.asarray(state, np.float32), np.asarray(action, np.float32)
        self.frame_episode = np.asarray(episode_index, np.int64)
        n = len(self.state)
        self.tasks = list(tasks) if len(tasks) == n else [tasks[e] for e in self.frame_episode]
        self.statistics = statistics
        self.name = name
        self.image_shape = tuple(self.primary.shape[1:])
        self.ep_end = np.zeros(n, np.int64)
        for e in np.unique(self.frame_episode):
            idx = np.nonzero(self.frame_episode == e)[0]
            self.ep_end[idx] = idx.max() + 1

    def __len__(self) -> int:
        return len(self.state)

    def get(self, i: int, horizon: int) -> dict:
        end = int(self.ep_end[i])
        idx = i + np.arange(horizon)
        mask = idx < end
        idx = np.minimum(idx, end - 1)
        return {"primary": self.primary[i], "wrist": self.wrist[i], "state": self.state[i],
                "action": self.action[idx], "action_mask": mask, "instruction": self.tasks[i]}


def synthetic_source(n_episodes: int = 6, length: int = 24, image_size: int = 32, seed: int = 0,
                     n_tasks: int = 2) -> ArraySource:
    """A small learnable in-memory dataset: actions are a smooth function of state, the task and
    a colour patch in the image; statistics in the ``dataset_statistics.json`` layout."""
    rng = np.random.default_rng(seed)
    prim, wrist, st, act, epi, tasks = [], [], [], [], [], []
    names = ["pick up the black bowl and place it on the plate", "push the red block to the left",
             "open the top drawer", "put the cup in the basket"][:max(1, n_tasks)]
    for e in range(n_episodes):
        task = e % len(names)
        goal = rng.uniform(-0.5, 0.5, 3)
        pos = rng.uniform(-0.3, 0.3, 3)
        for t in range(length):
            img = np.full((image_size, image_size, 3), 40, np.uint8)
            px = int((goal[0] + 0.5) * (image_size - 8))
            img[4:12, px:px + 8, task % 3] = 220
            d = goal - pos
            a = np.concatenate([np.clip(d * 4, -1, 1), [0.1 * task, -0.1 * task, 0.0], [1.0 if t < length // 2 else -1.0]])
            s = np.concatenate([pos, [0.0, 0.0, 0.0], [0.04, -0.04]])
            prim.append(img)
            wrist.append(img[::-1].copy())
            st.append(s)
            act.append(a)
            epi.append(e)
            tasks.append(names[task])
            pos = pos + 0.05 * a[:3]
    act_a = np.asarray(act, np.float32)
    stats = {"franka": {"action": {"min": act_a.min(0).tolist(), "max": act_a.max(0).tolist(),
                                   "mean": act_a.mean(0).tolist(), "std": act_a.std(0).tolist(),
                                   "mask": [True] * 6 + [False]},
                        "state": {"min": np.min(st, 0).tolist(), "max": np.max(st, 0).tolist()},
                        "num_trajectories": n_episodes, "num_transitions": len(act)}}
    return ArraySource(np.stack(prim), np.stack(wrist), np.stack(st), act_a, np.array(epi), tasks, stats, name="synthetic")


_INHERITED_READERS: list = []  # see LeRobotSource._reader


class LeRobotSource:
    """A LeRobot v2.1 dataset (``tutorial_utils.lerobot``) as training windows."""

    def __init__(self, root: str | os.PathLike, statistics: dict, cache_mb: int = 512):
        from tutorial_utils.lerobot import LIBERO_CAMERAS, LeRobotDataset

        self.root = Path(root)
        self.cache_mb = cache_mb
        self.ds = LeRobotDataset(self.root, verify_videos=False, cache_mb=cache_mb)
        self._pid = os.getpid()
        keys = self.ds.video_keys
        if len(keys) < 2:
            raise DatasetNotReady(f"{self.root}/meta/info.json: the mini policy needs two cameras (primary and wrist), "
                                  f"the dataset has {keys}.")
        self.primary_key = LIBERO_CAMERAS[0] if LIBERO_CAMERAS[0] in keys else keys[0]
        self.wrist_key = LIBERO_CAMERAS[1] if LIBERO_CAMERAS[1] in keys else keys[1]
        self.frame_episode = np.repeat(np.arange(self.ds.num_episodes), self.ds.lengths)
        self.statistics = statistics
        self.name = self.root.name
        self.image_shape = tuple(self.ds.features[self.primary_key]["shape"])

    def __len__(self) -> int:
        return len(self.ds)

    def _reader(self):
        """This process's dataset reader. A DataLoader worker forked from a process that had
        decoded video inherits PyAV decoders whose ffmpeg threads did not survive the fork:
        freeing them there blocks forever (pthread_cond_destroy). So a worker keeps the
        inherited reader referenced, never touches it, and opens its own."""
        if self._pid != os.getpid():
            from tutorial_utils.lerobot import LeRobotDataset

            _INHERITED_READERS.append(self.ds)
            self.ds = LeRobotDataset(self.root, verify_videos=False, cache_mb=self.cache_mb)
            self._pid = os.getpid()
        return self.ds

    def get(self, i: int, horizon: int) -> dict:
        s = self._reader().sample(int(i), action_horizon=horizon, video_delta_indices=(0,))
        return {"primary": s[self.primary_key][0], "wrist": s[self.wrist_key][0],
                "state": np.asarray(s["state"], np.float32), "action": np.asarray(s["action"], np.float32),
                "action_mask": np.asarray(s["action_mask"], bool), "instruction": s["task"]}


def _in_data(path: str | os.PathLike) -> Path:
    """``path`` itself, or ``data/<path>`` when only that exists (a dataset given by name)."""
    from tutorial_utils import paths

    p = Path(path)
    if not p.exists() and not p.is_absolute() and (paths.DATA / p).exists():
        return paths.DATA / p
    return p


def open_dataset(root: str | os.PathLike, run_dir: str | os.PathLike | None = None, cache_mb: int = 1024) -> LeRobotSource:
    """Check a dataset is ready for training and open it; statistics go to ``run_dir``."""
    root = _in_data(root)
    if not (root / "meta" / "info.json").is_file():
        raise DatasetNotReady(
            f"{root}/meta/info.json not found: {root} is not a LeRobot v2.1 dataset. Record one with the "
            "record_demos job (notebooks/jobs/record_demos.md) or generate a synthetic one with "
            "`python -m tutorial_utils dataset generate DIR`."
        )
    if not (root / "meta" / "modality.json").is_file():
        raise DatasetNotReady(
            f"{root}/meta/modality.json is missing: training needs the GR00T-style modality file that maps "
            "state/action/video/annotation keys (FACTS.md section 2). Create it with "
            f"`python -c \"from tutorial_utils.modality import build_modality; build_modality('{root}')\"` "
            "(DiT4DiT's LIBERO preset) and check it with `python -m tutorial_utils dataset validate DIR`."
        )
    stats_file = root / "meta" / "stats_gr00t.json"
    if not stats_file.is_file():
        raise DatasetNotReady(
            f"{stats_file} is missing: training normalises actions with the dataset statistics. Create them "
            f"with `python -m tutorial_utils dataset stats {root}` (writes stats_gr00t.json and "
            "dataset_statistics.json)."
        )
    statistics = dataset_statistics(root, run_dir)
    return LeRobotSource(root, statistics, cache_mb=cache_mb)


def dataset_statistics(root: Path, run_dir: str | os.PathLike | None) -> dict:
    """``dataset_statistics.json`` content for the dataset (via ``tutorial_utils.stats``)."""
    from tutorial_utils import stats as S

    res = S.compute_all(root, run_dir=run_dir) if run_dir else S.compute_all(root)
    if isinstance(res, Mapping):
        for key in ("dataset_statistics", "statistics"):
            if isinstance(res.get(key), Mapping):
                return dict(res[key])
        for key in ("dataset_statistics_path", "dataset_statistics_file"):
            if res.get(key):
                return json.loads(Path(res[key]).read_text())
        files = res.get("files")
        if isinstance(files, Mapping):
            for k, v in files.items():
                if "dataset_statistics" in str(k) or str(v).endswith("dataset_statistics.json"):
                    return json.loads(Path(v).read_text())
    if run_dir and (Path(run_dir) / "dataset_statistics.json").is_file():
        return json.loads((Path(run_dir) / "dataset_statistics.json").read_text())
    raise DatasetNotReady(f"{root}: tutorial_utils.stats.compute_all gave no dataset_statistics; "
                          f"run `python -m tutorial_utils dataset stats {root} --run-dir RUN_DIR`.")


class WindowDataset:
    """torch-style map dataset over a source: resized uint8 images, state, action chunk, mask."""

    def __init__(self, source, indices: np.ndarray, horizon: int, image_size: int):
        self.source, self.indices, self.horizon, self.image_size = source, np.asarray(indices), horizon, image_size

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> dict:
        s = self.source.get(int(k), self.horizon)  # k is already a source index (see StepBatchSampler)
        s["primary"] = _resize(s["primary"], self.image_size)
        s["wrist"] = _resize(s["wrist"], self.image_size)
        return s


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    if img.shape[0] == size and img.shape[1] == size:
        return np.ascontiguousarray(img)
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def random_shift(batch: dict, pad: int, generator) -> dict:
    """Shift both camera images by up to ``pad`` pixels (replicate padding, then a random crop),
    drawn from ``generator`` so a resumed run sees the same crops. Returns float images in [0,1]."""
    import torch
    import torch.nn.functional as F

    out = dict(batch)
    for key in ("primary", "wrist"):
        x = batch[key].permute(0, 3, 1, 2).float() / 255.0
        b, _, h, w = x.shape
        padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
        off = torch.randint(0, 2 * pad + 1, (b, 2), generator=generator)
        out[key] = torch.stack([padded[i, :, off[i, 0]:off[i, 0] + h, off[i, 1]:off[i, 1] + w] for i in range(b)])
    return out


def collate(items: list[dict]) -> dict:
    import torch

    out: dict[str, Any] = {"instruction": [it["instruction"] for it in items]}
    for k in ("primary", "wrist", "state", "action", "action_mask"):
        out[k] = torch.from_numpy(np.stack([it[k] for it in items]))
    return out


class StepBatchSampler:
    """Batches for steps ``start..steps-1`` of one rank, as a pure function of (seed, step).

    The index stream is one permutation of the training frames per epoch (seeded with
    seed + epoch); step s takes positions [s*G, (s+1)*G) with G = batch * world, and rank r
    the r-th slice of B. A resumed run therefore reads exactly the batches it would have.
    """

    def __init__(self, indices: np.ndarray, batch_size: int, steps: int, seed: int, start: int = 0,
                 rank: int = 0, world: int = 1):
        self.indices = np.asarray(indices, np.int64)
        self.batch_size, self.steps, self.seed, self.start, self.rank, self.world = batch_size, steps, seed, start, rank, world
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.indices))}
        return self._perms[epoch]

    def batch(self, step: int) -> list[int]:
        n = len(self.indices)
        g = self.batch_size * self.world
        first = step * g + self.rank * self.batch_size
        out = []
        for p in range(first, first + self.batch_size):
            out.append(int(self.indices[self._perm(p // n)[p % n]]))
        return out

    def __iter__(self):
        for s in range(self.start, self.steps):
            yield self.batch(s)

    def __len__(self) -> int:
        return max(0, self.steps - self.start)


def split_episodes(frame_episode: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(train frame indices, val frame indices, val episode ids).

    The held-out episodes are spread evenly over the dataset (the last one of each of
    ``n_val`` equal blocks), not taken from its end: recordings are written task by task, so
    holding out the last episodes would remove whole tasks from training.
    """
    eps = np.unique(frame_episode)
    n_val = int(round(len(eps) * val_fraction))
    if val_fraction > 0 and len(eps) >= 2:
        n_val = max(1, n_val)
    n_val = min(n_val, len(eps) - 1)
    picks = (np.arange(1, n_val + 1) * len(eps)) // max(1, n_val) - 1
    val_eps = eps[picks] if n_val > 0 else eps[:0]
    is_val = np.isin(frame_episode, val_eps)
    return np.nonzero(~is_val)[0], np.nonzero(is_val)[0], [int(e) for e in val_eps]


# --- learning-rate schedule --------------------------------------------------------------------


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of optimizer_lr at ``step``: linear warm-up, cosine decay, then hold."""
    w = cfg.scheduler_warmup_steps
    if w and step < w:
        return (step + 1) / w
    decay = cfg.scheduler_decay_steps or max(1, cfg.steps - w)
    floor = min(1.0, cfg.scheduler_decay_lr / cfg.optimizer_lr)
    p = min(1.0, (step - w) / decay)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


# --- modules --------------------------------------------------------------------------------------


def apply_freeze(policy, names: Sequence[str]) -> list[str]:
    """Freeze the named modules (dotted names); a clear error for unknown ones."""
    modules = dict(policy.named_modules())
    unknown = [n for n in names if n not in modules or not n]
    if unknown:
        known = [n for n in modules if n and n.count(".") < 2]
        raise ConfigError(
            f"freeze_modules: unknown module(s) {unknown}. The policy's modules are: {', '.join(known)} "
            "(deeper dotted names work too, e.g. action_model.blocks.0). DiT4DiT's "
            "`backbone_interface` is called `backbone` here."
        )
    for n in names:
        for p in modules[n].parameters():
            p.requires_grad_(False)
    if not any(p.requires_grad for p in policy.parameters()):
        raise ConfigError(f"freeze_modules={','.join(names)!r} freezes every parameter: nothing would train. "
                          "Leave at least action_model trainable.")
    return list(names)


def dir_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            fp = Path(root) / f
            if not fp.is_symlink():
                total += fp.stat().st_size
    return total


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


# --- checkpoints ----------------------------------------------------------------------------------


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def find_last(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint: ``last`` if it resolves, else the newest complete step_*."""
    last = ckpt_root / "last"
    if last.exists() and (last / TRAIN_STATE_JSON).is_file():
        return last.resolve()
    steps = sorted(p for p in ckpt_root.glob("step_*") if (p / TRAIN_STATE_JSON).is_file())
    return steps[-1] if steps else None


def _point_last(ckpt_root: Path, target: Path) -> None:
    """Atomically make ``checkpoints/last`` a relative symlink to ``target``."""
    tmp = ckpt_root / f".last.tmp-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target.name, tmp)
    os.replace(tmp, ckpt_root / "last")


def _slow_save_hook() -> None:
    # Test hook: TUTORIAL_TRAIN_SAVE_DELAY=seconds stalls inside a checkpoint write, so a test can
    # kill -9 the process mid-write. Unset in normal runs.
    delay = float(os.environ.get("TUTORIAL_TRAIN_SAVE_DELAY", "0") or 0)
    if delay > 0:
        time.sleep(delay)


# --- the loop -------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    output_dir: Path
    steps_done: int
    losses: list[tuple[int, float]]
    stopped_by: str | None
    summary: dict


class _Stop:
    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.getsignal(s)
            signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


class _Log:
    def __init__(self, path: Path | None, enabled: bool):
        self.enabled = enabled
        self.fh = open(path, "a", encoding="utf-8") if (path and enabled) else None

    def __call__(self, line: str) -> None:
        if not self.enabled:
            return
        print(line, flush=True)
        if self.fh:
            self.fh.write(line + "\n")
            self.fh.flush()

    def close(self) -> None:
        if self.fh:
            self.fh.close()


def train(cfg: TrainConfig, source=None, on_step: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train the mini policy as ``cfg`` says. ``source`` (an :class:`ArraySource`) replaces
    ``cfg.dataset`` (tests, benchmarks). Returns what happened; writes the run directory."""
    import torch

    from tutorial_utils import policy as P

    cfg.check()
    if not cfg.output_dir:
        raise ConfigError("output_dir is empty: pass --output-dir DIR (a job's run_dir) so the run has a home.")
    out = Path(cfg.output_dir)
    ckpt_root = out / "checkpoints"
    keep_final = cfg.keep_final_model or os.environ.get("KEEP_FINAL_MODEL", "") == "1"
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)

    from accelerate import Accelerator

    cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    acc = Accelerator(cpu=cpu)
    rank, world, main = acc.process_index, acc.num_processes, acc.is_main_process
    if world == 1 and os.environ.get("MASTER_ADDR") and os.environ.get("ACCELERATE_USE_CPU") is not None \
            and "WORLD_SIZE" not in os.environ:
        print("warning: accelerate launch started ONE process. Without GPUs, `accelerate launch --num_processes N` "
              "expects mpirun; add --multi_gpu (torchrun with the gloo backend on CPU) to get N processes: "
              "`accelerate launch --multi_gpu --num_processes 2 -m tutorial_utils train ...`.", file=sys.stderr)

    resume_from = None
    if main:
        out.mkdir(parents=True, exist_ok=True)
    if cfg.resume:
        resume_from = find_last(ckpt_root)
        if resume_from is None:
            raise ConfigError(f"resume=true but {ckpt_root} holds no complete checkpoint; start without resume "
                              "(or point output_dir at the run to continue).")
    elif (ckpt_root / "last").exists() or list(ckpt_root.glob("step_*")):
        raise ConfigError(f"{out} already holds checkpoints of a run; pass resume=true to continue it, or a new "
                          "output_dir (runs never overwrite another run).")
    acc.wait_for_everyone()

    # data
    if source is None:
        if not cfg.dataset:
            raise ConfigError("dataset is empty: pass --dataset DIR (alias data_mix) with a LeRobot v2.1 dataset.")
        if main:
            src = open_dataset(cfg.dataset, run_dir=out, cache_mb=cfg.data_cache_mb)
        acc.wait_for_everyone()
        if not main:
            src = open_dataset(cfg.dataset, run_dir=None, cache_mb=cfg.data_cache_mb)
        source = src
    statistics = source.statistics
    train_idx, val_idx, val_eps = split_episodes(source.frame_episode, cfg.val_fraction)
    if len(train_idx) == 0:
        raise ConfigError("no training frames left after holding out validation episodes; lower val_fraction.")

    # model
    torch.manual_seed(cfg.seed)
    policy = P.MiniPolicy(cfg.policy_config(), statistics)
    if cfg.pretrained_checkpoint and resume_from is None:
        P.load_weights_into(policy, cfg.pretrained_checkpoint)
    frozen = apply_freeze(policy, cfg.freeze_list)
    counts = policy.parameter_counts()
    params = [p for p in policy.parameters() if p.requires_grad]
    # the fused AdamW kernel updates all tensors in one pass (~10% of a CPU step for this small model)
    optimizer = torch.optim.AdamW(params, lr=cfg.optimizer_lr, betas=tuple(cfg.optimizer_betas),
                                  weight_decay=cfg.optimizer_weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))

    start_step, best = 0, {"val_action_mae": None, "step": None}
    if resume_from is not None:
        P.load_weights_into(policy, resume_from)
        state = torch.load(resume_from / TRAIN_STATE_FILE, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        meta = json.loads((resume_from / TRAIN_STATE_JSON).read_text())
        start_step = int(meta["step"])
        best = meta.get("best", best)
        if meta.get("world_size", world) != world or meta.get("batch_size", cfg.batch_size) != cfg.batch_size:
            print(f"warning: resuming with batch_size={cfg.batch_size} x {world} processes; the checkpoint used "
                  f"{meta.get('batch_size')} x {meta.get('world_size')}, so the data order differs from the original run.",
                  file=sys.stderr)

    model, optimizer = acc.prepare(policy, optimizer)
    device = acc.device

    run_id = cfg.run_id or out.name
    log = _Log(out / LOG_FILE, main)
    if main:
        pc = cfg.policy_config()
        atomic_write_json(out / CONFIG_FILE, {"train": cfg.to_dict(), "policy": pc.to_dict(), "run_id": run_id,
                                              "world_size": world, "val_episodes": val_eps,
                                              "dataset": {"name": getattr(source, "name", ""),
                                                          "frames": len(source), "train_frames": len(train_idx),
                                                          "val_frames": len(val_idx),
                                                          "image_shape": list(getattr(source, "image_shape", []))}})
        atomic_write_json(out / P.STATS_FILE, statistics)
        if start_step and (out / METRICS_FILE).is_file():  # drop rows past the checkpoint we resume from
            rows = [r for r in read_jsonl(out / METRICS_FILE) if int(r.get("step", 0)) <= start_step]
            atomic_write_text(out / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))

    ds = WindowDataset(source, train_idx, cfg.action_horizon, cfg.image_size)
    sampler = StepBatchSampler(train_idx, cfg.batch_size, cfg.steps, cfg.seed, start_step, rank, world)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=cfg.num_workers, collate_fn=collate,
                                         persistent_workers=False, prefetch_factor=4 if cfg.num_workers else None)
    len_loader = math.ceil(len(train_idx) / (cfg.batch_size * world))

    log(L.TRAIN_TOTAL_PARAMS.format(n=counts["total"], m=counts["total"] / 1e6))
    log(L.TRAIN_TRAINABLE_PARAMS.format(n=counts["trainable"], m=counts["trainable"] / 1e6))
    log(L.TRAIN_FROZEN_PARAMS.format(n=counts["frozen"], m=counts["frozen"] / 1e6))
    log(L.TRAIN_RATIO.format(pct=100.0 * counts["trainable"] / max(1, counts["total"])))
    if frozen:
        log(L.TRAIN_FROZEN_MODULES.format(modules=", ".join(frozen)))
    log(L.TRAIN_RUNNING)
    log(L.TRAIN_TOTAL_STEPS.format(n=cfg.steps))
    log(L.TRAIN_PER_DEVICE_BATCH.format(n=cfg.batch_size))
    log(L.TRAIN_DATALOADER_LEN.format(n=len_loader))
    if start_step:
        log(L.TRAIN_RESUMED.format(path=resume_from, step=start_step))

    # validation set: fixed, evenly spaced held-out frames
    val_pick = val_idx[np.linspace(0, len(val_idx) - 1, min(cfg.val_samples, len(val_idx))).round().astype(int)] if len(val_idx) else val_idx
    val_ds = WindowDataset(source, val_pick, cfg.action_horizon, cfg.image_size)

    def validate() -> dict:
        m = acc.unwrap_model(model)
        gen = torch.Generator().manual_seed(cfg.seed + 7)
        errs, masks = [], []
        for i in range(0, len(val_pick), 32):
            b = collate([val_ds[int(k)] for k in val_pick[i:i + 32]])
            pred = m.predict(b, generator=gen)
            mask = b["action_mask"].numpy()[..., None].astype(np.float32)
            errs.append(np.abs(pred - b["action"].numpy()) * mask)
            masks.append(np.broadcast_to(mask, pred.shape))
        e, w = np.concatenate(errs), np.concatenate(masks)
        per_dim = (e.sum((0, 1)) / np.maximum(w.sum((0, 1)), 1)).tolist()
        return {"val_action_mae": float(e.sum() / max(w.sum(), 1)), "val_action_mae_xyz": float(np.mean(per_dim[:3])),
                "val_gripper_mae": float(per_dim[-1]), "val_frames": int(len(val_pick))}

    metrics_fh = open(out / METRICS_FILE, "a", encoding="utf-8") if main else None

    def write_metrics(row: dict) -> None:
        if metrics_fh:
            metrics_fh.write(json.dumps(row) + "\n")
            metrics_fh.flush()

    def save(step: int, reason: str, force: bool = False) -> Path | None:
        """A step_* checkpoint (policy + training state) and ``last`` pointing at it. ``force``
        (a stop by signal) saves even with save_checkpoint=false, so the run can resume."""
        if not (main and (cfg.save_checkpoint or force)):
            return None
        target = ckpt_root / step_dir_name(step)
        m = acc.unwrap_model(model)
        with atomic_dir(target) as tmp:
            P.write_policy_files(m, tmp, {"dataset": dataset_meta, "step": step})
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "torch_rng": torch.get_rng_state()}, tmp / TRAIN_STATE_FILE)
            _slow_save_hook()
            atomic_write_json(tmp / TRAIN_STATE_JSON, {"step": step, "run_id": run_id, "reason": reason, "best": best,
                                                       "batch_size": cfg.batch_size, "world_size": world,
                                                       "seed": cfg.seed, "time": time.time()})
        _point_last(ckpt_root, target)
        return target

    dataset_meta = {"name": getattr(source, "name", ""), "image_size": (getattr(source, "image_shape", None) or [None])[0],
                    "gripper": "dataset"}  # LIBERO LeRobot data (IPEC, our recordings): 1 open, -1 close

    last_val: dict = {}

    def evaluate_now(step: int) -> None:
        """Validation action error on the held-out episodes; a new best is saved to ``best``."""
        nonlocal best, last_val
        if not (main and len(val_pick)):
            return
        last_val = {**validate(), "step": step}
        model.train()
        improved = best["val_action_mae"] is None or last_val["val_action_mae"] < best["val_action_mae"]
        if improved:
            best = {"val_action_mae": last_val["val_action_mae"], "step": step}
        write_metrics({**last_val, "best": improved, "time": time.time()})
        log(L.TRAIN_VALIDATION.format(run_id=run_id, step=step, metrics={
            "val_action_mae": round(last_val["val_action_mae"], 6), "best": improved}))
        if improved and cfg.save_checkpoint:
            P.save_policy(acc.unwrap_model(model), ckpt_root / "best", {"dataset": dataset_meta, "step": step, "val": last_val})

    stop = _Stop()
    stop.install()
    losses: list[tuple[int, float]] = []
    step = start_step
    stopped_by = None
    time_limited = False
    bar = None
    if main and cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start_step, desc=f"train {run_id}", unit="step", dynamic_ncols=True,
                   mininterval=1.0 if sys.stderr.isatty() else 10.0, file=sys.stderr)
    t_start = time.perf_counter()
    win = {"wait": 0.0, "total": 0.0, "samples": 0, "loss": []}
    total_wait = total_time = 0.0
    model.train()
    it = iter(loader)
    try:
        while step < cfg.steps:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            except RuntimeError:
                if stop.signum is None:
                    raise
                # Ctrl-C in a terminal reaches the DataLoader workers too; they exit, we stop.
                stopped_by = signal.Signals(stop.signum).name
                break
            t1 = time.perf_counter()
            gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + step * 101 + rank)
            if cfg.augment_shift:
                batch = random_shift(batch, cfg.augment_shift, gen)
            out_losses = model(batch, gen)
            loss = out_losses["total_loss"]
            optimizer.zero_grad(set_to_none=True)
            acc.backward(loss)
            if cfg.optimizer_grad_clip_norm > 0:
                gn = acc.clip_grad_norm_(params, cfg.optimizer_grad_clip_norm)
            else:
                gn = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in params if p.grad is not None))
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            step += 1
            lv = float(acc.reduce(loss.detach(), reduction="mean").item()) if world > 1 else float(loss.item())
            t2 = time.perf_counter()
            win["wait"] += t1 - t0
            win["total"] += t2 - t0
            win["samples"] += cfg.batch_size * world
            win["loss"].append(lv)
            total_wait += t1 - t0
            total_time += t2 - t0
            losses.append((step, lv))
            if on_step:
                on_step(step, lv)
            if bar:
                bar.update(1)
                bar.set_postfix(loss=f"{lv:.4f}", refresh=False)
            if cfg.log_freq and (step % cfg.log_freq == 0 or step == cfg.steps):
                ld = {"action_dit_loss": round(lv, 6), "total_loss": round(lv, 6), "learning_rate": lr,
                      "grad_norm": round(float(gn), 6)}
                log(L.TRAIN_STEP_LOSS.format(run_id=run_id, step=step, losses=ld))
                write_metrics({"step": step, "loss": lv, "loss_mean": float(np.mean(win["loss"])), "lr": lr,
                               "grad_norm": float(gn), "samples_per_s": win["samples"] / max(win["total"], 1e-9),
                               "data_wait_share": win["wait"] / max(win["total"], 1e-9), "epoch": step * cfg.batch_size * world / len(train_idx),
                               "time": time.time()})
                win = {"wait": 0.0, "total": 0.0, "samples": 0, "loss": []}
            if (cfg.eval_freq and step % cfg.eval_freq == 0) or step == cfg.steps:
                evaluate_now(step)
            sig = stop.signum
            over = bool(cfg.time_limit_min) and time.perf_counter() - t_start > 60.0 * cfg.time_limit_min
            if world > 1:  # every rank must take the same decision in the same step
                flags = acc.reduce(torch.tensor([1.0 if sig else 0.0, 1.0 if over else 0.0], device=device), reduction="sum")
                sig = stop.signum or (signal.SIGTERM if float(flags[0]) > 0 else None)
                over = float(flags[1]) > 0
            if sig:
                stopped_by = signal.Signals(sig).name
                break
            if over:
                time_limited = True
                log(L.TRAIN_TIME_LIMIT.format(minutes=cfg.time_limit_min, step=step))
                break
            if cfg.save_freq and step % cfg.save_freq == 0 and step < cfg.steps:
                save(step, "periodic")
                acc.wait_for_everyone()
    finally:
        stop.restore()
        if bar:
            bar.close()
    wall = time.perf_counter() - t_start

    result_paths: dict[str, Any] = {}
    if stopped_by:
        acc.wait_for_everyone()
        path = save(step, stopped_by, force=True)
        acc.wait_for_everyone()
        log(L.TRAIN_STOPPED.format(signal=stopped_by, step=step, path=path))
        result_paths["checkpoint"] = str(path) if path else None
    else:
        if time_limited and last_val.get("step") != step:
            evaluate_now(step)
        acc.wait_for_everyone()
        if main:
            if cfg.save_checkpoint and step > start_step:
                save(step, "final")
            final = out / "final_model"
            P.save_policy(acc.unwrap_model(model), final, {"dataset": dataset_meta, "step": step})
            log(L.TRAIN_COMPLETE.format(path=final))
            size_final = dir_size(final)
            size_before = dir_size(out)
            log(L.TRAIN_DISK_USAGE.format(final=human_bytes(size_final), run_dir=human_bytes(size_before)))
            if keep_final:
                log(L.TRAIN_FINAL_KEPT.format(final=final))
                size_after = size_before
            else:
                shutil.rmtree(final)
                size_after = dir_size(out)
                log(L.TRAIN_FINAL_REMOVED.format(run_dir=human_bytes(size_after)))
            result_paths.update(final_model=str(final) if keep_final else None, final_model_bytes=size_final,
                                run_dir_bytes_before=size_before, run_dir_bytes_after=size_after)
        acc.wait_for_everyone()

    summary = {
        "run_id": run_id, "steps": cfg.steps, "start_step": start_step, "steps_done": step, "stopped_by": stopped_by,
        "time_limited": time_limited,
        "world_size": world, "batch_size": cfg.batch_size, "parameters": counts, "frozen_modules": frozen,
        "first_loss": losses[0][1] if losses else None, "last_loss": losses[-1][1] if losses else None,
        "wall_s": round(wall, 3), "samples_per_s": (step - start_step) * cfg.batch_size * world / max(total_time, 1e-9),
        "data_wait_share": total_wait / max(total_time, 1e-9), "best": best, "last_val": last_val,
        "last_checkpoint": str(find_last(ckpt_root)) if ckpt_root.exists() and find_last(ckpt_root) else None,
        "best_checkpoint": str(ckpt_root / "best") if (ckpt_root / "best").is_dir() else None,
        "len_dataloader": len_loader, **result_paths,
    }
    if main:
        atomic_write_json(out / SUMMARY_FILE, summary)
    if metrics_fh:
        metrics_fh.close()
    log.close()
    return TrainResult(out, step, losses, stopped_by, summary)


# --- the job notebook's logic ---------------------------------------------------------------------

#: Success signs of a training run, as ``tutorial_utils.logs.TRAIN_SIGNS`` names them.
SIGNS = ("parameters counted", "first loss line", "training complete")


def prepare_metadata(root: str | os.PathLike) -> dict:
    """Write ``meta/modality.json`` and the statistics of a dataset that lacks them."""
    root = Path(root)
    done: dict[str, str] = {}
    if not (root / "meta" / "modality.json").is_file():
        try:
            from tutorial_utils import modality
        except ImportError:
            raise DatasetNotReady(f"{root}/meta/modality.json is missing and tutorial_utils.modality is not installed "
                                  "to write it.") from None
        fn = next((getattr(modality, n) for n in ("build_modality", "write_libero_modality", "write_modality")
                   if callable(getattr(modality, n, None))), None)
        if fn is None:
            raise DatasetNotReady(f"{root}/meta/modality.json is missing and tutorial_utils.modality has no writer.")
        done["modality"] = str(fn(root))
    if not (root / "meta" / "stats_gr00t.json").is_file():
        try:
            from tutorial_utils import stats as S
        except ImportError:
            raise DatasetNotReady(f"{root}/meta/stats_gr00t.json is missing and tutorial_utils.stats is not installed "
                                  "to compute it.") from None
        S.compute_all(root)
        done["stats"] = str(root / "meta" / "stats_gr00t.json")
    return done


def resolve_dataset(dataset: str, run_dir: str | os.PathLike) -> Path:
    """The job's ``dataset``: ``"synthetic"`` -> a small synthetic LIBERO-schema dataset in
    ``<run_dir>/dataset`` (written once, with its metadata); a name -> ``data/<name>``; else a path."""
    from tutorial_utils import paths

    if dataset == "synthetic":
        from tutorial_utils.synth import generate_dataset

        root = Path(run_dir) / "dataset"
        if not (root / "meta" / "info.json").is_file():
            generate_dataset(root, n_episodes=4, mean_length=16, image_size=64, n_tasks=2, seed=0)
        prepare_metadata(root)
        return root
    p = _in_data(dataset)
    if not (p / "meta" / "info.json").is_file():
        raise DatasetNotReady(
            f"dataset {dataset!r} not found (looked at {p} and {paths.DATA / dataset}). Record it with the record_demos "
            "job (`python -m tutorial_utils job run notebooks/jobs/record_demos.md`), or pass dataset=synthetic."
        )
    return p


def run_job(run_dir: str | os.PathLike, dataset: str, **params: Any) -> TrainResult:
    """What ``notebooks/jobs/train.md`` runs: resolve the dataset, train into ``run_dir``,
    record the success signs in ``status.json``."""
    from tutorial_utils import jobs
    from tutorial_utils.logs import parse_train_log

    root = resolve_dataset(dataset, run_dir)
    wrote = prepare_metadata(root)  # DiT4DiT computes missing statistics too; here it is said out loud
    for what, path in wrote.items():
        print(f"{root.name}: wrote the missing {what} ({path})")
    cfg = TrainConfig.from_overrides({**params, "dataset": str(root), "output_dir": str(run_dir)})
    res = train(cfg)
    log = parse_train_log(Path(run_dir) / LOG_FILE)
    signs = {"parameters counted": log["total_params"] is not None, "first loss line": bool(log["steps"]),
             "training complete": log["final_model"] is not None}
    jobs.update_status(run_dir, success_signs=signs, train={k: res.summary.get(k) for k in (
        "steps_done", "stopped_by", "first_loss", "last_loss", "best", "samples_per_s", "data_wait_share",
        "last_checkpoint", "best_checkpoint", "final_model_bytes", "run_dir_bytes_after", "wall_s")}, dataset=str(root))
    return res


def metrics_table(run_dir: str | os.PathLike, every: int = 1) -> list[dict]:
    """Rows of ``metrics.jsonl`` merged per step (training and validation rows), every n-th kept."""
    rows: dict[int, dict] = {}
    for r in read_jsonl(Path(run_dir) / METRICS_FILE):
        rows.setdefault(int(r["step"]), {}).update(r)
    steps = sorted(rows)
    keep = steps[::max(1, every)]
    if steps and steps[-1] not in keep:
        keep.append(steps[-1])
    return [rows[s] for s in keep]


# --- CLI --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils train",
        description="Train the mini DiT4DiT policy. Parameters as key=value (platform names or DiT4DiT aliases).",
        epilog="example: python -m tutorial_utils train --dataset data/libero_spatial_mini --output-dir runs/x "
               "steps=2 batch_size=1 log_freq=1",
    )
    parser.add_argument("--dataset", default=None, help="LeRobot v2.1 dataset directory")
    parser.add_argument("--output-dir", default=None, help="run directory")
    parser.add_argument("--list-params", action="store_true", help="print every parameter, default and meaning")
    parser.add_argument("--list-modules", action="store_true", help="print the modules freeze_modules accepts")
    parser.usage = "%(prog)s [--dataset DIR] [--output-dir DIR] [key=value ...] [--trainer.key value ...]"
    args, extra = parser.parse_known_args(argv)
    overrides: list[str] = []
    # DiT4DiT style `--trainer.max_train_steps 2` -> trainer.max_train_steps=2
    i = 0
    while i < len(extra):
        tok = extra[i]
        if tok.startswith("--") and "=" in tok:
            overrides.append(tok[2:])
            i += 1
        elif tok.startswith("--") and i + 1 < len(extra):
            overrides.append(f"{tok[2:]}={extra[i + 1]}")
            i += 2
        elif not tok.startswith("-") and "=" in tok:
            overrides.append(tok)
            i += 1
        else:
            print(f"error: cannot read argument {tok!r}; use key=value", file=sys.stderr)
            return 2
    if args.list_params:
        print(parameters_table())
        return 0
    try:
        kv = parse_overrides(overrides)
        if args.dataset:
            kv["dataset"] = args.dataset
        if args.output_dir:
            kv["output_dir"] = args.output_dir
        cfg = TrainConfig.from_overrides(kv)
        if args.list_modules:
            from tutorial_utils.policy import MiniPolicy

            print("\n".join(MiniPolicy(cfg.policy_config()).module_names()))
            return 0
        res = train(cfg)
    except (ConfigError, DatasetNotReady) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # checkpoint/statistics/dataset errors carry their own fix
        from tutorial_utils.policy import CheckpointError, StatisticsError

        try:
            from tutorial_utils.lerobot import DatasetError
        except ImportError:  # pragma: no cover
            DatasetError = ()  # type: ignore[assignment]
        if isinstance(exc, (CheckpointError, StatisticsError)) or (DatasetError and isinstance(exc, DatasetError)):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise
    if res.stopped_by:
        return 128 + int(getattr(signal, res.stopped_by))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
