"""The log lines the book, the checks and the diagnosis depend on, in one place.

Formats follow DiT4DiT's training script and LIBERO client and openpi's server (FACTS.md
sections 1, 4, 5), so one parser reads both the ``mini`` and the ``dit4dit`` backend.
Writers (``train``, ``evaluate``, ``serving``) format with these constants; parsers match them.
"""

from __future__ import annotations

# --- training (DiT4DiT/training/train.py) ---------------------------------------------------
TRAIN_TOTAL_PARAMS = "Total parameters: {n:,} ({m:.3f}M)"
TRAIN_TRAINABLE_PARAMS = "Trainable parameters: {n:,} ({m:.3f}M)"
TRAIN_FROZEN_PARAMS = "Frozen parameters: {n:,} ({m:.3f}M)"
TRAIN_RATIO = "Trainable ratio: {pct:.2f}%"
TRAIN_TOTAL_STEPS = "  Total optimization steps = {n}"
TRAIN_PER_DEVICE_BATCH = "  Per device batch size = {n}"
TRAIN_DATALOADER_LEN = "  len(vla_train_dataloader) = {n}"
TRAIN_STEP_LOSS = "[Exp: {run_id}] Step {step}, Loss: {losses}"
TRAIN_COMPLETE = "Training complete. Final model saved at {path}"

# --- policy server (DiT4DiT server_policy.py / websockets / openpi) --------------------------
SERVER_RUNNING = "server running on {host}:{port}"
SERVER_LISTENING = "server listening on {host}:{port}"
SERVER_CONNECTION_OPEN = "connection open"
SERVER_CONNECTION_FROM = "Connection from {addr} opened"
SERVER_CONNECTION_CLOSED = "Connection from {addr} closed"
SERVER_REQUEST_ERROR = "request from {addr} failed: {error}"
SERVER_STOPPED = "server stopped after {requests} requests ({errors} errors)"
SERVER_POLICY_UNAVAILABLE = "cannot serve policy {policy}: {reason}"

# --- LIBERO client (eval_libero.py / openpi examples/libero/main.py) ------------------------
EVAL_TASK = "Task: {task}"
EVAL_STARTING_EPISODE = "Starting episode {n}..."
EVAL_SUCCESS = "Success: {success}"
EVAL_EPISODES_SO_FAR = "# episodes completed so far: {n}"
EVAL_SUCCESSES = "# successes: {n} ({pct:.1f}%)"
EVAL_TASK_RATE = "Current task success rate: {rate}"
EVAL_TOTAL_RATE_SO_FAR = "Current total success rate: {rate}"
EVAL_TOTAL_RATE = "Total success rate: {rate}"
EVAL_TOTAL_EPISODES = "Total episodes: {n}"
EVAL_EGL_HARMLESS = "EGL_NOT_INITIALIZED"


# --- parsers ----------------------------------------------------------------------------------
#
# Each pattern is built from the constant above, so a writer and its parser cannot drift.
# Lines may carry a prefix (a timestamp, a logger name): patterns match anywhere in a line.

import ast as _ast
import json as _json
import os as _os
import re as _re
import sys as _sys
from dataclasses import asdict as _asdict
from dataclasses import dataclass as _dataclass
from dataclasses import field as _field
from pathlib import Path as _Path
from typing import Any as _Any

_FIELD = _re.compile(r"\{(\w+)(?::[^}]*)?\}")


def pattern(fmt: str) -> _re.Pattern[str]:
    """A regex for lines written with ``fmt`` (each ``{name}`` becomes a named group)."""
    out, pos = [], 0
    for m in _FIELD.finditer(fmt):
        out.append(_re.escape(fmt[pos : m.start()]))
        out.append(f"(?P<{m.group(1)}>.+?)")
        pos = m.end()
    out.append(_re.escape(fmt[pos:]))
    return _re.compile("".join(out) + r"\s*$")


