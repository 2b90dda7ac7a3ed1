"""Training data: sources (a LeRobot v2.1 dataset or arrays in memory), windows, batches in
LeRobot's key names, the step-indexed batch sampler and the episode split."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.data.images import resize
from tutorial_utils.policies.base import (
    BATCH_ACTION,
    BATCH_ACTION_IS_PAD,
    BATCH_CAMERAS,
    BATCH_IMAGE,
    BATCH_STATE,
    BATCH_TASK,
    BATCH_WRIST,
    PAD_SUFFIX,
)
from tutorial_utils.train.config import DatasetNotReady

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
        self.ep_start, self.ep_end = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for e in np.unique(self.frame_episode):
            idx = np.nonzero(self.frame_episode == e)[0]
            self.ep_start[idx], self.ep_end[idx] = idx.min(), idx.max() + 1

    def __len__(self) -> int:
        return len(self.state)

    def get(self, i: int, horizon: int, obs_deltas=None, action_deltas=None, image_size: int | None = None) -> dict:
        """The window at frame ``i`` (see :func:`window_indices` for ``obs_deltas`` / ``action_deltas``).
        The images stay at their size whatever ``image_size`` asks: :class:`WindowDataset` resizes them."""
        start, end = int(self.ep_start[i]), int(self.ep_end[i])
        obs_idx, obs_pad, act_idx, act_pad = _window(i, start, end, horizon, obs_deltas, action_deltas)
        out = {
            BATCH_IMAGE: self.primary[obs_idx],
            BATCH_WRIST: self.wrist[obs_idx],
            BATCH_STATE: self.state[obs_idx],
            BATCH_ACTION: self.action[act_idx],
            BATCH_ACTION_IS_PAD: act_pad,
            BATCH_TASK: self.tasks[i],
        }
        return _with_history_pads(out, obs_pad)


def window_indices(i: int, start: int, end: int, deltas) -> tuple[np.ndarray, np.ndarray]:
    """Frame ``i`` of the episode ``[start, end)`` and its offsets ``deltas`` -> (indices, is_pad),
    LeRobot's ``delta_timestamps`` semantics (``LeRobotDataset._get_query_indices``): each index
    ``i + d`` is clamped into the episode (the first frame repeats before it starts, the last one
    after it ends) and marked as padding where it fell outside."""
    want = i + np.asarray(deltas, np.int64)
    return np.clip(want, start, end - 1), (want < start) | (want >= end)


def _window(i: int, start: int, end: int, horizon: int, obs_deltas, action_deltas):
    """Observation and action (indices, is_pad) of one window. ``obs_deltas`` None: the current
    frame only, with no time axis (the single-frame windows every family started with);
    ``action_deltas`` None: ``0..horizon-1``."""
    if obs_deltas is None:
        obs_idx, obs_pad = i, None
    else:
        obs_idx, obs_pad = window_indices(i, start, end, obs_deltas)
    act_idx, act_pad = window_indices(i, start, end, range(horizon) if action_deltas is None else action_deltas)
    return obs_idx, obs_pad, act_idx, act_pad


def _with_history_pads(out: dict, obs_pad) -> dict:
    """Add LeRobot's ``<key>_is_pad`` (T,) masks for the observation keys of a window with history."""
    if obs_pad is not None:
        for key in (*BATCH_CAMERAS, BATCH_STATE):
            out[key + PAD_SUFFIX] = obs_pad.copy()
    return out


