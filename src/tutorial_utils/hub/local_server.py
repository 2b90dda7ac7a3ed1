"""A local stand-in for the Hugging Face Hub: serves folders as model and dataset repos.

The book cannot reach huggingface.co, so the download chapter and the tests point
``huggingface_hub`` at this server instead (``HF_ENDPOINT`` or ``endpoint=``). It speaks just what
``repo_info``, ``list_repo_tree``, ``snapshot_download`` and ``verify_repo_checksums`` use
(FACTS section 11):

- ``GET /api/{models|datasets}/{repo}/revision/{rev}`` -> ``{"sha", "siblings"}``;
- ``GET /api/{models|datasets}/{repo}/tree/{rev}?recursive=true`` -> the file entries, with a git
  blob id (``oid``) and, for binary files, an ``lfs`` block holding the sha256;
- ``HEAD|GET /{repo}/resolve/{rev}/{path}`` (``/datasets/{repo}/...`` for datasets) with
  ``X-Repo-Commit``, ``ETag``, ``Content-Length`` and ``Range``;
- errors as the Hub sends them: the status plus ``X-Error-Code`` (``GatedRepo``,
  ``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``) and ``X-Error-Message``.

A gated repo answers 401 without a token or with an unknown one, and 403 to a known token whose
licence was not accepted, as the Hub does. Faults can be injected per file to show what a real
network does to a download: a response cut short, a stall in the middle of a file, a hook called
on every request. Threads, 127.0.0.1, a free port::

    with serve_repos({"dataset:libero_spatial": "data/my_dataset"}) as endpoint:
        plan("dataset:libero_spatial", endpoint=endpoint)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tutorial_utils.errors import ConfigError

_TEXT_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".md", ".txt", ".py")
_CHUNK = 64 * 1024


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class LocalRepo:
    """One repo: files (bytes, or read from a folder), the revisions that name its one commit,
    and whether it is gated. Binary files are listed as LFS files (with a sha256), as on the Hub."""

    def __init__(
        self,
        repo_id: str,
        files: Mapping[str, bytes] | str | os.PathLike,
        repo_type: str = "model",
        revisions: tuple[str, ...] = ("main",),
        gated: bool = False,
    ):
        if repo_type not in ("model", "dataset"):
            raise ConfigError(f"repo {repo_id!r}: repo_type must be 'model' or 'dataset', got {repo_type!r}")
        if repo_id.count("/") != 1:
            raise ConfigError(f"repo id {repo_id!r} must look like 'owner/name'")
        self.repo_id, self.repo_type, self.gated = repo_id, repo_type, gated
        if isinstance(files, Mapping):
            self._data = {str(k): bytes(v) for k, v in files.items()}
            self._paths: dict[str, Path] = {}
        else:
            root = Path(files)
            if not root.is_dir():
                raise ConfigError(f"repo {repo_id!r}: {root} is not a folder. Fix: pass an existing folder to serve")
            self._data = {}
            self._paths = {
                p.relative_to(root).as_posix(): p
                for p in sorted(root.rglob("*"))
                if p.is_file() and not p.relative_to(root).as_posix().startswith((".cache/", ".git/"))
            }
        self._entries = {path: self._entry(path) for path in self.paths}
        digest = hashlib.sha1(repo_id.encode())
        for path in self.paths:
            digest.update(path.encode() + self._entries[path]["oid"].encode())
        self.commit = digest.hexdigest()
        self.revisions = {r: self.commit for r in revisions} | {self.commit: self.commit}

    @property
    def paths(self) -> list[str]:
        return sorted({*self._data, *self._paths})

    def read(self, path: str) -> bytes:
        return self._data[path] if path in self._data else self._paths[path].read_bytes()

    def size(self, path: str) -> int:
        return self._entries[path]["size"]

    def _entry(self, path: str) -> dict:
        data = self.read(path)
        out = {"type": "file", "path": path, "size": len(data), "oid": _git_blob_id(data)}
        if not path.endswith(_TEXT_SUFFIXES):
            out["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out

    def entry(self, path: str) -> dict:
        return dict(self._entries[path])

    def etag(self, path: str) -> str:
        e = self._entries[path]
        return e["lfs"]["oid"] if "lfs" in e else e["oid"]


@dataclass
class Fault:
    """A fault on GET of files whose path ends with ``path``: ``truncate`` sends ``at`` bytes of
    the body then closes the connection; ``stall`` sends ``at`` bytes then waits ``seconds``
    (or until the server closes) before sending the rest. ``times`` requests are hit (-1: all)."""

    kind: str
    path: str
    at: int = 0
    seconds: float = 0.0
    times: int = 1
    hits: int = 0

    def applies(self, path: str) -> bool:
        return path.endswith(self.path) and (self.times < 0 or self.hits < self.times)


@dataclass
class LocalHub:
    """The server. ``tokens`` are the tokens it knows; ``licences`` those whose account accepted
    the licence of the gated repos. Use as a context manager, or call :meth:`start`/:meth:`close`."""

    tokens: tuple[str, ...] = ()
    licences: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    repos: dict[tuple[str, str], LocalRepo] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    hooks: list[Callable[[str, str], None]] = field(default_factory=list)
    log: list[tuple[str, str]] = field(default_factory=list)
    #: ``(method, path, Range header or "")`` of every request: shows whether a rerun resumed a file
    ranges: list[tuple[str, str, str]] = field(default_factory=list)
    url: str = ""

    def __post_init__(self):
        self.stalled = threading.Event()  # set when a stall begins (a test can kill the client then)
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- set-up ---------------------------------------------------------------------------------
    def add(self, repo: LocalRepo) -> LocalRepo:
        self.repos[(repo.repo_type, repo.repo_id)] = repo
        return repo

    def repo(self, repo_id: str, repo_type: str = "model") -> LocalRepo:
        return self.repos[(repo_type, repo_id)]

    def truncate(self, path: str, at: int, times: int = 1) -> Fault:
        """Cut the body of ``path`` after ``at`` bytes, ``times`` times (-1: always)."""
        return self._fault(Fault("truncate", path, at=at, times=times))

    def stall(self, path: str, at: int, seconds: float, times: int = 1) -> Fault:
        """Stop sending ``path`` after ``at`` bytes for ``seconds`` (until :meth:`close` at most)."""
        return self._fault(Fault("stall", path, at=at, seconds=seconds, times=times))

    def _fault(self, f: Fault) -> Fault:
        with self._lock:
            self.faults.append(f)
        return f

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{self.host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True).start()
        return self.url

    def close(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LocalHub:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- HTTP -------------------------------------------------------------------------------------
    @staticmethod
    def _send(h, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        h.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", len(body))
        for k, v in headers.items():
            h.send_header(k, str(v))
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def _error(self, h, status: int, code: str | None, message: str, head: bool):
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(h, status, json.dumps({"error": message}).encode(), headers, head)

    def _authorised(self, h, repo: LocalRepo, head: bool) -> bool:
        if not repo.gated:
            return True
        auth = h.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
        if token and token in self.tokens and token in self.licences:
            return True
        if token in self.tokens:
            kind = "model" if repo.repo_type == "model" else "dataset"
            self._error(
                h,
                403,
                "GatedRepo",
                f"Access to {kind} {repo.repo_id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{repo.repo_id} to ask for access.",
                head,
            )
        elif token:
            self._error(h, 401, None, "Invalid credentials in Authorization header", head)
        else:
            self._error(h, 401, "GatedRepo", "Access to this repo is restricted. You must be authenticated.", head)
        return False

    def _handle(self, h, head: bool) -> None:
        try:
            self._route(h, head)
        except (BrokenPipeError, ConnectionResetError):  # the client went away (killed, timed out)
            pass

    def _route(self, h, head: bool) -> None:
        split = urlsplit(h.path)
        with self._lock:
            self.log.append((h.command, h.path))
            self.ranges.append((h.command, split.path, h.headers.get("Range", "")))
        for hook in list(self.hooks):
            hook(h.command, split.path)
        parts = split.path.split("/")[1:]
        api = parts[:1] == ["api"]
        if api and len(parts) > 1 and parts[1] in ("models", "datasets"):
            repo_type, parts = parts[1][:-1], parts[2:]
        elif not api and parts[:1] == ["datasets"]:
            repo_type, parts = "dataset", parts[1:]
        else:
            repo_type = "model"
        repo_id, kind = "/".join(parts[:2]), parts[2] if len(parts) > 2 else ""
        rest = unquote("/".join(parts[3:]))
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:  # the Hub answers 401 for a repo it will not show to this caller
            return self._error(h, 401, "RepoNotFound", f"Repository not found: {repo_id}", head)
        if not self._authorised(h, repo, head):
            return None
        rev, path = self._split_revision(repo, rest)
        if rev is None:
            return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rest.split('/')[0]}", head)
        sha = repo.revisions[rev]
        if api and kind == "revision":
            body = {
                "id": repo.repo_id,
                "sha": sha,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "siblings": [{"rfilename": p} for p in repo.paths],
            }
            return self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        if api and kind == "tree":
            prefix = path.rstrip("/") + "/" if path else ""
            entries = [repo.entry(p) for p in repo.paths if p.startswith(prefix)]
            return self._send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
        if not api and kind == "resolve":
            if path not in repo.paths:
                return self._error(h, 404, "EntryNotFound", f"Entry not found: {path}", head)
            return self._file(h, repo, sha, path, head)
        return self._error(h, 404, None, f"not served by the local Hub: {h.path}", head)

    @staticmethod
    def _split_revision(repo: LocalRepo, rest: str) -> tuple[str | None, str]:
        """'<revision>/<path>' where the revision may hold slashes (``diffusers/base/post-trained``)."""
        for rev in sorted(repo.revisions, key=len, reverse=True):
            if rest == rev or rest.startswith(rev + "/"):
                return rev, rest[len(rev) + 1 :]
        return None, rest

    def _file(self, h, repo: LocalRepo, sha: str, path: str, head: bool) -> None:
        total = repo.size(path)
        headers = {"X-Repo-Commit": sha, "ETag": f'"{repo.etag(path)}"', "Accept-Ranges": "bytes"}
        start, end, status = 0, total - 1, 200
        rng = h.headers.get("Range", "")
        if rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a or 0), min(int(b) if b else total - 1, total - 1)
            if start >= total and total:
                return self._error(h, 416, None, f"range {rng} outside {total} bytes", head)
            headers["Content-Range"] = f"bytes {start}-{end}/{total}"
            status = 206
        headers["Content-Length"] = max(0, end - start + 1)
        if head:
            return self._send(h, status, b"", headers, head=True)
        body = repo.read(path)[start : end + 1]
        fault = None
        with self._lock:
            for f in self.faults:
                if f.applies(path):
                    f.hits += 1
                    fault = f
                    break
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, str(v))
        h.end_headers()
        if fault is None:
            return self._write(h, body)
        self._write(h, body[: fault.at])
        if fault.kind == "truncate":
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.wfile.flush()
                h.connection.shutdown(2)
            return None
        self.stalled.set()
        self._release.wait(fault.seconds)
        self._write(h, body[fault.at :])
        return None

    @staticmethod
    def _write(h, data: bytes) -> None:
        for i in range(0, len(data), _CHUNK):
            h.wfile.write(data[i : i + _CHUNK])
        h.wfile.flush()


def repo_from_spec(key: str, source, gated: bool | None) -> LocalRepo:
    """``key`` is an asset name (``dataset:libero_spatial``, ``checkpoint``, ``cosmos``) or
    ``model:owner/name`` / ``dataset:owner/name``; ``source`` a folder, a dict of bytes or a repo."""
    if isinstance(source, LocalRepo):
        return source
    from tutorial_utils.hub.assets import ASSETS, get_asset

    kind, _, name = key.partition(":")
    if key in ASSETS or (kind == "dataset" and "/" not in name and name):
        a = get_asset(key)
        return LocalRepo(a.repo_id, source, a.repo_type, (a.revision,), a.gated if gated is None else gated)
    if kind in ("model", "dataset") and "/" in name:
        return LocalRepo(name, source, kind, ("main",), bool(gated))
    raise ConfigError(
        f"serve_repos: cannot tell which repo {key!r} is. Fix: use an asset name ({', '.join(ASSETS)}) "
        "or 'model:owner/name' / 'dataset:owner/name'"
    )


@contextlib.contextmanager
def serve_repos(
    repos: Mapping[str, str | os.PathLike | Mapping[str, bytes] | LocalRepo],
    tokens: tuple[str, ...] = (),
    licences: tuple[str, ...] = (),
    gated: bool | None = None,
) -> Iterator[str]:
    """Serve ``repos`` (asset name or ``kind:owner/name`` -> folder) on 127.0.0.1; yields the
    endpoint URL to give ``huggingface_hub`` (``endpoint=`` or ``HF_ENDPOINT``)."""
    hub = LocalHub(tokens=tuple(tokens), licences=tuple(licences))
    for key, source in repos.items():
        hub.add(repo_from_spec(key, source, gated))
    with hub:
        yield hub.url
