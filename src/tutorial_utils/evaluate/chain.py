"""The evaluation job: a policy server process and a LIBERO client process, collected and diagnosed.

:func:`run_chain` starts ``python -m tutorial_utils serve`` as its own process, waits for
``/healthz``, writes the client's :class:`~tutorial_utils.evaluate.loop.EvalConfig` to
``client_config.json`` and runs ``python -m tutorial_utils eval --config client_config.json`` in
a second process, collects ``server.log``, ``eval_<suite>.log``, ``results.json`` and ``videos/``
in the run directory, diagnoses the logs and raises :class:`StageFailed` naming the stage that
failed. :func:`run_job` is what the job notebook calls: ``run_job(run_dir, **params)`` with
the EvalConfig names, the success signs recorded in ``status.json``."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tutorial_utils import logs as L
from tutorial_utils.evaluate.loop import RESULTS_FILE, SERVER_LOG, EvalConfig, StageFailed, eval_log_name
from tutorial_utils.io import tail_text
from tutorial_utils.serve.config import ServeConfig, server_argv


@dataclass
class ChainResult:
    run_dir: Path
    results: dict
    diagnosis: Any
    server_log: Path
    eval_log: Path
    wall_s: float
    stages: dict = field(default_factory=dict)


def _child_env() -> dict[str, str]:
    from tutorial_utils.secrets import scrubbed_env

    env = scrubbed_env()
    env["PYTHONUNBUFFERED"] = "1"
    return env


CLIENT_CONFIG = "client_config.json"


def run_chain(cfg: EvalConfig, run_dir: str | os.PathLike = "") -> ChainResult:
    """Start the policy server, wait for ``/healthz``, run the LIBERO client, collect, diagnose.

    Raises :class:`StageFailed` naming the stage (``server``, ``client connect``,
    ``LIBERO setup``, ``evaluation``) with the tail of the log that shows why.
    """
    from tutorial_utils import jobs, params
    from tutorial_utils.serve.client import wait_for_health
    from tutorial_utils.serve.protocol import ServerUnavailable
    from tutorial_utils.serve.server import free_port

    t0 = time.monotonic()
    rd = jobs.ensure_run_dir(run_dir or None, "evaluate")
    out_dir = _absolute(cfg.output_dir) if cfg.output_dir else rd
    out_dir.mkdir(parents=True, exist_ok=True)
    # the children run in the run directory: every path they get is absolute
    checkpoint = os.fspath(_absolute(cfg.checkpoint)) if cfg.checkpoint else None
    port = cfg.port or free_port()
    client_cfg = dataclasses.replace(
        cfg, checkpoint=checkpoint, port=port, host="127.0.0.1", output_dir=os.fspath(out_dir)
    )
    server_log, eval_log = rd / SERVER_LOG, rd / eval_log_name(cfg.suite)
    stages: dict[str, float] = {}
    py = sys.executable
    srv_cmd = server_argv(
        ServeConfig(
            policy=cfg.policy,
            checkpoint=checkpoint,
            host="127.0.0.1",
            port=port,
            temporal_ensemble_coeff=cfg.temporal_ensemble_coeff,
        ),
        py,
    )
    jobs.update_status(rd, stage="server", eval={"port": port, "policy": cfg.policy, "suite": cfg.suite})
    with open(server_log, "w", encoding="utf-8") as srv_fh:
        server = subprocess.Popen(srv_cmd, stdout=srv_fh, stderr=subprocess.STDOUT, env=_child_env(), cwd=os.fspath(rd))
    try:
        try:
            stages["server_up_s"] = round(
                wait_for_health("127.0.0.1", port, timeout=cfg.server_timeout, alive=lambda: server.poll() is None), 2
            )
        except ServerUnavailable as exc:
            jobs.stop_process(server)
            d = L.diagnose(rd)
            jobs.update_status(rd, stage="server", success_signs=d.signs)
            raise StageFailed(
                "server", f"{exc}\n{_causes(d)}--- server.log (tail) ---\n{tail_text(server_log)}", rd
            ) from None
        params.write_json(client_cfg, rd / CLIENT_CONFIG)
        cli_cmd = [py, "-m", "tutorial_utils", "eval", "--config", os.fspath(rd / CLIENT_CONFIG)]
        jobs.update_status(rd, stage="evaluation")
        t_client = time.monotonic()
        with open(eval_log, "w", encoding="utf-8") as ev_fh:
            client = subprocess.Popen(
                cli_cmd, stdout=ev_fh, stderr=subprocess.STDOUT, env=_child_env(), cwd=os.fspath(rd)
            )
            try:
                rc = client.wait(cfg.client_timeout)
            except subprocess.TimeoutExpired:
                jobs.stop_process(client)
                rc = None
        stages["client_s"] = round(time.monotonic() - t_client, 1)
    finally:
        jobs.stop_process(server)
    d = L.diagnose(rd)
    results_path = out_dir / RESULTS_FILE
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    jobs.update_status(
        rd,
        stage="done" if d.ok and rc == 0 else (d.failed_stage or "evaluation"),
        success_signs=d.signs,
        eval={"success_rate": results.get("success_rate"), "episodes": results.get("total_episodes")},
    )
    if rc != 0 or not d.ok:
        stage = d.failed_stage or "evaluation"
        why = "timed out" if rc is None else f"exited with code {rc}"
        raise StageFailed(
            stage,
            f"the LIBERO client {why}.\n{_causes(d)}--- {eval_log.name} (tail) ---\n{tail_text(eval_log)}\n"
            f"--- server.log (tail) ---\n{tail_text(server_log, 8)}",
            rd,
        )
    if out_dir != rd:
        shutil.copy2(results_path, rd / RESULTS_FILE)
    return ChainResult(rd, results, d, server_log, eval_log, round(time.monotonic() - t0, 1), stages)


def run_job(run_dir: str | os.PathLike = "", **overrides: Any) -> ChainResult:
    """What ``notebooks/jobs/evaluate.md`` runs: the chain with :class:`EvalConfig` parameters
    (``backend="dit4dit"``: upstream's server and a LIBERO client through the bridge)."""
    from tutorial_utils import params
    from tutorial_utils.bridge.commands import split_backend

    backend, bridge_params = split_backend(overrides)
    if backend == "dit4dit":
        return _run_dit4dit(run_dir, {**overrides, **bridge_params})
    if bridge_params.get("smoke"):
        overrides["trials_per_task"] = 1
    return run_chain(params.from_mapping(EvalConfig, overrides, "`python -m tutorial_utils eval --help`"), run_dir)


def _run_dit4dit(run_dir: str | os.PathLike, params: dict[str, Any]) -> ChainResult:
    from tutorial_utils import jobs
    from tutorial_utils.bridge.job import eval_job

    rd = jobs.ensure_run_dir(run_dir or None, "evaluate")
    out = eval_job(rd, **params)
    eval_log = next(iter(sorted(rd.glob("eval_*.log"))), rd / "eval.log")
    stages = {"server_up_s": out.get("server_up_s"), "client_s": out.get("wall_s")}
    return ChainResult(rd, out["results"], L.diagnose(rd), rd / SERVER_LOG, eval_log, out.get("wall_s") or 0.0, stages)


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
