"""LeRobot dataset format v2.1: the reader. :class:`LeRobotDataset` opens a dataset and
validates it (metadata on open, every file with ``validate``), serves training windows and
episodes; :func:`episode_grouped_order` is the sampler order that keeps its video cache warm, and
:func:`file_tree` and :func:`parquet_columns` are the book's views of a dataset. The layout and
the constants are :mod:`~tutorial_utils.data.schema`'s.

Every problem found when opening a dataset raises :class:`DatasetError`, which names the file,
the key and the fix. ``pyarrow`` and ``av`` (PyAV) are imported inside the functions that need
them."""

from __future__ import annotations

import bisect
import collections
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.data import schema
from tutorial_utils.data.columns import arrow_value_type, check_column_type, check_finite, column_to_numpy
from tutorial_utils.data.stats import read_stats_json
from tutorial_utils.data.video import (
    INHERITED_DECODERS,
    EpisodeVideo,
    decode_all_frames,
    decode_all_frames_checked,
    probe_video,
)
from tutorial_utils.errors import DatasetError


@dataclass
class Episode:
    """One episode for the book: low-dim arrays in memory, frames decoded on demand."""

    index: int
    task: str
    length: int
    data: dict[str, np.ndarray]
    video_paths: dict[str, Path] = field(default_factory=dict)
    _frames: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def state(self) -> np.ndarray:
        return self.data["observation.state"]

    @property
    def action(self) -> np.ndarray:
        return self.data["action"]

    def frames(self, key: str) -> np.ndarray:
        """All frames of camera ``key`` as (T,H,W,3) uint8 (decoded once, then kept)."""
        if key not in self._frames:
            self._frames[key] = decode_all_frames(self.video_paths[key])
        return self._frames[key]


def _refuse_rows(path, key: str, bad_rows, describe, fix: str) -> None:
    """A :class:`DatasetError` for column ``key`` when any of ``bad_rows`` (a boolean mask) is set:
    "<count> row(s) " + ``describe(first bad row)``."""
    bad = np.flatnonzero(bad_rows)
    if len(bad):
        raise DatasetError(path, key, f"{len(bad)} row(s) {describe(int(bad[0]))}", fix)