_P = {
    name: pattern(globals()[name])
    for name in (
        "TRAIN_TOTAL_PARAMS",
        "TRAIN_TRAINABLE_PARAMS",
        "TRAIN_FROZEN_PARAMS",
        "TRAIN_RATIO",
        "TRAIN_TOTAL_STEPS",
        "TRAIN_DATALOADER_LEN",
        "TRAIN_STEP_LOSS",
        "TRAIN_COMPLETE",
        "SERVER_LISTENING",
        "SERVER_CONNECTION_FROM",
        "SERVER_CONNECTION_CLOSED",
        "SERVER_REQUEST_ERROR",
        "EVAL_TASK",
        "EVAL_STARTING_EPISODE",
        "EVAL_SUCCESS",
        "EVAL_EPISODES_SO_FAR",
        "EVAL_SUCCESSES",
        "EVAL_TASK_RATE",
        "EVAL_TOTAL_RATE_SO_FAR",
        "EVAL_TOTAL_RATE",
        "EVAL_TOTAL_EPISODES",
    )
}
#: DiT4DiT prints ``server running ...`` with its own wording after it: match the prefix.
_SERVER_RUNNING = _re.compile(r"\bserver running\b")
_CONNECTION_OPEN = _re.compile(r"\b" + _re.escape(SERVER_CONNECTION_OPEN) + r"\b")
_PORT_IN_USE = _re.compile(r"already in use|Address in use|EADDRINUSE|Errno 98", _re.I)
_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINE = _re.compile(r"^(?:[\w.]+(?:Error|Exception|Unavailable|Died|Failed)|KeyboardInterrupt|SystemExit)\b.*")


def _text(source: str | _os.PathLike) -> str:
    """A log's text from a path or the text itself."""
    if isinstance(source, _os.PathLike) or (
        isinstance(source, str) and "\n" not in source and len(source) < 4096 and _Path(source).is_file()
    ):
        return _Path(source).read_text(encoding="utf-8", errors="replace")
    return str(source)


def _num(text: str) -> float | int:
    t = text.strip().rstrip("%").replace(",", "")
    try:
        return int(t)
    except ValueError:
        return float(t)


def _errors(lines: list[str]) -> list[str]:
    """The last line of each traceback (``SomeError: message``), in order."""
    found, in_tb = [], False
    for ln in lines:
        s = ln.strip()
        if s.startswith(_TRACEBACK):
            in_tb = True
            continue
        if in_tb and _ERROR_LINE.match(s):
            found.append(s)
            in_tb = False
    return found


def parse_losses(text: str) -> dict[str, float]:
    """``{'action_dit_loss': 0.1, ...}`` -> dict (also with ``nan``/``inf`` and tensor reprs)."""
    try:
        val = _ast.literal_eval(text.strip())
        if isinstance(val, dict):
            return {str(k): float(v) for k, v in val.items()}
    except (ValueError, SyntaxError, TypeError):
        pass
    out = {}
    for k, v in _re.findall(
        r"['\"]?(\w+)['\"]?\s*:\s*(?:tensor\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))", text
    ):
        out[k] = float(v)
    return out


def parse_train_log(source: str | _os.PathLike) -> dict[str, _Any]:
    """DiT4DiT-format training log (FACTS section 1) -> parameters, steps and losses, completion."""
    lines = _text(source).splitlines()
    res: dict[str, _Any] = {
        "total_params": None,
        "trainable_params": None,
        "frozen_params": None,
        "trainable_ratio": None,
        "total_steps": None,
        "dataloader_len": None,
        "run_id": None,
        "steps": [],
        "final_model": None,
        "errors": _errors(lines),
    }
    keys = {
        "TRAIN_TOTAL_PARAMS": "total_params",
        "TRAIN_TRAINABLE_PARAMS": "trainable_params",
        "TRAIN_FROZEN_PARAMS": "frozen_params",
    }
    for ln in lines:
        for const, key in keys.items():
            m = _P[const].search(ln)
            if m:
                res[key] = _num(m.group("n"))
        if m := _P["TRAIN_RATIO"].search(ln):
            res["trainable_ratio"] = _num(m.group("pct"))
        if m := _P["TRAIN_TOTAL_STEPS"].search(ln):
            res["total_steps"] = _num(m.group("n"))
        if m := _P["TRAIN_DATALOADER_LEN"].search(ln):
            res["dataloader_len"] = _num(m.group("n"))
        if m := _P["TRAIN_STEP_LOSS"].search(ln):
            res["run_id"] = m.group("run_id")
            res["steps"].append({"step": _num(m.group("step")), "losses": parse_losses(m.group("losses"))})
        if m := _P["TRAIN_COMPLETE"].search(ln):
            res["final_model"] = m.group("path")
    return res


