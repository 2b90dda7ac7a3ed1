"""The log-line contract and its parsers: the lines the book, the checks and the diagnosis depend on.

Formats follow DiT4DiT's training script and LIBERO client and openpi's server (docs/FACTS.md
sections 1, 4, 5), so one parser reads both the ``mini`` and the ``dit4dit`` backend.
Writers (``train``, ``evaluate``, ``serving``) format with these constants; parsers match them.
Upstream's Rich-formatted logs are turned back into plain message lines by :func:`normalise`.
The diagnosis that reads these parses is :mod:`tutorial_utils.logs.diagnosis`.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from pathlib import Path
from typing import Any

__all__ = [
    "TRAIN_TOTAL_PARAMS",
    "TRAIN_TRAINABLE_PARAMS",
    "TRAIN_FROZEN_PARAMS",
    "TRAIN_RATIO",
    "TRAIN_TOTAL_STEPS",
    "TRAIN_PER_DEVICE_BATCH",
    "TRAIN_DATALOADER_LEN",
    "TRAIN_STEP_LOSS",
    "TRAIN_COMPLETE",
    "SERVER_RUNNING",
    "SERVER_LISTENING",
    "SERVER_CONNECTION_OPEN",
    "SERVER_CONNECTION_FROM",
    "SERVER_CONNECTION_CLOSED",
    "SERVER_REQUEST_ERROR",
    "SERVER_STOPPED",
    "SERVER_POLICY_UNAVAILABLE",
    "EVAL_TASK",
    "EVAL_STARTING_EPISODE",
    "EVAL_SUCCESS",
    "EVAL_EPISODES_SO_FAR",
    "EVAL_SUCCESSES",
    "EVAL_TASK_RATE",
    "EVAL_TOTAL_RATE_SO_FAR",
    "EVAL_TOTAL_RATE",
    "EVAL_TOTAL_EPISODES",
    "EVAL_EGL_HARMLESS",
    "TRAIN_RUNNING",
    "TRAIN_FROZEN_MODULES",
    "TRAIN_RESUMED",
    "TRAIN_VALIDATION",
    "TRAIN_STOPPED",
    "TRAIN_DISK_USAGE",
    "TRAIN_FINAL_REMOVED",
    "TRAIN_FINAL_KEPT",
    "TRAIN_HEALTH",
    "TRAIN_TIME_LIMIT",
    "TRAIN_NONFINITE_LOSS",
    "pattern",
    "log_text",
    "RICH_PREFIX",
    "normalise",
    "traceback_errors",
    "parse_losses",
    "parse_train_log",
    "parse_server_log",
    "parse_eval_log",
    "documented_eval_lines",
]

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
TRAIN_HEALTH = "Health check at step {step}: [{severity}] {code}: {message} Fix: {fix}"
TRAIN_TIME_LIMIT = "Time limit of {minutes} min reached at step {step}; finishing the run"
TRAIN_NONFINITE_LOSS = "Non-finite loss at step {step}: {losses}; training stopped, last good checkpoint: {path}"


# --- parsers ----------------------------------------------------------------------------------
#
# Each pattern is built from the constant above, so a writer and its parser cannot drift.
# Lines may carry a prefix (a timestamp, a logger name): patterns match anywhere in a line.

_FIELD = re.compile(r"\{(\w+)(?::[^}]*)?\}")


@functools.cache
def pattern(fmt: str) -> re.Pattern[str]:
    """A regex for lines written with ``fmt`` (each ``{name}`` becomes a named group), compiled once."""
    out, pos = [], 0
    for m in _FIELD.finditer(fmt):
        out.append(re.escape(fmt[pos : m.start()]))
        out.append(f"(?P<{m.group(1)}>.+?)")
        pos = m.end()
    out.append(re.escape(fmt[pos:]))
    return re.compile("".join(out) + r"\s*$")


#: DiT4DiT prints ``server running ...`` with its own wording after it: match the prefix.
_SERVER_RUNNING = re.compile(r"\bserver running\b")
_CONNECTION_OPEN = re.compile(r"\b" + re.escape(SERVER_CONNECTION_OPEN) + r"\b")
_PORT_IN_USE = re.compile(r"already in use|Address in use|EADDRINUSE|Errno 98", re.I)
_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception|Unavailable|Died|Failed)|KeyboardInterrupt|SystemExit)\b.*")


def log_text(source: str | os.PathLike) -> str:
    """A log's text from a path or the text itself, normalised (see :func:`normalise`)."""
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and "\n" not in source and len(source) < 4096 and Path(source).is_file()
    ):
        with open(source, encoding="utf-8", errors="replace", newline="") as f:  # keep tqdm's \r redraws
            return normalise(f.read())
    return normalise(str(source))


