"""Record LIBERO demonstrations with the scripted expert into a LeRobot v2.1 dataset.

One *item* is a (task id, init state) pair. A worker process solves it headless with the
expert (:func:`tutorial_utils.sim.expert.solve`, no cameras), then replays the successful
action sequence once in a rendering env (same render profile as evaluation) to take the
images, and drops no-op actions (:func:`tutorial_utils.sim.libero_env.is_noop`: no arm motion and
an unchanged gripper command, as in the ``no_noops`` datasets; the settle steps are no-ops).
Only successful episodes are written; actions are stored in the dataset convention
(gripper ``1`` open, ``-1`` close), images flipped 180 degrees as in the IPEC data.

The main process writes episodes in plan order through :class:`tutorial_utils.data.writer.LeRobotWriter`.
Resumability: before an episode is handed to the writer, its item is recorded as the intent
for that episode index in ``meta/record_manifest.json``; the writer's ``meta/episodes.jsonl``
is the commit point. On restart, intents beyond the committed episodes are dropped, the
writer removes half-written files, and the remaining items are recorded: no duplicated and
no half-written episode. A folder holding another dataset (other features, fps, suite,
image size or render profile) is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.errors import DatasetError, TutorialError
from tutorial_utils.io import atomic_write_json
from tutorial_utils.params import param, parse_task_ids

MANIFEST = "meta/record_manifest.json"
FPS = 20  # LIBERO's control frequency (the IPEC datasets' fps)


class RecordError(TutorialError, ValueError):
    """Bad recording input or an output folder that cannot be used."""


@dataclasses.dataclass(frozen=True)
class RecordConfig:
    """Every parameter of the recording job (the job notebook, the CLI and the book's table)."""

    suite: str = param("libero_spatial", "LIBERO suite to record")
    task_ids: Any = param(
        "2", "tasks to record: all, 0-4, 0,3 or a list (tutorial_utils.params.parse_task_ids)", cpu="all"
    )
    episodes_per_task: int = param(
        1, "successful episodes per task (init states offset, offset+1, ...)", cpu=20, gpu=50
    )
    init_state_offset: int = param(
        10,
        "first init state of each task (10: the evaluation's starts, init states 0, 1, ..., stay held out)",
        cpu=10,
        gpu=0,
    )
    image_size: int = param(128, "square camera size (LIBERO's reference is 256; an even number)", gpu=256)
    render_profile: str = param("fast", "fast | reference (the same profile evaluation uses)")
    seed: int = param(7, "seed of the expert's grasp search")
    attempts: int = param(4, "expert attempts per (task, init state) before the item is skipped")
    output_dir: str | None = param(
        "run",
        "dataset folder: None for data/<suite>_no_noops_expert_<size>[_init<offset>]_lerobot, 'run' for <run_dir>/dataset, or a path",
        cpu=None,
    )
    workers: int = param(1, "worker processes recording in parallel (each holds one LIBERO scene)", cpu=2, gpu=8)

    def identity(self) -> dict:
        """What makes two recordings the same dataset (resuming needs these to match)."""
        return {"suite": self.suite, "image_size": int(self.image_size), "render_profile": self.render_profile}

    @property
    def task_list(self) -> tuple[int, ...]:
        ids = parse_task_ids(self.task_ids)
        if ids is None:
            from tutorial_utils.sim import libero_env

            ids = list(range(libero_env.num_tasks(self.suite)))
        return tuple(ids)

    def items(self) -> list[tuple[int, int]]:
        return [
            (int(t), int(self.init_state_offset) + k)
            for t in self.task_list
            for k in range(int(self.episodes_per_task))
        ]


def default_output_dir(suite: str, image_size: int, init_state_offset: int = 0) -> Path:
    """``data/<suite>_no_noops_expert_<size>_lerobot``: the book's own recording;
    ``..._<size>_init<N>_lerobot`` when it starts at init state ``N`` (the main job records from
    init state 10 so that the evaluation's starts 0, 1, ... are held out). Two recordings from
    different init states never share a folder (resuming would mix them)."""
    from tutorial_utils import paths

    offset = f"_init{int(init_state_offset)}" if int(init_state_offset) else ""
    return paths.DATA / f"{suite}_no_noops_expert_{int(image_size)}{offset}_lerobot"


def resolve_output_dir(
    output_dir: str | None, run_dir, suite: str, image_size: int, init_state_offset: int = 0
) -> Path:
    """The job's ``output_dir``: None -> :func:`default_output_dir`, ``"run"`` -> ``<run_dir>/dataset``."""
    if not output_dir:
        return default_output_dir(suite, image_size, init_state_offset)
    if output_dir == "run":
        return Path(run_dir) / "dataset"
    return Path(output_dir)


# --- one episode (runs in a worker) ------------------------------------------------------------

_ENV_CACHE: dict = {}


def _cached_env(key: tuple, make: Callable):
    if key not in _ENV_CACHE:
        # keep at most one task's envs per worker (memory: ~1 GB headless, ~2 GB rendering)
        for k in [k for k in _ENV_CACHE if k[1] != key[1]]:
            _ENV_CACHE.pop(k).close()
        _ENV_CACHE[key] = make()
    return _ENV_CACHE[key]


def replay(env, actions: Iterable[np.ndarray]) -> tuple[dict[str, np.ndarray], bool, int]:
    """Reset ``env``, run the settle steps, then step robosuite ``actions`` until the task succeeds,
    keeping the non-no-op frames. ``actions`` may be lazy: each one is drawn after the previous step.

    Returns (frames for the writer, success, number of no-op actions dropped).
    """
    from tutorial_utils.data.libero_schema import env_action_to_dataset
    from tutorial_utils.sim import libero_env as le

    obs = env.reset()
    prev = None
    for _ in range(le.NUM_STEPS_WAIT):
        obs, *_ = env.step(le.SETTLE_ACTION)
        prev = le.SETTLE_ACTION
    states, acts, prim, wrist = [], [], [], []
    dropped = 0
    success = False
    for a in actions:
        if le.is_noop(a, prev):
            dropped += 1
        else:
            p, w = le.policy_images(obs)
            states.append(le.state_vector(obs))
            acts.append(env_action_to_dataset(a))
            prim.append(p)
            wrist.append(w)
        prev = a
        obs, *_ = env.step(a)
        if env.check_success():
            success = True
            break
    frames = {
        "observation.state": np.asarray(states, dtype=np.float32).reshape(-1, 8),
        "action": np.asarray(acts, dtype=np.float32).reshape(-1, 7),
        "observation.images.image": np.asarray(prim, dtype=np.uint8),
        "observation.images.wrist_image": np.asarray(wrist, dtype=np.uint8),
    }
    return frames, success, dropped


def expert_with_cameras(env, attempt: int = 0) -> tuple[dict[str, np.ndarray], bool, int]:
    """Run the scripted expert closed loop in a rendering env, recording as it goes (one pass
    instead of a headless search plus a replay): :func:`replay` of the expert's actions, each
    computed from the state the previous one left. Returns (frames, success, no-ops dropped)."""
    from tutorial_utils.sim import expert as ex

    expert = ex.ScriptedExpert()
    expert.reset(env.info, attempt=attempt)
    return replay(env, (expert.act(env.privileged_observation()) for _ in range(env.max_steps)))


def record_item(cfg: RecordConfig, item: tuple[int, int]) -> dict:
    """Record one (task, init state). Runs in a worker.

    The expert's first attempt runs closed loop in the rendering env and is recorded as it goes
    (most episodes: one pass). If it fails, the expert's other attempts are searched headless
    (cheaper without cameras) and the successful one is replayed with the cameras.
    """
    from tutorial_utils.sim import expert as ex
    from tutorial_utils.sim import libero_env as le

    task_id, init = item
    t0 = time.time()
    cam = _cached_env(
        ("camera", task_id),
        lambda: le.make_env(cfg.suite, task_id, init, image_size=cfg.image_size, render_profile=cfg.render_profile),
    )
    cam.reset(init)
    frames, ok, dropped = expert_with_cameras(cam, attempt=0)
    out = {"task_id": task_id, "init_state": init, "task": cam.task_language}
    if ok:
        out.update(
            success=True,
            attempt=0,
            expert_steps=int(len(frames["action"]) + dropped),
            search_s=0.0,
            recorded_by="expert_with_cameras",
        )
    else:
        t_search = time.time()
        headless = _cached_env(("headless", task_id), lambda: le.make_env(cfg.suite, task_id, init, cameras=False))
        headless.reset(init)
        found = ex.solve(headless, attempts=cfg.attempts)
        out.update(
            success=bool(found.success),
            attempt=int(found.attempt),
            expert_steps=int(found.steps),
            search_s=round(time.time() - t_search, 2),
        )
        if not found.success:
            return out
        cam.reset(init)
        frames, ok, dropped = replay(cam, found.actions)
        out["recorded_by"] = "replay"
        if not ok:  # the replay diverged (tiny state differences between envs): that attempt closed loop
            frames, ok, dropped = expert_with_cameras(cam, attempt=found.attempt)
            out["recorded_by"] = "expert_with_cameras"
    out.update(
        success=bool(ok),
        frames=frames if ok else None,
        noops_dropped=int(dropped),
        length=int(len(frames["action"])),
        record_s=round(time.time() - t0, 2),
    )
    return out


# --- the manifest -------------------------------------------------------------------------------


def read_manifest(root: Path) -> dict | None:
    path = root / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RecordError(
            f"{path}: not valid JSON ({exc.msg}); delete the output folder or choose another `output_dir`"
        ) from None


def check_output_dir(root: Path, cfg: RecordConfig) -> dict | None:
    """Refuse a folder that holds something else than this recording; return its manifest."""
    root = Path(root)
    man = read_manifest(root)
    info = root / "meta" / "info.json"
    if man is None:
        if info.is_file() and not _empty_dataset(root):
            raise RecordError(
                f"{root} already holds a LeRobot dataset that this recorder did not write "
                f"({MANIFEST} is missing): refusing to mix episodes. Choose another `output_dir`."
            )
        return None
    ours, theirs = cfg.identity(), man.get("identity", {})
    if ours != theirs:
        diff = {k: (theirs.get(k), ours[k]) for k in ours if theirs.get(k) != ours[k]}
        raise RecordError(
            f"{root / MANIFEST}: this folder holds a different recording ({', '.join(f'{k}: {a!r} there, {b!r} asked' for k, (a, b) in diff.items())}); "
            "refusing to mix. Choose another `output_dir`, or the same parameters to resume."
        )
    return man


def _empty_dataset(root: Path) -> bool:
    """A dataset folder with no committed episode (a recording killed before its first one)."""
    from tutorial_utils.data.schema import read_info

    try:
        info = read_info(root)
    except DatasetError:
        return False
    ep = root / "meta" / "episodes.jsonl"
    return int(info.get("total_episodes", 0)) == 0 and (not ep.is_file() or not ep.read_text().strip())


# --- the job ------------------------------------------------------------------------------------


def _pool_map(fn, cfg, items, workers: int) -> Iterable[dict]:
    if workers <= 1 or len(items) <= 1:
        for it in items:
            yield fn(cfg, it)
        return
    import functools
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(processes=workers, maxtasksperchild=None) as pool:
        yield from pool.imap(functools.partial(fn, cfg), items, chunksize=1)


def record(
    output_dir: str | os.PathLike,
    cfg: RecordConfig,
    workers: int = 1,
    progress: bool = True,
    episode_fn: Callable[[RecordConfig, tuple], dict] | None = None,
    log: Callable[[str], None] | None = print,
) -> dict:
    """Record ``cfg.items()`` into ``output_dir`` (resuming what is there). Returns a summary.

    ``episode_fn(cfg, item) -> dict`` (default :func:`record_item`, a picklable top-level
    function) gives ``{"success", "task", "frames", ...}`` per item.
    """
    from tutorial_utils.data.libero_schema import libero_features
    from tutorial_utils.data.writer import LeRobotWriter

    if int(cfg.episodes_per_task) < 1:
        raise RecordError(f"episodes_per_task must be >= 1, got {cfg.episodes_per_task}")
    if cfg.suite and episode_fn is None:
        from tutorial_utils.sim import libero_env as le

        for t in cfg.task_list:  # unknown suite/task or init state out of range: fail before any work
            info = le.task_info(cfg.suite, t)
            last = int(cfg.init_state_offset) + int(cfg.episodes_per_task) - 1
            if int(cfg.init_state_offset) < 0 or last >= info.num_init_states:
                raise RecordError(
                    f"init states {cfg.init_state_offset}..{last} are out of range for {cfg.suite} task {t}: "
                    f"it has {info.num_init_states} (parameters `init_state_offset`, `episodes_per_task`)."
                )
        if cfg.render_profile not in le.RENDER_PROFILES:
            raise RecordError(f"unknown render_profile {cfg.render_profile!r}: use one of {le.RENDER_PROFILES}")
    root = Path(output_dir)
    man = check_output_dir(root, cfg)
    t0 = time.time()
    writer = LeRobotWriter(root, features=libero_features(cfg.image_size), fps=FPS, robot_type="franka")
    committed = writer.num_episodes
    man = man or {"identity": cfg.identity(), "episodes": [], "failed": []}
    man["identity"] = cfg.identity()
    # the tasks as recorded, not as asked ("all", "0-4"): a reader of the card counts them
    man["config"] = {**dataclasses.asdict(cfg), "task_ids": list(cfg.task_list)}
    man["episodes"] = [e for e in man.get("episodes", []) if e["episode_index"] < committed]
    if len(man["episodes"]) != committed:
        raise RecordError(
            f"{root / MANIFEST} lists {len(man['episodes'])} episodes but meta/episodes.jsonl has "
            f"{committed}: the folder was changed by hand. Choose another `output_dir`."
        )
    done = {(e["task_id"], e["init_state"]) for e in man["episodes"]} | {
        (f["task_id"], f["init_state"]) for f in man.get("failed", [])
    }
    todo = [it for it in cfg.items() if tuple(it) not in done]
    atomic_write_json(root / MANIFEST, man)
    if log and committed:
        log(f"resuming {root}: {committed} episodes already written, {len(todo)} items left")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(cfg.items()), initial=len(cfg.items()) - len(todo), desc="episodes", unit="ep")
    fn = episode_fn or record_item
    new = 0
    try:
        for res in _pool_map(fn, cfg, todo, workers):
            entry = {k: v for k, v in res.items() if k != "frames"}
            if res.get("success") and res.get("frames") is not None:
                entry["episode_index"] = writer.num_episodes
                man["episodes"].append(entry)
                atomic_write_json(root / MANIFEST, man)  # intent first; episodes.jsonl commits
                writer.add_episode(res["frames"], task=res["task"])
                new += 1
            else:
                man.setdefault("failed", []).append(entry)
                atomic_write_json(root / MANIFEST, man)
                if log:
                    log(f"expert failed on task {res['task_id']} init {res['init_state']}: skipped")
            if bar is not None:
                bar.update(1)
        writer.finalize()
    except BaseException:
        # the episode being written when this happened is not committed: drop its intent
        man["episodes"] = [e for e in man["episodes"] if e["episode_index"] < writer.num_episodes]
        atomic_write_json(root / MANIFEST, man)
        raise
    finally:
        if bar is not None:
            bar.close()
        writer.close()
    wall = time.time() - t0
    lengths = [e["length"] for e in man["episodes"]]
    summary = {
        "output_dir": str(root),
        "episodes": writer.num_episodes,
        "frames": writer.num_frames,
        "new_episodes": new,
        "failed": len(man.get("failed", [])),
        "items": len(cfg.items()),
        "success_rate": len(man["episodes"]) / max(1, len(man["episodes"]) + len(man.get("failed", []))),
        "mean_length": float(np.mean(lengths)) if lengths else 0.0,
        "noops_dropped": int(sum(e.get("noops_dropped", 0) for e in man["episodes"])),
        "wall_s": round(wall, 1),
        "workers": workers,
    }
    man["summary"] = summary
    atomic_write_json(root / MANIFEST, man)
    return summary