def parse_server_log(source: str | _os.PathLike) -> dict[str, _Any]:
    """Policy server log (ours, DiT4DiT's or openpi's) -> startup, connections, request errors."""
    lines = _text(source).splitlines()
    res: dict[str, _Any] = {
        "running": False,
        "listening": [],
        "connections_open": 0,
        "connections_from": [],
        "connections_closed": 0,
        "request_errors": [],
        "port_in_use": False,
        "errors": _errors(lines),
        "stopped": False,
        "policy_unavailable": [],
    }
    stopped = pattern(SERVER_STOPPED)
    unavailable = pattern(SERVER_POLICY_UNAVAILABLE)
    for ln in lines:
        if _SERVER_RUNNING.search(ln):
            res["running"] = True
        if m := _P["SERVER_LISTENING"].search(ln):
            res["listening"].append(f"{m.group('host')}:{m.group('port')}")
        elif "server listening on" in ln:
            res["listening"].append(ln.split("server listening on", 1)[1].strip())
        if _CONNECTION_OPEN.search(ln):
            res["connections_open"] += 1
        if m := _P["SERVER_CONNECTION_FROM"].search(ln):
            res["connections_from"].append(m.group("addr"))
        if _P["SERVER_CONNECTION_CLOSED"].search(ln):
            res["connections_closed"] += 1
        if m := _P["SERVER_REQUEST_ERROR"].search(ln):
            res["request_errors"].append(m.group("error"))
        if _PORT_IN_USE.search(ln):
            res["port_in_use"] = True
        if stopped.search(ln):
            res["stopped"] = True
        if m := unavailable.search(ln):
            res["policy_unavailable"].append(m.group("reason"))
    return res


def _bool(text: str) -> bool | None:
    return {"true": True, "false": False}.get(text.strip().lower())


def parse_eval_log(source: str | _os.PathLike) -> dict[str, _Any]:
    """LIBERO client log (FACTS section 5) -> per task episodes and rates, totals, EGL noise.

    ``tasks``: ``[{"task", "episodes": [{"episode", "success"}], "task_rate"}]``;
    ``total_rate``/``total_episodes``: from the final lines (None when missing);
    ``egl_after_total``: the harmless ``EGL_NOT_INITIALIZED`` at exit.
    """
    lines = _text(source).splitlines()
    res: dict[str, _Any] = {
        "tasks": [],
        "episodes": 0,
        "successes": 0,
        "total_rate": None,
        "total_episodes": None,
        "running_total_rate": None,
        "egl_after_total": False,
        "egl_before_total": False,
        "errors": _errors(lines),
    }
    task = None
    pending_episode = None
    for ln in lines:
        if m := _P["EVAL_TASK"].search(ln):
            task = {"task": m.group("task"), "episodes": [], "task_rate": None}
            res["tasks"].append(task)
        elif m := _P["EVAL_STARTING_EPISODE"].search(ln):
            pending_episode = _num(m.group("n"))
        elif m := _P["EVAL_SUCCESS"].search(ln):
            ok = _bool(m.group("success"))
            if task is None:
                task = {"task": "?", "episodes": [], "task_rate": None}
                res["tasks"].append(task)
            task["episodes"].append({"episode": pending_episode, "success": ok})
            res["episodes"] += 1
            res["successes"] += int(bool(ok))
        elif m := _P["EVAL_TASK_RATE"].search(ln):
            if task is not None:
                task["task_rate"] = _num(m.group("rate"))
        elif m := _P["EVAL_TOTAL_RATE_SO_FAR"].search(ln):
            res["running_total_rate"] = _num(m.group("rate"))
        elif m := _P["EVAL_TOTAL_RATE"].search(ln):
            res["total_rate"] = _num(m.group("rate"))
        elif m := _P["EVAL_TOTAL_EPISODES"].search(ln):
            res["total_episodes"] = _num(m.group("n"))
        if EVAL_EGL_HARMLESS in ln:
            res["egl_after_total" if res["total_rate"] is not None else "egl_before_total"] = True
    return res


