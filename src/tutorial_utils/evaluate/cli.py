"""``python -m tutorial_utils eval``: the LIBERO client process."""

from __future__ import annotations

from tutorial_utils.evaluate.loop import EvalConfig


def main(argv: list[str]) -> int:
    from tutorial_utils import params

    if argv[:1] == ["merge"]:  # `eval merge RUN_DIR...`: join the shards of one evaluation
        from tutorial_utils.evaluate.parallel import merge_main

        return merge_main(argv[1:])
    cfg = params.parse_cli(
        EvalConfig,
        argv,
        "python -m tutorial_utils eval",
        "Run the LIBERO evaluation client against a running policy server "
        "(the evaluation job starts both; see notebooks/jobs/evaluate.md). "
        "`python -m tutorial_utils eval merge RUN_DIR...` joins the shards of one evaluation.",
    )
    if cfg is not None:
        from tutorial_utils.evaluate.parallel import evaluate

        evaluate(cfg)  # `workers` client processes (1: this one)
    return 0
