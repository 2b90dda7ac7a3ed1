"""Plan, download and verify one Hub asset; huggingface_hub's errors become teaching errors.

The download runs ``snapshot_download`` in a child process: ``HF_HUB_DISABLE_XET``,
``HF_HUB_DOWNLOAD_TIMEOUT`` and ``HF_ENDPOINT`` are read when huggingface_hub is imported, so
only a fresh interpreter honours them. The token travels only through the child's environment
(``HF_TOKEN``): it is never printed, put in argv or written to a file.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tutorial_utils.errors import DiskFull, TutorialError
from tutorial_utils.hub.assets import Asset, get_asset
from tutorial_utils.io import atomic_write_json, human_bytes, sha256_file

MANIFEST = "manifest.json"
_RESULT = "TUTORIAL_HUB_RESULT "


# --- teaching errors -----------------------------------------------------------------------------
class HubError(TutorialError, RuntimeError):
    """A Hub download problem; the message says what happened and how to fix it."""


class HubAuthError(HubError):
    """401: no token, or a wrong one."""


class HubGatedError(HubError):
    """403 on a gated repo: the token is fine, the licence is not accepted yet."""


class HubNotFoundError(HubError):
    """The repo or the revision does not exist (or is private and hidden from this token)."""


class HubTimeoutError(HubError, TimeoutError):
    """The server did not answer in time, or could not be reached."""


class HubVerifyError(HubError):
    """A downloaded file is missing, has the wrong size or the wrong sha256."""


def teach(asset: Asset, names: list[str], status: int | None, message: str = "") -> HubError | DiskFull:
    """The teaching error for a huggingface_hub exception, given its class names (MRO) and status."""
    a = asset
    where = f"{a.repo_id} ({a.repo_type}, revision {a.revision!r})"
    has = set(names)
    login = "set HF_TOKEN (export HF_TOKEN=hf_...) or run `hf auth login`, then rerun"
    if "GatedRepoError" in has and status == 401 or (status == 401 and "RepositoryNotFoundError" not in has):
        gated = f" It is gated: also accept the licence on {a.page} with the same account." if a.gated else ""
        if "Invalid credentials" in message:
            return HubAuthError(f"{where}: 401, the token was refused (wrong or revoked). Fix: {login}.{gated}")
        return HubAuthError(f"{where}: 401, no valid token was sent. Fix: {login}.{gated}")
    if "GatedRepoError" in has or status == 403:
        return HubGatedError(
            f"{where}: 403, the repo is gated and this account has not accepted its licence. "
            f"Fix: open {a.page}, log in, accept the licence (approval can take a while), then rerun."
        )
    if "RevisionNotFoundError" in has:
        return HubNotFoundError(
            f"{where}: revision {a.revision!r} not found. Fix: check the revision (a branch such as "
            "'main' or 'diffusers/base/post-trained', a tag or a commit sha) on the repo page."
        )
    if "RepositoryNotFoundError" in has or status == 404:
        hint = f" A private or gated repo also looks missing without a token: {login}." if status == 401 else ""
        return HubNotFoundError(
            f"{where}: repository not found. Fix: check the repo id and --repo-type "
            f"({'dataset' if a.repo_type == 'dataset' else 'model'}).{hint}"
        )
    if has & {"TimeoutException", "ReadTimeout", "ConnectTimeout", "TimeoutError", "ReadError", "RemoteProtocolError"}:
        return HubTimeoutError(
            f"{where}: the download timed out or stalled ({message[:200]}). Fix: rerun (finished files are "
            "kept); raise HF_HUB_DOWNLOAD_TIMEOUT (seconds, default 10); keep HF_HUB_DISABLE_XET=1 if the "
            "Xet transfer hangs behind a proxy."
        )
    if has & {"ConnectError", "OfflineModeIsEnabled", "ConnectionError"}:
        return HubTimeoutError(
            f"{where}: the Hub cannot be reached ({message[:200]}). Fix: check the network and proxy "
            "(`python -m tutorial_utils doctor`), HF_ENDPOINT, and that HF_HUB_OFFLINE is not set."
        )
    if "No space left" in message or "Errno 28" in message:
        return DiskFull(a.repo_id, "while downloading")
    return HubError(f"{where}: {message[:500]} ({', '.join(names[:1])}, status {status})")


def _translate(asset: Asset, exc: BaseException) -> HubError | DiskFull | None:
    """Map an exception raised in this process (or its cause chain) to a teaching error."""
    seen = exc
    while seen is not None:
        names = [c.__name__ for c in type(seen).__mro__]
        response = getattr(seen, "response", None)
        status = getattr(response, "status_code", None)
        if status is not None or any(
            n in names for n in ("RevisionNotFoundError", "RepositoryNotFoundError", "TimeoutException", "ConnectError")
        ):
            return teach(asset, names, status, str(seen))
        seen = seen.__cause__ or seen.__context__
    return None


def _api(endpoint: str | None):
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint)


def _matches(path: str, patterns) -> bool:
    return patterns is None or any(fnmatch.fnmatch(path, p) for p in patterns)


def _tree(asset: Asset, endpoint: str | None, token: str | None) -> tuple[str, list[dict]]:
    """(commit sha, [{path, size, sha256}]) of the asset's files, filtered by allow_patterns."""
    from huggingface_hub.hf_api import RepoFile

    api = _api(endpoint)
    try:
        info = api.repo_info(asset.repo_id, repo_type=asset.repo_type, revision=asset.revision, token=token)
        files = [
            {"path": f.path, "size": int(f.size), "sha256": f.lfs.sha256 if f.lfs else None}
            for f in api.list_repo_tree(
                asset.repo_id, recursive=True, revision=info.sha, repo_type=asset.repo_type, token=token
            )
            if isinstance(f, RepoFile) and _matches(f.path, asset.allow_patterns)
        ]
    except Exception as exc:
        err = _translate(asset, exc)
        if err is None:
            raise
        raise err from None
    return info.sha, sorted(files, key=lambda f: f["path"])


