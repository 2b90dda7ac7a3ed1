"""LIBERO evaluation: the simulation client loop and the two-process chain around it.

The client (FACTS.md section 5, as openpi's ``examples/libero/main.py`` and DiT4DiT's
``eval_libero.py``) runs every episode of a suite against a policy server:

1. reset the task to init state ``episode % num_init_states`` and take ``num_steps_wait`` (10)
   settle steps with ``[0]*6 + [-1]`` so the objects come to rest;
2. every step: flip both camera images 180 degrees (robosuite renders upside down), resize them
   to the policy's ``image_size``, read the 8-D state and, only when the server's metadata asks
   for it, the privileged simulator state; ask the server for an action chunk when the
   previous one is used up, and execute ``replan_steps`` of its actions (openpi 5, DiT4DiT the
   whole chunk of 8, the expert 1);
3. the gripper of a ``"dataset"``-convention policy (1 open, -1 close) is flipped to
   robosuite's (-1 open, +1 close);
4. stop at success or after the suite's max steps (spatial 220, object 280, goal 300,
   libero_10 520, libero_90 400).

It prints exactly the documented lines (``tutorial_utils.logs`` constants), writes
``results.json`` (per task and per episode: success, steps, wall time, video) after every
episode, and one mp4 per episode.

:func:`run_chain` is the evaluation job: it starts the server as its own process, waits for
``/healthz``, runs this client in a second process, collects ``server.log``,
``eval_<suite>.log``, ``results.json`` and ``videos/`` in the run directory, diagnoses the logs
and raises :class:`StageFailed` naming the stage that failed. :func:`promote` copies a run's
real logs, results and one video into ``logs/`` and ``assets/`` for the book.

CLI (the client process): ``python -m tutorial_utils eval --port 8000 --suite libero_spatial``;
``python -m tutorial_utils eval promote RUN_DIR`` promotes a finished run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tutorial_utils import logs as L
from tutorial_utils.io import atomic_path, atomic_write_bytes, atomic_write_json, promote_text

RESULTS_FILE = "results.json"
SERVER_LOG = "server.log"
VIDEOS_DIR = "videos"
VIDEO_FPS = 20


def eval_log_name(suite: str) -> str:
    return f"eval_{suite}.log"


class StageFailed(RuntimeError):
    """The evaluation chain failed; ``stage`` names where (server, client connect, LIBERO setup, evaluation)."""

    def __init__(self, stage: str, message: str, run_dir: Path | None = None):
        super().__init__(f"evaluation failed at stage '{stage}': {message}")
        self.stage, self.run_dir = stage, run_dir


@dataclass
class EvalConfig:
    """Everything the client loop needs (the job notebook's parameters map onto it)."""

    suite: str = "libero_spatial"
    task_ids: list[int] | None = None  # None: every task of the suite
    trials_per_task: int = 1
    seed: int = 7
    host: str = "127.0.0.1"
    port: int = 8000
    render_profile: str = "fast"
    env_image_size: int = 128  # camera render size (LIBERO's reference is 256)
    max_steps: int | None = None  # None: the suite's limit
    num_steps_wait: int = 10
    replan_steps: int | None = None  # None: the server's metadata
    protocol: str = "openpi"
    output_dir: str = "."
    videos: bool = True
    connect_timeout: float = 120.0
    recv_timeout: float = 120.0


# --- small pieces (tested without LIBERO) ----------------------------------------------------------


def resize_image(img, size: int | None):
    """Square-resize an HxWx3 uint8 image to ``size`` (bilinear); unchanged when it already fits."""
    import numpy as np

    if size is None or img.shape[:2] == (size, size):
        return img
    from PIL import Image

    return np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((int(size), int(size)), Image.BILINEAR))


def to_env_action(action, gripper: str = "robosuite"):
    """A policy action -> the robosuite action: clipped to [-1, 1]; a ``"dataset"``-convention
    gripper (1 open, -1 close) is flipped to robosuite's (-1 open, +1 close) and binarised."""
    import numpy as np

    a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[:7], -1.0, 1.0)
    if a.shape != (7,):
        raise ValueError(f"a LIBERO action has 7 numbers (dx dy dz droll dpitch dyaw gripper), the policy sent {a.shape}")
    if gripper == "dataset":
        a[6] = -1.0 if a[6] > 0 else 1.0
    elif gripper != "robosuite":
        raise ValueError(f"unknown gripper convention {gripper!r} in the server metadata: use 'robosuite' or 'dataset'")
    return a


