"""``python -m tutorial_utils eval``: the LIBERO client process (and ``eval promote``)."""

from __future__ import annotations


import argparse
import sys


from tutorial_utils.evaluate.chain import parse_task_ids
from tutorial_utils.evaluate.loop import EvalConfig, run_evaluation



def main(argv: list[str]) -> int:
    from tutorial_utils.serve import protocol as serving

    if argv[:1] == ["promote"]:
        pp = argparse.ArgumentParser(prog="python -m tutorial_utils eval promote",
                                     description="Copy a finished evaluation run's logs, results and one video into logs/ and assets/.")
        pp.add_argument("run_dir")
        args = pp.parse_args(argv[1:])
        try:
            from tutorial_utils.report import promote

            done = promote.evaluation(args.run_dir)
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for key, path in done.items():
            print(f"{key}: {path}")
        return 0
    ap = argparse.ArgumentParser(prog="python -m tutorial_utils eval", description="Run the LIBERO evaluation client against a policy server.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=serving.DEFAULT_PORT)
    ap.add_argument("--suite", default="libero_spatial")
    ap.add_argument("--task-ids", default="", help="e.g. 0,1,2 or 0-9 (default: every task)")
    ap.add_argument("--trials-per-task", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--render-profile", default="fast", choices=("fast", "reference"))
    ap.add_argument("--env-image-size", type=int, default=128)
    ap.add_argument("--max-steps", type=int, default=0, help="override the suite's step limit")
    ap.add_argument("--replan-steps", type=int, default=0, help="override the server's replan_steps")
    ap.add_argument("--protocol", default="openpi", choices=("openpi", "dit4dit"))
    ap.add_argument("--output-dir", default=".")
    ap.add_argument("--no-videos", action="store_true")
    ap.add_argument("--connect-timeout", type=float, default=120.0)
    ap.add_argument("--recv-timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    cfg = EvalConfig(
        suite=a.suite, task_ids=parse_task_ids(a.task_ids), trials_per_task=a.trials_per_task, seed=a.seed,
        host=a.host, port=a.port, render_profile=a.render_profile, env_image_size=a.env_image_size,
        max_steps=a.max_steps or None, replan_steps=a.replan_steps or None, protocol=a.protocol,
        output_dir=a.output_dir, videos=not a.no_videos, connect_timeout=a.connect_timeout, recv_timeout=a.recv_timeout,
    )
    run_evaluation(cfg)
    return 0