def synthetic_source(
    n_episodes: int = 6, length: int = 24, image_size: int = 32, seed: int = 0, n_tasks: int = 2
) -> ArraySource:
    """A small learnable in-memory dataset: actions are a smooth function of state, the task and
    a colour patch in the image; statistics in the ``dataset_statistics.json`` layout."""
    rng = np.random.default_rng(seed)
    prim, wrist, st, act, epi, tasks = [], [], [], [], [], []
    names = [
        "pick up the black bowl and place it on the plate",
        "push the red block to the left",
        "open the top drawer",
        "put the cup in the basket",
    ][: max(1, n_tasks)]
    for e in range(n_episodes):
        task = e % len(names)
        goal = rng.uniform(-0.5, 0.5, 3)
        pos = rng.uniform(-0.3, 0.3, 3)
        for t in range(length):
            img = np.full((image_size, image_size, 3), 40, np.uint8)
            px = int((goal[0] + 0.5) * (image_size - 8))
            img[4:12, px : px + 8, task % 3] = 220
            d = goal - pos
            a = np.concatenate(
                [np.clip(d * 4, -1, 1), [0.1 * task, -0.1 * task, 0.0], [1.0 if t < length // 2 else -1.0]]
            )
            s = np.concatenate([pos, [0.0, 0.0, 0.0], [0.04, -0.04]])
            prim.append(img)
            wrist.append(img[::-1].copy())
            st.append(s)
            act.append(a)
            epi.append(e)
            tasks.append(names[task])
            pos = pos + 0.05 * a[:3]
    act_a = np.asarray(act, np.float32)
    from tutorial_utils.data.stats import statistics_of

    stats = statistics_of(act_a, np.asarray(st, np.float32), n_episodes)
    return ArraySource(
        np.stack(prim), np.stack(wrist), np.stack(st), act_a, np.array(epi), tasks, stats, name="synthetic"
    )


_INHERITED_READERS: list = []  # see LeRobotSource._reader


class LeRobotSource:
    """A LeRobot v2.1 dataset (``tutorial_utils.data.reader``) as training windows."""

    def __init__(self, root: str | os.PathLike, statistics: dict, cache_mb: int = 512):
        from tutorial_utils.data.libero_schema import LIBERO_CAMERAS
        from tutorial_utils.data.reader import LeRobotDataset

        self.root = Path(root)
        self.cache_mb = cache_mb
        self.ds = LeRobotDataset(self.root, verify_videos=False, cache_mb=cache_mb)
        self._pid = os.getpid()
        keys = self.ds.video_keys
        if len(keys) < 2:
            raise DatasetNotReady(
                f"{self.root}/meta/info.json: the mini policy needs two cameras (primary and wrist), "
                f"the dataset has {keys}."
            )
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
            from tutorial_utils.data.reader import LeRobotDataset

            _INHERITED_READERS.append(self.ds)
            self.ds = LeRobotDataset(self.root, verify_videos=False, cache_mb=self.cache_mb)
            self._pid = os.getpid()
        return self.ds

    def get(self, i: int, horizon: int, obs_deltas=None, action_deltas=None, image_size: int | None = None) -> dict:
        """The window at global frame ``i`` (see :func:`window_indices`); images resized to
        ``image_size`` by the video cache, once per frame (not once per epoch)."""
        ds = self._reader()
        ep, f = ds.locate(int(i))
        low = ds._lowdim(ep)
        obs_idx, obs_pad, act_idx, act_pad = _window(f, 0, int(ds.lengths[ep]), horizon, obs_deltas, action_deltas)
        frames = np.atleast_1d(obs_idx)
        images = {
            key: np.stack([ds.frame(ep, key, int(k), image_size) for k in frames])
            for key in (self.primary_key, self.wrist_key)
        }
        if obs_deltas is None:
            images = {key: v[0] for key, v in images.items()}
        task_index = int(low["task_index"][f]) if "task_index" in low else 0
        out = {
            BATCH_IMAGE: images[self.primary_key],
            BATCH_WRIST: images[self.wrist_key],
            BATCH_STATE: np.asarray(low["observation.state"][obs_idx], np.float32),
            BATCH_ACTION: np.asarray(low["action"][act_idx], np.float32),
            BATCH_ACTION_IS_PAD: act_pad,
            BATCH_TASK: ds.tasks.get(task_index, ""),
        }
        return _with_history_pads(out, obs_pad)


def _in_data(path: str | os.PathLike) -> Path:
    """``path`` itself, or ``data/<path>`` when only that exists (a dataset given by name)."""
    from tutorial_utils import paths

    p = Path(path)
    if not p.exists() and not p.is_absolute() and (paths.DATA / p).exists():
        return paths.DATA / p
    return p


def open_dataset(
    root: str | os.PathLike, run_dir: str | os.PathLike | None = None, cache_mb: int = 1024
) -> LeRobotSource:
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
            "state/action/video/annotation keys (docs/FACTS.md section 2). Create it with "
            f"`python -c \"from tutorial_utils.data.modality import build_modality; build_modality('{root}')\"` "
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
    """``dataset_statistics.json`` content for the dataset (written into ``run_dir`` too)."""
    from tutorial_utils.data import stats as S

    return dict(S.compute_all(root, run_dir=run_dir)["dataset_statistics"])


class WindowDataset:
    """torch-style map dataset over a source: resized uint8 images, state, action chunk, mask.

    A source wrapped for a family that sees several observation frames
    (:class:`tutorial_utils.policies.trainable.TimeWindows`) gives (T, H, W, 3) images and (T, 8)
    states; each frame is resized."""

    def __init__(self, source, indices: np.ndarray, horizon: int, image_size: int):
        self.source, self.indices, self.horizon, self.image_size = source, np.asarray(indices), horizon, image_size

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> dict:
        # k is already a source index (see StepBatchSampler); a video source resizes each frame once
        s = self.source.get(int(k), self.horizon, image_size=self.image_size)
        for key in BATCH_CAMERAS:
            img = np.asarray(s[key])
            s[key] = (
                np.stack([resize(x, self.image_size) for x in img]) if img.ndim == 4 else resize(img, self.image_size)
            )
        return s


def random_shift(batch: dict, pad: int, generator) -> dict:
    """Shift both camera images by up to ``pad`` pixels (replicate padding, then a random crop),
    drawn from ``generator`` (a CPU one) so a resumed run sees the same crops. The images may be on
    any device; the crop is one gather there. Returns float images in [0,1]."""
    import torch
    import torch.nn.functional as F

    out = dict(batch)
    for key in BATCH_CAMERAS:
        lead = batch[key].shape[:-3]  # (B,) or (B, T) for windows with observation history
        x = batch[key].reshape(-1, *batch[key].shape[-3:]).permute(0, 3, 1, 2).float() / 255.0
        b, _, h, w = x.shape
        padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
        off = torch.randint(0, 2 * pad + 1, (b, 2), generator=generator).to(x.device)
        rows = (off[:, 0:1] + torch.arange(h, device=x.device))[:, :, None]  # (B, h, 1)
        cols = (off[:, 1:2] + torch.arange(w, device=x.device))[:, None, :]  # (B, 1, w)
        crop = padded.permute(0, 2, 3, 1)[torch.arange(b, device=x.device)[:, None, None], rows, cols]  # (B,h,w,C)
        shifted = crop.permute(0, 3, 1, 2)
        out[key] = shifted.reshape(*lead, *shifted.shape[1:])
    return out


def collate(items: list[dict]) -> dict:
    import torch

    out: dict[str, Any] = {BATCH_TASK: [it[BATCH_TASK] for it in items]}
    for k in items[0]:  # the standard keys, and any a family's training_source adds
        if k != BATCH_TASK:
            out[k] = torch.from_numpy(np.stack([np.asarray(it[k]) for it in items]))
    return out


class StepBatchSampler:
    """Batches for steps ``start..steps-1`` of one rank, as a pure function of (seed, step).

    The index stream is one permutation of the training frames per epoch (seeded with
    seed + epoch); step s takes positions [s*G, (s+1)*G) with G = batch * world, and rank r
    the r-th slice of B. A resumed run therefore reads exactly the batches it would have.
    """

    def __init__(
        self, indices: np.ndarray, batch_size: int, steps: int, seed: int, start: int = 0, rank: int = 0, world: int = 1
    ):
        self.indices = np.asarray(indices, np.int64)
        self.batch_size, self.steps, self.seed, self.start, self.rank, self.world = (
            batch_size,
            steps,
            seed,
            start,
            rank,
            world,
        )
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
