"""Promotion: a finished run's small, real outputs copied out of ``runs/`` for the book.

One function per kind of run, each atomic and each writing portable paths
(:func:`tutorial_utils.paths.for_book`): :func:`recording_episode` and :func:`dataset_card`
(a recorded dataset), :func:`training` (a training run's logs, metrics and summary) and
:func:`evaluation` (an evaluation run's logs, results and one rollout video).

Where they go (:func:`destinations`): by default this build's copy, ``_build/promoted/logs`` and
``_build/promoted/assets`` (git-ignored; a reader's ``make book`` leaves the checkout clean and the
pages prefer these files, :mod:`tutorial_utils.report.provenance`). The reference shipped with the
book, ``logs/`` and ``assets/``, changes only by the maintainer command
``python -m tutorial_utils promote --reference`` (:func:`to_reference`), which copies this build's
promoted files there.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from tutorial_utils import logs as L
from tutorial_utils import paths
from tutorial_utils.data.schema import read_info
from tutorial_utils.errors import TutorialError, error_text
from tutorial_utils.evaluate.loop import RESULTS_FILE, SERVER_LOG, eval_log_name
from tutorial_utils.io import atomic_write_bytes, atomic_write_json, promote_text
from tutorial_utils.secrets import redact_data
from tutorial_utils.sim.record import RecordError, read_manifest


def destinations(reference: bool = False) -> tuple[Path, Path]:
    """(logs folder, assets folder) promotion writes to: this build's copy, or with
    ``reference=True`` the shipped reference (``logs/``, ``assets/``)."""
    if reference:
        return paths.LOGS, paths.ASSETS
    return paths.PROMOTED / "logs", paths.PROMOTED / "assets"


def to_reference() -> list[Path]:
    """Copy this build's promoted files (``_build/promoted/{logs,assets}``) over the shipped
    reference in ``logs/`` and ``assets/``, stamps merged: the one maintainer command that
    changes the reference (``python -m tutorial_utils promote --reference``)."""
    import shutil

    from tutorial_utils.io import atomic_path
    from tutorial_utils.report import provenance

    build_logs, build_assets = destinations()
    files = [p for base in (build_logs, build_assets) if base.is_dir() for p in sorted(base.rglob("*")) if p.is_file()]
    if not files:
        raise FileNotFoundError(
            f"{paths.for_book(str(paths.PROMOTED))} holds no promoted files: run the main job "
            "(`python -m tutorial_utils pipeline` in the cpu profile) first"
        )
    done = []
    for src in files:
        if src.name == provenance.STAMPS and src.parent == build_logs:
            provenance.write_stamps(provenance.stamps(build=True), reference=True)
            done.append(paths.LOGS / provenance.STAMPS)
            continue
        dest = provenance.reference_path(src.relative_to(paths.PROMOTED).as_posix())
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(dest) as tmp:
            shutil.copyfile(src, tmp)
        dest.chmod(0o644)
        done.append(dest)
    return done


def recording_episode(
    dataset_root: str | os.PathLike,
    episode_index: int = 0,
    assets_dir: str | os.PathLike | None = None,
    prefix: str = "record_episode",
    max_kb: int = 600,
) -> dict:
    """Copy one recorded episode's primary and wrist mp4 into ``assets/`` (small, h264) plus a JSON card."""
    import shutil

    from tutorial_utils.io import atomic_path

    root = Path(dataset_root)
    assets = Path(assets_dir) if assets_dir else destinations()[1]
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


def _resolved_config(config: dict | None, per_task: dict[str, dict]) -> dict | None:
    """The recording's config with ``task_ids`` as the list of tasks it recorded: a manifest
    written before the recorder resolved them holds what was asked (``"all"``, ``"0-4"``), and
    ``len("all")`` is not a number of tasks. Without LIBERO here, the tasks the manifest saw."""
    import dataclasses

    from tutorial_utils.errors import TutorialError
    from tutorial_utils.sim.record import RecordConfig

    if not config or isinstance(config.get("task_ids"), list):
        return config
    known = {f.name for f in dataclasses.fields(RecordConfig)}
    try:
        ids = list(RecordConfig(**{k: v for k, v in config.items() if k in known}).task_list)
    except (ImportError, OSError, TutorialError, ValueError):
        ids = sorted(int(t) for t in per_task)
    return {**config, "task_ids": ids}


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
        "config": _resolved_config(man.get("config"), per_task),
        "summary": man.get("summary"),
        "per_task": per_task,
        # the (task, init state) each episode started from: which evaluated starts were demonstrated
        "starts": sorted([int(e["task_id"]), int(e["init_state"])] for e in man.get("episodes", [])),
        "schema": schema_report(root),
    }
    if wall_s is not None:
        card["job_wall_s"] = round(float(wall_s), 1)
    from tutorial_utils.io import atomic_write_json

    card = paths.for_book(card)  # the dataset's location relative to the repository, not this machine's path
    atomic_write_json(Path(out) if out else destinations()[0] / "record_dataset.json", card)
    return card