def plan(asset: str | Asset, endpoint: str | None = None, token: str | None = None, dest=None) -> dict:
    """Files and total bytes the download will fetch (from the repo tree), and the disk it needs."""
    import shutil

    a = get_asset(asset)
    commit, files = _tree(a, endpoint, token)
    total = sum(f["size"] for f in files)
    out = {
        "asset": a.name,
        "repo_id": a.repo_id,
        "repo_type": a.repo_type,
        "revision": a.revision,
        "commit": commit,
        "files": files,
        "n_files": len(files),
        "total_bytes": total,
    }
    if dest is not None:
        probe = Path(dest)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        out.update(free_bytes=free, fits=free > total)
    return out


# --- download in a child process -----------------------------------------------------------------
_CHILD = r"""
import json, sys
args = json.loads(sys.argv[1])
def report(obj):
    print("TUTORIAL_HUB_RESULT " + json.dumps(obj), flush=True)
try:
    from huggingface_hub import HfApi, snapshot_download
    HfApi(endpoint=args["endpoint"]).repo_info(args["repo_id"], repo_type=args["repo_type"], revision=args["revision"])
    path = snapshot_download(
        args["repo_id"], repo_type=args["repo_type"], revision=args["revision"],
        allow_patterns=args["allow_patterns"], local_dir=args["dest"], endpoint=args["endpoint"],
        max_workers=args["max_workers"],
    )
    report({"ok": True, "path": str(path)})
except BaseException as exc:
    seen, chain = exc, []
    while seen is not None and len(chain) < 8:
        resp = getattr(seen, "response", None)
        chain.append({"names": [c.__name__ for c in type(seen).__mro__], "status": getattr(resp, "status_code", None),
                      "message": str(seen)[:2000]})
        seen = seen.__cause__ or seen.__context__
    report({"ok": False, "chain": chain})
    sys.exit(1)
"""


