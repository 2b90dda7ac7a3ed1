"""Plan, download and verify one Hub asset; huggingface_hub's errors become teaching errors.

The download runs ``snapshot_download`` in a child process: ``HF_HUB_DISABLE_XET``,
``HF_HUB_DOWNLOAD_TIMEOUT`` and ``HF_ENDPOINT`` are read when huggingface_hub is imported, so
only a fresh interpreter honours them. The token travels only through the child's environment
(``HF_TOKEN``): it is never printed, put in argv or written to a file.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from tutorial_utils.errors import DiskFull, TutorialError, is_disk_full
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
    from tutorial_utils.secrets import redact

    a = asset
    message = " ".join(redact(message).split())  # at the source (a server's error text may echo the token), one line
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
            f"{where}: repository not found. Fix: check that {a.repo_id} exists as a {a.repo_type} repo on "
            f"{a.page} (`python -m tutorial_utils hub list` shows the repo and type each asset uses).{hint}"
        )
    if "RemoteProtocolError" in has or "peer closed connection" in message or "Consistency check failed" in message:
        return HubTimeoutError(
            f"{where}: a response was cut short: the connection closed before the whole file arrived "
            f"({message[:200]}), and huggingface_hub's retries met the same. Nothing short was kept as a "
            "finished file. Fix: rerun later (finished files are kept); behind a proxy, check that it does not "
            "cut long downloads, and keep HF_HUB_DISABLE_XET=1."
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
            _listed(asset, f)
            for f in api.list_repo_tree(
                asset.repo_id, recursive=True, revision=info.sha, repo_type=asset.repo_type, token=token
            )
            if isinstance(f, RepoFile) and isinstance(f.path, str) and _matches(f.path, asset.allow_patterns)
        ]
    except HubError:
        raise
    except Exception as exc:
        err = _translate(asset, exc)
        if err is None:  # a redirect loop, a malformed answer: one redacted line, never a traceback
            from tutorial_utils.secrets import redact

            first = (str(exc).strip().splitlines() or [""])[0]
            err = HubError(
                f"{asset.repo_id} ({asset.repo_type}, revision {asset.revision!r}): the Hub's answer could not be "
                f"used ({type(exc).__name__}: {redact(first)[:200]}). Fix: check HF_ENDPOINT / --endpoint and the "
                "network (`python -m tutorial_utils doctor`), then rerun."
            )
        raise err from None
    if not isinstance(info.sha, str) or not info.sha:
        raise HubError(f"{asset.repo_id}: the Hub's repo info has no commit sha ({type(info.sha).__name__}); rerun.")
    return info.sha, sorted(files, key=lambda f: f["path"])


def _listed(asset: Asset, f) -> dict:
    """One file of the Hub's listing, typed: a whole ``size`` >= 0, a ``sha256`` string or none.
    Anything else is a :class:`HubError` naming the file and the key."""
    size, lfs = f.size, f.lfs
    sha = getattr(lfs, "sha256", None) if lfs else None
    bad = (
        ("size", size)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0
        else ("lfs.sha256", sha)
        if sha is not None and not isinstance(sha, str)
        else None
    )
    if bad:
        shown = repr(bad[1])[:60]
        raise HubError(
            f"{asset.repo_id}: the Hub's file listing gives {f.path[:200]!r} a {bad[0]} of {shown} "
            f"({type(bad[1]).__name__}), not {'a whole number of bytes' if bad[0] == 'size' else 'a sha256 string'}. "
            "Fix: the endpoint is not a Hugging Face Hub (check HF_ENDPOINT / --endpoint), or retry later."
        )
    return {"path": f.path, "size": size, "sha256": sha}


def _free_probe(dest: Path) -> Path:
    probe = Path(dest)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def plan(asset: str | Asset, endpoint: str | None = None, token: str | None = None, dest=None) -> dict:
    """Files and total bytes the download will fetch (from the repo tree), and, given ``dest``,
    the bytes still missing there against the free space (``fits``)."""
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
        dest = Path(dest)
        here = sum(
            f["size"] for f in files if (dest / f["path"]).is_file() and (dest / f["path"]).stat().st_size == f["size"]
        )
        free = shutil.disk_usage(_free_probe(dest)).free
        out.update(
            dest=str(dest),
            present_bytes=here,
            needed_bytes=total - here,
            free_bytes=free,
            fits=free > total - here,
        )
    return out


def disk_plan_text(p: dict) -> str:
    """One line: what the download needs against what is free at its destination."""
    text = f"{p['repo_id']}@{p['revision']}: {p['n_files']} files, {human_bytes(p['total_bytes'])} in total"
    if "free_bytes" in p:
        text += (
            f"; {human_bytes(p['needed_bytes'])} still to download"
            f" ({human_bytes(p['present_bytes'])} already there), {human_bytes(p['free_bytes'])} free at {p['dest']}"
        )
    return text


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
        env["HF_HUB_DOWNLOAD_TIMEOUT"] = str(max(1, math.ceil(float(timeout_s))))  # 2.x reads it with int()
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if token:
        env["HF_TOKEN"] = token
    return env


def _die_with_parent() -> None:  # pragma: no cover  (runs in the child, between fork and exec)
    """Linux: the child gets SIGTERM when the process that started it dies, even by SIGKILL."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_child(argv: list[str], env: dict) -> tuple[int | None, str]:
    """Run the download child to its end and return ``(exit code, stdout)``; it never outlives this
    process. Ctrl-C (its process group gets it too), SIGTERM or SIGHUP sent to this process stop
    the child first (SIGINT, then SIGKILL after 10 s) and then end this process as the signal would;
    on Linux the child also gets SIGTERM if this process is killed outright (``PR_SET_PDEATHSIG``)."""
    import signal
    import threading

    from tutorial_utils.jobs import stop_process

    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    previous: dict[int, object] = {}

    def forward(signum, frame):
        raise SystemExit(128 + signum)  # unwinds to the `except` below, which stops the child

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, forward)
    try:
        out, _ = proc.communicate()
    except BaseException:
        stop_process(proc)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return proc.returncode, out or ""