def training(run_dir: str | os.PathLike, prefix: str = "train_", logs_dir: Path | None = None) -> dict[str, Path]:
    """Copy a finished training run's small real files into ``logs/``: ``train.log``,
    ``metrics.jsonl``, ``summary.json``, ``dataset_statistics.json`` and ``train_config.json``
    (atomically, with this machine's paths made portable)."""
    run_dir = Path(run_dir)
    logs_dir = logs_dir or destinations()[0]
    out: dict[str, Path] = {}
    for name in ("train.log", "metrics.jsonl", "summary.json", "dataset_statistics.json", "train_config.json"):
        src = run_dir / name
        if not src.is_file():
            if name in ("train.log", "summary.json"):
                raise FileNotFoundError(f"{src} is missing: is {run_dir} a finished training run?")
            continue
        out[name] = promote_text(src, logs_dir / f"{prefix}{name}")
    return out


def rollouts(run_dir: str | os.PathLike, results: dict | None = None) -> list[dict]:
    """The episodes of an evaluation run whose video is on disk, successes first (in episode order),
    then failures; each episode dict gains ``video_path`` and its ``task_id``. :func:`first_by_outcome` picks from
    it the videos every page shows (``promote eval`` and ``zoo promote`` alike)."""
    run = Path(run_dir)
    if results is None:
        results = json.loads((run / RESULTS_FILE).read_text())
    out_root = Path(results.get("config", {}).get("output_dir") or run)
    episodes = [
        {**ep, "task_id": t.get("task_id")}
        for t in results.get("tasks", [])
        for ep in t.get("episodes", [])
        if ep.get("video")
    ]
    out = []
    for ep in [e for e in episodes if e.get("success")] + [e for e in episodes if not e.get("success")]:
        src = out_root / ep["video"] if (out_root / ep["video"]).is_file() else run / ep["video"]
        if src.is_file():
            out.append({**ep, "video_path": src})
    return out


def first_by_outcome(run_dir: str | os.PathLike, results: dict | None = None) -> dict[str, dict]:
    """``{"success": ep, "failure": ep}``: the first of each outcome among :func:`rollouts`, for the outcomes
    the run had (the pair a page shows side by side)."""
    out: dict[str, dict] = {}
    for ep in rollouts(run_dir, results):
        out.setdefault("success" if ep.get("success") else "failure", ep)
    return out


def _video_bytes(src: Path, max_video_bytes: int) -> bytes:
    if src.stat().st_size > max_video_bytes:
        raise ValueError(
            f"{src} is {src.stat().st_size / 1e6:.1f} MB: too large to promote (limit {max_video_bytes / 1e6:.1f} MB)"
        )
    return src.read_bytes()


def rollout_pair(run_dir: str | os.PathLike, dest_stem: str | os.PathLike, max_video_bytes: int = 2_000_000) -> dict:
    """Copy an evaluation run's first success and first failure (where there is one) to
    ``<dest_stem>_success.mp4`` and ``<dest_stem>_failure.mp4``. Returns ``{"success": {"video":
    path, "episode": i, "task_id": t}, "failure": ...}`` for the outcomes the run had."""
    out: dict = {}
    for kind, ep in first_by_outcome(run_dir).items():
        dest = Path(f"{os.fspath(dest_stem)}_{kind}.mp4")
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(dest, _video_bytes(ep["video_path"], max_video_bytes)).chmod(0o644)
        out[kind] = {"video": dest, "episode": ep.get("episode"), "task_id": ep.get("task_id")}
    return out


