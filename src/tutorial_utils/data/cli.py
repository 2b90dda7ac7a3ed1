"""``python -m tutorial_utils dataset {info,validate,generate,stats,import-hdf5,import-url}``: the dataset
stage's CLI."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.errors import TutorialError, error_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils dataset", description="Inspect, validate and generate LeRobot v2.1 datasets."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="print a summary of a dataset (JSON)")
    p.add_argument("root")
    p = sub.add_parser("validate", help="check a dataset and its meta/modality.json; exit 1 on a problem")
    p.add_argument("root")
    p.add_argument("--deep", action="store_true", help="also read every parquet and decode every video")
    p = sub.add_parser("generate", help="write a synthetic dataset with the LIBERO schema")
    p.add_argument("root")
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--length", type=int, default=20, help="mean episode length (frames)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    p = sub.add_parser(
        "stats", help="compute (or load cached) stats_gr00t.json, the step index and dataset_statistics.json"
    )
    p.add_argument("root")
    p.add_argument("--run-dir", default=None, help="also write <run-dir>/dataset_statistics.json")
    p.add_argument(
        "--write-pkl",
        action="store_true",
        help="also write the upstream meta/steps_data_index.pkl (for DiT4DiT's loader)",
    )
    p = sub.add_parser("import-hdf5", help="convert LIBERO's original HDF5 demos (robomimic layout) to LeRobot v2.1")
    p.add_argument("sources", nargs="+", help="*_demo.hdf5 files or folders holding them")
    p.add_argument("--root", required=True, help="the dataset folder to write (an interrupted import resumes)")
    p.add_argument("--image-size", type=int, default=None, help="resize both cameras (default: the files' size)")
    p.add_argument("--drop-noops", action="store_true", help="drop no-op actions, as the no_noops datasets do")
    p.add_argument("--max-episodes", type=int, default=None)
    p = sub.add_parser("import-url", help="fetch a .tar/.tgz/.zip of a v2.1 dataset from a URL, then validate it")
    p.add_argument("url")
    p.add_argument("root", help="where the dataset goes (must not exist)")
    p.add_argument("--sha256", default=None, help="expected sha256 of the archive")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "info":
            print(json.dumps(LeRobotDataset(args.root, verify_videos=False).summary(), indent=2))
        elif args.cmd == "validate":
            t0 = time.perf_counter()
            ds = LeRobotDataset(args.root, verify_videos=True)
            report = ds.validate(deep=args.deep)
            if (ds.root / "meta" / "modality.json").is_file():
                from tutorial_utils.data.modality import validate_modality

                validate_modality(ds.root)
                report["modality"] = "ok"
            report["seconds"] = round(time.perf_counter() - t0, 2)
            print(json.dumps(report))
        elif args.cmd == "generate":
            from tutorial_utils.data.synth import generate_dataset

            root = generate_dataset(
                args.root,
                n_episodes=args.episodes,
                mean_length=args.length,
                image_size=args.image_size,
                n_tasks=args.tasks,
                seed=args.seed,
                overwrite=args.overwrite,
            )
            print(json.dumps(LeRobotDataset(root).summary()))
        elif args.cmd == "import-hdf5":
            from tutorial_utils.data.hdf5 import import_hdf5

            summary = import_hdf5(
                args.sources,
                args.root,
                image_size=args.image_size,
                drop_noops=args.drop_noops,
                max_episodes=args.max_episodes,
                progress=True,
            )
            LeRobotDataset(args.root, verify_videos=True).validate()
            print(json.dumps(summary))
        elif args.cmd == "import-url":
            from tutorial_utils.hub.archive import fetch_archive

            summary = fetch_archive(args.url, args.root, sha256=args.sha256)
            summary["validate"] = LeRobotDataset(args.root, verify_videos=True).validate()
            print(json.dumps(summary, default=str))
        elif args.cmd == "stats":
            from tutorial_utils.data.stats import compute_all

            res = compute_all(args.root, run_dir=args.run_dir, write_pkl=args.write_pkl)
            print(
                json.dumps(
                    {
                        k: (str(v) if isinstance(v, Path) else v)
                        for k, v in res.items()
                        if k in ("cached", "seconds", "num_trajectories", "num_transitions", "files")
                    }
                )
            )
    except TutorialError as exc:  # DatasetError, ModalityError...: the message names the file and the fix
        print(error_text(exc), file=sys.stderr)
        return 1
    return 0
