"""The download job (``notebooks/jobs/download.md``): plan, download, verify one Hub asset and
record the manifest as the run's success sign.

``endpoint``: ``""`` is the real Hub (or ``HF_ENDPOINT``), a URL another server, and ``"local"``
the project's stand-in (:mod:`tutorial_utils.hub.local_server`) serving ``local_source``, a
folder the caller made (the ``ci`` profile serves a dataset the project generates): the book
cannot reach huggingface.co, and says so where it shows the result.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils.errors import ConfigError
from tutorial_utils.hub.assets import ASSETS, get_asset
from tutorial_utils.io import atomic_write_json
from tutorial_utils.params import param


@dataclass
class DownloadConfig:
    asset: str = param("dataset:libero_spatial", f"what to download: {', '.join(ASSETS)}", "download")
    dest: str | None = param(
        "run",
        "target folder; None: data/models/<repo> or data/datasets/<repo>; 'run': <run_dir>/<repo>",
        "download",
        cpu=None,
    )
    endpoint: str | None = param(
        "local", "None: the real Hub (or HF_ENDPOINT); a URL; or 'local' (a local stand-in)", "download", cpu=None
    )
    dry_run: bool = param(False, "plan only: files, bytes and the disk check, nothing downloaded", "download")
    timeout_s: float = param(30.0, "HF_HUB_DOWNLOAD_TIMEOUT for the download, seconds", "download")


def resolve_dest(dest: str | None, run_dir: str | os.PathLike, asset: str) -> Path:
    """Where the asset goes: ``dest``, or the default folder for its kind (see :class:`DownloadConfig`)."""
    from tutorial_utils import paths

    a = get_asset(asset)
    name = a.repo_id.split("/")[-1]
    if dest == "run":
        return Path(run_dir) / name
    if dest:
        return Path(dest)
    return paths.DATA / ("datasets" if a.repo_type == "dataset" else "models") / name


def run_job(run_dir: str | os.PathLike, local_source: str | os.PathLike | None = None, **overrides: Any) -> dict:
    """Plan (always), then download and verify unless ``dry_run``; writes ``plan.json`` and
    ``download_summary.json`` in the run directory and the success signs in ``status.json``
    (``manifest``: the verified ``manifest.json``)."""
    from tutorial_utils import jobs, params
    from tutorial_utils.hub import download as hub
    from tutorial_utils.hub.local_server import serve_repos

    cfg = params.from_mapping(DownloadConfig, overrides, "the download job's parameters")
    a = get_asset(cfg.asset)
    dest = resolve_dest(cfg.dest, run_dir, cfg.asset)
    with contextlib.ExitStack() as stack:
        endpoint = cfg.endpoint or None
        if cfg.endpoint == "local":
            if local_source is None or not Path(local_source).is_dir():
                raise ConfigError(
                    f"endpoint='local' serves a folder as {a.name}, but local_source is {local_source!r}. Fix: "
                    "pass the folder to serve (the ci profile generates a dataset), or set endpoint to None for the Hub"
                )
            endpoint = stack.enter_context(serve_repos({a.name: local_source}, gated=False))
            print(f"serving {local_source} as {a.repo_id} on a local stand-in for the Hub: {endpoint}")
        p = hub.plan(a, endpoint=endpoint, dest=dest)
        atomic_write_json(Path(run_dir) / "plan.json", p)
        print(hub.disk_plan_text(p) + (" -> fits" if p["fits"] else " -> DOES NOT FIT"))
        for f in p["files"][:20]:
            print(f"  {f['size']:>14,}  {f['path']}")
        if p["n_files"] > 20:
            print(f"  ... and {p['n_files'] - 20} more")
        signs: dict[str, Any] = {"planned_files": p["n_files"], "planned_bytes": p["total_bytes"], "fits": p["fits"]}
        result: dict[str, Any] = {"asset": a.name, "dest": str(dest), "dry_run": cfg.dry_run, "plan": "plan.json"}
        if not cfg.dry_run:
            out = hub.download(a, dest, endpoint=endpoint, timeout_s=cfg.timeout_s)
            v = out["verify"]
            result.update(seconds=out["seconds"], verify=v)
            signs.update(
                manifest=v["manifest"],
                verified_files=v["n_files"],
                checksums_checked=v["checksums_checked"],
                stale_incomplete_removed=len(v["stale_incomplete"]),
            )
    atomic_write_json(Path(run_dir) / "download_summary.json", result)
    jobs.update_status(run_dir, success_signs=signs)
    return result
