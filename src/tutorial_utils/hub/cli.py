"""``python -m tutorial_utils hub {plan,download,verify} ASSET --dest DIR [--endpoint URL]``.

The token comes only from the environment (``HF_TOKEN``) or ``hf auth login``; there is no
``--token`` flag, so it never lands in shell history or a process list.
"""

from __future__ import annotations

import argparse
import signal
import sys

from tutorial_utils.errors import TutorialError, error_text
from tutorial_utils.hub.assets import ASSETS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils hub",
        description=__doc__.split("\n")[0],
        epilog="Stopping a download (Ctrl-C, kill) stops its download process too; rerun the same command to go "
        f"on: {_resume_note()}.",
    )
    ap.add_argument("action", choices=("plan", "download", "verify", "list", "serve"))
    ap.add_argument("asset", nargs="?", help=f"one of: {', '.join(ASSETS)}")
    ap.add_argument("--dest", help="local folder (download target)")
    ap.add_argument("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or huggingface.co)")
    ap.add_argument("--timeout", type=float, default=None, help="HF_HUB_DOWNLOAD_TIMEOUT for the download, seconds")
    ap.add_argument("--source", help="serve: the folder to serve as ASSET on a local stand-in for the Hub")
    ap.add_argument("--port", type=int, default=0, help="serve: the port on 127.0.0.1 (default: a free one)")
    ns = ap.parse_args(argv)
    if ns.action == "list":
        for name, a in ASSETS.items():
            print(f"{name:24} {a.repo_type:8} {a.repo_id}@{a.revision}{'  (gated)' if a.gated else ''}")
        return 0
    if not ns.asset:
        ap.error("ASSET is required")
    if ns.action == "serve":
        return _serve(ns.asset, ns.source, ns.port)
    if ns.action in ("download", "verify") and not ns.dest:
        ap.error("--dest is required")
    from tutorial_utils.hub import download as hub
    from tutorial_utils.io import human_bytes

    try:
        if ns.action == "plan":
            p = hub.plan(ns.asset, endpoint=ns.endpoint, dest=ns.dest)
            print(f"{p['repo_id']} ({p['repo_type']}) revision {p['revision']} commit {p['commit']}")
            for f in p["files"]:
                print(f"  {f['size']:>14,}  {f['path']}")
            print(f"{p['n_files']} files, {p['total_bytes']:,} bytes ({human_bytes(p['total_bytes'])})")
            if "free_bytes" in p:
                verdict = "fits" if p["fits"] else "DOES NOT FIT: free space first"
                print(f"{hub.disk_plan_text(p)} -> {verdict}")
        elif ns.action == "download":
            out = hub.download(ns.asset, ns.dest, endpoint=ns.endpoint, timeout_s=ns.timeout)
            v = out["verify"]
            print(f"downloaded {v['n_files']} files ({v['total']}) in {out['seconds']} s; verified: {v['manifest']}")
        else:
            v = hub.verify(ns.asset, ns.dest, endpoint=ns.endpoint)
            print(
                f"verified {v['n_files']} files ({v['total']}, {v['checksums_checked']} checksums by "
                f"{v['checksum_method']}): {v['manifest']}"
            )
        if ns.action in ("download", "verify") and v["stale_incomplete"]:
            print(f"removed {len(v['stale_incomplete'])} stale .incomplete file(s): {', '.join(v['stale_incomplete'])}")
    except TutorialError as exc:
        print(error_text(exc), file=sys.stderr)
        return 1
    return 0


def _resume_note() -> str:
    try:
        from tutorial_utils.hub.download import resume_note

        return resume_note().replace("huggingface_hub", "the installed huggingface_hub", 1)
    except ImportError:
        return "a half-downloaded file resumes only where huggingface_hub supports it"


def _serve(asset: str, source: str | None, port: int) -> int:
    """Serve ``source`` as ``asset`` until interrupted (the book's stand-in for huggingface.co)."""
    import time

    from tutorial_utils.hub.assets import get_asset
    from tutorial_utils.hub.local_server import LocalHub, repo_from_spec

    if not source:
        print("error: serve needs --source DIR (the folder to serve)", file=sys.stderr)
        return 2
    try:
        get_asset(asset)
        hub = LocalHub(port=port)
        hub.add(repo_from_spec(asset, source, gated=False))
    except TutorialError as exc:
        print(error_text(exc), file=sys.stderr)
        return 1
    # Ctrl-C (SIGINT) and SIGTERM stop the server even when it was started from a context that
    # ignores SIGINT (a background job of a script, nohup): Python keeps an inherited SIG_IGN
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with hub:
        print(f"serving {source} as {asset} on a local stand-in for the Hub: {hub.url}", flush=True)
        print(f"use it with --endpoint {hub.url} (or HF_ENDPOINT={hub.url}); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