def suite_max_steps(suite: str, override: int | None = None) -> int:
    from tutorial_utils.libero_env import MAX_STEPS

    if override:
        return int(override)
    if suite not in MAX_STEPS:
        raise ValueError(f"unknown suite {suite!r}: expected one of {', '.join(MAX_STEPS)}")
    return MAX_STEPS[suite]


def write_video(path: Path, frames: list, fps: int = VIDEO_FPS) -> Path:
    """Write an h264 mp4 (atomically). Frames are HxWx3 uint8, sides multiples of 16."""
    import imageio.v2 as imageio

    with atomic_path(path, suffix=".mp4") as tmp:
        with imageio.get_writer(tmp, format="FFMPEG", fps=fps, codec="libx264", quality=6, macro_block_size=16,
                                pixelformat="yuv420p", ffmpeg_log_level="error") as w:
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
    """One episode; returns ``{success, steps, wall_s, frames}`` (steps after the settle steps)."""
    import numpy as np

    from tutorial_utils import serving
    from tutorial_utils.libero_env import SETTLE_ACTION

    t0 = time.monotonic()
    image_size = meta.get("image_size")
    replan = int(cfg.replan_steps or meta.get("replan_steps") or meta.get("action_horizon") or 1)
    gripper = meta.get("gripper", "robosuite")
    needs_priv = bool(meta.get("needs_privileged"))
    episode_id = uuid.uuid4().hex
    obs = env.reset(init_state)
    client.reset()
    for _ in range(cfg.num_steps_wait):
        obs, _r, _done, _info = env.step(SETTLE_ACTION)
    plan: deque = deque()
    frames, success, steps = [], False, 0
    while steps < max_steps:
        primary, wrist = env.images(obs)
        if cfg.videos:
            frames.append(primary)
        if not plan:
            request = {
                serving.IMAGE_KEY: resize_image(primary, image_size),
                serving.WRIST_KEY: resize_image(wrist, image_size),
                serving.STATE_KEY: np.asarray(env.state_vector(obs), dtype=np.float32),
                serving.PROMPT_KEY: env.task_language,
            }
            if needs_priv:
                request[serving.PRIVILEGED_KEY] = {"episode_id": episode_id, "task_info": task_info,
                                                   "obs": env.privileged_observation()}
            chunk = serving.reply_actions(client.infer(request))
            if len(chunk) == 0:
                raise serving.ServingError("the policy server replied with an empty action chunk")
            plan.extend(chunk[:replan])
        obs, _r, done, _info = env.step(to_env_action(plan.popleft(), gripper))
        steps += 1
        if done or env.check_success():
            success = True
            if cfg.videos:
                frames.append(env.images(obs)[0])
            break
    return {"success": success, "steps": steps, "wall_s": round(time.monotonic() - t0, 2), "frames": frames}


def _results_skeleton(cfg: EvalConfig, meta: dict) -> dict:
    return {"suite": cfg.suite, "policy": meta, "config": asdict(cfg), "tasks": [], "total_episodes": 0,
            "total_successes": 0, "success_rate": None, "wall_s": 0.0, "finished": False}


def run_evaluation(cfg: EvalConfig, out=None) -> dict:
    """Evaluate the served policy on ``cfg.suite``; returns the results written to results.json."""
    import numpy as np

    from tutorial_utils import libero_env, serving

    say = _Printer(out)
    t_start = time.monotonic()
    np.random.seed(cfg.seed)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    max_steps = suite_max_steps(cfg.suite, cfg.max_steps)
    client = serving.PolicyClient(cfg.host, cfg.port, connect_timeout=cfg.connect_timeout,
                                  recv_timeout=cfg.recv_timeout, protocol=cfg.protocol)
    meta = dict(client.metadata)
    results = _results_skeleton(cfg, meta)
    task_ids = list(cfg.task_ids) if cfg.task_ids else list(range(_num_tasks(cfg.suite)))
    total_eps = total_ok = 0
    try:
        for task_id in task_ids:
            env = libero_env.make_env(cfg.suite, int(task_id), init_state=0, image_size=cfg.env_image_size,
                                      render_profile=cfg.render_profile, cameras=True)
            try:
                info = env.info.to_dict() if hasattr(env, "info") else {"suite": cfg.suite, "task_id": int(task_id)}
                task = {"task_id": int(task_id), "task": env.task_language, "episodes": [], "successes": 0, "success_rate": None}
                results["tasks"].append(task)
                say(L.EVAL_TASK, task=env.task_language)
                task_eps = task_ok = 0
                for trial in range(cfg.trials_per_task):
                    init_state = trial % env.num_init_states
                    say(L.EVAL_STARTING_EPISODE, n=total_eps + 1)
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
                    task["episodes"].append({"episode": trial, "init_state": init_state, "success": ep["success"],
                                             "steps": ep["steps"], "wall_s": ep["wall_s"], "video": video})
                    task["successes"] = task_ok
                    task["success_rate"] = task_ok / task_eps
                    say(L.EVAL_SUCCESS, success=ep["success"])
                    say(L.EVAL_EPISODES_SO_FAR, n=total_eps)
                    say(L.EVAL_SUCCESSES, n=total_ok, pct=total_ok / total_eps * 100)
                    results.update(total_episodes=total_eps, total_successes=total_ok, success_rate=total_ok / total_eps,
                                   wall_s=round(time.monotonic() - t_start, 1))
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


