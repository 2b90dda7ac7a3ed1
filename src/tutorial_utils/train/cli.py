"""``python -m tutorial_utils train``: the training stage's CLI."""

from __future__ import annotations

import argparse
import signal
import sys

from tutorial_utils.errors import TutorialError, error_text
from tutorial_utils.train.config import TrainConfig, parameters_table, parse_overrides
from tutorial_utils.train.loop import train

# --- CLI --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils train",
        description="Train a policy family (policy=mini by default; mlp, ...). Parameters as key=value "
        "(platform names, DiT4DiT aliases, or policy.<name> for the family's own).",
        epilog="example: python -m tutorial_utils train --dataset data/libero_spatial_mini --output-dir runs/x "
        "steps=2 batch_size=1 log_freq=1",
    )
    parser.add_argument("--dataset", default=None, help="LeRobot v2.1 dataset directory")
    parser.add_argument("--output-dir", default=None, help="run directory")
    parser.add_argument("--list-params", action="store_true", help="print every parameter, default and meaning")
    parser.add_argument("--list-modules", action="store_true", help="print the modules freeze_modules accepts")
    parser.usage = "%(prog)s [--dataset DIR] [--output-dir DIR] [key=value ...] [--trainer.key value ...]"
    args, extra = parser.parse_known_args(argv)
    overrides: list[str] = []
    # DiT4DiT style `--trainer.max_train_steps 2` -> trainer.max_train_steps=2
    i = 0
    while i < len(extra):
        tok = extra[i]
        if tok.startswith("--") and "=" in tok:
            overrides.append(tok[2:])
            i += 1
        elif tok.startswith("--") and i + 1 < len(extra):
            overrides.append(f"{tok[2:]}={extra[i + 1]}")
            i += 2
        elif not tok.startswith("-") and "=" in tok:
            overrides.append(tok)
            i += 1
        else:
            print(f"error: cannot read argument {tok!r}; use key=value", file=sys.stderr)
            return 2
    try:
        if args.list_params:
            family = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "policy"), "mini")
            print(parameters_table(family))
            return 0
        kv = parse_overrides(overrides)
        if args.dataset:
            kv["dataset"] = args.dataset
        if args.output_dir:
            kv["output_dir"] = args.output_dir
        cfg = TrainConfig.from_overrides(kv)
        if args.list_modules:
            from tutorial_utils import policies

            print("\n".join(policies.make(cfg.policy, cfg.policy_config).module_names()))
            return 0
        res = train(cfg)
    except TutorialError as exc:  # config, dataset, checkpoint and statistics errors carry their own fix
        print(error_text(exc), file=sys.stderr)
        return 2
    sig = getattr(signal, res.stopped_by, None) if res.stopped_by else None
    if sig is not None:  # stopped by a signal: the shell's 128 + N; a control-file stop or pause is a normal exit
        return 128 + int(sig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
