"""``python -m tutorial_utils runs ...``: list, show, copy, start, delete, stop, pause, resume,
rollback, checkpoints, evaluate, mark-best, best, compare, diagnose, prune, export, verify."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from tutorial_utils.errors import TutorialError, error_text
from tutorial_utils.io import human_bytes


def _kv(items: list[str]) -> dict[str, str]:
    from tutorial_utils.params import parse_overrides

    return parse_overrides(items)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils runs",
        description="Watch, steer and ship training runs (run = a run id under runs/ or a path).",
    )
    ap.add_argument("--runs-dir", default=None, help="where runs live (default: runs/, or TUTORIAL_RUNS_DIR)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="every run: job, state, step/total, best, wall time, size")
    p = sub.add_parser("show", help="one run in full (JSON)")
    p.add_argument("run")
    p = sub.add_parser("copy", help="a new run with the same parameters plus key=value overrides (not started)")
    p.add_argument("run")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--start", action="store_true", help="start it now and wait for it")
    p = sub.add_parser("start", help="start a copy")
    p.add_argument("run")
    p = sub.add_parser("delete", help="delete a run that is not running; prints the space freed")
    p.add_argument("run")
    for name, what in (("stop", "finish the step, checkpoint, exit"), ("pause", "like stop, recorded as paused")):
        p = sub.add_parser(name, help=what)
        p.add_argument("run")
        p.add_argument("--wait", action="store_true", help="wait until the run has stopped")
        p.add_argument("--timeout", type=float, default=600.0)
    p = sub.add_parser("resume", help="continue a run (exact), optionally from a checkpoint and with changes")
    p.add_argument("run")
    p.add_argument("changes", nargs="*", metavar="key=value", help="allowed: optimizer_lr, steps, eval_freq, ...")
    p.add_argument("--from", dest="resume_from", default=None, help="a step_* checkpoint (default: last)")
    p = sub.add_parser("rollback", help="fork a new run from a checkpoint (the run stays as it is)")
    p.add_argument("run")
    p.add_argument("checkpoint")
    p.add_argument("--dest", default=None)
    p = sub.add_parser("checkpoints", help="a run's checkpoints: step, time, size, metrics, success rate")
    p.add_argument("run")
    p = sub.add_parser(
        "evaluate", help="evaluate checkpoints in LIBERO (same episodes each), record success rates with 95%% CIs"
    )
    p.add_argument("run")
    p.add_argument("checkpoints", nargs="*", default=["best", "last"], help="names (default: best last)")
    p.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="evaluation parameters (trials_per_task=10 ...)"
    )
    p = sub.add_parser("mark-best", help="make a checkpoint the run's best by hand (or the best by --metric)")
    p.add_argument("run")
    p.add_argument("checkpoint", nargs="?", default=None, help="a step_* name (default: the best by --metric)")
    p.add_argument("--metric", default=None, help="val_action_mae (default), another validation metric, success_rate")
    p.add_argument("--mode", choices=("min", "max"), default=None, help="default: max for success_rate, else min")
    p = sub.add_parser("best", help="the best checkpoint by a metric, of one run or across runs (--mark marks it)")
    p.add_argument("runs", nargs="+", metavar="run")
    p.add_argument("--metric", default="val_action_mae", help="a validation metric or success_rate")
    p.add_argument("--mode", choices=("min", "max"), default=None, help="default: max for success_rate, else min")
    p.add_argument("--mark", action="store_true", help="make it its run's best (mark-best)")
    p = sub.add_parser("compare", help="runs side by side: best/last table, parameter diff, seeds, curves")
    p.add_argument("runs", nargs="+", metavar="run")
    p.add_argument("--metric", default="val_action_mae", help="a validation metric or success_rate")
    p.add_argument("--mode", choices=("min", "max"), default=None, help="default: max for success_rate, else min")
    p.add_argument("--out", default=None, help="write the curves to this figure (.svg, .png, .pdf)")
    p.add_argument("--smoothing", type=float, default=0.6, help="EMA smoothing of the loss curves, 0..0.99")
    p = sub.add_parser("diagnose", help="what is wrong with a run, and the fix; exit code 1 on an error finding")
    p.add_argument("run")
    p.add_argument("--write", action="store_true", help="also record the diagnosis in the run's status.json")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("prune", help="keep the newest N step_* checkpoints (never last or best)")
    p.add_argument("run")
    p.add_argument("keep_last", type=int)
    p = sub.add_parser("export", help="write a checkpoint as a verified, self-contained bundle")
    p.add_argument("checkpoint", help="a checkpoint directory (runs/<id>/checkpoints/best...) or RUN:NAME")
    p.add_argument("dest")
    p = sub.add_parser("verify", help="check a bundle's files against its manifest")
    p.add_argument("bundle")
    return ap


def _checkpoint_path(text: str, runs_dir):
    """``RUN:NAME`` (a run id or path, a checkpoint name) or a directory."""
    from pathlib import Path

    from tutorial_utils.runs.registry import resolve
    from tutorial_utils.train.checkpoints import CHECKPOINTS_DIR, resolve_checkpoint

    if Path(text).is_dir() or ":" not in text:
        return Path(text)
    run, _, name = text.rpartition(":")
    return resolve_checkpoint(resolve(run, runs_dir) / CHECKPOINTS_DIR, name, resumable=False)


def _train_rc(res) -> int:
    by = getattr(res, "stopped_by", None)
    if not by:
        return 0
    sig = getattr(signal, str(by), None)
    return 128 + int(sig) if sig is not None else 0


def main(argv: list[str] | None = None) -> int:
    from tutorial_utils.runs import checkpoints, compare, control, export, health, registry

    args = _parser().parse_args(argv)
    rd = args.runs_dir
    try:
        if args.cmd == "list":
            print(registry.describe(registry.list_runs(rd)))
        elif args.cmd == "show":
            print(json.dumps(registry.show(args.run, rd), indent=2, default=str))
        elif args.cmd == "copy":
            new = registry.copy(args.run, rd, **_kv(args.overrides))
            print(f"copied {args.run} -> {new}")
            if args.start:
                return _train_rc(registry.start(new))
        elif args.cmd == "start":
            return _train_rc(registry.start(args.run, rd))
        elif args.cmd == "delete":
            freed = registry.delete(args.run, rd)
            print(f"deleted {args.run}: {human_bytes(freed)} freed")
        elif args.cmd in ("stop", "pause"):
            fn = control.stop if args.cmd == "stop" else control.pause
            out = fn(args.run, wait=args.wait, timeout=args.timeout, runs_dir=rd)
            print(
                f"{args.cmd} sent to {args.run}"
                if not args.wait
                else f"{args.run}: {out['state']} at step {out['step']}"
            )
        elif args.cmd == "resume":
            return _train_rc(control.resume(args.run, args.resume_from, runs_dir=rd, **_kv(args.changes)))
        elif args.cmd == "evaluate":
            from tutorial_utils.runs import evaluation

            print(evaluation.describe(evaluation.evaluate_checkpoints(args.run, args.checkpoints, rd, **_kv(args.set))))
        elif args.cmd == "rollback":
            print(f"forked {control.rollback(args.run, args.checkpoint, args.dest, rd)}")
        elif args.cmd == "checkpoints":
            for r in checkpoints.list_checkpoints(args.run, rd):
                flags = ",".join(f for f, on in (("last", r["is_last"]), ("best", r["is_best"])) if on)
                val = f"{r['val_action_mae']:.4f}" if isinstance(r.get("val_action_mae"), float) else "-"
                sr = f"{r['success_rate']:.0%} (n={r['episodes']})" if "success_rate" in r else "-"
                print(
                    f"{r['name']:<12} step {r['step']!s:>7}  {r['time']}  {human_bytes(r['bytes']):>9}  "
                    f"val {val:>7}  success {sr:<12} {r['reason']:<14} {flags}"
                )
        elif args.cmd == "mark-best":
            path = checkpoints.mark_best(args.run, args.checkpoint, rd, metric=args.metric, mode=args.mode)
            marked = json.loads((path / "config.json").read_text(encoding="utf-8"))["best"]
            by = f" (by {marked['metric']} = {marked['value']:.4g})" if "metric" in marked else ""
            print(f"best <- {marked['from']}{by}: {path}")
        elif args.cmd == "best":
            fn = compare.mark_best_across_runs if args.mark else compare.best_across_runs
            b = fn(args.runs, args.metric, args.mode, rd)
            print(
                f"best by {b['metric']} ({b['mode']}): {b['run']} {b['checkpoint']} (step {b['step']}, {b['value']:.4g})"
                + (f"; marked: {b['best_dir']}" if args.mark else "")
            )
        elif args.cmd == "compare":
            cmp = compare.compare(args.runs, args.metric, args.mode, rd)
            print(cmp.text())
            if args.out:
                from pathlib import Path

                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                cmp.figure(args.smoothing).savefig(args.out)
                print(f"curves: {args.out}")
        elif args.cmd == "diagnose":
            diag = health.diagnose(args.run, rd)
            if args.write:
                health.record(args.run, rd, diag)
            print(json.dumps(diag.as_dict(), indent=2) if args.json else diag.text())
            return 0 if diag.ok else 1
        elif args.cmd == "prune":
            gone = checkpoints.prune(args.run, args.keep_last, rd)
            print(f"removed {', '.join(gone) or 'nothing'}")
        elif args.cmd == "export":
            m = export.export(_checkpoint_path(args.checkpoint, rd), args.dest)
            print(
                f"exported {m['family']} step {m['step']} to {args.dest}: {len(m['files'])} files, parity max abs "
                f"diff {m['parity']['max_abs_diff']:.3g}"
            )
        elif args.cmd == "verify":
            m = export.verify(args.bundle)
            print(f"{args.bundle}: ok ({len(m['files'])} files match the manifest)")
    except (TutorialError, TimeoutError) as exc:
        print(error_text(exc), file=sys.stderr)
        return 2
    return 0