def resumes_interrupted_files() -> bool | None:
    """Does the installed huggingface_hub continue a file an earlier, interrupted run left half
    done? 0.x appends to ``<etag>.incomplete`` from where it stopped (an HTTP Range request); the
    newer releases (2.4 measured) download into a file unique to each process, so a rerun fetches
    that file from byte 0 (finished files are always kept). None when it cannot be told."""
    import inspect

    try:
        from huggingface_hub import file_download

        source = inspect.getsource(file_download._download_to_tmp_and_move)
    except (ImportError, AttributeError, OSError, TypeError):
        return None
    if 'open("ab")' in source:
        return True
    if "uuid" in source and 'open("wb")' in source:
        return False
    return None


def resume_note() -> str:
    """One sentence for the CLI's help and the chapter: what a rerun does with a half-done file."""
    import huggingface_hub

    v = huggingface_hub.__version__
    return {
        True: f"huggingface_hub {v} resumes a half-downloaded file where it stopped",
        False: f"huggingface_hub {v} fetches a half-downloaded file again from byte 0 (finished files are kept)",
        None: f"huggingface_hub {v}: whether a half-downloaded file resumes is unknown (finished files are kept)",
    }[resumes_interrupted_files()]


def download(
    asset: str | Asset,
    dest: str | os.PathLike,
    endpoint: str | None = None,
    token: str | None = None,
    timeout_s: float | None = None,
    max_workers: int = 8,
    verify_after: bool = True,
    check_space: bool = True,
    progress: bool | None = None,
) -> dict:
    """``snapshot_download`` the asset into ``dest`` in a child process, then :func:`verify` it.

    With ``check_space`` the plan runs first and a download that cannot fit is refused before a
    byte is fetched (:class:`DiskFull`, with the disk plan); a disk that fills up during the
    download raises the same error. ``progress`` shows huggingface_hub's tqdm bars on stderr
    (default: when stderr is a terminal). Rerunning after an interruption fetches only what is
    missing (a half-done file resumes only where huggingface_hub does that:
    :func:`resumes_interrupted_files`); :func:`verify` then removes the stale ``.incomplete``
    files and reports them. Stopping this process stops the download child (:func:`run_child`).
    """
    a = get_asset(asset)
    dest = Path(dest)
    p = None
    if check_space:
        p = plan(a, endpoint=endpoint, token=token, dest=dest)
        if not p["fits"]:
            raise DiskFull(dest, f"the download does not fit, nothing was fetched. Disk plan: {disk_plan_text(p)}")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / MANIFEST).unlink(missing_ok=True)  # the success sign is rewritten only by verify
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(dest, "cannot even create the destination") from None
        raise
    args = {
        "repo_id": a.repo_id,
        "repo_type": a.repo_type,
        "revision": a.revision,
        "allow_patterns": list(a.allow_patterns) if a.allow_patterns else None,
        "dest": str(dest),
        "endpoint": endpoint,
        "max_workers": max_workers,
    }
    env = child_env(endpoint, token, timeout_s)
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    started = time.monotonic()
    returncode, stdout = run_child([sys.executable, "-c", _CHILD, json.dumps(args)], env)
    result = None
    for line in stdout.splitlines():
        if line.startswith(_RESULT):
            result = json.loads(line[len(_RESULT) :])
    if result is None or not result.get("ok"):
        from tutorial_utils.secrets import redact

        chain = (result or {}).get("chain") or [
            {"names": [], "status": None, "message": f"the download process exited with {returncode}"}
        ]
        if any("No space left" in c["message"] or "Errno 28" in c["message"] for c in chain):
            try:  # the plan against what is on the disk now
                now = f" Disk plan: {disk_plan_text(plan(a, endpoint=endpoint, token=token, dest=dest))}"
            except TutorialError:
                now = ""
            raise DiskFull(
                dest, f"no space left during the download (finished files are kept; rerun after freeing space).{now}"
            )
        # the most specific link: one with an HTTP status, else a known class, else the first
        known = {"RevisionNotFoundError", "RepositoryNotFoundError", "TimeoutException", "ConnectError"}
        pick = next((c for c in chain if c["status"] is not None), None) or next(
            (c for c in chain if known & set(c["names"])), chain[0]
        )
        raise teach(a, pick["names"], pick["status"], redact(pick["message"]))
    out = {"asset": a.name, "dest": str(dest), "seconds": round(time.monotonic() - started, 2)}
    if p is not None:
        out["plan"] = {k: v for k, v in p.items() if k != "files"}
    if verify_after:
        out["verify"] = verify(a, dest, endpoint=endpoint, token=token)
    return out