def write_metadata(root: str | os.PathLike, run_dir: str | os.PathLike | None = None) -> dict:
    """``meta/modality.json`` (DiT4DiT's LIBERO modality map, validated against info.json) and the
    statistics (``meta/stats_gr00t.json``, the step index, and ``<run_dir>/dataset_statistics.json``)
    through :mod:`tutorial_utils.modality` and :mod:`tutorial_utils.stats`."""
    from tutorial_utils.data import modality, stats

    root = Path(root)
    modality.build_modality(root, preset="libero")
    st = stats.compute_all(root, run_dir=run_dir)
    return {
        "modality": str(root / modality.MODALITY_PATH),
        **st["files"],
        "num_trajectories": st["num_trajectories"],
        "num_transitions": st["num_transitions"],
    }


def run_job(run_dir: str | os.PathLike, **overrides: Any) -> dict:
    """What ``notebooks/jobs/record_demos.md`` runs: record with :class:`RecordConfig` parameters,
    write the metadata, validate the dataset and record the success signs in ``status.json``."""
    from tutorial_utils import jobs, params
    from tutorial_utils.data.reader import LeRobotDataset

    cfg = params.from_mapping(RecordConfig, overrides, "`python -m tutorial_utils record --list-params`")
    out = resolve_output_dir(cfg.output_dir, run_dir, cfg.suite, cfg.image_size, cfg.init_state_offset)
    print(
        f"run directory: {run_dir}\noutput: {out}\n{len(cfg.items())} episodes to record: tasks {list(cfg.task_list)}, "
        f"init states {cfg.init_state_offset}..{cfg.init_state_offset + cfg.episodes_per_task - 1}, "
        f"{cfg.image_size}x{cfg.image_size}, render profile {cfg.render_profile!r}, {cfg.workers} worker(s)"
    )
    summary = record(out, cfg, workers=cfg.workers)
    meta = write_metadata(out, run_dir=run_dir)
    ds = LeRobotDataset(out)
    ds.validate()
    result = {**summary, "metadata": meta, "dataset": str(out), "episodes": ds.num_episodes, "frames": ds.num_frames}
    atomic_write_json(Path(run_dir) / "record_summary.json", result)
    jobs.update_status(
        run_dir,
        success_signs={
            "episodes": ds.num_episodes,
            "frames": ds.num_frames,
            "expert_success_rate": summary["success_rate"],
            "dataset": str(out),
        },
    )
    return result


def main(argv: list[str]) -> int:
    """``python -m tutorial_utils record --output-dir DIR [--task-ids 0,1] [--episodes-per-task 5] ...``"""
    from tutorial_utils import params

    cfg = params.parse_cli(
        RecordConfig,
        argv,
        "python -m tutorial_utils record",
        "Record LIBERO demonstrations with the scripted expert into a LeRobot v2.1 dataset.",
    )
    if cfg is not None:
        out = resolve_output_dir(cfg.output_dir, Path.cwd(), cfg.suite, cfg.image_size, cfg.init_state_offset)
        print(json.dumps(record(out, cfg, workers=cfg.workers)))
    return 0