# --- diagnosis -----------------------------------------------------------------------------------


@_dataclass
class Diagnosis:
    """What a run's logs show: the success signs seen, the stage that failed, likely causes."""

    run_dir: str
    kind: str  # "evaluation", "training" or "unknown"
    signs: dict[str, bool] = _field(default_factory=dict)
    failed_stage: str | None = None
    causes: list[str] = _field(default_factory=list)
    notes: list[str] = _field(default_factory=list)
    figures: dict[str, _Any] = _field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failed_stage is None

    def to_dict(self) -> dict[str, _Any]:
        return {**_asdict(self), "ok": self.ok}

    def __str__(self) -> str:
        out = [f"run: {self.run_dir} ({self.kind})"]
        out += [f"  [{'x' if seen else ' '}] {name}" for name, seen in self.signs.items()]
        for k, v in self.figures.items():
            out.append(f"  {k}: {v}")
        if self.ok:
            out.append("verdict: OK, every success sign was seen")
        else:
            out.append(f"verdict: FAILED at stage '{self.failed_stage}'. Likely causes:")
            out += [f"  - {c}" for c in self.causes]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


#: Success signs of an evaluation run, in the order they appear.
EVAL_SIGNS = (
    "server running",
    "server listening",
    "connection open",
    "task started",
    "episode finished",
    "total success rate",
)
#: Success signs of a training run.
TRAIN_SIGNS = ("parameters counted", "first loss line", "training complete")


def _first(run: _Path, patterns: tuple[str, ...], exclude: str = "") -> _Path | None:
    for pat in patterns:
        hits = sorted(p for p in run.glob(pat) if not (exclude and exclude in p.name))
        if hits:
            return hits[0]
    return None


def _diagnose_eval(d: Diagnosis, server_log: _Path | None, eval_log: _Path | None) -> None:
    srv = parse_server_log(server_log) if server_log else None
    ev = parse_eval_log(eval_log) if eval_log else None
    d.signs = {
        "server running": bool(srv and srv["running"]),
        "server listening": bool(srv and srv["listening"]),
        "connection open": bool(srv and srv["connections_open"]),
        "task started": bool(ev and ev["tasks"]),
        "episode finished": bool(ev and ev["episodes"]),
        "total success rate": bool(ev and ev["total_rate"] is not None),
    }
    if ev:
        d.figures = {"episodes": ev["episodes"], "successes": ev["successes"], "total_success_rate": ev["total_rate"]}
    if srv and srv["request_errors"]:
        d.figures["server_request_errors"] = len(srv["request_errors"])
    ev_errors = ev["errors"] if ev else []
    srv_errors = srv["errors"] if srv else []
    if ev and ev["egl_after_total"]:
        d.notes.append(
            f"{EVAL_EGL_HARMLESS} after 'Total success rate' is robosuite's renderer cleanup at exit: harmless."
        )

    if srv is None:
        d.failed_stage = "server"
        d.causes = [
            "no server.log in the run directory: the server was never started, or the job died before collecting logs"
        ]
        return
    if not (d.signs["server running"] or d.signs["server listening"]):
        d.failed_stage = "server"
        if srv["port_in_use"]:
            d.causes.append("the port is already in use by another process: pick another `port` (0 picks a free one)")
        d.causes += [f"the policy cannot be served here: {r}" for r in srv["policy_unavailable"]]
        d.causes += [f"the server crashed at startup: {e}" for e in srv_errors[-2:]]
        d.causes.append("the server's packages or checkpoint failed to load: read server.log from the top")
        return
    if not d.signs["connection open"]:
        d.failed_stage = "client connect"
        d.causes = [
            "the LIBERO client was not started, or it crashed before connecting (missing packages: read the eval log)",
            "the client connected to a different host/port than the server's 'server listening on' line",
        ] + [f"client error: {e}" for e in ev_errors[-2:]]
        return
    if not d.signs["task started"]:
        d.failed_stage = "LIBERO setup"
        d.causes = [
            "LIBERO could not load its suite or assets: check LIBERO_CONFIG_PATH and the paths in its config.yaml",
            "no offscreen GL backend: MUJOCO_GL=egl needs libegl1 libegl-mesa0 libgl1-mesa-dri, osmesa needs libosmesa6",
        ] + [f"client error: {e}" for e in ev_errors[-2:]]
        if ev and ev["egl_before_total"]:
            d.causes.insert(
                0, f"{EVAL_EGL_HARMLESS} before any task: the EGL backend does not work here; try MUJOCO_GL=osmesa"
            )
        return
    if not d.signs["total success rate"]:
        d.failed_stage = "evaluation"
        d.causes = [f"client error: {e}" for e in ev_errors[-2:]]
        if srv_errors:
            d.causes.append(f"the policy server raised: {srv_errors[-1]}")
        d.causes += [
            "the server died or stopped answering mid-episode (the client then raises ServerDied): read server.log",
            "the client was killed (out of memory: ~2 GB per rendering env) or interrupted before the last episode",
        ]
        return


