"""``python -m tutorial_utils eval``: the LIBERO client process."""

from __future__ import annotations

from tutorial_utils.evaluate.loop import EvalConfig, run_evaluation


def main(argv: list[str]) -> int:
    from tutorial_utils import params

    cfg = params.parse_cli(
        EvalConfig,
        argv,
        "python -m tutorial_utils eval",
        "Run the LIBERO evaluation client against a running policy server "
        "(the evaluation job starts both; see notebooks/jobs/evaluate.md).",
    )
    if cfg is not None:
        run_evaluation(cfg)
    return 0