def child_env(endpoint: str | None = None, token: str | None = None, timeout_s: float | None = None) -> dict:
    """The child's environment: Xet off (unless set), the timeout, the endpoint, the token."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_DISABLE_XET", "1")
    if timeout_s is not None:
        env["HF_HUB_DOWNLOAD_TIMEOUT"] = str(timeout_s)
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if token:
        env["HF_TOKEN"] = token
    return env


def download(
    asset: str | Asset,
    dest: str | os.PathLike,
    endpoint: str | None = None,
    token: str | None = None,
    timeout_s: float | None = None,
    max_workers: int = 8,
    verify_after: bool = True,
) -> dict:
    """``snapshot_download`` the asset into ``dest`` in a child process, then :func:`verify` it.

    Progress bars go to stderr. Rerunning after an interruption fetches only what is missing.
    """
    a = get_asset(asset)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST).unlink(missing_ok=True)  # the success sign is rewritten only by verify
    args = {
        "repo_id": a.repo_id,
        "repo_type": a.repo_type,
        "revision": a.revision,
        "allow_patterns": list(a.allow_patterns) if a.allow_patterns else None,
        "dest": str(dest),
        "endpoint": endpoint,
        "max_workers": max_workers,
    }
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)],
        env=child_env(endpoint, token, timeout_s),
        stdout=subprocess.PIPE,
        text=True,
    )
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT):
            result = json.loads(line[len(_RESULT) :])
    if result is None or not result.get("ok"):
        chain = (result or {}).get("chain") or [{"names": [], "status": None, "message": proc.stdout[-500:]}]
        # the most specific link: one with an HTTP status, else a known class, else the first
        known = {"RevisionNotFoundError", "RepositoryNotFoundError", "TimeoutException", "ConnectError"}
        pick = next((c for c in chain if c["status"] is not None), None) or next(
            (c for c in chain if known & set(c["names"])), chain[0]
        )
        from tutorial_utils.secrets import redact

        raise teach(a, pick["names"], pick["status"], redact(pick["message"]))
    out = {"asset": a.name, "dest": str(dest), "seconds": round(time.monotonic() - started, 2)}
    if verify_after:
        out["verify"] = verify(a, dest, endpoint=endpoint, token=token)
    return out


# --- verify ---------------------------------------------------------------------------------------


def stale_incomplete(dest: str | os.PathLike) -> list[str]:
    """``.incomplete`` files huggingface_hub left under ``dest/.cache/huggingface``."""
    cache = Path(dest) / ".cache" / "huggingface"
    return sorted(str(p.relative_to(dest)) for p in cache.rglob("*.incomplete")) if cache.is_dir() else []


def verify(
    asset: str | Asset,
    dest: str | os.PathLike,
    endpoint: str | None = None,
    token: str | None = None,
    remove_stale: bool = True,
) -> dict:
    """Check ``dest`` against the repo tree: every file present with its size (and sha256 where
    the tree gives one), the key files present. On success write ``dest/manifest.json``
    atomically (the success sign) and remove stale ``.incomplete`` files; else raise
    :class:`HubVerifyError` naming the files."""
    a = get_asset(asset)
    dest = Path(dest)
    (dest / MANIFEST).unlink(missing_ok=True)
    commit, files = _tree(a, endpoint, token)
    problems, checked_sha = [], 0
    for f in files:
        p = dest / f["path"]
        if not p.is_file():
            problems.append(f"{f['path']}: missing")
            continue
        size = p.stat().st_size
        if size != f["size"]:
            problems.append(f"{f['path']}: {size} bytes, the Hub has {f['size']}")
            continue
        if f["sha256"]:
            checked_sha += 1
            if sha256_file(p) != f["sha256"]:
                problems.append(f"{f['path']}: sha256 differs from the Hub's (corrupted file)")
    for key in a.key_files:
        if not (dest / key).is_file() and not any(key in pr for pr in problems):
            problems.append(f"{key}: key file missing (the repo tree does not list it)")
    stale = stale_incomplete(dest)
    if problems:
        raise HubVerifyError(
            f"{dest}: {len(problems)} problem(s) against {a.repo_id}@{a.revision}: "
            + "; ".join(problems[:10])
            + ". Fix: delete the named files and rerun the download (it fetches only what is missing)."
            + (f" Stale partial downloads: {len(stale)}." if stale else "")
        )
    removed = []
    if remove_stale:
        for s in stale:
            (dest / s).unlink(missing_ok=True)
            removed.append(s)
    manifest = {
        "asset": a.name,
        "repo_id": a.repo_id,
        "repo_type": a.repo_type,
        "revision": a.revision,
        "commit": commit,
        "files": {f["path"]: f["size"] for f in files},
        "total_bytes": sum(f["size"] for f in files),
        "sha256_checked": checked_sha,
        "stale_incomplete_removed": removed,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(dest / MANIFEST, manifest)
    return {
        "ok": True,
        "n_files": len(files),
        "total_bytes": manifest["total_bytes"],
        "total": human_bytes(manifest["total_bytes"]),
        "sha256_checked": checked_sha,
        "stale_incomplete": stale,
        "manifest": str(dest / MANIFEST),
    }
