"""Process helpers of the jobs and the chains: a free port, stopping a child, whether a pid lives."""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["free_port", "stop_process", "pid_alive"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the policy servers, the lab, the upstream server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_process(proc, timeout: float = 10.0) -> int | None:
    """Stop a child process the way Ctrl-C would (SIGINT), then kill it after ``timeout`` seconds;
    returns its exit code (servers and clients of the chains shut down cleanly on SIGINT)."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not; another user's process does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: gone all the same
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
