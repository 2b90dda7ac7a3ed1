"""``python -m tutorial_utils <command> ...``: one entry point over the package's CLIs.

Each command lives in its own module as ``main(argv) -> int`` and is imported only when
called, so ``python -m tutorial_utils doctor`` never pays for torch or LIBERO.
"""

from __future__ import annotations

import importlib
import sys

#: command -> (module, help). Each module defines ``main(argv: list[str]) -> int``.
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("tutorial_utils.machine", "check this machine: accelerators, VRAM, disk, tokens, proxy, GL"),
    "job": ("tutorial_utils.jobs", "run a job notebook with papermill (`job run NOTEBOOK -p key value`)"),
    "book": ("tutorial_utils.report.book", "notebook twins, book build, page checks"),
    "hub": ("tutorial_utils.hub.cli", "plan, download and verify the official chain's Hub assets"),
    "bridge": (
        "tutorial_utils.bridge.cli",
        "the upstream DiT4DiT checkout: check, contract, commands (commands.sh), prepare, patch-py38",
    ),
    "dataset": ("tutorial_utils.data.cli", "inspect, validate and generate LeRobot v2.1 datasets"),
    "record": ("tutorial_utils.sim.record", "record LIBERO demonstrations with the scripted expert"),
    "expert": ("tutorial_utils.sim.expert", "the scripted expert's success table over tasks and init states"),
    "serve": ("tutorial_utils.serve.cli", "run a websocket policy server"),
    "eval": ("tutorial_utils.evaluate.cli", "run the LIBERO evaluation client"),
    "train": ("tutorial_utils.train.cli", "train a policy family (mini, mlp, ...)"),
    "runs": ("tutorial_utils.runs.cli", "list, stop, pause, resume, roll back, copy, delete and export runs"),
    "pipeline": (
        "tutorial_utils.pipeline",
        "the main job: record -> train -> evaluate -> promote (reuses finished runs)",
    ),
    "zoo": (
        "tutorial_utils.zoo",
        "the model zoo comparison's table and promotion (the zoo job runs it: notebooks/jobs/zoo.md)",
    ),
    "promote": (
        "tutorial_utils.report.promote",
        "copy a finished run's real logs, results and a video into logs/ and assets/",
    ),
    "logs": ("tutorial_utils.logs", "parse run logs and diagnose which stage failed"),
    "lab": ("tutorial_utils.report.lab", "JupyterLab on the chapters (127.0.0.1, token file); `lab publish DIR`"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m tutorial_utils <command> [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