def _num_tasks(suite: str) -> int:
    import contextlib
    import io

    from tutorial_utils import libero_env

    libero_env.ensure_libero_config()
    with contextlib.redirect_stdout(io.StringIO()):
        return int(libero_env._suite(suite).n_tasks)


# --- the two-process chain (the evaluation job) -----------------------------------------------------


@dataclass
class ChainResult:
    run_dir: Path
    results: dict
    diagnosis: Any
    server_log: Path
    eval_log: Path
    wall_s: float
    stages: dict = field(default_factory=dict)


def parse_task_ids(task_ids: Any) -> list[int] | None:
    """``"all"``/``""``/None -> None; ``"0,1,2"``, ``"0-4"``, ``[0, 1]`` or ``3`` -> a list of ints."""
    if task_ids in (None, "", "all", []):
        return None
    if isinstance(task_ids, int):
        return [task_ids]
    if isinstance(task_ids, str):
        out: list[int] = []
        for part in task_ids.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                out += list(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
        return out
    return [int(t) for t in task_ids]


def _tail(path: Path, n: int = 15) -> str:
    if not path.is_file():
        return f"({path.name} was not written)"
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:])


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


def _child_env() -> dict[str, str]:
    from tutorial_utils.secrets import scrubbed_env

    env = scrubbed_env()
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_chain(
    policy: str = "expert",
    checkpoint: str = "",
    suite: str = "libero_spatial",
    task_ids: Any = None,
    trials_per_task: int = 1,
    seed: int = 7,
    port: int = 0,
    render_profile: str = "fast",
    max_steps: int = 0,
    output_dir: str = "",
    run_dir: str | os.PathLike = "",
    env_image_size: int = 128,
    server_timeout: float = 300.0,
    client_timeout: float | None = None,
    protocol: str = "openpi",
    replan_steps: int = 0,
) -> ChainResult:
    """Start the policy server, wait for ``/healthz``, run the LIBERO client, collect, diagnose.

    ``replan_steps`` (0: the policy's metadata) is how many actions of each chunk the client
    executes before it asks again.

    Raises :class:`StageFailed` naming the stage (``server``, ``client connect``,
    ``LIBERO setup``, ``evaluation``) with the tail of the log that shows why.
    """
    from tutorial_utils import jobs, serving

    t0 = time.monotonic()
    rd = jobs.ensure_run_dir(run_dir or None, "evaluate")
    out_dir = _absolute(output_dir) if output_dir else rd
    checkpoint = os.fspath(_absolute(checkpoint)) if checkpoint else ""  # the children run in the run dir
    out_dir.mkdir(parents=True, exist_ok=True)
    port = int(port) or serving.free_port()
    server_log, eval_log = rd / SERVER_LOG, rd / eval_log_name(suite)
    stages: dict[str, float] = {}
    py = sys.executable
    srv_cmd = [py, "-m", "tutorial_utils", "serve", "--policy", policy, "--port", str(port)]
    if checkpoint:
        srv_cmd += ["--checkpoint", str(checkpoint)]
    jobs.update_status(rd, stage="server", eval={"port": port, "policy": policy, "suite": suite})
    with open(server_log, "w", encoding="utf-8") as srv_fh:
        server = subprocess.Popen(srv_cmd, stdout=srv_fh, stderr=subprocess.STDOUT, env=_child_env(), cwd=os.fspath(rd))
    try:
        try:
            stages["server_up_s"] = round(serving.wait_for_health("127.0.0.1", port, timeout=server_timeout,
                                                                  alive=lambda: server.poll() is None), 2)
        except serving.ServerUnavailable as exc:
            _stop(server)
            d = L.diagnose(rd)
            jobs.update_status(rd, stage="server", success_signs=d.signs)
            raise StageFailed("server", f"{exc}\n{_causes(d)}--- server.log (tail) ---\n{_tail(server_log)}", rd) from None
        ids = parse_task_ids(task_ids)
        cli_cmd = [py, "-m", "tutorial_utils", "eval", "--port", str(port), "--suite", suite,
                   "--trials-per-task", str(trials_per_task), "--seed", str(seed), "--render-profile", render_profile,
                   "--env-image-size", str(env_image_size), "--output-dir", os.fspath(out_dir), "--protocol", protocol]
        if ids:
            cli_cmd += ["--task-ids", ",".join(map(str, ids))]
        if max_steps:
            cli_cmd += ["--max-steps", str(max_steps)]
        if replan_steps:
            cli_cmd += ["--replan-steps", str(int(replan_steps))]
        jobs.update_status(rd, stage="evaluation")
        t_client = time.monotonic()
        with open(eval_log, "w", encoding="utf-8") as ev_fh:
            client = subprocess.Popen(cli_cmd, stdout=ev_fh, stderr=subprocess.STDOUT, env=_child_env(), cwd=os.fspath(rd))
            try:
                rc = client.wait(client_timeout)
            except subprocess.TimeoutExpired:
                _stop(client)
                rc = None
        stages["client_s"] = round(time.monotonic() - t_client, 1)
    finally:
        _stop(server)
    d = L.diagnose(rd)
    results_path = out_dir / RESULTS_FILE
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    jobs.update_status(rd, stage="done" if d.ok and rc == 0 else (d.failed_stage or "evaluation"), success_signs=d.signs,
                       eval={"success_rate": results.get("success_rate"), "episodes": results.get("total_episodes")})
    if rc != 0 or not d.ok:
        stage = d.failed_stage or "evaluation"
        why = "timed out" if rc is None else f"exited with code {rc}"
        raise StageFailed(stage, f"the LIBERO client {why}.\n{_causes(d)}--- {eval_log.name} (tail) ---\n{_tail(eval_log)}\n"
                                 f"--- server.log (tail) ---\n{_tail(server_log, 8)}", rd)
    if out_dir != rd:
        shutil.copy2(results_path, rd / RESULTS_FILE)
    return ChainResult(rd, results, d, server_log, eval_log, round(time.monotonic() - t0, 1), stages)


