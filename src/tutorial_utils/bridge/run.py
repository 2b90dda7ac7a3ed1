"""Run the upstream steps as child processes, with the run files the mini backend writes.

Each step runs with its :class:`~tutorial_utils.bridge.commands.Command`'s environment and
directory; its output (stdout and stderr, secrets redacted) is streamed into the run directory's
``train.log``, ``server.log`` or ``eval_<suite>.log``. The server counts as up once the websockets
library logs ``server listening on`` (upstream logs ``server running ...`` before it binds) or its
port accepts a connection. After each job, :func:`tutorial_utils.logs.diagnose` reads the logs and
``status.json`` gets the success signs, as for the mini backend.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from tutorial_utils import jobs
from tutorial_utils.bridge.commands import (
    SERVER_READY_LINE,
    BridgeConfig,
    Command,
    client_command,
    eval_command,
    libero_config_command,
    serve_command,
    train_command,
)
from tutorial_utils.errors import TutorialError
from tutorial_utils.io import tail_text
from tutorial_utils.jobs import free_port  # noqa: F401  (re-exported: callers use it from here)

READY = re.compile(re.escape(SERVER_READY_LINE))
#: Seconds after which a server without its ``server listening on`` line is probed on its port.
PROBE_AFTER_S = 10.0


class StepFailed(TutorialError, RuntimeError):
    """An upstream step failed; the message names the step, the log and the diagnosis."""

    def __init__(self, step: str, message: str, run_dir: str | os.PathLike | None = None, diagnosis: Any = None):
        super().__init__(f"step {step} failed: {message}")
        self.step, self.run_dir, self.diagnosis = step, run_dir, diagnosis


def _pump(stream: TextIO, log: Path, echo: bool, ready: threading.Event | None) -> None:
    from tutorial_utils.secrets import redact

    with open(log, "a", encoding="utf-8") as fh:
        for line in stream:
            line = redact(line)
            fh.write(line)
            fh.flush()
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            if ready is not None and READY.search(line):
                ready.set()


def _popen(cmd: Command, base_env: dict[str, str] | None) -> subprocess.Popen:
    Path(cmd.log).parent.mkdir(parents=True, exist_ok=True)
    Path(cmd.log).write_text("", encoding="utf-8")
    try:
        return subprocess.Popen(
            cmd.argv,
            cwd=cmd.cwd or None,
            env=cmd.child_env(base_env),
            stdin=subprocess.DEVNULL,  # a prompt (LIBERO's, without config.yaml) fails at once, never hangs
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            errors="replace",
        )
    except FileNotFoundError:
        raise StepFailed(
            cmd.step,
            f"{cmd.argv[0]!r} was not found (cwd {cmd.cwd}). Fix: pass the interpreter or tool of the right "
            "environment as a path (model_python, libero_python, accelerate), or put it on PATH.",
        ) from None


def run_step(
    cmd: Command, *, timeout: float | None = None, echo: bool = False, base_env: dict[str, str] | None = None
) -> int | None:
    """Run ``cmd`` to the end, its output streamed into ``cmd.log``; the exit code (None: timed out)."""
    proc = _popen(cmd, base_env)
    pump = threading.Thread(target=_pump, args=(proc.stdout, Path(cmd.log), echo, None), daemon=True)
    pump.start()
    try:
        rc: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        jobs.stop_process(proc)
        rc = None
    except KeyboardInterrupt:
        jobs.stop_process(proc)
        raise
    pump.join(10)
    return rc


class Server:
    """Upstream's policy server as a child process; a context manager that stops it."""

    def __init__(self, cmd: Command, port: int, base_env: dict[str, str] | None = None, echo: bool = False):
        self.cmd, self.port = cmd, port
        self.ready = threading.Event()
        self.proc = _popen(cmd, base_env)
        self._pump = threading.Thread(
            target=_pump, args=(self.proc.stdout, Path(cmd.log), echo, self.ready), daemon=True
        )
        self._pump.start()

    def _port_open(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def wait_ready(self, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            # the log line first: a bare TCP probe makes websockets log a failed handshake
            if self.ready.is_set() or (time.monotonic() - t0 > PROBE_AFTER_S and self._port_open()):
                return time.monotonic() - t0
            if self.proc.poll() is not None:
                self._pump.join(5)
                raise StepFailed(
                    "serve",
                    f"the server exited with code {self.proc.returncode} before listening (read {self.cmd.log})",
                )
            time.sleep(0.1)
        raise StepFailed(
            "serve", f"the server did not listen on port {self.port} within {timeout:.0f} s (read {self.cmd.log})"
        )

    def stop(self) -> int | None:
        rc = jobs.stop_process(self.proc)
        self._pump.join(5)
        return rc

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _verdict(run_dir: Path, step: str, rc: int | None, log: str, **fields: Any) -> Any:
    """Diagnose the run directory, record the success signs in status.json, raise on failure."""
    from tutorial_utils import jobs, logs

    try:
        d = logs.diagnose(run_dir)
    except Exception as exc:  # a parser that cannot read this log must not hide the step's own outcome
        d = logs.Diagnosis(str(run_dir), "unknown", notes=[f"the diagnosis could not read the logs: {exc!r}"])
    failed = rc != 0 or not d.ok
    jobs.update_status(
        run_dir,
        backend="dit4dit",
        stage=(d.failed_stage or step) if failed else "done",
        success_signs=d.signs,
        diagnosis={"failed_stage": d.failed_stage, "causes": d.causes, "notes": d.notes},
        **fields,
    )
    if failed:
        why = "timed out" if rc is None else f"exited with code {rc}"
        causes = "".join(f"\n  - {c}" for c in d.causes + d.notes)
        raise StepFailed(
            step,
            f"{Path(log).name}: the process {why}; diagnosis: stage '{d.failed_stage or step}'{causes}\n"
            f"--- {Path(log).name} (tail) ---\n{tail_text(log, 12)}",
            run_dir,
            d,
        )
    return d


# --- the jobs -------------------------------------------------------------------------------------


def train(
    cfg: BridgeConfig,
    *,
    smoke: bool = True,
    prepare: bool = True,
    echo: bool = False,
    keep_final_model: bool | None = None,
    timeout: float | None = None,
    base_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The upstream training step into ``<runs_dir>/<run_id>``: prepare (modality.json, launcher),
    run, write ``config.yaml`` beside ``final_model`` so it can be served, clean ``final_model`` up
    (unless ``KEEP_FINAL_MODEL=1``), diagnose, record ``status.json``."""
    from tutorial_utils.bridge import files
    from tutorial_utils.bridge.checkout import validate_checkout
    from tutorial_utils.bridge.launcher import LAUNCHER_NAME, mixture_entries, write_launcher
    from tutorial_utils.errors import ConfigError

    cfg = cfg.resolved()
    cfg.check()
    cfg.check_interpreters()
    if not cfg.data_dir:
        raise ConfigError("the dit4dit training step needs data_dir: the folder holding the dataset folders")
    validate_checkout(cfg.checkout)
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    prepared: dict[str, Any] = {}
    if prepare:
        prepared["modality"] = files.write_modality(Path(cfg.data_dir) / cfg.dataset)
    write_launcher(run_dir, cfg.mixture, mixture_entries(cfg.dataset))
    cmd = train_command(cfg, smoke)
    t0 = time.monotonic()
    rc = run_step(cmd, timeout=timeout, echo=echo, base_env=base_env)
    wall = round(time.monotonic() - t0, 1)
    out: dict[str, Any] = {"run_dir": str(run_dir), "returncode": rc, "wall_s": wall, "prepared": prepared}
    pt = run_dir / "final_model" / "pytorch_model.pt"
    if pt.is_file():
        script = cmd.argv.index(os.fspath(run_dir / LAUNCHER_NAME))
        merged = files.merged_training_config(cfg.checkout, files.dotlist_overrides(cmd.argv[script + 1 :]))
        served = files.write_serving_config(pt, cfg.cosmos_dir, merged=merged, check=False)
        out["serving_config"] = {"path": str(served.path), "written": served.written, "statistics": served.statistics}
        out["final_model"] = files.cleanup_final_model(run_dir, keep_final_model)
    _verdict(run_dir, "train", rc, cmd.log, train={k: v for k, v in out.items() if k != "prepared"}, command=cmd.argv)
    return out


def evaluate(
    cfg: BridgeConfig,
    *,
    client: str = "upstream",
    prepare: bool = True,
    echo: bool = False,
    ready_timeout: float = 600.0,
    client_timeout: float | None = None,
    base_env: dict[str, str] | None = None,
    client_python: str | None = None,
    statistics_flag: str | None = "--statistics",
) -> dict[str, Any]:
    """Upstream's server on ``cfg.serve_checkpoint`` and a LIBERO client against it (``upstream``:
    ``eval_libero.py``; ``ours``: this project's client with ``--protocol dit4dit``), logs in the
    run directory, diagnosed."""
    from tutorial_utils import logs
    from tutorial_utils.bridge import files
    from tutorial_utils.bridge.checkout import validate_checkout
    from tutorial_utils.errors import ConfigError

    if client not in ("upstream", "ours"):
        raise ConfigError(f"client={client!r}: use upstream (eval_libero.py) or ours (python -m tutorial_utils eval)")
    cfg = cfg.resolved()
    cfg.check()
    cfg.check_interpreters()
    validate_checkout(cfg.checkout)
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"run_dir": str(run_dir), "client": client}
    if client == "upstream":  # LIBERO's config.yaml first: without it `import libero` asks on stdin
        files.write_libero_config_script(run_dir)
        lc = libero_config_command(cfg)
        if run_step(lc, timeout=120, echo=echo, base_env=base_env) != 0:
            raise StepFailed(
                "libero-config", f"LIBERO's config.yaml was not written:\n{tail_text(lc.log, 12)}", run_dir
            )
    config_yaml = cfg.serve_checkpoint.parents[1] / files.CONFIG_YAML
    if prepare and config_yaml.is_file():
        out["cosmos_fix"] = files.fix_cosmos_path(config_yaml, cfg.cosmos_dir)
    srv_cmd = serve_command(cfg)
    cli_cmd = eval_command(cfg) if client == "upstream" else client_command(cfg, client_python, statistics_flag)
    t0 = time.monotonic()
    with Server(srv_cmd, cfg.port, base_env, echo) as server:
        try:
            out["server_up_s"] = round(server.wait_ready(ready_timeout), 2)
        except StepFailed:
            server.stop()
            _verdict(run_dir, "serve", None, srv_cmd.log, eval={"client": client})
            raise
        rc = run_step(cli_cmd, timeout=client_timeout, echo=echo, base_env=base_env)
    out["returncode"], out["wall_s"] = rc, round(time.monotonic() - t0, 1)
    try:
        ev = logs.parse_eval_log(cli_cmd.log)
        out["episodes"], out["total_success_rate"] = ev.get("episodes"), ev.get("total_rate")
    except Exception as exc:  # the diagnosis below says the same in status.json
        out["episodes"] = out["total_success_rate"] = None
        out["parse_error"] = repr(exc)
    _verdict(run_dir, "eval", rc, cli_cmd.log, eval={k: v for k, v in out.items() if k != "cosmos_fix"})
    return out
