"""Atomic file writes: a temp file in the same folder, fsync, then rename. A reader never
sees half a file and a crash never leaves one behind. The one way the package writes files.

And bounded, typed reads of small JSON/YAML files (:func:`read_small`, :func:`read_json_or_empty`):
regular files only, a size and a depth cap, a type check, an error naming the file and the key.
The one way the package reads a control file, a status, a manifest or a config."""

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

from tutorial_utils.errors import DiskFull, TutorialError, is_disk_full


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


# --- bounded, typed reads of small files ------------------------------------------------------------

#: the largest small file (a control command, a status, a manifest, a config) read whole
SMALL_FILE_MAX_BYTES = 4 << 20
#: the deepest nesting of lists and dicts a small file may hold
SMALL_FILE_MAX_DEPTH = 32


class SmallFileError(TutorialError, ValueError):
    """A small JSON/YAML file that is not what the package expects: not a regular file, too
    big, too deep, not JSON/YAML, or a key of the wrong type. The message names the file, the
    key and the fix."""

    def __init__(self, path: str | os.PathLike, problem: str, fix: str, key: str | None = None):
        self.path, self.key, self.problem, self.fix = os.fspath(path), key, problem, fix
        where = f"{self.path} [{key}]:" if key else self.path
        super().__init__(f"{where} {problem}. Fix: {fix}")


def _read_bounded(path: Path, max_bytes: int, fix: str) -> bytes:
    """At most ``max_bytes`` of a regular file, opened without blocking (a FIFO, a device or a
    socket is refused, a symlink to one too: the check is on the opened file)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SmallFileError(path, f"cannot be opened ({exc.strerror or type(exc).__name__})", fix) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a folder"
                if stat.S_ISDIR(st.st_mode)
                else "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a device or socket"
            )
            raise SmallFileError(path, f"is {kind}, not a regular file", fix)
        if st.st_size > max_bytes:
            raise SmallFileError(path, f"is {human_bytes(st.st_size)}, over the {human_bytes(max_bytes)} limit", fix)
        chunks, left = [], max_bytes + 1
        while left > 0:
            block = os.read(fd, min(left, 1 << 20))
            if not block:
                break
            chunks.append(block)
            left -= len(block)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # grew while read (procfs, a writer appending)
            raise SmallFileError(path, f"is over the {human_bytes(max_bytes)} limit", fix)
        return data
    finally:
        os.close(fd)


def read_bounded_bytes(
    path: str | os.PathLike, max_bytes: int = SMALL_FILE_MAX_BYTES, fix: str = "rewrite the file"
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (see :func:`read_small`; a FIFO,
    a device, a symlink to either or a bigger file is a :class:`SmallFileError`)."""
    return _read_bounded(Path(path), max_bytes, fix)


def _depth_ok(obj: Any, max_depth: int) -> bool:
    """Whether ``obj`` nests lists/dicts at most ``max_depth`` deep (iterative; shared YAML
    aliases are visited once)."""
    stack, seen = [(obj, 1)], set()
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list, tuple)) or id(node) in seen:
            continue
        if depth > max_depth:
            return False
        seen.add(id(node))
        children = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children)
    return True


def _type_names(types: type | tuple) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def check_types(
    data: dict, schema: dict[str, type | tuple], path: str | os.PathLike, fix: str, required: tuple[str, ...] = ()
) -> dict:
    """Check the keys of ``data`` named in ``schema`` (``{key: type or tuple of types}``; a
    missing key is fine unless ``required``); a :class:`SmallFileError` names the key. A bool
    is not accepted where a number is asked for. Returns ``data``."""
    for key in required:
        if key not in data:
            raise SmallFileError(path, f"has no {key!r}", fix, key=key)
    for key, types in schema.items():
        if key not in data:
            continue
        v = data[key]
        want = types if isinstance(types, tuple) else (types,)
        ok = isinstance(v, want) and not (isinstance(v, bool) and bool not in want)
        if not ok:
            raise SmallFileError(
                path, f"{key!r} is {type(v).__name__} {_short(v)}, expected {_type_names(types)}", fix, key=key
            )
    return data


def _short(v: Any, n: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} chars)"


def read_small(
    path: str | os.PathLike,
    *,
    schema: dict[str, type | tuple] | None = None,
    required: tuple[str, ...] = (),
    expect: type | tuple = dict,
    fmt: str | None = None,
    max_bytes: int = SMALL_FILE_MAX_BYTES,
    max_depth: int = SMALL_FILE_MAX_DEPTH,
    fix: str = "rewrite the file (or delete it to go back to the default)",
) -> Any:
    """Read a small JSON or YAML file (``fmt``: ``json``/``yaml``, else from the suffix) the
    one safe way: a regular file only (a FIFO, a device, a symlink to either is refused
    without blocking), at most ``max_bytes``, nested at most ``max_depth`` deep, of type
    ``expect`` (a dict by default) whose keys match ``schema`` (see :func:`check_types`).
    Anything else is a :class:`SmallFileError` naming the file, the key and ``fix``; a missing
    file is ``FileNotFoundError``."""
    path = Path(path)
    raw = _read_bounded(path, max_bytes, fix)
    fmt = fmt or ("yaml" if path.suffix.lower() in (".yaml", ".yml") else "json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SmallFileError(path, f"is not UTF-8 text (byte {exc.start})", fix) from None
    try:
        if fmt == "yaml":
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except RecursionError:
        raise SmallFileError(path, f"nests deeper than {max_depth} levels", fix) from None
    except ValueError as exc:  # json.JSONDecodeError
        raise SmallFileError(path, f"is not JSON ({str(exc)[:120]})", fix) from None
    except Exception as exc:  # yaml.YAMLError
        raise SmallFileError(path, f"is not {fmt.upper()} ({str(exc).splitlines()[0][:120]})", fix) from None
    if not _depth_ok(data, max_depth):
        raise SmallFileError(path, f"nests deeper than {max_depth} levels", fix)
    if expect is not None and not isinstance(data, expect):
        raise SmallFileError(path, f"holds {type(data).__name__} {_short(data)}, expected {_type_names(expect)}", fix)
    if schema or required:
        check_types(data, schema or {}, path, fix, required)
    return data


def read_json_or_empty(path: str | os.PathLike, **kw: Any) -> dict:
    """:func:`read_small` for a JSON object that may be absent or bad (a run's status, summary,
    configuration while it is written, listed or half-deleted): ``{}`` instead of an error."""
    try:
        return read_small(path, **kw)
    except (OSError, SmallFileError):
        return {}