class LeRobotDataset:
    """A LeRobot v2.1 dataset on disk, validated on open.

    ``sample(i)`` returns a training window for global frame ``i``; it is safe in torch
    DataLoader workers (decoders open lazily per process and are never pickled) and fast
    when consecutive samples come from the same episode (see :func:`episode_grouped_order`):
    each episode's video is decoded forward once and kept in a bounded cache.

    ``verify_videos``: True probes every mp4 header on open (frame count vs parquet length),
    False only checks existence and size, "auto" probes when there are at most 200 videos.
    """

    def __init__(self, root: str | os.PathLike, *, verify_videos: bool | str = "auto", cache_mb: int = 512):
        self.root = Path(root)
        self.cache_bytes = int(cache_mb) * 2**20
        self._load_meta()
        self._check_files(verify_videos)
        self._reset_caches()

    # -- meta --------------------------------------------------------------------------
    def _load_meta(self) -> None:
        info_path = self.root / schema.INFO_PATH
        fix = "re-download meta/info.json"
        info = schema.read_info(self.root)
        for key in schema.REQUIRED_INFO_KEYS:
            if key not in info:
                raise DatasetError(
                    info_path,
                    key,
                    "required key is missing",
                    f'add "{key}" (see docs/FACTS.md section 3 / LeRobot v2.1), or re-download the dataset',
                )
        version = info["codebase_version"]
        if version != schema.CODEBASE_VERSION:
            hint = (
                "LeRobot >= 0.4 wrote this v3.0 dataset; download the v2.1 revision "
                "(`--revision v2.1`) or convert it with LeRobot 0.3.x"
                if str(version).startswith("v3")
                else "convert it to v2.1 with LeRobot 0.3.x (`python -m lerobot.datasets.v21.convert_dataset_v20_to_v21`)"
            )
        else:
            hint = ""
        if hint:
            raise DatasetError(
                info_path,
                "codebase_version",
                f"unsupported version {schema.short_repr(version)}, this reader reads {schema.CODEBASE_VERSION!r}",
                hint,
            )
        self.info = info
        self.fps = schema.whole_number(info["fps"], info_path, "fps", 'set "fps" to the frame rate, e.g. 20', minimum=1)
        self.robot_type = info["robot_type"]
        self.chunks_size = schema.whole_number(
            info["chunks_size"],
            info_path,
            "chunks_size",
            f'set "chunks_size": {schema.CHUNKS_SIZE} (episodes per chunk)',
            1,
        )
        total_episodes = schema.whole_number(info["total_episodes"], info_path, "total_episodes", fix)
        total_frames = schema.whole_number(info["total_frames"], info_path, "total_frames", fix)
        feats = schema.check_features(info_path, info["features"])
        for k in schema.DEFAULT_FEATURES:
            if k not in feats:
                raise DatasetError(
                    info_path,
                    f"features.{k}",
                    "default LeRobot column is missing",
                    "add it (dtype int64/float32, shape [1]) or re-download the dataset",
                )
        self.features = schema.normalize_features(feats)
        self.video_keys = schema.video_keys_of(self.features)
        schema.check_path_template(info_path, "data_path", info["data_path"])
        if self.video_keys:
            if not info.get("video_path"):
                raise DatasetError(
                    info_path,
                    "video_path",
                    "the dataset has video features but no video_path",
                    f'set "video_path": "{schema.VIDEO_PATH}"',
                )
            schema.check_path_template(info_path, "video_path", info["video_path"], self.video_keys)
        self.data_keys = [k for k in self.features if self.features[k]["dtype"] not in ("video", "image")]

        ep_path = self.root / schema.EPISODES_PATH
        ep_fix = "re-download meta/episodes.jsonl or re-run the writer's finalize()"
        episodes = schema.read_jsonl_objects(ep_path, "meta/episodes.jsonl")
        lengths = np.zeros(len(episodes), dtype=np.int64)
        for i, ep in enumerate(episodes):
            for key in ("episode_index", "length"):
                if key not in ep:
                    raise DatasetError(ep_path, f"line {i + 1}: {key}", "required key is missing", ep_fix)
            ei = ep["episode_index"]
            if isinstance(ei, bool) or not isinstance(ei, int) or ei != i:
                raise DatasetError(
                    ep_path,
                    f"line {i + 1}: episode_index",
                    f"expected {i}, found {schema.short_repr(ei)} (episodes must be the whole numbers 0..N-1 in order)",
                    ep_fix,
                )
            lengths[i] = schema.whole_number(
                ep["length"], ep_path, f"line {i + 1}: length", ep_fix, minimum=1, maximum=1 << 40
            )
            tasks = ep.get("tasks", [])
            if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
                raise DatasetError(
                    ep_path,
                    f"line {i + 1}: tasks",
                    f"must be a list of task strings, found {schema.short_repr(tasks)}",
                    ep_fix,
                )
        if len(episodes) != total_episodes:
            raise DatasetError(
                info_path,
                "total_episodes",
                f"says {total_episodes} but meta/episodes.jsonl lists {len(episodes)}",
                "finish the recording and call LeRobotWriter.finalize() (or re-download)",
            )
        if int(lengths.sum()) != total_frames:
            raise DatasetError(
                info_path,
                "total_frames",
                f"says {total_frames} but the episode lengths in meta/episodes.jsonl add up to {int(lengths.sum())}",
                "call LeRobotWriter.finalize() again (or re-download)",
            )
        self.episodes = episodes
        self.lengths = lengths
        self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths
        tasks_path = self.root / schema.TASKS_PATH
        self.tasks = {}
        for i, r in enumerate(schema.read_jsonl_objects(tasks_path, "meta/tasks.jsonl")):
            for key in ("task_index", "task"):
                if key not in r:
                    raise DatasetError(
                        tasks_path,
                        f"line {i + 1}: {key}",
                        "required key is missing",
                        "each line needs task_index and task",
                    )
            if not isinstance(r["task"], str):
                raise DatasetError(
                    tasks_path,
                    f"line {i + 1}: task",
                    f"must be a string, found {schema.short_repr(r['task'])}",
                    "re-download the file",
                )
            ti = schema.whole_number(r["task_index"], tasks_path, f"line {i + 1}: task_index", "re-download the file")
            self.tasks[ti] = r["task"]
        self.stats = None
        if (self.root / schema.STATS_PATH).is_file():
            self.stats = read_stats_json(self.root / schema.STATS_PATH)

    def _check_files(self, verify_videos: bool | str) -> None:
        import pyarrow.parquet as pq

        for ep in range(len(self.episodes)):
            path = self.data_path(ep)
            if not path.is_file():
                raise DatasetError(
                    path,
                    None,
                    f"parquet of episode {ep} is missing",
                    "re-download the data/ folder, or re-record the episode",
                )
            try:
                md = pq.read_metadata(path)
                arrow_schema = md.schema.to_arrow_schema()
            except Exception as exc:
                raise DatasetError(
                    path,
                    None,
                    f"not a readable parquet file ({type(exc).__name__}: {exc})",
                    "re-download the file, or re-record the episode",
                ) from None
            if md.num_rows != self.lengths[ep]:
                raise DatasetError(
                    path,
                    "length",
                    f"meta/episodes.jsonl says episode {ep} has "
                    f"{int(self.lengths[ep])} frames but the parquet has {md.num_rows} rows",
                    "fix the length in meta/episodes.jsonl (and total_frames in info.json), or re-download the dataset",
                )
            for key in self.data_keys:
                if key not in arrow_schema.names:
                    raise DatasetError(
                        path,
                        key,
                        f"column is missing (columns: {arrow_schema.names})",
                        "re-write the episode with every feature of meta/info.json, or remove "
                        "the feature from info.json if the dataset never had it",
                    )
                typ = arrow_schema.field(key).type
                check_column_type(path, key, typ, self.features[key])
                shape = self.features[key]["shape"]
                size = getattr(typ, "list_size", None)
                if size is not None and size != int(np.prod(shape)):
                    raise DatasetError(
                        path,
                        key,
                        f"rows hold {size} values, meta/info.json says shape {shape}",
                        "fix the feature's shape in meta/info.json or re-write the episode",
                    )
                if arrow_value_type(typ) == typ and shape != [1] and self.features[key]["dtype"] != "string":
                    raise DatasetError(
                        path,
                        key,
                        f"column holds scalars but meta/info.json says shape {shape}",
                        "fix the feature's shape in meta/info.json or re-write the episode",
                    )
            for key in self.video_keys:
                vp = self.video_path(ep, key)
                if not vp.is_file() or vp.stat().st_size == 0:
                    raise DatasetError(
                        vp,
                        key,
                        f"video of episode {ep} is missing or empty",
                        "re-download the videos/ folder, or re-record the episode",
                    )
        n_videos = len(self.episodes) * len(self.video_keys)
        if verify_videos is True or (verify_videos == "auto" and n_videos <= 200):
            self.verify_videos()

    def verify_videos(self) -> None:
        """Probe every mp4: it opens and has at least as many frames as its parquet rows."""
        for ep in range(len(self.episodes)):
            for key in self.video_keys:
                vp = self.video_path(ep, key)
                info = probe_video(vp)
                if info["frames"] and info["frames"] < self.lengths[ep]:
                    raise DatasetError(
                        vp,
                        key,
                        f"the video has {info['frames']} frames but the parquet has {int(self.lengths[ep])} rows",
                        "re-encode or re-record this episode",
                    )
                h, w, _ = self.features[key]["shape"]
                if (info["height"], info["width"]) != (h, w):
                    raise DatasetError(
                        vp,
                        key,
                        f"frames are {info['height']}x{info['width']}, meta/info.json says {h}x{w}",
                        "fix the shape in info.json or re-encode",
                    )

    def validate(self, deep: bool = False) -> dict:
        """Full check. ``deep`` also reads every parquet (numeric columns must be finite) and
        decodes every video to the end. An empty dataset, or one whose files resolve outside
        its folder (symlinks), does not validate."""
        if not self.episodes:
            raise DatasetError(
                self.root / schema.EPISODES_PATH,
                None,
                "the dataset has no episodes",
                "record or download episodes into it first (a recording that stopped before its first "
                "episode leaves an empty dataset: run it again)",
            )
        self.check_inside_root()
        self._check_episodes_stats()
        self.verify_videos()
        if deep:
            for ep in range(len(self.episodes)):
                low = self._lowdim(ep)
                for key in self.data_keys:
                    check_finite(self.data_path(ep), key, low[key], low.get("frame_index"))
                self._check_index_columns(ep, low)
                for key in self.video_keys:
                    frames = decode_all_frames_checked(self.video_path(ep, key))
                    if len(frames) < self.lengths[ep]:
                        raise DatasetError(
                            self.video_path(ep, key),
                            key,
                            f"decoded {len(frames)} frames, the parquet has {int(self.lengths[ep])} rows",
                            "re-encode or re-record this episode",
                        )
        return {
            "episodes": len(self.episodes),
            "frames": self.num_frames,
            "videos": len(self.episodes) * len(self.video_keys),
            "deep": deep,
            "ok": True,
        }

    def _check_index_columns(self, ep: int, low: dict[str, np.ndarray]) -> None:
        """The bookkeeping columns of episode ``ep`` against the metadata: ``episode_index`` is
        ``ep``, ``frame_index`` counts 0..length-1, ``index`` continues the previous episodes'
        (``starts``), ``timestamp`` is ``frame_index / fps`` (to 1 ms), and every ``task_index``
        names a task of meta/tasks.jsonl (else those frames would train with an empty instruction)."""
        path, n = self.data_path(ep), int(self.lengths[ep])
        fix = "re-record or re-download this episode (or re-import it): these columns are written with the frames"
        want = {
            "episode_index": np.full(n, ep, dtype=np.int64),
            "frame_index": np.arange(n, dtype=np.int64),
            "index": int(self.starts[ep]) + np.arange(n, dtype=np.int64),
        }
        for key, expected in want.items():
            if key not in low:
                continue
            got = np.asarray(low[key]).reshape(-1)
            if got.dtype.kind not in "iuf" or len(got) != n:
                raise DatasetError(path, key, f"is {got.dtype} with {len(got)} values, expected {n} whole numbers", fix)
            _refuse_rows(
                path, key, got != expected,
                lambda r, got=got, want=expected: f"disagree with the metadata; row {r} has {got[r]!r}, expected {want[r]}",
                fix,
            )  # fmt: skip
        if "timestamp" in low:
            ts = np.asarray(low["timestamp"], dtype=np.float64).reshape(-1)
            expected_ts = np.arange(n, dtype=np.float64) / self.fps
            _refuse_rows(
                path, "timestamp", ~(np.abs(ts - expected_ts) <= 1e-3), lambda r: f"are not frame_index / fps "
                f"(fps {self.fps}); row {r} has {ts[r]!r}, expected {expected_ts[r]:.4f}", fix
            )  # fmt: skip
        if "task_index" in low:
            ti = np.asarray(low["task_index"]).reshape(-1)
            known = np.array(sorted(self.tasks), dtype=np.int64)
            _refuse_rows(
                path, "task_index", ~np.isin(ti, known), lambda r: f"name no task of {schema.TASKS_PATH} "
                f"(row {r}: {ti[r]!r}; known: {', '.join(map(str, known[:10])) or 'none'})",
                f"add the task to {schema.TASKS_PATH}, or {fix}",
            )  # fmt: skip

    def _check_episodes_stats(self) -> None:
        """``meta/episodes_stats.jsonl`` (optional; LeRobot 0.3.x reads it): one object per line
        with a whole-number ``episode_index`` and a ``stats`` object."""
        path = self.root / schema.EPISODES_STATS_PATH
        if not path.is_file():
            return
        fix = "delete it and re-run LeRobotWriter.finalize() on the dataset (it is recomputed), or re-download it"
        for i, row in enumerate(schema.read_jsonl_objects(path, schema.EPISODES_STATS_PATH)):
            ei = row.get("episode_index")
            if isinstance(ei, bool) or not isinstance(ei, int) or not 0 <= ei < len(self.episodes):
                raise DatasetError(
                    path, f"line {i + 1}: episode_index", f"not an episode of the dataset: {schema.short_repr(ei)}", fix
                )
            if not isinstance(row.get("stats"), dict):
                raise DatasetError(
                    path,
                    f"line {i + 1}: stats",
                    f"expected an object, found {schema.short_repr(row.get('stats'))}",
                    fix,
                )

    def check_inside_root(self) -> None:
        """Every parquet and mp4 of the dataset resolves (symlinks followed) inside its folder."""
        top = self.root.resolve()
        for ep in range(len(self.episodes)):
            for p in [self.data_path(ep)] + [self.video_path(ep, k) for k in self.video_keys]:
                real = p.resolve()
                if real != top and top not in real.parents:
                    raise DatasetError(
                        p,
                        f"episode {ep}",
                        f"the file resolves to {real}, outside the dataset folder {top} (a symlink?)",
                        "copy the real files into the dataset folder (e.g. `cp -rL`, or `huggingface-cli download "
                        "--local-dir DIR`), then validate again",
                    )

    # -- paths and sizes ---------------------------------------------------------------
    def data_path(self, ep: int) -> Path:
        return self.root / schema.episode_file(self.info["data_path"], ep, self.chunks_size)

    def video_path(self, ep: int, key: str) -> Path:
        return self.root / schema.episode_file(self.info["video_path"], ep, self.chunks_size, key)

    @property
    def num_frames(self) -> int:
        return int(self.lengths.sum())

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def __len__(self) -> int:
        return self.num_frames

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset({str(self.root)!r}, episodes={self.num_episodes}, frames={self.num_frames}, "
            f"fps={self.fps}, cameras={self.video_keys})"
        )

    def locate(self, index: int) -> tuple[int, int]:
        """Global frame index -> (episode_index, frame_index)."""
        n = self.num_frames
        if not -n <= index < n:
            raise IndexError(f"frame index {index} out of range for {n} frames")
        index %= n
        ep = (
            bisect.bisect_right(self.starts.tolist() if not hasattr(self, "_starts_list") else self._starts_list, index)
            - 1
        )
        return ep, int(index - self.starts[ep])

    # -- caches (per process) ----------------------------------------------------------
    def _reset_caches(self) -> None:
        self._pid = os.getpid()
        self._lowdim_cache: dict[int, dict[str, np.ndarray]] = {}
        self._video_cache: collections.OrderedDict[tuple[int, str], EpisodeVideo] = collections.OrderedDict()
        self._video_bytes = 0
        self._starts_list = self.starts.tolist()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_lowdim_cache"] = {}
        state["_video_cache"] = collections.OrderedDict()
        state["_video_bytes"] = 0
        state["_pid"] = -1
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # forked into a DataLoader worker: never share decoders
            # Decoders opened by the parent must not be closed or freed in the child (FFmpeg
            # state copied by fork can deadlock there): keep them referenced, unused.
            INHERITED_DECODERS.append(self.__dict__.get("_video_cache"))
            self._reset_caches()

    def _lowdim(self, ep: int) -> dict[str, np.ndarray]:
        self._check_pid()
        got = self._lowdim_cache.get(ep)
        if got is None:
            import pyarrow.parquet as pq

            path = self.data_path(ep)
            table = pq.ParquetFile(path, memory_map=True).read(columns=self.data_keys, use_threads=False)
            got = {k: column_to_numpy(table, k, self.features[k], path) for k in self.data_keys}
            if len(next(iter(got.values()))) != self.lengths[ep]:
                raise DatasetError(
                    path, "length", "row count changed since the dataset was opened", "re-open the dataset"
                )
            self._lowdim_cache[ep] = got
        return got

    def _video(self, ep: int, key: str) -> EpisodeVideo:
        self._check_pid()
        k = (ep, key)
        vid = self._video_cache.get(k)
        if vid is not None:
            self._video_cache.move_to_end(k)
            return vid
        vid = EpisodeVideo(self.video_path(ep, key), int(self.lengths[ep]), self.fps)
        self._video_cache[k] = vid
        self._evict()
        return vid

    #: Open decoders (file handles) kept per process; older ones are closed, frames stay cached.
    MAX_OPEN_DECODERS = 32

    def _evict(self) -> None:
        self._video_bytes = sum(v.nbytes for v in self._video_cache.values())
        while self._video_bytes > self.cache_bytes and len(self._video_cache) > len(self.video_keys):
            _, old = self._video_cache.popitem(last=False)
            old.close()
            self._video_bytes -= old.nbytes
        open_ = [v for v in self._video_cache.values() if v.container is not None]
        for v in open_[: max(0, len(open_) - self.MAX_OPEN_DECODERS)]:
            v.close()

    def frame(self, ep: int, key: str, frame_index: int, size: int | None = None) -> np.ndarray:
        """One camera frame (H,W,3) uint8; with ``size``, resized to size x size once and cached
        at that size (:meth:`EpisodeVideo.get`)."""
        vid = self._video(ep, key)
        before = vid.nbytes
        frame = vid.get(frame_index, size)
        self._video_bytes += vid.nbytes - before
        if self._video_bytes > self.cache_bytes:
            self._evict()
        return frame

    # -- the training window -----------------------------------------------------------
    def sample(self, index: int, action_horizon: int = 8, video_delta_indices: Sequence[int] = (0,)) -> dict:
        """The training window at global frame ``index``.

        Returns ``state`` (D_s,) float32, ``action`` (H, D_a) float32 (past the episode end the
        last action is repeated), ``action_mask`` (H,) bool (False where padded), one
        ``(len(deltas), H, W, 3)`` uint8 array per camera (indices clamped to the episode),
        ``task``, ``task_index``, ``episode_index``, ``frame_index``, ``index``.
        """
        ep, f = self.locate(index)
        low = self._lowdim(ep)
        t = int(self.lengths[ep])
        idx = f + np.arange(int(action_horizon))
        mask = idx < t
        idx = np.minimum(idx, t - 1)
        out: dict[str, Any] = {
            "state": low["observation.state"][f],
            "action": low["action"][idx],
            "action_mask": mask,
        }
        for key in self.video_keys:
            vi = [min(max(f + int(d), 0), t - 1) for d in video_delta_indices]
            out[key] = np.stack([self.frame(ep, key, i) for i in vi])
        task_index = int(low["task_index"][f]) if "task_index" in low else 0
        out.update(
            task=self.tasks.get(task_index, ""),
            task_index=task_index,
            episode_index=ep,
            frame_index=f,
            index=int(self.starts[ep] + f),
        )
        return out

    def __getitem__(self, index: int) -> dict:
        return self.sample(index)

    # -- episodes for the book ---------------------------------------------------------
    def episode(self, i: int) -> Episode:
        if not 0 <= i < self.num_episodes:
            raise IndexError(f"episode {i} out of range (the dataset has {self.num_episodes})")
        low = self._lowdim(i)
        tasks = self.episodes[i].get("tasks") or [self.tasks.get(int(low["task_index"][0]), "")]
        return Episode(
            index=i,
            task=tasks[0],
            length=int(self.lengths[i]),
            data=dict(low),
            video_paths={k: self.video_path(i, k) for k in self.video_keys},
        )

    def iter_episodes(self) -> Iterator[Episode]:
        for i in range(self.num_episodes):
            yield self.episode(i)

    def summary(self) -> dict:
        return {
            "root": str(self.root),
            "codebase_version": self.info["codebase_version"],
            "robot_type": self.robot_type,
            "fps": self.fps,
            "episodes": self.num_episodes,
            "frames": self.num_frames,
            "tasks": len(self.tasks),
            "cameras": self.video_keys,
            "features": {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in self.features.items()},
        }