def _absolute(path: str | os.PathLike) -> Path:
    """A relative path as the caller means it: from the current directory if it exists there,
    else from the repository (job notebooks run with the repository as their directory)."""
    from tutorial_utils import paths

    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    return (Path.cwd() / p).resolve() if (Path.cwd() / p).exists() else (paths.REPO / p).resolve()


def _causes(d) -> str:
    if not d.causes:
        return ""
    return "likely causes:\n" + "".join(f"  - {c}\n" for c in d.causes)


# --- promotion into the book --------------------------------------------------------------------


def promote(run_dir: str | os.PathLike, logs_dir: Path | None = None, assets_dir: Path | None = None,
            prefix: str = "eval_", max_video_bytes: int = 2_000_000) -> dict[str, Path]:
    """Copy a finished evaluation run's real artifacts for the book (atomically):

    ``server.log`` -> ``logs/<prefix>server.log``, ``eval_<suite>.log`` -> ``logs/<prefix><suite>.log``,
    ``results.json`` -> ``logs/<prefix>results.json``, and the first successful episode's video
    (else the first video) -> ``assets/<prefix>rollout.mp4`` (refused when larger than
    ``max_video_bytes``). Only a run whose logs pass :func:`tutorial_utils.logs.diagnose` is
    promoted; a low success rate is still a valid run.
    """
    from tutorial_utils import paths

    run = Path(run_dir)
    logs_dir = Path(logs_dir or paths.LOGS)
    assets_dir = Path(assets_dir or paths.ASSETS)
    results_path = run / RESULTS_FILE
    if not results_path.is_file():
        raise FileNotFoundError(f"{results_path} not found: promote a finished evaluation run (one with results.json)")
    results = json.loads(results_path.read_text())
    suite = results.get("suite", "")
    d = L.diagnose(run)
    if not d.ok:
        raise ValueError(f"run {run} did not pass its success checks (failed stage: {d.failed_stage}); not promoting it")
    eval_log = run / eval_log_name(suite)
    done: dict[str, Path] = {}
    targets = {"server_log": (run / SERVER_LOG, logs_dir / f"{prefix}server.log"),
               "eval_log": (eval_log, logs_dir / f"{prefix}{suite}.log"),
               }
    for key, (src, dst) in targets.items():
        done[key] = promote_text(src, dst)
    # the book's copy names runs and checkpoints relative to the repository, not this machine's paths
    done["results"] = atomic_write_json(logs_dir / f"{prefix}results.json", paths.for_book(results))
    out_root = Path(results.get("config", {}).get("output_dir") or run)
    episodes = [ep for t in results.get("tasks", []) for ep in t.get("episodes", []) if ep.get("video")]
    videos = [ep["video"] for ep in episodes if ep.get("success")] + [ep["video"] for ep in episodes if not ep.get("success")]
    for rel in videos:
        src = out_root / rel if (out_root / rel).is_file() else run / rel
        if src.is_file():
            if src.stat().st_size > max_video_bytes:
                raise ValueError(f"{src} is {src.stat().st_size / 1e6:.1f} MB: too large to promote (limit {max_video_bytes / 1e6:.1f} MB)")
            done["video"] = atomic_write_bytes(assets_dir / f"{prefix}rollout.mp4", src.read_bytes())
            break
    for path in done.values():
        path.chmod(0o644)  # readable by the book build and web servers (temp files are created 0600)
    return done