def _diagnose_train(d: Diagnosis, train_log: _Path) -> None:
    tr = parse_train_log(train_log)
    d.signs = {
        "parameters counted": tr["total_params"] is not None,
        "first loss line": bool(tr["steps"]),
        "training complete": tr["final_model"] is not None,
    }
    d.figures = {
        "steps_logged": len(tr["steps"]),
        "last_step": tr["steps"][-1]["step"] if tr["steps"] else None,
        "last_total_loss": (tr["steps"][-1]["losses"].get("total_loss") if tr["steps"] else None),
        "final_model": tr["final_model"],
    }
    errs = [f"error in the log: {e}" for e in tr["errors"][-2:]]
    for sign, stage, causes in _TRAIN_STAGES:
        if not d.signs[sign]:
            d.failed_stage, d.causes = stage, errs + list(causes)
            break


#: (missing sign, stage that failed, likely causes) of a training run, in order.
_TRAIN_STAGES = (
    (
        "parameters counted",
        "model setup",
        (
            "the config did not load: pass --config_yaml (the default is the placeholder xxx.yaml) and run from the repo root",
            "wandb.init needs an account: set WANDB_MODE=offline",
            "the backbone weights were not downloaded (gated model: accept the licence and set HF_TOKEN)",
        ),
    ),
    (
        "first loss line",
        "data loading",
        (
            "the data mixture is unknown (libero_spatial_only does not exist upstream: register a mixture entry)",
            "the dataset path or meta files (modality.json, stats) are missing or invalid",
            "the loss is printed every trainer.logging_frequency steps: a 2-step run needs --trainer.logging_frequency 1",
        ),
    ),
    (
        "training complete",
        "training",
        (
            "the run was killed or crashed mid-training (out of memory, disk full while saving a checkpoint)",
            "it is still running: check the process and the newest checkpoint",
        ),
    ),
)


def _short(path: str | _os.PathLike) -> str:
    """``path`` relative to the repository when it lies inside it (what the book shows)."""
    from tutorial_utils import paths

    p = _Path(path).resolve()
    try:
        return p.relative_to(paths.REPO).as_posix()
    except ValueError:
        return str(path)