# --- verify ---------------------------------------------------------------------------------------


def stale_incomplete(dest: str | os.PathLike) -> list[str]:
    """``.incomplete`` files huggingface_hub left under ``dest/.cache/huggingface``."""
    cache = Path(dest) / ".cache" / "huggingface"
    return sorted(str(p.relative_to(dest)) for p in cache.rglob("*.incomplete")) if cache.is_dir() else []


def _checksum_problems(
    a: Asset, dest: Path, commit: str, wanted: set[str], endpoint, token
) -> tuple[list[str] | None, int, str]:
    """(problems, files checked, method): ``HfApi.verify_repo_checksums`` where the installed
    huggingface_hub has it (>= 1.x: sha256 of LFS files, git blob ids of the others), else the
    sha256 the tree gives for LFS files."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint)
    if hasattr(api, "verify_repo_checksums"):
        try:
            res = api.verify_repo_checksums(
                a.repo_id, repo_type=a.repo_type, revision=commit, local_dir=dest, token=token
            )
        except Exception as exc:
            err = _translate(a, exc)
            if err is None:
                raise
            raise err from None
        what = {"sha256": "sha256", "git-sha1": "git blob id"}
        problems = [
            f"{m['path']}: {what.get(m['algorithm'], m['algorithm'])} differs from the Hub's (corrupted file)"
            for m in res.mismatches
            if m["path"] in wanted
        ]
        checked = len([p for p in wanted if p not in res.missing_paths])
        return problems, checked, "HfApi.verify_repo_checksums"
    return None, 0, "sha256 from the repo tree"


def verify(
    asset: str | Asset,
    dest: str | os.PathLike,
    endpoint: str | None = None,
    token: str | None = None,
    remove_stale: bool = True,
) -> dict:
    """Check ``dest`` against the repo tree: every wanted file present with its size, its
    checksum right (:func:`_checksum_problems`), the key files present. On success write
    ``dest/manifest.json`` atomically (the success sign) and remove the stale ``.incomplete``
    files an interrupted download left (reported in the result); else raise
    :class:`HubVerifyError` naming the files."""
    a = get_asset(asset)
    dest = Path(dest)
    if not dest.is_dir():
        raise HubVerifyError(
            f"{dest}: no such folder. Fix: run the download first (hub download {a.name} --dest {dest})"
        )
    (dest / MANIFEST).unlink(missing_ok=True)
    commit, files = _tree(a, endpoint, token)
    problems, sized = [], set()
    for f in files:
        p = dest / f["path"]
        if not p.is_file():
            problems.append(f"{f['path']}: missing")
            continue
        size = p.stat().st_size
        if size != f["size"]:
            problems.append(f"{f['path']}: {size} bytes, the Hub has {f['size']} (cut short or changed)")
            continue
        sized.add(f["path"])
    checked, method = 0, "sizes only"
    if sized:
        found, checked, method = _checksum_problems(a, dest, commit, sized, endpoint, token)
        if found is None:  # older huggingface_hub: sha256 of the LFS files from the tree
            found = []
            for f in files:
                if f["path"] in sized and f["sha256"]:
                    checked += 1
                    if sha256_file(dest / f["path"]) != f["sha256"]:
                        found.append(f"{f['path']}: sha256 differs from the Hub's (corrupted file)")
        problems += found
    for key in a.key_files:
        if not (dest / key).is_file() and not any(pr.startswith(key + ":") for pr in problems):
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
        "checksums_checked": checked,
        "checksum_method": method,
        "stale_incomplete_removed": removed,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(dest / MANIFEST, manifest)
    return {
        "ok": True,
        "n_files": len(files),
        "total_bytes": manifest["total_bytes"],
        "total": human_bytes(manifest["total_bytes"]),
        "checksums_checked": checked,
        "checksum_method": method,
        "stale_incomplete": stale,
        "manifest": str(dest / MANIFEST),
    }