# --- upstream's log format (FACTS section 11) ------------------------------------------------------
#
# Every upstream process that imports the DiT4DiT package logs through a Rich handler on the root
# logger: a time column (blank when it repeats), an 8-cell level column, the message formatted as
# ``| >> <message>``, and a ``file.py:N`` column on the right; messages wrap inside their column
# (80 columns when the output is not a terminal). ``server_policy.py`` logs plain ``INFO:root:...``.
# ``normalise`` turns both back into the plain message lines the parsers read.

#: The prefix upstream's Rich formatter puts in front of every message.
RICH_PREFIX = "| >> "
_LEVELS = "DEBUG|INFO|WARNING|ERROR|CRITICAL"
_RICH_LEVEL_WIDTH = 8  # Rich's level column, then one space
_RICH_RECORD = re.compile(rf"^(?P<time>[^A-Za-z]*?)(?P<level>{_LEVELS})(?P<pad> +)(?P<rest>.*?) *$")
_RICH_PATH = re.compile(r" (?P<path>[\w.\-<>]+:\d+)$")
_RICH_TIME = re.compile(r"[\d/:.,\-\[\]() ]*\d[\d/:.,\-\[\]() ]* ")
_PLAIN_LOGGING = re.compile(rf"^(?:{_LEVELS}):[^:\s]*:")
_PLAIN_LOGGING_M = re.compile(rf"^(?:{_LEVELS}):[^:\s]*:", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_TQDM_BAR = re.compile(r"\s*(?:[^\r\n|]*?:\s*)?\d{1,3}%\|[^|\n]*\|[^\[\n]*\[[^\]\n]*\]")
#: A wrapped line whose next word would have fitted this many cells short of the edge: a newline.
_NEWLINE_MARGIN = 8
_BOX = "╭│╰┃┏┗"


def _cells(text: str) -> int:
    """Terminal cells ``text`` takes (wide characters such as emoji take two), as Rich counts them."""
    import unicodedata

    n = 0
    for ch in text:
        if ch.isascii():
            n += 1
        elif unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf") or 0xFE00 <= ord(ch) <= 0xFE0F:
            continue
        else:
            n += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return n


def _physical(line: str) -> str:
    """One physical line without colour codes and progress-bar redraws (``\\r``, tqdm bars)."""
    line = _ANSI.sub("", line)
    if "\r" not in line and "%|" not in line:
        return line
    parts = [p for p in line.split("\r") if p.strip()]
    if not parts:
        return ""
    kept = [_TQDM_BAR.sub("", p) for p in parts]
    text = [k for k in kept if k.strip()]
    return text[-1] if text else parts[-1]


def _rich_record(line: str) -> tuple[int, int | None, str] | None:
    """(message column start, message column width or None, first message segment) of a Rich record."""
    m = _RICH_RECORD.match(line)
    if not m or len(m.group("level")) + len(m.group("pad")) < _RICH_LEVEL_WIDTH + 1:
        return None
    t = m.group("time")
    if t and not (t.strip() == "" or _RICH_TIME.fullmatch(t)):
        return None
    start = m.start("level") + _RICH_LEVEL_WIDTH + 1
    body = line[start:].rstrip()
    p = _RICH_PATH.search(body)
    if p is None:
        return None  # upstream always shows the path column; without it this is someone else's format
    width = _cells(line[start : start + p.start()])
    return start, width, body[: p.start()].rstrip()


def _join_record(segments: list[str], width: int | None) -> list[str]:
    """The message lines of one Rich record from its wrapped segments (Rich's own wrapping rules:
    greedy on spaces, a word longer than the column starts a line and is folded)."""
    out: list[str] = []
    prev: str | None = None
    for seg in segments:
        if seg[:1] in _BOX:
            if "Traceback" in seg:
                out.append("Traceback (most recent call last):")
            prev = None
            continue
        if prev is None or not seg or seg[0] == " ":
            out.append(seg)
        elif width is not None and _cells(prev) >= width and " " not in prev:
            out[-1] += seg  # a folded word
        elif (width is None and prev == RICH_PREFIX.rstrip()) or (
            width is not None
            and _cells(prev) + 1 + _cells(seg.split(" ", 1)[0]) <= width - (0 if prev == "| >>" else _NEWLINE_MARGIN)
        ):
            # the word would have fitted: the message had a newline here (the margin allows for the
            # run of spaces Rich drops at a wrap, as in "Total parameters:      N")
            out.append(seg)
        else:
            out[-1] += " " + seg  # wrapped at a space
        prev = seg
    if out:
        out[0] = out[0][len(RICH_PREFIX) :] if out[0].startswith(RICH_PREFIX) else out[0].removeprefix("| >>")
    return out


def normalise(text: str) -> str:
    """Upstream's Rich-formatted or plain log text -> the plain message lines the parsers read.

    Rich records (80 or 200 columns) lose their time, level and ``file.py:N`` columns and the
    ``| >> `` prefix, and their wrapped lines are joined back; ``LEVEL:logger:`` prefixes of plain
    Python logging, colour codes and progress-bar redraws are removed. Other lines (our own
    logs, tracebacks, ``print`` output) are kept as they are, so ``normalise`` is idempotent.
    """
    if not any(sign in text for sign in (RICH_PREFIX, "\r", "\x1b", "%|")):  # no Rich, redraws or colours
        return _PLAIN_LOGGING_M.sub("", text)
    out: list[str] = []
    rec: tuple[int, int | None, list[str]] | None = None

    def flush() -> None:
        if rec is not None:
            out.extend(_join_record(rec[2], rec[1]))

    for raw in text.replace("\r\n", "\n").split("\n"):
        line = _physical(raw)
        head = _rich_record(line)
        if head is not None:
            flush()
            rec = (head[0], head[1], [head[2]])
            continue
        if rec is not None and line[: rec[0]].strip() == "" and len(line) >= rec[0] and line.strip():
            rec[2].append(line[rec[0] :].rstrip())
            continue
        if rec is not None and line.strip() == "" and len(line) >= rec[0]:
            rec[2].append("")  # an empty line inside a message
            continue
        flush()
        rec = None
        out.append(_PLAIN_LOGGING.sub("", line, count=1))
    flush()
    return "\n".join(out)


def _num(text: str) -> float | int:
    t = text.strip().rstrip("%").replace(",", "")
    try:
        return int(t)
    except ValueError:
        return float(t)


def traceback_errors(lines: list[str]) -> list[str]:
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
    """``{'action_dit_loss': 0.1, ...}`` -> dict (also with ``nan``/``inf``, tensor reprs, keys such as
    ``learning_rate/<group>`` and the stray ``)`` upstream prints after the dict)."""
    text = text.strip()
    while text.endswith(")") and text.count(")") > text.count("("):
        text = text[:-1].rstrip()
    try:
        val = ast.literal_eval(text)
        if isinstance(val, dict):
            return {str(k): float(v) for k, v in val.items()}
    except (ValueError, SyntaxError, TypeError):
        pass
    out = {}
    for k, v in re.findall(
        r"['\"]?([\w/.\-]+)['\"]?\s*:\s*(?:tensor\(|np\.float\d+\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))",
        text,
    ):
        out[k] = float(v)
    return out


def parse_train_log(source: str | os.PathLike) -> dict[str, Any]:
    """DiT4DiT-format training log (FACTS section 1) -> parameters, steps and losses, completion."""
    lines = log_text(source).splitlines()
    res: dict[str, Any] = {
        "total_params": None,
        "trainable_params": None,
        "frozen_params": None,
        "trainable_ratio": None,
        "total_steps": None,
        "dataloader_len": None,
        "run_id": None,
        "steps": [],
        "final_model": None,
        "errors": traceback_errors(lines),
    }
    keys = {
        TRAIN_TOTAL_PARAMS: "total_params",
        TRAIN_TRAINABLE_PARAMS: "trainable_params",
        TRAIN_FROZEN_PARAMS: "frozen_params",
    }
    for ln in lines:
        for fmt, key in keys.items():
            m = pattern(fmt).search(ln)
            if m:
                res[key] = _num(m.group("n"))
        if m := pattern(TRAIN_RATIO).search(ln):
            res["trainable_ratio"] = _num(m.group("pct"))
        if m := pattern(TRAIN_TOTAL_STEPS).search(ln):
            res["total_steps"] = _num(m.group("n"))
        if m := pattern(TRAIN_DATALOADER_LEN).search(ln):
            res["dataloader_len"] = _num(m.group("n"))
        if m := pattern(TRAIN_STEP_LOSS).search(ln):
            res["run_id"] = m.group("run_id")
            res["steps"].append({"step": _num(m.group("step")), "losses": parse_losses(m.group("losses"))})
        if m := pattern(TRAIN_COMPLETE).search(ln):
            res["final_model"] = m.group("path")
    return res


def parse_server_log(source: str | os.PathLike) -> dict[str, Any]:
    """Policy server log (ours, DiT4DiT's or openpi's) -> startup, connections, request errors."""
    lines = log_text(source).splitlines()
    res: dict[str, Any] = {
        "running": False,
        "listening": [],
        "connections_open": 0,
        "connections_from": [],
        "connections_closed": 0,
        "request_errors": [],
        "port_in_use": False,
        "errors": traceback_errors(lines),
        "stopped": False,
        "policy_unavailable": [],
    }
    stopped = pattern(SERVER_STOPPED)
    unavailable = pattern(SERVER_POLICY_UNAVAILABLE)
    for ln in lines:
        if _SERVER_RUNNING.search(ln):
            res["running"] = True
        if m := pattern(SERVER_LISTENING).search(ln):
            res["listening"].append(f"{m.group('host')}:{m.group('port')}")
        elif "server listening on" in ln:
            res["listening"].append(ln.split("server listening on", 1)[1].strip())
        if _CONNECTION_OPEN.search(ln):
            res["connections_open"] += 1
        if m := pattern(SERVER_CONNECTION_FROM).search(ln):
            res["connections_from"].append(m.group("addr"))
        if pattern(SERVER_CONNECTION_CLOSED).search(ln):
            res["connections_closed"] += 1
        if m := pattern(SERVER_REQUEST_ERROR).search(ln):
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


def documented_eval_lines(source: str | os.PathLike) -> list[str]:
    """The lines of a LIBERO client log written with the ``EVAL_*`` formats (FACTS section 5), in
    order; LIBERO's and robosuite's own prints left out. Two evaluations of the same episodes (one
    client process or several, merged) give the same list."""
    heads = tuple(fmt.split("{")[0] for name, fmt in globals().items() if name.startswith("EVAL_") and "{" in fmt)
    return [ln for ln in log_text(source).splitlines() if ln.startswith(heads)]


def parse_eval_log(source: str | os.PathLike) -> dict[str, Any]:
    """LIBERO client log (FACTS section 5) -> per task episodes and rates, totals, EGL noise.

    ``tasks``: ``[{"task", "episodes": [{"episode", "success"}], "task_rate"}]``;
    ``total_rate``/``total_episodes``: from the final lines (None when missing);
    ``egl_after_total``: the harmless ``EGL_NOT_INITIALIZED`` at exit.
    """
    lines = log_text(source).splitlines()
    res: dict[str, Any] = {
        "tasks": [],
        "episodes": 0,
        "successes": 0,
        "total_rate": None,
        "total_episodes": None,
        "running_total_rate": None,
        "egl_after_total": False,
        "egl_before_total": False,
        "errors": traceback_errors(lines),
    }
    task = None
    pending_episode = None
    for ln in lines:
        if m := pattern(EVAL_TASK).search(ln):
            task = {"task": m.group("task"), "episodes": [], "task_rate": None}
            res["tasks"].append(task)
        elif m := pattern(EVAL_STARTING_EPISODE).search(ln):
            pending_episode = _num(m.group("n"))
        elif m := pattern(EVAL_SUCCESS).search(ln):
            ok = _bool(m.group("success"))
            if task is None:
                task = {"task": "?", "episodes": [], "task_rate": None}
                res["tasks"].append(task)
            task["episodes"].append({"episode": pending_episode, "success": ok})
            res["episodes"] += 1
            res["successes"] += int(bool(ok))
        elif m := pattern(EVAL_TASK_RATE).search(ln):
            if task is not None:
                task["task_rate"] = _num(m.group("rate"))
        elif m := pattern(EVAL_TOTAL_RATE_SO_FAR).search(ln):
            res["running_total_rate"] = _num(m.group("rate"))
        elif m := pattern(EVAL_TOTAL_RATE).search(ln):
            res["total_rate"] = _num(m.group("rate"))
        elif m := pattern(EVAL_TOTAL_EPISODES).search(ln):
            res["total_episodes"] = _num(m.group("n"))
        if EVAL_EGL_HARMLESS in ln:
            res["egl_after_total" if res["total_rate"] is not None else "egl_before_total"] = True
    return res