def results_table(results: dict) -> list[dict]:
    """One row per task: id, language, successes/episodes, mean steps, wall time."""
    rows = []
    for t in results.get("tasks", []):
        eps = t.get("episodes", [])
        rows.append({
            "task_id": t.get("task_id"), "task": t.get("task"),
            "success": f"{sum(bool(e['success']) for e in eps)}/{len(eps)}",
            "steps": round(sum(e["steps"] for e in eps) / len(eps), 1) if eps else None,
            "wall_s": round(sum(e["wall_s"] for e in eps), 1),
        })
    return rows


# --- CLI --------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    from tutorial_utils import serving

    if argv[:1] == ["promote"]:
        pp = argparse.ArgumentParser(prog="python -m tutorial_utils eval promote",
                                     description="Copy a finished evaluation run's logs, results and one video into logs/ and assets/.")
        pp.add_argument("run_dir")
        args = pp.parse_args(argv[1:])
        try:
            done = promote(args.run_dir)
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for key, path in done.items():
            print(f"{key}: {path}")
        return 0
    ap = argparse.ArgumentParser(prog="python -m tutorial_utils eval", description="Run the LIBERO evaluation client against a policy server.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=serving.DEFAULT_PORT)
    ap.add_argument("--suite", default="libero_spatial")
    ap.add_argument("--task-ids", default="", help="e.g. 0,1,2 or 0-9 (default: every task)")
    ap.add_argument("--trials-per-task", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--render-profile", default="fast", choices=("fast", "reference"))
    ap.add_argument("--env-image-size", type=int, default=128)
    ap.add_argument("--max-steps", type=int, default=0, help="override the suite's step limit")
    ap.add_argument("--replan-steps", type=int, default=0, help="override the server's replan_steps")
    ap.add_argument("--protocol", default="openpi", choices=("openpi", "dit4dit"))
    ap.add_argument("--output-dir", default=".")
    ap.add_argument("--no-videos", action="store_true")
    ap.add_argument("--connect-timeout", type=float, default=120.0)
    ap.add_argument("--recv-timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    cfg = EvalConfig(
        suite=a.suite, task_ids=parse_task_ids(a.task_ids), trials_per_task=a.trials_per_task, seed=a.seed,
        host=a.host, port=a.port, render_profile=a.render_profile, env_image_size=a.env_image_size,
        max_steps=a.max_steps or None, replan_steps=a.replan_steps or None, protocol=a.protocol,
        output_dir=a.output_dir, videos=not a.no_videos, connect_timeout=a.connect_timeout, recv_timeout=a.recv_timeout,
    )
    run_evaluation(cfg)
    return 0