def file_tree(root: str | os.PathLike, per_dir: int = 2) -> list[dict]:
    """Rows (path, files, bytes) describing a dataset folder: every folder with its file
    count and size, and the first ``per_dir`` files of each (for the book's anatomy table)."""
    root = Path(root)
    rows = []
    for d in sorted([root] + [p for p in root.rglob("*") if p.is_dir()]):
        files = sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            continue
        rel = d.relative_to(root).as_posix()
        rows.append(
            {
                "path": (rel if rel != "." else "") + "/",
                "files": len(files),
                "bytes": sum(p.stat().st_size for p in files),
            }
        )
        for p in files[:per_dir]:
            rows.append({"path": p.relative_to(root).as_posix(), "files": 1, "bytes": p.stat().st_size})
        if len(files) > per_dir:
            rows.append(
                {
                    "path": f"{rel}/... ({len(files) - per_dir} more)",
                    "files": len(files) - per_dir,
                    "bytes": sum(p.stat().st_size for p in files[per_dir:]),
                }
            )
    return rows


def parquet_columns(ds: LeRobotDataset, episode: int = 0) -> list[dict]:
    """One row per parquet column of an episode: arrow type, info.json dtype/shape, first value."""
    import pyarrow.parquet as pq

    table = pq.read_table(ds.data_path(episode))
    rows = []
    for name in table.column_names:
        ft = ds.features.get(name, {})
        first = table.column(name)[0].as_py()
        if isinstance(first, float):
            first = round(first, 4)
        elif isinstance(first, list):
            first = [round(x, 3) for x in first]
        rows.append(
            {
                "column": name,
                "arrow type": str(table.schema.field(name).type),
                "dtype": ft.get("dtype"),
                "shape": ft.get("shape"),
                "first row": first,
            }
        )
    return rows


def episode_grouped_order(lengths: Sequence[int], seed: int = 0) -> np.ndarray:
    """A shuffled order of all global frame indices that visits one episode at a time.

    Episodes come in shuffled order and the frames of each episode in shuffled order, so a
    reader decodes each episode's videos once and serves all its frames from the cache
    (random order across the whole dataset re-opens and seeks a video for almost every
    sample). Use it as a DataLoader ``sampler``; batches then mix few episodes.
    """
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    order = []
    for ep in rng.permutation(len(lengths)):
        frames = starts[ep] + rng.permutation(lengths[ep])
        order.append(frames)
    return np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
