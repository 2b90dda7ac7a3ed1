"""``python -m tutorial_utils hub {plan,download,verify} ASSET --dest DIR [--endpoint URL]``.

The token comes only from the environment (``HF_TOKEN``) or ``hf auth login``; there is no
``--token`` flag, so it never lands in shell history or a process list.
"""

from __future__ import annotations

import argparse
import sys

from tutorial_utils.errors import TutorialError
from tutorial_utils.hub.assets import ASSETS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tutorial_utils hub", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("plan", "download", "verify", "list"))
    ap.add_argument("asset", nargs="?", help=f"one of: {', '.join(ASSETS)}")
    ap.add_argument("--dest", help="local folder (download target)")
    ap.add_argument("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or huggingface.co)")
    ap.add_argument("--timeout", type=float, default=None, help="HF_HUB_DOWNLOAD_TIMEOUT for the download, seconds")
    ns = ap.parse_args(argv)
    if ns.action == "list":
        for name, a in ASSETS.items():
            print(f"{name:24} {a.repo_type:8} {a.repo_id}@{a.revision}{'  (gated)' if a.gated else ''}")
        return 0
    if not ns.asset:
        ap.error("ASSET is required")
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
                print(f"free at {ns.dest}: {human_bytes(p['free_bytes'])} -> {verdict}")
        elif ns.action == "download":
            out = hub.download(ns.asset, ns.dest, endpoint=ns.endpoint, timeout_s=ns.timeout)
            v = out["verify"]
            print(f"downloaded {v['n_files']} files ({v['total']}) in {out['seconds']} s; verified: {v['manifest']}")
        else:
            v = hub.verify(ns.asset, ns.dest, endpoint=ns.endpoint)
            print(f"verified {v['n_files']} files ({v['total']}, sha256 of {v['sha256_checked']}): {v['manifest']}")
            if v["stale_incomplete"]:
                print(f"removed {len(v['stale_incomplete'])} stale .incomplete file(s)")
    except TutorialError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
