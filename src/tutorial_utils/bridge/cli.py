"""``python -m tutorial_utils bridge {check,contract,commands,prepare,patch-py38}``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tutorial_utils.bridge.commands import BridgeConfig

DESCRIPTION = """\
The bridge to an upstream DiT4DiT checkout (github.com/Mondo-Robotics/DiT4DiT, checked at 0362b34).
It builds the corrected commands, prepares the files upstream needs and reads its logs; upstream
files are never edited.

  check CHECKOUT             are the files the bridge uses there?
  contract CHECKOUT          are the flags, config keys and log lines it relies on still there?
  commands --checkout ...    write commands.sh (train smoke test, server, LIBERO client); runs nothing
  prepare --checkout ...     modality.json into the dataset, the mixture launcher, the Cosmos path fix;
                             with --checkpoint RUN/final_model/pytorch_model.pt: the config.yaml to serve it
  patch-py38 CHECKOUT        the Python 3.8 client fixes as a patch (printed or written, never applied)
"""


def _config_args(ap: argparse.ArgumentParser) -> None:
    from tutorial_utils.params import add_arguments

    add_arguments(ap, BridgeConfig)


def _config(args: argparse.Namespace) -> BridgeConfig:
    from tutorial_utils import params

    names = {f.name for f in dataclasses.fields(BridgeConfig)}
    return params.from_mapping(
        BridgeConfig, {k: v for k, v in vars(args).items() if k in names}, "`bridge commands --help`"
    )


def main(argv: list[str]) -> int:
    from tutorial_utils.errors import TutorialError

    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils bridge",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    ck = sub.add_parser("check", help="check that the checkout has every file the bridge uses")
    ck.add_argument("checkout")
    ct = sub.add_parser("contract", help="grep the checkout for every flag, key and log line the bridge relies on")
    ct.add_argument("checkout")
    ct.add_argument("--json", action="store_true", help="print the report as JSON")
    cm = sub.add_parser("commands", help="write commands.sh (dry run: nothing is executed)")
    cm.add_argument("--out", default=None, help="where to write it (default: <runs_dir>/<run_id>/commands.sh)")
    cm.add_argument(
        "--long",
        action="store_true",
        help="a longer training run (steps, logging_frequency...) instead of the 2-step smoke test",
    )
    cm.add_argument("--print", dest="show", action="store_true", help="also print the script")
    _config_args(cm)
    pr = sub.add_parser("prepare", help="write modality.json, the mixture launcher and fix the released config.yaml")
    pr.add_argument("--no-cosmos-fix", action="store_true", help="leave the released config.yaml as it is")
    _config_args(pr)
    pp = sub.add_parser("patch-py38", help="the Python 3.8 client fixes as a unified diff (not applied)")
    pp.add_argument("checkout")
    pp.add_argument("--out", default=None, help="write the patch here instead of printing it")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except TutorialError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from tutorial_utils.bridge import checkout, commands, files, launcher

    if args.cmd == "check":
        root = checkout.validate_checkout(args.checkout)
        print(f"OK: {root} has the {len(checkout.REQUIRED_FILES)} files the bridge uses")
        return 0
    if args.cmd == "contract":
        report = checkout.contract_check(args.checkout)
        print(json.dumps(report.to_dict(), indent=2) if args.json else report)
        return 0 if report.ok else 1
    if args.cmd == "patch-py38":
        checkout.validate_checkout(args.checkout)
        if args.out:
            out = files.write_py38_patch(args.checkout, args.out)
            print(
                f"wrote {out}; apply it in the checkout with `git apply {out}` (or `patch -p1 < {out}`)"
                if out
                else "nothing to patch: the fixes are already in the checkout"
            )
        else:
            text = files.py38_patch(args.checkout)
            print(text or "# nothing to patch: the fixes are already in the checkout", end="" if text else "\n")
        return 0
    cfg = _config(args).resolved()
    if args.cmd == "commands":
        out = commands.dry_run(cfg, args.out, smoke=not args.long)
        print(f"wrote {out} (nothing was run)")
        if args.show:
            print(out.read_text())
        return 0
    # prepare
    cfg.check()
    checkout.validate_checkout(cfg.checkout)
    if cfg.data_dir and not cfg.checkpoint:
        m = files.write_modality(f"{cfg.data_dir}/{cfg.dataset}")
        print(f"modality.json: {m['path']} ({'written' if m['written'] else 'already there, valid'})")
    lp = launcher.write_launcher(cfg.run_dir, cfg.mixture, launcher.mixture_entries(cfg.dataset))
    print(f"mixture launcher: {lp} (registers {cfg.mixture!r} in memory; mixtures.py is not edited)")
    if cfg.checkpoint and not (cfg.serve_checkpoint.parents[1] / files.CONFIG_YAML).is_file():
        # a run's own final_model: the released config.yaml with this machine's Cosmos path beside it
        released = cfg.released_checkpoint.parents[1] / files.CONFIG_YAML
        served = files.write_serving_config(cfg.serve_checkpoint, cfg.cosmos_dir, released_config=released)
        print(f"serving config: wrote {served.path} (from {released}, Cosmos path {cfg.cosmos_dir})")
    elif not args.no_cosmos_fix:
        cy = cfg.serve_checkpoint.parents[1] / files.CONFIG_YAML
        fix = files.fix_cosmos_path(cy, cfg.cosmos_dir)
        state = (
            f"changed {fix['old']!r} -> {fix['new']!r}, backup {fix['backup']}" if fix["changed"] else "already right"
        )
        print(f"{cy} [{files.COSMOS_KEY}]: {state}")
    return 0
