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
``python -m tutorial_utils eval promote RUN_DIR`` promotes a finished run."""

from __future__ import annotations


import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tutorial_utils import logs as L

from tutorial_utils.evaluate.loop import RESULTS_FILE, SERVER_LOG, StageFailed, eval_log_name


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
    from tutorial_utils import jobs
    from tutorial_utils.serve.client import wait_for_health
    from tutorial_utils.serve.protocol import ServerUnavailable
    from tutorial_utils.serve.server import free_port

    t0 = time.monotonic()
    rd = jobs.ensure_run_dir(run_dir or None, "evaluate")
    out_dir = _absolute(output_dir) if output_dir else rd
    checkpoint = os.fspath(_absolute(checkpoint)) if checkpoint else ""  # the children run in the run dir
    out_dir.mkdir(parents=True, exist_ok=True)
    port = int(port) or free_port()
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
            stages["server_up_s"] = round(wait_for_health("127.0.0.1", port, timeout=server_timeout,
                                                                  alive=lambda: server.poll() is None), 2)
        except ServerUnavailable as exc:
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



