"""Promotion: a finished run's small, real outputs copied into ``logs/`` and ``assets/`` for the book.

One function per kind of run, each atomic and each writing portable paths
(:func:`tutorial_utils.paths.for_book`): :func:`recording_episode` and :func:`dataset_card`
(a recorded dataset), :func:`training` (a training run's logs, metrics and summary) and
:func:`evaluation` (an evaluation run's logs, results and one rollout video).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tutorial_utils import logs as L
from tutorial_utils import paths
from tutorial_utils.data.format import read_info
from tutorial_utils.errors import error_text
from tutorial_utils.evaluate.loop import RESULTS_FILE, SERVER_LOG, eval_log_name
from tutorial_utils.io import atomic_write_bytes, atomic_write_json, promote_text
from tutorial_utils.secrets import redact_data
from tutorial_utils.sim.record import RecordError, read_manifest


def recording_episode(
    dataset_root: str | os.PathLike,
    episode_index: int = 0,
    assets_dir: str | os.PathLike | None = None,
    prefix: str = "record_episode",
    max_kb: int = 600,
) -> dict:
    """Copy one recorded episode's primary and wrist mp4 into ``assets/`` (small, h264) plus a JSON card."""
    import shutil

    from tutorial_utils import paths
    from tutorial_utils.io import atomic_path

    root = Path(dataset_root)
    assets = Path(assets_dir) if assets_dir else paths.ASSETS
    info = read_info(root)
    episodes = [json.loads(x) for x in (root / "meta" / "episodes.jsonl").read_text().splitlines() if x.strip()]
    if not 0 <= episode_index < len(episodes):
        raise RecordError(f"{root}: episode {episode_index} does not exist (it has {len(episodes)})")
    out = {
        "episode_index": episode_index,
        "task": episodes[episode_index]["tasks"][0],
        "length": episodes[episode_index]["length"],
        "fps": info["fps"],
    }
    chunk = episode_index // int(info.get("chunks_size", 1000))
    for key, name in (("observation.images.image", "primary"), ("observation.images.wrist_image", "wrist")):
        src = root / info["video_path"].format(episode_chunk=chunk, video_key=key, episode_index=episode_index)
        size_kb = src.stat().st_size / 1024
        if size_kb > max_kb:
            raise RecordError(f"{src} is {size_kb:.0f} KB (> {max_kb} KB): promote a shorter or smaller episode")
        dst = assets / f"{prefix}_{name}.mp4"
        with atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)
        out[name] = dst.name
        out[f"{name}_kb"] = round(size_kb, 1)
    man = read_manifest(root)
    if man:
        e = next((e for e in man["episodes"] if e["episode_index"] == episode_index), None)
        if e:
            out.update(task_id=e["task_id"], init_state=e["init_state"], noops_dropped=e.get("noops_dropped"))
        out["identity"] = man.get("identity")
    atomic_write_json(assets / f"{prefix}.json", out)
    return out


# --- the schema check and the dataset card the chapter reads -------------------------------------


def schema_report(dataset_root: str | os.PathLike, reference_size: int = 256) -> dict:
    """Compare a dataset's features with the IPEC LIBERO schema (names, dtypes, shapes).

    IPEC's images are ``reference_size`` square; a dataset recorded smaller differs only in
    the image resolution, which ``shapes_equal_except_resolution`` allows.
    """
    from tutorial_utils.data.libero_schema import libero_features

    info = read_info(dataset_root)
    ours = info["features"]
    ref = libero_features(reference_size)
    names_equal = set(ours) == set(ref)
    rows, dtypes_equal, shapes_equal, shapes_res = [], True, True, True
    for key in ref:
        o = ours.get(key, {})
        same_dtype = o.get("dtype") == ref[key]["dtype"]
        same_shape = list(o.get("shape", [])) == list(ref[key]["shape"])
        res_only = same_shape or (ref[key]["dtype"] == "video" and len(o.get("shape", [])) == 3 and o["shape"][2] == 3)
        dtypes_equal &= same_dtype
        shapes_equal &= same_shape
        shapes_res &= res_only
        rows.append(
            {
                "feature": key,
                "dtype": o.get("dtype"),
                "shape": o.get("shape"),
                "ipec_dtype": ref[key]["dtype"],
                "ipec_shape": ref[key]["shape"],
            }
        )
    return {
        "names_equal": names_equal,
        "dtypes_equal": dtypes_equal,
        "shapes_equal": shapes_equal,
        "shapes_equal_except_resolution": shapes_res,
        "missing": sorted(set(ref) - set(ours)),
        "extra": sorted(set(ours) - set(ref)),
        "rows": rows,
    }


def dataset_card(
    dataset_root: str | os.PathLike, out: str | os.PathLike | None = None, wall_s: float | None = None
) -> dict:
    """Write ``logs/record_dataset.json``: totals, the recording summary, per-task counts, schema check."""
    from tutorial_utils import paths

    root = Path(dataset_root)
    info = read_info(root)
    man = read_manifest(root) or {}
    per_task: dict[str, dict] = {}
    for e in man.get("episodes", []):
        row = per_task.setdefault(str(e["task_id"]), {"task": e["task"], "episodes": 0, "frames": 0, "failed": 0})
        row["episodes"] += 1
        row["frames"] += int(e.get("length", 0))
    for f in man.get("failed", []):
        per_task.setdefault(str(f["task_id"]), {"task": f.get("task", ""), "episodes": 0, "frames": 0, "failed": 0})[
            "failed"
        ] += 1
    card = {
        "dataset": root.name,
        "codebase_version": info.get("codebase_version"),
        "fps": info.get("fps"),
        "robot_type": info.get("robot_type"),
        "total_episodes": info.get("total_episodes"),
        "total_frames": info.get("total_frames"),
        "total_tasks": info.get("total_tasks"),
        "features": {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in info["features"].items()},
        "identity": man.get("identity"),
        "config": man.get("config"),
        "summary": man.get("summary"),
        "per_task": per_task,
        "schema": schema_report(root),
    }
    if wall_s is not None:
        card["job_wall_s"] = round(float(wall_s), 1)
    from tutorial_utils.io import atomic_write_json

    card = paths.for_book(card)  # the dataset's location relative to the repository, not this machine's path
    atomic_write_json(Path(out) if out else paths.LOGS / "record_dataset.json", card)
    return card