def diagnose(
    run_dir: str | _os.PathLike | None = None,
    *,
    server_log: str | _os.PathLike | None = None,
    eval_log: str | _os.PathLike | None = None,
    train_log: str | _os.PathLike | None = None,
) -> Diagnosis:
    """Read a run's logs and say which success signs were seen and, when one is missing, which
    stage failed and the likely causes.

    An evaluation run directory has ``server.log`` and ``eval_<suite>.log``; a training run
    ``train.log``. Promoted logs (``logs/eval_server.log`` ...) are diagnosed by naming the
    files: ``diagnose(server_log=..., eval_log=...)``.
    """
    run = _Path(run_dir) if run_dir is not None else None
    if run is not None:
        if not run.is_dir():
            raise FileNotFoundError(
                f"run directory {run} does not exist; list runs with `python -m tutorial_utils job list`"
            )
        server_log = server_log or _first(run, ("server.log", "*server*.log"))
        eval_log = eval_log or _first(run, ("eval_*.log", "eval.log"), exclude="server")
        train_log = train_log or _first(run, ("train.log", "train_*.log"))
    where = _short(run) if run is not None else ", ".join(_short(p) for p in (server_log, eval_log, train_log) if p)
    for p in (server_log, eval_log, train_log):
        if p is not None and not _Path(p).is_file():
            raise FileNotFoundError(f"log file {p} not found")
    server_log, eval_log, train_log = (_Path(p) if p else None for p in (server_log, eval_log, train_log))
    if server_log or eval_log:
        d = Diagnosis(where, "evaluation")
        _diagnose_eval(d, server_log, eval_log)
    elif train_log:
        d = Diagnosis(where, "training")
        _diagnose_train(d, train_log)
    else:
        d = Diagnosis(
            where,
            "unknown",
            failed_stage="no logs",
            causes=[
                f"no server.log, eval_*.log or train.log in {where}: the job failed before its first stage "
                "(read status.json and the executed notebook)"
            ],
        )
    if run is None:
        return d
    status = run / "status.json"
    if status.is_file():
        try:
            st = _json.loads(status.read_text())
        except ValueError:
            st = {}
        if st.get("state") == "failed" and d.ok:
            d.notes.append(f"status.json says the job failed: {st.get('error')}")
    return d


# --- CLI -----------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils logs", description="Parse run logs and diagnose which stage failed."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    dg = sub.add_parser("diagnose", help="success signs, failed stage and likely causes of a run directory")
    dg.add_argument("run_dir")
    dg.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    ps = sub.add_parser("parse", help="parse one log file and print JSON")
    ps.add_argument("kind", choices=("eval", "server", "train"))
    ps.add_argument("path")
    args = ap.parse_args(argv)
    if args.cmd == "parse":
        if not _Path(args.path).is_file():
            print(f"error: log file {args.path} not found", file=_sys.stderr)
            return 2
        fn = {"eval": parse_eval_log, "server": parse_server_log, "train": parse_train_log}[args.kind]
        print(_json.dumps(fn(_Path(args.path)), indent=2))
        return 0
    try:
        d = diagnose(args.run_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=_sys.stderr)
        return 2
    print(_json.dumps(d.to_dict(), indent=2) if args.json else str(d))
    return 0 if d.ok else 1


# --- mini training extras (tutorial_utils.train; no DiT4DiT counterpart) ----------------------
TRAIN_RUNNING = "***** Running training *****"
TRAIN_FROZEN_MODULES = "Frozen modules: {modules}"
TRAIN_RESUMED = "Resumed from {path} at step {step}"
TRAIN_VALIDATION = "[Exp: {run_id}] Step {step}, Validation: {metrics}"
TRAIN_STOPPED = (
    "Training stopped by {signal} at step {step}; checkpoint saved at {path}. "
    "Continue with resume=true and the same output_dir."
)
TRAIN_DISK_USAGE = "Disk usage: final_model {final}, run directory {run_dir}"
TRAIN_FINAL_REMOVED = "Removed final_model (set KEEP_FINAL_MODEL=1 to keep it); run directory now {run_dir}"
TRAIN_FINAL_KEPT = "KEEP_FINAL_MODEL=1: final_model kept ({final})"
TRAIN_TIME_LIMIT = "Time limit of {minutes} min reached at step {step}; finishing the run"
TRAIN_NONFINITE_LOSS = "Non-finite loss at step {step}: {losses}; training stopped, last good checkpoint: {path}"
