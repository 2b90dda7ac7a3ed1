"""The one base class of the package's teaching errors, and the dataset error every stage shares.

Every error the package raises on purpose derives from :class:`TutorialError` (and from the
builtin it behaves like: ``ValueError`` for bad input, ``RuntimeError`` for a failed step), so a
CLI or a notebook can catch them all at once and print the message: it already names the file,
the key and the fix.
"""

from __future__ import annotations

import os


class TutorialError(Exception):
    """Base class of the package's errors; the message names what is wrong and how to fix it."""


class DatasetError(TutorialError, ValueError):
    """A dataset problem, phrased as: which file, which key, what was found, how to fix it."""

    def __init__(
        self, file: str | os.PathLike, key: str | None = None, problem: str | None = None, fix: str | None = None
    ):
        if problem is None and fix is None and key is None:
            # re-raised from a message alone: torch's DataLoader rebuilds a worker's exception as
            # ``type(msg)`` with the worker's whole traceback in ``msg``; keep the teaching line
            super().__init__(_from_worker(str(file)))
            self.file, self.key, self.problem, self.fix = "", None, str(self), ""
            return
        self.file, self.key, self.problem, self.fix = str(file), key, problem, fix
        where = f"{file}" + (f" [{key}]" if key else "")
        super().__init__(f"{where}: {problem}. Fix: {fix}")


def _from_worker(message: str) -> str:
    """The error's own line out of a DataLoader worker's re-raised traceback (or the message)."""
    if "Traceback (most recent call last)" not in message:
        return message
    worker = (
        message.split("\n", 1)[0].removeprefix("Caught ").rstrip(".")
    )  # "DatasetError in DataLoader worker process 0"
    last = next((ln for ln in reversed(message.strip().splitlines()) if ln.strip()), message)
    own = last.split(": ", 1)[1] if last.split(":", 1)[0].endswith("Error") else last
    return f"{own} (raised in {worker.split(' in ', 1)[-1]})"


class ConfigError(TutorialError, ValueError):
    """A bad job parameter (unknown name, wrong type, out of range)."""


class DiskFull(TutorialError, OSError):
    """A write failed because the disk (or quota) is full; nothing half-written is left behind."""

    def __init__(self, path: str | os.PathLike, detail: str = ""):
        import shutil

        where = os.fspath(path)
        try:
            free = shutil.disk_usage(os.path.dirname(where) or ".").free
            left = f"{free / 1e6:.1f} MB free there"
        except OSError:
            left = "free space unknown"
        super().__init__(
            f"{where}: the disk is full ({left}){': ' + detail if detail else ''}. Nothing was half-written: "
            "the previous version of the file, if any, is intact. Free space (old runs: "
            "`python -m tutorial_utils job list`, then delete finished runs you do not need; `df -h`), "
            "or point TUTORIAL_RUNS_DIR / TUTORIAL_DATA_DIR at a bigger disk, then rerun."
        )
        self.path = where


def is_disk_full(exc: BaseException, where: str | os.PathLike | None = None) -> bool:
    """True for an OSError with ENOSPC/EDQUOT, a library error that carries one in its text
    (safetensors: ``No space left on device (os error 28)``), or a failed write (torch.save's
    ``file write failed``) while the disk at ``where`` has less than 1 MiB left."""
    import errno
    import shutil

    if isinstance(exc, DiskFull) or not isinstance(exc, Exception):
        return False
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True
    if where is not None and isinstance(exc, (OSError, RuntimeError)):
        try:
            return shutil.disk_usage(os.fspath(where)).free < (1 << 20)
        except OSError:
            return False
    return False


def error_text(exc: BaseException, limit: int = 4000) -> str:
    """What a command prints for an error it refuses with: ``error: <message>``, secrets masked
    (:func:`tutorial_utils.secrets.redact`: a parameter value may be a token) and at most
    ``limit`` characters (a message quoting a huge value stays short)."""
    from tutorial_utils.secrets import redact

    text = redact(str(exc)[: limit * 2])
    return "error: " + (text if len(text) <= limit else text[:limit] + "...")
