"""How a running training loop is told to stop: the stop signals (SIGINT, SIGTERM, SIGUSR1: a
cluster's pre-emption notice; :class:`StopSignals`) and ``control.json`` (:class:`ControlFile`: a
``stop`` or ``pause`` written from a notebook or another shell, by :mod:`tutorial_utils.runs.control`).
Either stops the loop after the current step with a checkpoint; the ``stopped_by`` of the run says
which (the signal's name, :data:`CONTROL_STOP` or :data:`CONTROL_PAUSE`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tutorial_utils.io import atomic_write_json, read_small
from tutorial_utils.train.rundir import CONTROL_FILE

#: What ``control.json`` may ask of a running loop.
CONTROL_COMMANDS = ("stop", "pause")
#: ``stopped_by`` of a run stopped through ``control.json``.
CONTROL_STOP, CONTROL_PAUSE = "control:stop", "control:pause"
#: ``control.json`` commands as numbers, so ranks can share them in one tensor.
CONTROL_CODES = {None: 0, "stop": 1, "pause": 2}
#: the ``stopped_by`` of each command
STOPPED_BY = {"stop": CONTROL_STOP, "pause": CONTROL_PAUSE}


#: The signals that stop the loop after the current step with a checkpoint (SIGUSR1: a cluster's
#: pre-emption notice, e.g. Slurm's ``--signal=USR1@120``).
STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)) if s is not None)


class StopSignals:
    """SIGINT/SIGTERM/SIGUSR1 set a flag the loop reads after each step (a second Ctrl-C stops at once)."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for s in STOP_SIGNALS:
            self._old[s] = signal.getsignal(s)
            signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader workers ignore the stop signals: a Ctrl-C to the terminal's process group or a
    scheduler's signal to the whole group would otherwise kill them and break the main
    process's iterator mid-step; the main process decides when to stop (and its workers exit
    with it: the DataLoader watches its parent)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


#: the control file is a few hundred bytes; anything far bigger is not a command
CONTROL_MAX_BYTES = 64 << 10
CONTROL_SCHEMA = {"command": str, "time": (int, float), "id": str, "acknowledged": (dict, type(None))}
CONTROL_FIX = (
    'write {"command": "stop"} or {"command": "pause"} as a regular JSON file (runs.stop / runs.pause do it for you)'
)


class ControlFile:
    """``<output_dir>/control.json``, polled by the main process once per step: a ``stat`` (one
    system call) and a read only when the file changed. ``{"command": "stop"}`` or ``"pause"``
    ends the run after the current step with a checkpoint; the loop acknowledges it in the file
    (``acknowledged``: step, time, pid). A file that is not such JSON is ignored with a warning.
    A command already in the file when training starts is acted on only if it was written after
    this process started (``time``), so an old ``pause`` never stops the resumed run."""

    def __init__(self, out: Path, main: bool, started: float, warn: Callable[[str], None]):
        self.path, self.main, self.warn = Path(out) / CONTROL_FILE, main, warn
        self.seen = self._stamp() if main else None
        if self.seen is not None:
            data = self._read(quiet=True)
            fresh = isinstance(data, dict) and not data.get("acknowledged")
            if fresh and isinstance(data.get("time"), (int, float)) and data["time"] >= started:
                self.seen = None  # written while this process was starting: act on it
            elif fresh and data.get("command") in CONTROL_COMMANDS:
                warn(
                    f"warning: {self.path} asks to {data['command']!r} but was written before this training "
                    "process started; ignored (write it again to act on this run)."
                )

    def _stamp(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _read(self, quiet: bool = False) -> Any:
        try:  # bounded and typed: a FIFO, a huge or deeply nested file is "no command", never a hang or a crash
            return read_small(self.path, schema=CONTROL_SCHEMA, max_bytes=CONTROL_MAX_BYTES, fix=CONTROL_FIX)
        except (OSError, ValueError) as exc:
            if not quiet:
                self.warn(f"warning: {str(exc)[:300]}; ignored.")
            return None

    def poll(self) -> str | None:
        """The new command (``stop``, ``pause``) since the last poll, or None."""
        if not self.main:
            return None
        stamp = self._stamp()
        if stamp is None or stamp == self.seen:
            return None
        self.seen = stamp
        data = self._read()
        if data is None:
            return None
        cmd = data.get("command") if isinstance(data, dict) else None
        if isinstance(data, dict) and data.get("acknowledged"):
            return None
        if cmd not in CONTROL_COMMANDS:
            shown = repr(cmd) if len(repr(cmd)) <= 40 else f"{repr(cmd)[:40]}..."
            self.warn(f"warning: {self.path}: command {shown} is not one of {', '.join(CONTROL_COMMANDS)}; ignored.")
            return None
        return cmd

    def acknowledge(self, cmd: str, step: int) -> None:
        """Record in the file that ``cmd`` was acted on at ``step``."""
        if not self.main:
            return
        data = self._read(quiet=True)
        data = data if isinstance(data, dict) else {"command": cmd}
        data["acknowledged"] = {"command": cmd, "step": step, "time": time.time(), "pid": os.getpid()}
        with contextlib.suppress(OSError):
            atomic_write_json(self.path, data)
        self.seen = self._stamp()
