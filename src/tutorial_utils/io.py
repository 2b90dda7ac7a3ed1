"""Atomic file writes: a temp file in the same folder, fsync, then rename. A reader never
sees half a file and a crash never leaves one behind. The one way the package writes files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tutorial_utils.errors import DiskFull, is_disk_full


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix or ".tmp")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if is_disk_full(exc, path.parent):
            raise DiskFull(path, str(exc).splitlines()[0] if str(exc) else "") from None
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def promote_text(src: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Copy a text file (a log, JSON) into the book's ``logs/``, atomically, with this
    machine's paths made portable (:func:`tutorial_utils.paths.for_book`) and secrets masked
    (:func:`tutorial_utils.secrets.redact`: ``logs/`` is tracked by git)."""
    from tutorial_utils.paths import for_book
    from tutorial_utils.secrets import redact

    text = Path(src).read_text(encoding="utf-8", errors="surrogateescape")
    return atomic_write_bytes(dest, redact(for_book(text)).encode("utf-8", errors="surrogateescape"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    # numpy scalars/arrays and paths without importing numpy here
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it into place when done.

    If ``path`` exists it is replaced only after the new one is complete (the old one is
    moved aside first and removed afterwards), so a crash leaves either the old or the new.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        yield tmp
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc, path.parent):
            raise DiskFull(path, str(exc).splitlines()[0] if str(exc) else "") from None
        raise
    old = None
    if path.exists() or path.is_symlink():
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()


def read_jsonl(path: str | os.PathLike, tolerate_partial_last_line: bool = True) -> list[dict]:
    """Read a JSON-lines file; a half-written last line (a run still writing) is skipped."""
    rows: list[dict] = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if tolerate_partial_last_line and i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON: {line[:80]!r}") from None
    return rows


def tail_lines(path: str | os.PathLike, n: int = 20, max_bytes: int = 65536) -> list[str]:
    """The last ``n`` lines of a text file, read from its end in windows of ``max_bytes`` (doubled
    until ``n`` lines are in, up to 64 times that); [] if absent."""
    if n <= 0:
        return []
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            window = max_bytes
            while True:
                fh.seek(max(0, size - window))
                lines = fh.read().decode("utf-8", errors="replace").splitlines()
                if size > window and lines:
                    lines = lines[1:]  # the first one is cut
                if len(lines) >= n or window >= size or window >= 64 * max_bytes:
                    return lines[-n:]
                window *= 2
    except OSError:
        return []


def tail_text(path: str | os.PathLike, n: int = 15) -> str:
    """The last ``n`` lines of a log as one string for an error message: ``(<name> was not
    written)`` when the file is absent, ``(<name> is empty)`` when it holds nothing."""
    p = Path(path)
    if not p.is_file():
        return f"({p.name} was not written)"
    return "\n".join(tail_lines(p, n)) or f"({p.name} is empty)"


def dir_size(path: str | os.PathLike) -> int:
    """Bytes of the files under ``path`` (links not followed). Files that vanish while it counts
    (a running run renames and removes temporary checkpoint folders) are skipped."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, f))
                total += 0 if stat.S_ISLNK(st.st_mode) else st.st_size
    return total


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


# --- the loop -------------------------------------------------------------------------------------


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 hex digest of a file, read in 1 MiB blocks (checkpoints, bundles, downloads)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
