"""``python -m tutorial_utils eval``: the LIBERO client process."""

from __future__ import annotations

import argparse
import sys

from tutorial_utils.evaluate.loop import EvalConfig, run_evaluation


def main(argv: list[str]) -> int:
    from tutorial_utils import params
    from tutorial_utils.errors import TutorialError

    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils eval",
        description="Run the LIBERO evaluation client against a running policy server "
        "(the evaluation job starts both; see notebooks/jobs/evaluate.md).",
    )
    ap.add_argument(
        "--config",
        default=None,
        help="a JSON file of EvalConfig parameters (what the job writes); options given beside it override it",
    )
    ap.add_argument("--list-params", action="store_true", help="print every parameter, default and meaning")
    params.add_arguments(ap, EvalConfig)
    a = ap.parse_args(argv)
    if a.list_params:
        print(params.markdown_table(EvalConfig))
        return 0
    try:
        base = params.read_json(EvalConfig, a.config) if a.config else None
        given = {k: v for k, v in vars(a).items() if k not in ("config", "list_params")}
        cfg = params.from_mapping(EvalConfig, given, "`python -m tutorial_utils eval --list-params`", base=base)
    except TutorialError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_evaluation(cfg)
    return 0
