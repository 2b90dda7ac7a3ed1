"""The LIBERO evaluation client loop (docs/FACTS.md section 5)."""

from __future__ import annotations

import sys
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import logs as L
from tutorial_utils.errors import ConfigError, TutorialError
from tutorial_utils.io import atomic_path, atomic_write_json
from tutorial_utils.params import like, param
from tutorial_utils.serve.config import ServeConfig
from tutorial_utils.serve.protocol import DEFAULT_PORT

RESULTS_FILE = "results.json"
SERVER_LOG = "server.log"
VIDEOS_DIR = "videos"
VIDEO_FPS = 20


def eval_log_name(suite: str) -> str:
    return f"eval_{suite}.log"


class StageFailed(TutorialError, RuntimeError):
    """The evaluation chain failed; ``stage`` names where (server, client connect, LIBERO setup, evaluation)."""

    def __init__(self, stage: str, message: str, run_dir: Path | None = None):
        super().__init__(f"evaluation failed at stage '{stage}': {message}")
        self.stage, self.run_dir = stage, run_dir


@dataclass
class EvalConfig:
    """Every parameter of the evaluation job: the server it starts, the LIBERO client it runs.

    The job notebook, ``python -m tutorial_utils eval`` and the book's tables are generated from
    these fields; the chain hands the client process its copy as a JSON file
    (``client_config.json`` in the run directory). ``None`` means "no override": the suite's
    step limit, the policy's own ``replan_steps``.
    """

    policy: str = like(ServeConfig, "policy")
    checkpoint: str | None = like(ServeConfig, "checkpoint")
    temporal_ensemble_coeff: float | None = like(ServeConfig, "temporal_ensemble_coeff")
    suite: str = param("libero_spatial", "benchmark suite (LIBERO's, or one registered in tutorial_utils.sim.suites)")
    task_ids: str = param(
        "0", "tasks to run: all, 0-4, 0,3 (one parser: tutorial_utils.params.parse_task_ids)", cpu="all"
    )
    trials_per_task: int = param(1, "episodes per task (init states 0, 1, ...; the benchmark uses 50)", cpu=5, gpu=50)
    seed: int = param(7, "seed of the client's numpy RNG")
    host: str = param("127.0.0.1", "policy server address (the chain starts it here)", "server")
    port: int | None = param(
        None, "policy server port (None: the chain picks a free one; the client alone connects to 8000)", "server"
    )
    render_profile: str = param("fast", "fast | reference (the same profile recording uses)", gpu="reference")
    env_image_size: int = param(128, "camera render size (LIBERO's reference is 256)")
    max_steps: int | None = param(None, "step limit per episode (None: the suite's limit, spatial 220)")
    num_steps_wait: int = param(10, "settle steps with a do-nothing action before the policy acts")
    replan_steps: int | None = param(
        None, "actions of each chunk executed before asking again (None: the server's metadata)"
    )
    protocol: str = param("openpi", "request shape: openpi | dit4dit")
    statistics: str | None = param(
        None,
        "dataset_statistics.json that un-normalises dit4dit replies (None: the checkpoint's, else the server's)",
    )
    output_dir: str | None = param(None, "results.json and videos/ (None: the run directory)")
    videos: bool = param(True, "write one mp4 per episode")
    connect_timeout: float = param(120.0, "seconds the client waits for the server")
    recv_timeout: float = param(120.0, "seconds the client waits for one reply")
    server_timeout: float = param(300.0, "seconds the chain waits for the server's /healthz", "server")
    client_timeout: float | None = param(None, "seconds the chain lets the client run (None: no limit)", "server")
    workers: int = param(
        1,
        "LIBERO client processes against the one policy server (each renders its own env; the episodes and "
        "their log lines are the same for any count: benchmarks/bench_eval_workers.py)",
        cpu=2,
    )
    shard: int = param(0, "which part of the (task, trial) episodes this run evaluates: 0..num_shards-1")
    num_shards: int = param(
        1, "parts the episodes are split into, one run each (a SLURM array); join them with `eval merge`"
    )

    def check(self) -> None:
        from tutorial_utils.params import parse_task_ids

        parse_task_ids(self.task_ids)
        from tutorial_utils.sim import suites

        suites.get(self.suite)  # an unknown name lists the known ones
        if self.protocol not in ("openpi", "dit4dit"):
            raise ConfigError(f"protocol={self.protocol!r}: use openpi or dit4dit")
        if self.render_profile not in ("fast", "reference"):
            raise ConfigError(f"render_profile={self.render_profile!r}: use fast or reference")
        for name in ("trials_per_task", "env_image_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        from tutorial_utils.evaluate.shards import check_split

        check_split(self.shard, self.num_shards, self.workers, "EvalConfig (`-p shard`, `-p num_shards`, `-p workers`)")

    @property
    def task_list(self) -> list[int] | None:
        from tutorial_utils.params import parse_task_ids

        return parse_task_ids(self.task_ids)


# --- small pieces (tested without LIBERO) ----------------------------------------------------------


def to_env_action(action, gripper: str = "robosuite"):
    """A policy action -> the robosuite action: clipped to [-1, 1]; a ``"dataset"``-convention
    gripper (1 open, -1 close) goes through the package's one conversion,
    :func:`tutorial_utils.data.libero_schema.dataset_action_to_env` (flipped to robosuite's -1 open,
    +1 close and binarised). Our server answers openpi requests in robosuite's convention already
    (its metadata says ``gripper: "robosuite"``), so this usually only clips."""
    import numpy as np

    from tutorial_utils.data.libero_schema import action_to_env

    a = np.asarray(action, dtype=np.float64).reshape(-1)[:7]
    if a.shape != (7,):
        raise ValueError(
            f"a LIBERO action has 7 numbers (dx dy dz droll dpitch dyaw gripper), the policy sent {a.shape}"
        )
    return np.clip(action_to_env(a, gripper), -1.0, 1.0)


def suite_max_steps(suite: str, override: int | None = None) -> int:
    from tutorial_utils.sim import suites

    if override:
        return int(override)
    return suites.get(suite).max_steps


def write_video(path: Path, frames: list, fps: int = VIDEO_FPS) -> Path:
    """Write an h264 mp4 (atomically). Frames are HxWx3 uint8, sides multiples of 16."""
    import imageio.v2 as imageio

    with atomic_path(path, suffix=".mp4") as tmp:
        with imageio.get_writer(
            tmp,
            format="FFMPEG",
            fps=fps,
            codec="libx264",
            quality=6,
            macro_block_size=16,
            pixelformat="yuv420p",
            ffmpeg_log_level="error",
        ) as w:
            for f in frames:
                w.append_data(f)
    return path


class _Printer:
    """Writes the documented log lines to stdout (the job captures them into eval_<suite>.log)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout

    def __call__(self, fmt: str, **kw: Any) -> None:
        print(fmt.format(**kw), file=self.stream, flush=True)


# --- the client loop -------------------------------------------------------------------------------


def run_episode(env, client, meta: dict, cfg: EvalConfig, init_state: int, max_steps: int, task_info: dict) -> dict:
    """One episode; returns ``{success, steps, wall_s, frames, round_trip_ms, server_infer_ms}``
    (steps after the settle steps; the two lists time each request to the policy server: the
    round trip as the client sees it, and the server's own inference where it reports it).

    ``cfg.protocol == "dit4dit"`` is upstream's LIBERO client (:mod:`tutorial_utils.serve.dit4dit_profile`):
    the env's rotated cameras area-resized to 224 side by side, the state as interleaved sin/cos,
    each reply un-normalised with ``cfg.statistics`` (else the checkpoint's, else the server's
    announced statistics) and its WHOLE chunk executed before the next request (``replan_steps``
    applies to openpi only)."""
    import numpy as np

    from tutorial_utils.data.images import resize
    from tutorial_utils.policies import base as P
    from tutorial_utils.serve.protocol import ServingError, reply_actions
    from tutorial_utils.sim import suites

    t0 = time.monotonic()
    image_size = meta.get("image_size")
    replan = int(cfg.replan_steps or meta.get("replan_steps") or meta.get("action_horizon") or 1)
    # the convention of the actions in the replies: our server answers openpi requests in robosuite's
    # (metadata "gripper") and DiT4DiT requests in the policy's own ("policy_gripper")
    gripper = meta.get("gripper", "robosuite")
    dit4dit = None
    if cfg.protocol == "dit4dit":  # the client un-normalises into robosuite actions itself
        from tutorial_utils.serve.dit4dit_profile import client_statistics

        dit4dit, gripper = client_statistics(cfg.statistics, cfg.checkpoint, meta), "robosuite"
    needs_priv = bool(meta.get("needs_privileged"))
    # a policy with observation history (metadata n_obs_steps > 1) also gets the frames between two
    # predictions, marked observe_only, so its history is one step apart as in training (openpi only)
    history = int(meta.get("n_obs_steps") or 1) > 1 and dit4dit is None
    episode_id = uuid.uuid4().hex
    obs = env.reset(init_state)
    client.reset()
    settle = np.asarray(suites.get(cfg.suite).settle_action, dtype=np.float64)
    for _ in range(cfg.num_steps_wait):
        obs, _r, _done, _info = env.step(settle)
    plan: deque = deque()
    frames, success, steps = [], False, 0
    round_trip_ms: list[float] = []  # each request, as the client sees it (encode, send, infer, reply)
    server_ms: list[float] = []  # the server's own inference time, where it reports one (openpi)
    while steps < max_steps:
        primary, wrist = env.images(obs)
        if cfg.videos:
            frames.append(primary)
        if history and plan:
            client.infer(
                {
                    P.IMAGE_KEY: resize(primary, image_size),
                    P.WRIST_KEY: resize(wrist, image_size),
                    P.STATE_KEY: np.asarray(env.state_vector(obs), dtype=np.float32),
                    P.PROMPT_KEY: env.task_language,
                    P.EPISODE_KEY: episode_id,
                    P.OBSERVE_ONLY_KEY: True,
                }
            )
        if not plan:
            request = {
                P.IMAGE_KEY: primary if dit4dit else resize(primary, image_size),
                P.WRIST_KEY: wrist if dit4dit else resize(wrist, image_size),
                P.STATE_KEY: np.asarray(env.state_vector(obs), dtype=np.float32),
                P.PROMPT_KEY: env.task_language,
            }
            if dit4dit is None:  # the episode, for a server that keeps observation history (openpi ignores it)
                request[P.EPISODE_KEY] = episode_id
            if needs_priv:
                request[P.PRIVILEGED_KEY] = {
                    "episode_id": episode_id,
                    "task_info": task_info,
                    "obs": env.privileged_observation(),
                }
            t_req = time.perf_counter()
            reply = client.infer(request)
            round_trip_ms.append(round((time.perf_counter() - t_req) * 1000.0, 1))
            timing = reply.get("server_timing") if isinstance(reply, dict) else None
            if isinstance(timing, dict) and isinstance(timing.get("infer_ms"), (int, float)):
                server_ms.append(round(float(timing["infer_ms"]), 1))
            if dit4dit is not None:
                from tutorial_utils.serve.dit4dit_profile import reply_chunk

                chunk = dit4dit.to_env(reply_chunk(reply))
            else:
                chunk = reply_actions(reply)
            if len(chunk) == 0:
                raise ServingError("the policy server replied with an empty action chunk")
            plan.extend(chunk if dit4dit is not None else chunk[:replan])
        obs, _r, done, _info = env.step(to_env_action(plan.popleft(), gripper))
        steps += 1
        if done or env.check_success():
            success = True
            if cfg.videos:
                frames.append(env.images(obs)[0])
            break
    return {
        "success": success,
        "steps": steps,
        "wall_s": round(time.monotonic() - t0, 2),
        "frames": frames,
        "round_trip_ms": round_trip_ms,
        "server_infer_ms": server_ms,
    }


def _results_skeleton(cfg: EvalConfig, meta: dict) -> dict:
    return {
        "suite": cfg.suite,
        "policy": meta,
        "config": asdict(cfg),
        "tasks": [],
        "total_episodes": 0,
        "total_successes": 0,
        "success_rate": None,
        "wall_s": 0.0,
        "finished": False,
    }


def run_evaluation(cfg: EvalConfig, out=None, pairs: list | None = None) -> dict:
    """Evaluate the served policy on ``cfg.suite`` in this process; returns the results written to
    results.json.

    It runs the ``(task, trial)`` pairs of shard ``cfg.shard`` of ``cfg.num_shards``
    (:mod:`tutorial_utils.evaluate.shards`), or ``pairs`` when given (one worker's part: what
    :func:`tutorial_utils.evaluate.parallel.evaluate` hands each of ``cfg.workers`` processes).
    """
    import numpy as np

    from tutorial_utils.evaluate import shards
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.sim import suites

    suite = suites.get(cfg.suite)
    if pairs is None and cfg.workers > 1:
        raise ConfigError(
            f"workers={cfg.workers}: run_evaluation is one client process; N workers are started by "
            "tutorial_utils.evaluate.parallel.evaluate(cfg) (what `python -m tutorial_utils eval` and the job call)"
        )
    say = _Printer(out)
    t_start = time.monotonic()
    np.random.seed(cfg.seed)
    out_dir = Path(cfg.output_dir or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    max_steps = suite_max_steps(cfg.suite, cfg.max_steps)
    client = PolicyClient(
        cfg.host,
        cfg.port or DEFAULT_PORT,
        connect_timeout=cfg.connect_timeout,
        recv_timeout=cfg.recv_timeout,
        protocol=cfg.protocol,
    )
    meta = dict(client.metadata)
    results = _results_skeleton(cfg, meta)
    task_ids = cfg.task_list or list(range(suite.num_tasks()))
    numbers = shards.episode_numbers(task_ids, cfg.trials_per_task)
    if pairs is None:
        pairs = shards.shard_pairs(task_ids, cfg.trials_per_task, cfg.shard, cfg.num_shards)
    pairs = [(int(t), int(k)) for t, k in pairs]
    if outside := [p for p in pairs if p not in numbers]:
        raise ConfigError(
            f"pairs {outside[:3]} are not (task, trial) pairs of tasks {task_ids} x {cfg.trials_per_task}"
        )
    results.update(task_ids=[int(t) for t in task_ids], pairs=[list(p) for p in pairs])
    total_eps = total_ok = 0
    try:
        for task_id, trials in shards.group_by_task(pairs).items():
            env = suite.make_env(
                int(task_id),
                init_state=0,
                image_size=cfg.env_image_size,
                render_profile=cfg.render_profile,
                cameras=True,
            )
            try:
                info = env.info.to_dict() if hasattr(env, "info") else {"suite": cfg.suite, "task_id": int(task_id)}
                task = {
                    "task_id": int(task_id),
                    "task": env.task_language,
                    "episodes": [],
                    "successes": 0,
                    "success_rate": None,
                }
                results["tasks"].append(task)
                say(L.EVAL_TASK, task=env.task_language)
                task_eps = task_ok = 0
                for trial in trials:
                    init_state = trial % env.num_init_states
                    say(L.EVAL_STARTING_EPISODE, n=numbers[(int(task_id), trial)])
                    ep = run_episode(env, client, meta, cfg, init_state, max_steps, info)
                    task_eps += 1
                    total_eps += 1
                    task_ok += int(ep["success"])
                    total_ok += int(ep["success"])
                    video = None
                    if cfg.videos and ep["frames"]:
                        name = f"{cfg.suite}_task{int(task_id):02d}_ep{trial:02d}_{'success' if ep['success'] else 'failure'}.mp4"
                        write_video(out_dir / VIDEOS_DIR / name, ep["frames"])
                        video = f"{VIDEOS_DIR}/{name}"
                    task["episodes"].append(
                        {
                            "episode": trial,
                            "init_state": init_state,
                            "success": ep["success"],
                            "steps": ep["steps"],
                            "wall_s": ep["wall_s"],
                            "video": video,
                            "round_trip_ms": ep["round_trip_ms"],
                            "server_infer_ms": ep["server_infer_ms"],
                        }
                    )
                    task["successes"] = task_ok
                    task["success_rate"] = task_ok / task_eps
                    say(L.EVAL_SUCCESS, success=ep["success"])
                    say(L.EVAL_EPISODES_SO_FAR, n=total_eps)
                    say(L.EVAL_SUCCESSES, n=total_ok, pct=total_ok / total_eps * 100)
                    results.update(
                        total_episodes=total_eps,
                        total_successes=total_ok,
                        success_rate=total_ok / total_eps,
                        wall_s=round(time.monotonic() - t_start, 1),
                    )
                    atomic_write_json(out_dir / RESULTS_FILE, results)
                say(L.EVAL_TASK_RATE, rate=float(task_ok) / float(task_eps) if task_eps else 0.0)
                say(L.EVAL_TOTAL_RATE_SO_FAR, rate=float(total_ok) / float(total_eps) if total_eps else 0.0)
            finally:
                env.close()
    finally:
        client.close()
    results.update(finished=True, wall_s=round(time.monotonic() - t_start, 1))
    atomic_write_json(out_dir / RESULTS_FILE, results)
    say(L.EVAL_TOTAL_RATE, rate=float(total_ok) / float(total_eps) if total_eps else 0.0)
    say(L.EVAL_TOTAL_EPISODES, n=total_eps)
    return results


# --- the two-process chain (the evaluation job) -----------------------------------------------------


def results_table(results: dict) -> list[dict]:
    """One row per task: id, language, successes/episodes, mean steps, wall time."""
    rows = []
    for t in results.get("tasks", []):
        eps = t.get("episodes", [])
        rows.append(
            {
                "task_id": t.get("task_id"),
                "task": t.get("task"),
                "success": f"{sum(bool(e['success']) for e in eps)}/{len(eps)}",
                "steps": round(sum(e["steps"] for e in eps) / len(eps), 1) if eps else None,
                "wall_s": round(sum(e["wall_s"] for e in eps), 1),
            }
        )
    return rows


def latency_summary(results: dict) -> dict:
    """The policy server's latency over every request of every episode in ``results`` (one
    process's, or merged from workers and shards): request count, round-trip p50/p90 as the
    client measured it (encode, websocket, inference, reply) and the server's own inference p50.
    ``None`` where the episodes carry no timings (results written before they were recorded)."""
    import numpy as np

    rt = [x for t in results.get("tasks", []) for e in t.get("episodes", []) for x in e.get("round_trip_ms") or []]
    srv = [x for t in results.get("tasks", []) for e in t.get("episodes", []) for x in e.get("server_infer_ms") or []]

    def q(values: list[float], p: float) -> float | None:
        return round(float(np.percentile(values, p)), 1) if values else None

    return {
        "requests": len(rt),
        "round_trip_ms_p50": q(rt, 50),
        "round_trip_ms_p90": q(rt, 90),
        "server_infer_ms_p50": q(srv, 50),
    }


# --- CLI --------------------------------------------------------------------------------------------