def training(run_dir: str | os.PathLike, prefix: str = "train_", logs_dir: Path | None = None) -> dict[str, Path]:
    """Copy a finished training run's small real files into ``logs/``: ``train.log``,
    ``metrics.jsonl``, ``summary.json``, ``dataset_statistics.json`` and ``train_config.json``
    (atomically, with this machine's paths made portable)."""
    run_dir = Path(run_dir)
    logs_dir = logs_dir or paths.LOGS
    out: dict[str, Path] = {}
    for name in ("train.log", "metrics.jsonl", "summary.json", "dataset_statistics.json", "train_config.json"):
        src = run_dir / name
        if not src.is_file():
            if name in ("train.log", "summary.json"):
                raise FileNotFoundError(f"{src} is missing: is {run_dir} a finished training run?")
            continue
        out[name] = promote_text(src, logs_dir / f"{prefix}{name}")
    return out


def evaluation(
    run_dir: str | os.PathLike,
    logs_dir: Path | None = None,
    assets_dir: Path | None = None,
    prefix: str = "eval_",
    max_video_bytes: int = 2_000_000,
) -> dict[str, Path]:
    """Copy a finished evaluation run's real artifacts for the book (atomically):

    ``server.log`` -> ``logs/<prefix>server.log``, ``eval_<suite>.log`` -> ``logs/<prefix><suite>.log``,
    ``results.json`` -> ``logs/<prefix>results.json``, and the first successful episode's video
    (else the first video) -> ``assets/<prefix>rollout.mp4`` (refused when larger than
    ``max_video_bytes``). Only a run whose logs pass :func:`tutorial_utils.logs.diagnose` is
    promoted; a low success rate is still a valid run.
    """
    from tutorial_utils import paths

    run = Path(run_dir)
    logs_dir = Path(logs_dir or paths.LOGS)
    assets_dir = Path(assets_dir or paths.ASSETS)
    results_path = run / RESULTS_FILE
    if not results_path.is_file():
        raise FileNotFoundError(f"{results_path} not found: promote a finished evaluation run (one with results.json)")
    results = json.loads(results_path.read_text())
    suite = results.get("suite", "")
    d = L.diagnose(run)
    if not d.ok:
        raise ValueError(
            f"run {run} did not pass its success checks (failed stage: {d.failed_stage}); not promoting it"
        )
    eval_log = run / eval_log_name(suite)
    done: dict[str, Path] = {}
    targets = {
        "server_log": (run / SERVER_LOG, logs_dir / f"{prefix}server.log"),
        "eval_log": (eval_log, logs_dir / f"{prefix}{suite}.log"),
    }
    for key, (src, dst) in targets.items():
        done[key] = promote_text(src, dst)
    # the book's copy names runs and checkpoints relative to the repository, not this machine's paths
    # ... and holds no secret (logs/ is tracked by git)
    done["results"] = atomic_write_json(logs_dir / f"{prefix}results.json", redact_data(paths.for_book(results)))
    out_root = Path(results.get("config", {}).get("output_dir") or run)
    episodes = [ep for t in results.get("tasks", []) for ep in t.get("episodes", []) if ep.get("video")]
    videos = [ep["video"] for ep in episodes if ep.get("success")] + [
        ep["video"] for ep in episodes if not ep.get("success")
    ]
    for rel in videos:
        src = out_root / rel if (out_root / rel).is_file() else run / rel
        if src.is_file():
            if src.stat().st_size > max_video_bytes:
                raise ValueError(
                    f"{src} is {src.stat().st_size / 1e6:.1f} MB: too large to promote (limit {max_video_bytes / 1e6:.1f} MB)"
                )
            done["video"] = atomic_write_bytes(assets_dir / f"{prefix}rollout.mp4", src.read_bytes())
            break
    for path in done.values():
        path.chmod(0o644)  # readable by the book build and web servers (temp files are created 0600)
    return done


def main(argv: list[str]) -> int:
    """``python -m tutorial_utils promote {eval,train} RUN_DIR``: promote a finished run by hand."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils promote",
        description="Copy a finished run's logs, results and one video into logs/ and assets/.",
    )
    ap.add_argument("kind", choices=("eval", "train"))
    ap.add_argument("run_dir")
    ap.add_argument("--prefix", default=None, help="file name prefix (default: eval_ or train_)")
    args = ap.parse_args(argv)
    try:
        if args.kind == "eval":
            done = evaluation(args.run_dir, prefix=args.prefix or "eval_")
        else:
            done = training(args.run_dir, prefix=args.prefix or "train_")
    except (FileNotFoundError, ValueError) as exc:
        print(error_text(exc), file=sys.stderr)
        return 1
    for key, path in done.items():
        print(f"{key}: {path}")
    return 0