def evaluation(
    run_dir: str | os.PathLike,
    logs_dir: Path | None = None,
    assets_dir: Path | None = None,
    prefix: str = "eval_",
    max_video_bytes: int = 2_000_000,
    extra: dict | None = None,
) -> dict[str, Path]:
    """Copy a finished evaluation run's real artifacts for the book (atomically):

    ``server.log`` -> ``logs/<prefix>server.log``, ``eval_<suite>.log`` -> ``logs/<prefix><suite>.log``,
    ``results.json`` -> ``logs/<prefix>results.json``, the first successful episode's video
    (else the first failure's) -> ``assets/<prefix>rollout.mp4`` and, when that one is a success
    and the run also failed, the first failure's -> ``assets/<prefix>failed_rollout.mp4`` (videos
    larger than ``max_video_bytes`` are refused; the choice is :func:`first_by_outcome`'s). Only a
    run whose logs pass :func:`tutorial_utils.logs.diagnose` is promoted; a low success rate is
    still a valid run. ``extra`` is merged into the promoted results (the main job adds
    ``demonstrations``: how many evaluated starts were demonstrated).
    """
    run = Path(run_dir)
    logs_dir = Path(logs_dir or destinations()[0])
    assets_dir = Path(assets_dir or destinations()[1])
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
    promoted = {**results, **(extra or {})}
    done["results"] = atomic_write_json(logs_dir / f"{prefix}results.json", redact_data(paths.for_book(promoted)))
    pick = first_by_outcome(run, results)
    shown = pick.get("success") or pick.get("failure")
    if shown:
        done["video"] = atomic_write_bytes(
            assets_dir / f"{prefix}rollout.mp4", _video_bytes(shown["video_path"], max_video_bytes)
        )
    if "success" in pick and "failure" in pick:  # a success is shown: show a failure beside it
        done["failed_video"] = atomic_write_bytes(
            assets_dir / f"{prefix}failed_rollout.mp4", _video_bytes(pick["failure"]["video_path"], max_video_bytes)
        )
    for path in done.values():
        path.chmod(0o644)  # readable by the book build and web servers (temp files are created 0600)
    return done


def main(argv: list[str]) -> int:
    """``python -m tutorial_utils promote {eval,train} RUN_DIR [--reference]``: promote a finished
    run by hand (into this build's copy, or with ``--reference`` into ``logs/`` and ``assets/``);
    ``python -m tutorial_utils promote --reference``: make this build's promoted files the
    shipped reference (the maintainer command)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils promote",
        description="Copy a finished run's logs, results and videos (an evaluation's first success, and its first "
        "failure beside it) into _build/promoted/ (this build), "
        "or, with --reference, into logs/ and assets/ (the reference shipped with the book). "
        "Without a run: --reference copies this build's promoted files over the shipped reference.",
    )
    ap.add_argument("kind", nargs="?", choices=("eval", "train"))
    ap.add_argument("run_dir", nargs="?")
    ap.add_argument("--prefix", default=None, help="file name prefix (default: eval_ or train_)")
    ap.add_argument(
        "--reference", action="store_true", help="write the shipped reference in logs/ and assets/ (maintainers)"
    )
    args = ap.parse_args(argv)
    if args.kind and not args.run_dir:
        ap.error(f"promote {args.kind} needs a RUN_DIR")
    if not args.kind and not args.reference:
        ap.error("name a run (promote eval|train RUN_DIR) or pass --reference to update the shipped reference")
    logs_dir, assets_dir = destinations(args.reference)
    try:
        if args.kind is None:
            done = {p.name: p for p in to_reference()}
        elif args.kind == "eval":
            done = evaluation(args.run_dir, logs_dir=logs_dir, assets_dir=assets_dir, prefix=args.prefix or "eval_")
        else:
            done = training(args.run_dir, logs_dir=logs_dir, prefix=args.prefix or "train_")
    except (FileNotFoundError, ValueError) as exc:
        print(error_text(exc), file=sys.stderr)
        return 1
    if args.kind is not None:  # each promoted file carries its run's provenance, as the pipeline's and the zoo's do
        from tutorial_utils.report import provenance

        st = provenance_of(args.run_dir, args.kind)
        provenance.write_stamps(
            {f"{'logs' if p.parent == logs_dir else 'assets'}/{p.name}": st for p in done.values()},
            reference=args.reference,
        )
    for key, path in done.items():
        print(f"{key}: {path}")
    return 0


def provenance_of(run_dir: str | os.PathLike, kind: str) -> dict:
    """The provenance stamp of a promoted train or evaluate run: the run, and the dataset it learned
    from (a training's own ``dataset``; an evaluation's, from its checkpoint's ``config.json``)."""
    from tutorial_utils.policies.checkpoint import read_checkpoint_config
    from tutorial_utils.report import provenance

    run = Path(run_dir)
    dataset = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, TutorialError):
        if kind == "train":
            dataset = json.loads((run / "train_config.json").read_text())["train"]["dataset"]
        else:
            ckpt = paths.from_book(json.loads((run / RESULTS_FILE).read_text())["config"]["checkpoint"])
            name = read_checkpoint_config(ckpt)["dataset"]["name"]
            dataset = paths.DATA / name if (paths.DATA / name).is_dir() else None
    return provenance.stamp(run, dataset, stage="evaluate" if kind == "eval" else kind)
