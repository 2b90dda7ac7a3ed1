"""LeRobot dataset format v2.1: the writer. :class:`LeRobotWriter` appends episodes (videos,
parquet, then the meta files) and resumes an interrupted dataset; the layout and the constants
are :mod:`~tutorial_utils.data.schema`'s.

Every file is written through :mod:`tutorial_utils.io` (temporary file + rename), so a crash
leaves either the old file or the new one, never half of one.

``pyarrow`` and ``av`` (PyAV) are imported inside the functions that need them."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tutorial_utils.data.columns import column_to_numpy
from tutorial_utils.data.schema import (
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_PATH,
    DEFAULT_FEATURES,
    EPISODES_PATH,
    EPISODES_STATS_PATH,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    check_features,
    episode_file,
    normalize_features,
    read_info,
    read_jsonl_objects,
    short_repr,
    video_keys_of,
    whole_number,
)
from tutorial_utils.data.stats import aggregate_stats, feature_stats, image_stats
from tutorial_utils.data.video import VIDEO_CODEC_NAME, VIDEO_PIX_FMT, decode_all_frames_checked, encode_video
from tutorial_utils.errors import DatasetError
from tutorial_utils.io import atomic_path, atomic_write_json, atomic_write_text


def _schema_view(features: dict) -> dict:
    """What must match for two datasets to be the same kind: names, dtypes, shapes."""
    return {k: (v["dtype"], list(v["shape"])) for k, v in features.items()}


def _jsonl(rows: Sequence[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


class LeRobotWriter:
    """Append episodes one at a time to a LeRobot v2.1 dataset; resume an interrupted one.

    ``LeRobotWriter(root, features, fps)`` creates ``root`` or continues the dataset already
    there: episodes listed in ``meta/episodes.jsonl`` are kept, files of the half-written
    episode after them are removed. A folder holding another dataset (other features, fps or
    robot) is refused, and so is a commit log that is missing, unreadable or disagrees with the
    files on disk: then nothing is deleted and the error says how to recover. Single process:
    send episodes from workers to one writer.

    Per episode, the videos and the parquet are written first (each atomically), then the
    meta files; ``meta/episodes.jsonl`` is the commit point. ``finalize()`` rewrites every
    meta file with the final totals and may be called any number of times.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        features: dict,
        fps: int,
        robot_type: str | None = None,
        *,
        chunks_size: int = CHUNKS_SIZE,
        crf: int = 23,
        preset: str = "veryfast",
        gop: int | None = None,
        image_stats_samples: int = 100,
    ):
        self.root = Path(root)
        self.fps = int(fps)
        if self.fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.robot_type = robot_type
        self.chunks_size = int(chunks_size)
        self.crf, self.preset, self.gop = crf, preset, gop
        self.image_stats_samples = image_stats_samples
        self.features = normalize_features(features)
        self.video_keys = video_keys_of(self.features)
        for key in self.video_keys:
            shape = self.features[key]["shape"]
            if len(shape) != 3 or shape[2] != 3:
                raise ValueError(f"video feature {key!r} must have shape (H, W, 3), got {shape}")
            h, w, _ = shape
            self.features[key]["info"] = {
                "video.height": h,
                "video.width": w,
                "video.codec": VIDEO_CODEC_NAME,
                "video.pix_fmt": VIDEO_PIX_FMT,
                "video.is_depth_map": False,
                "video.fps": self.fps,
                "video.channels": 3,
                "has_audio": False,
            }
        self._data_keys = [k for k in self.features if k not in DEFAULT_FEATURES and k not in self.video_keys]
        self._episodes: list[dict] = []
        self._episode_stats: list[dict] = []
        self._episode_stats_lines: list[str] = []
        self._tasks: dict[str, int] = {}
        self._total_frames = 0
        self._lock_fd = self._take_lock()
        try:
            self._open_or_resume()
        except BaseException:  # refused: release the lock now, not when the object is collected
            self.close()
            raise

    def _take_lock(self) -> int:
        """One writer per dataset: a second one (another job resuming the same folder) fails
        clearly instead of interleaving episodes. The lock sits beside the folder, so an empty
        folder stays empty, and the OS drops it when the process dies."""
        import fcntl

        lock = self.root.parent / f".{self.root.name}.writer.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DatasetError(
                self.root,
                None,
                f"another writer (pid {holder}) is writing this dataset",
                "wait for that job to finish (or stop it) and run again: it resumes",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def close(self) -> None:
        """Release the writer lock (``finalize`` first if you want the metadata written)."""
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __del__(self) -> None:
        self.close()

    # -- opening -----------------------------------------------------------------------
    def _open_or_resume(self) -> None:
        info_path = self.root / INFO_PATH
        if info_path.is_file():
            fix = (
                f"the writer changed nothing in {self.root}: write to a new folder, or move this one aside "
                f"(`mv {self.root} {self.root}.old`) if you want to keep it, or delete it if it is disposable"
            )
            try:
                info = read_info(self.root)
                feats = check_features(info_path, info.get("features"), fix)
            except DatasetError as exc:
                raise DatasetError(exc.file, exc.key, exc.problem, fix) from None
            mismatch = []
            if info.get("codebase_version") != CODEBASE_VERSION:
                mismatch.append(f"codebase_version {short_repr(info.get('codebase_version'))} != {CODEBASE_VERSION!r}")
            fps = info.get("fps")
            if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps != self.fps:
                mismatch.append(f"fps {short_repr(fps)} != {self.fps}")
            if self.robot_type is None:  # not given: keep the dataset's own
                self.robot_type = info.get("robot_type")
            elif info.get("robot_type") != self.robot_type:
                mismatch.append(f"robot_type {short_repr(info.get('robot_type'))} != {self.robot_type!r}")
            theirs = _schema_view(normalize_features(feats))
            ours = _schema_view(self.features)
            if theirs != ours:
                diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
                mismatch.append(f"features differ at {diff}")
            for key, ours_t in (("data_path", DATA_PATH), ("video_path", VIDEO_PATH if self.video_keys else None)):
                if info.get(key) != ours_t:  # the writer writes (and deletes) only at its own paths
                    mismatch.append(f"{key} {short_repr(info.get(key))} != {ours_t!r}")
            if mismatch:
                raise DatasetError(
                    info_path,
                    None,
                    "this folder holds a different dataset: " + "; ".join(mismatch),
                    "write to a new folder, or delete this one if it is disposable",
                )
            self.chunks_size = whole_number(info.get("chunks_size", self.chunks_size), info_path, "chunks_size", fix, 1)
            self._resume(info, fix)
        else:
            if self.root.exists() and any(
                p.name not in {"meta", "data", "videos"} or any(p.rglob("*")) for p in self.root.iterdir()
            ):
                raise DatasetError(
                    self.root,
                    INFO_PATH,
                    "the folder is not empty and has no meta/info.json",
                    "write to a new or empty folder (the writer never mixes its files with others)",
                )
            self.root.mkdir(parents=True, exist_ok=True)
            self._write_info()

    _EPISODE_FILE = re.compile(r"episode_(\d+)\.(parquet|mp4)$")

    def _episode_files_on_disk(self) -> tuple[dict[int, list[Path]], list[Path]]:
        """Episode files under data/ and videos/ by episode index, and temporary files (names
        starting with "." are the temporary files of interrupted atomic writes)."""
        found: dict[int, list[Path]] = {}
        temps: list[Path] = []
        for sub in ("data", "videos"):
            base = self.root / sub
            for p in sorted(base.rglob("*")) if base.is_dir() else []:
                if not p.is_file():
                    continue
                if p.name.startswith("."):
                    temps.append(p)
                    continue
                m = self._EPISODE_FILE.search(p.name)
                if m:
                    found.setdefault(int(m.group(1)), []).append(p)
        temps += [p for p in (self.root / "meta").glob(".*") if p.is_file()]
        return found, temps

    def _resume(self, info: dict, fix: str) -> None:
        """Continue the dataset on disk. ``meta/episodes.jsonl`` is the commit log: the episodes
        it lists are kept, and the files of the one episode after them (interrupted while being
        written) are removed. A commit log that is missing, unreadable or disagrees with the
        files on disk is refused with a :class:`DatasetError`, and nothing is deleted."""
        import pyarrow.parquet as pq

        ep_path = self.root / EPISODES_PATH
        info_path = self.root / INFO_PATH
        found, temps = self._episode_files_on_disk()
        n_files = sum(len(v) for v in found.values())

        def refuse(file, key, problem: str, restore: str | None = None):
            on_disk = (
                f"{n_files} episode files on disk (episodes {min(found)}..{max(found)}, e.g. "
                f"{found[min(found)][0].relative_to(self.root).as_posix()})"
                if found
                else "no episode files on disk"
            )
            restore = restore or f"restore {Path(file).relative_to(self.root).as_posix()} from a copy"
            raise DatasetError(
                file,
                key,
                f"{problem}; the writer cannot tell which episodes are complete, so it refuses to resume "
                f"and deleted nothing ({on_disk})",
                f"{restore} if you have one; otherwise move the folder aside (`mv {self.root} {self.root}.broken`) "
                "and record into a new one (`python -m tutorial_utils dataset validate` tells what the old "
                "folder still holds), or delete it if it is disposable",
            )

        try:
            total = whole_number(info.get("total_episodes", 0), info_path, "total_episodes", fix)
        except DatasetError as exc:
            refuse(exc.file, exc.key, exc.problem)
        if not ep_path.is_file():
            if total != 0 or any(ep != 0 for ep in found):
                refuse(
                    ep_path,
                    None,
                    f"{EPISODES_PATH} (the commit log) is missing but meta/info.json says total_episodes {total}",
                )
            committed: list[dict] = []
        else:
            try:
                committed = read_jsonl_objects(ep_path, EPISODES_PATH)
            except DatasetError as exc:
                refuse(exc.file, exc.key, exc.problem)
            for i, row in enumerate(committed):
                ei = row.get("episode_index")
                if isinstance(ei, bool) or not isinstance(ei, int) or ei != i:
                    refuse(
                        ep_path,
                        f"line {i + 1}: episode_index",
                        f"expected the whole number {i}, found {short_repr(ei)}",
                    )
                try:
                    whole_number(row.get("length"), ep_path, f"line {i + 1}: length", fix, minimum=1)
                except DatasetError as exc:
                    refuse(exc.file, exc.key, exc.problem)
                tasks = row.get("tasks", [])
                if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
                    refuse(
                        ep_path, f"line {i + 1}: tasks", f"must be a list of task strings, found {short_repr(tasks)}"
                    )
        n = len(committed)
        if total not in (n, n - 1):  # info.json is written right after the commit, so it may lag by one
            refuse(
                info_path,
                "total_episodes",
                f"says {total} but {EPISODES_PATH} lists {n} episodes",
                f"restore {EPISODES_PATH} from a copy",
            )
        # every committed episode has all its files, with as many rows as the log says
        expected = {}
        for ep in range(n):
            for p in self._episode_paths(ep):
                expected[p] = ep
                if not p.is_file() or p.stat().st_size == 0:
                    refuse(p, f"episode {ep}", f"{EPISODES_PATH} lists episode {ep} but this file is missing or empty")
            data = self.root / self._data_path(ep)
            try:
                n_rows = pq.read_metadata(data).num_rows
            except Exception as exc:  # any unreadable parquet is refused the same way
                refuse(data, f"episode {ep}", f"not a readable parquet file ({type(exc).__name__})")
            if n_rows != int(committed[ep]["length"]):
                refuse(
                    data,
                    "length",
                    f"{EPISODES_PATH} says episode {ep} has {committed[ep]['length']} frames, the parquet has {n_rows} rows",
                )
        # the only other episode files allowed are those of episode n, interrupted while being written
        in_flight = set(self._episode_paths(n))
        strays = [p for ps in found.values() for p in ps if p not in expected and p not in in_flight]
        if strays:
            refuse(
                strays[0],
                None,
                f"{len(strays)} episode file(s) that {EPISODES_PATH} ({n} episodes) does not account for, "
                f"e.g. {strays[0].relative_to(self.root).as_posix()}",
                f"restore {EPISODES_PATH} (which lists every committed episode) from a copy",
            )
        tasks_path = self.root / TASKS_PATH
        if tasks_path.is_file():
            try:
                rows = read_jsonl_objects(tasks_path, TASKS_PATH)
            except DatasetError as exc:
                refuse(exc.file, exc.key, exc.problem)
            for i, row in enumerate(rows):
                ti, task = row.get("task_index"), row.get("task")
                if isinstance(ti, bool) or not isinstance(ti, int) or ti < 0 or not isinstance(task, str):
                    refuse(tasks_path, f"line {i + 1}", f"expected {{task_index, task}}, found {short_repr(row)}")
                self._tasks[task] = ti
        for ep in committed:
            for task in ep.get("tasks", []):
                self._tasks.setdefault(task, len(self._tasks))
        by_ep = self._read_episode_stats(n)  # derived data: what is missing or unreadable is recomputed
        self._episode_stats = []
        for i in range(n):
            if i not in by_ep:
                by_ep[i] = self._recompute_episode_stats(i)
            self._episode_stats.append(by_ep[i])
        self._episodes = committed
        self._total_frames = sum(int(e["length"]) for e in committed)
        # everything checked: remove the interrupted episode's files and temporary files only
        for p in sorted(in_flight) + temps:
            p.unlink(missing_ok=True)
        atomic_write_text(self.root / EPISODES_PATH, _jsonl(self._episodes))
        self._write_info()

    def _read_episode_stats(self, n: int) -> dict[int, dict]:
        path = self.root / EPISODES_STATS_PATH
        if not path.is_file():
            return {}
        try:
            rows = read_jsonl_objects(path, EPISODES_STATS_PATH)
        except DatasetError:
            return {}
        by_ep = {}
        for r in rows:
            ei, stats = r.get("episode_index"), r.get("stats")
            if isinstance(ei, int) and not isinstance(ei, bool) and 0 <= ei < n and isinstance(stats, dict):
                by_ep[ei] = stats
        return by_ep

    def _episode_paths(self, ep: int) -> list[Path]:
        return [self.root / self._data_path(ep)] + [self.root / self._video_path(ep, k) for k in self.video_keys]

    def _recompute_episode_stats(self, ep: int) -> dict:
        import pyarrow.parquet as pq

        table = pq.read_table(self.root / self._data_path(ep))
        stats = {
            k: feature_stats(column_to_numpy(table, k, self.features[k], self.root / self._data_path(ep)))
            for k in table.column_names
            if k in self.features
        }
        for key in self.video_keys:
            stats[key] = image_stats(
                decode_all_frames_checked(self.root / self._video_path(ep, key)), self.image_stats_samples
            )
        return stats

    # -- paths -------------------------------------------------------------------------
    def _data_path(self, ep: int) -> str:
        return episode_file(DATA_PATH, ep, self.chunks_size)

    def _video_path(self, ep: int, key: str) -> str:
        return episode_file(VIDEO_PATH, ep, self.chunks_size, key)

    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    @property
    def num_frames(self) -> int:
        return self._total_frames

    # -- writing -----------------------------------------------------------------------
    def _check_frames(self, frames: dict[str, np.ndarray]) -> tuple[int, dict[str, np.ndarray]]:
        expected = set(self._data_keys) | set(self.video_keys)
        missing = sorted(expected - set(frames))
        extra = sorted(set(frames) - expected - set(DEFAULT_FEATURES))
        if missing or extra:
            raise ValueError(
                f"add_episode: frames must have exactly the keys {sorted(expected)}; "
                f"missing {missing}, unexpected {extra}"
            )
        lengths = {k: len(frames[k]) for k in expected}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"add_episode: every array needs the same number of frames, got {lengths}")
        t = next(iter(lengths.values()))
        if t < 1:
            raise ValueError("add_episode: an episode needs at least one frame")
        out = {}
        for k in expected:
            ft = self.features[k]
            arr = np.asarray(frames[k])
            want = (t, *ft["shape"])
            if k in self.video_keys:
                if arr.dtype != np.uint8 or arr.shape != want:
                    raise ValueError(f"add_episode: {k!r} must be uint8 {want}, got {arr.dtype} {arr.shape}")
            else:
                if ft["shape"] == [1] and arr.ndim == 1:
                    arr = arr[:, None]
                if arr.shape != want:
                    raise ValueError(f"add_episode: {k!r} must have shape {want}, got {arr.shape}")
                arr = arr.astype(ft["dtype"], copy=False)
                if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    raise ValueError(f"add_episode: {k!r} has NaN or inf values")
            out[k] = arr
        return t, out

    def add_episode(self, frames: dict[str, np.ndarray], task: str) -> int:
        """Write one episode; returns its episode_index. ``frames``: every non-default feature,
        with a leading time axis (videos ``(T,H,W,3)`` uint8)."""
        if not isinstance(task, str) or not task.strip():
            raise ValueError("add_episode: task must be a non-empty string (the language instruction)")
        t, arrs = self._check_frames(frames)
        ep = self.num_episodes
        new_task = task not in self._tasks
        task_index = self._tasks.setdefault(task, len(self._tasks))
        written: list[Path] = []
        try:
            stats = self._write_episode_files(ep, t, arrs, task_index, written)
        except BaseException:
            # nothing of an uncommitted episode stays on disk
            for p in written:
                p.unlink(missing_ok=True)
            if new_task:
                del self._tasks[task]
            raise
        # 3. meta (episodes.jsonl last: the commit point)
        self._episodes.append({"episode_index": ep, "tasks": [task], "length": int(t)})
        self._episode_stats.append(stats)
        self._total_frames += t
        if new_task:
            self._write_tasks()
        self._write_episodes_stats()
        atomic_write_text(self.root / EPISODES_PATH, _jsonl(self._episodes))
        self._write_info()
        return ep

    def _write_episode_files(self, ep: int, t: int, arrs: dict, task_index: int, written: list) -> dict:
        stats: dict[str, dict] = {}
        # 1. videos (each atomic)
        for key in self.video_keys:
            written.append(self.root / self._video_path(ep, key))
            encode_video(written[-1], arrs[key], self.fps, crf=self.crf, preset=self.preset, gop=self.gop)
            stats[key] = image_stats(arrs[key], self.image_stats_samples)
        # 2. parquet (atomic)
        cols = {
            "timestamp": (np.arange(t, dtype=np.float32) / np.float32(self.fps)).astype(np.float32),
            "frame_index": np.arange(t, dtype=np.int64),
            "episode_index": np.full(t, ep, dtype=np.int64),
            "index": np.arange(self._total_frames, self._total_frames + t, dtype=np.int64),
            "task_index": np.full(t, task_index, dtype=np.int64),
        }
        for k in self._data_keys:
            cols[k] = arrs[k]
        written.append(self.root / self._data_path(ep))
        self._write_parquet(written[-1], cols)
        for k, v in cols.items():
            stats[k] = feature_stats(v)
        return stats

    def _write_parquet(self, path: Path, cols: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrays, names = [], []
        for k in self.features:  # the info.json order
            if k not in cols:
                continue
            v = cols[k]
            if self.features[k]["shape"] == [1]:
                arrays.append(pa.array(v.reshape(-1)))
            else:
                flat = pa.array(np.ascontiguousarray(v).reshape(-1))
                arrays.append(pa.FixedSizeListArray.from_arrays(flat, int(np.prod(v.shape[1:]))))
            names.append(k)
        table = pa.Table.from_arrays(arrays, names=names)
        with atomic_path(path, suffix=".parquet") as tmp:
            pq.write_table(table, tmp)

    def _write_tasks(self) -> None:
        rows = [{"task_index": i, "task": t} for t, i in sorted(self._tasks.items(), key=lambda kv: kv[1])]
        atomic_write_text(self.root / TASKS_PATH, _jsonl(rows))

    def _write_episodes_stats(self) -> None:
        lines = self._episode_stats_lines
        for i in range(len(lines), len(self._episode_stats)):  # serialise each episode once
            lines.append(json.dumps({"episode_index": i, "stats": self._episode_stats[i]}) + "\n")
        del lines[len(self._episode_stats) :]
        atomic_write_text(self.root / EPISODES_STATS_PATH, "".join(lines))

    def _info(self) -> dict:
        n = self.num_episodes
        return {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": n,
            "total_frames": int(self._total_frames),
            "total_tasks": len(self._tasks),
            "total_videos": n * len(self.video_keys),
            "total_chunks": (max(n - 1, 0) // self.chunks_size) + 1 if n else 0,
            "chunks_size": self.chunks_size,
            "fps": self.fps,
            "splits": {"train": f"0:{n}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.video_keys else None,
            "features": self.features,
        }

    def _write_info(self) -> None:
        atomic_write_json(self.root / INFO_PATH, self._info(), indent=4)

    def finalize(self) -> Path:
        """Write every meta file (atomically) with the final totals. Idempotent."""
        self._write_tasks()
        self._write_episodes_stats()
        atomic_write_text(self.root / EPISODES_PATH, _jsonl(self._episodes))
        if self._episode_stats:
            atomic_write_json(self.root / STATS_PATH, aggregate_stats(self._episode_stats), indent=4)
        self._write_info()
        return self.root

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.finalize()
        finally:
            self.close()
