"""``python -m tutorial_utils <command> ...``: one entry point over the package's CLIs.

Each command lives in its own module as ``main(argv) -> int`` and is imported only when
called, so ``python -m tutorial_utils doctor`` never pays for torch or LIBERO.
"""

from __future__ import annotations

import importlib
import sys

#: command -> (module, help). Each module defines ``main(argv: list[str]) -> int``.
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("tutorial_utils.report.doctor", "check this machine: accelerators, VRAM, disk, tokens, proxy, GL"),
    "job": ("tutorial_utils.jobs.runner", "run a job notebook with papermill (`job run NOTEBOOK -p key value`)"),
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
    "openloop": (
        "tutorial_utils.evaluate.openloop",
        "replay demonstrations through a checkpoint: action error, and whether it reads its cameras or its state",
    ),
    "latent": (
        "tutorial_utils.evaluate.latent",
        "open a checkpoint on demonstrations beside it untrained: TD-MPC's latent, Diffusion/VQ-BeT camera keypoints",
    ),
    "train": ("tutorial_utils.train.cli", "train a policy family (mini, mlp, ...)"),
    "lerobot-train": (
        "tutorial_utils.train.lerobot_loop",
        "train a LeRobot family with LeRobot's own training loop on our recording; save a checkpoint we serve",
    ),
    "runs": ("tutorial_utils.runs.cli", "list, stop, pause, resume, roll back, copy, delete and export runs"),
    "pipeline": (
        "tutorial_utils.pipeline",
        "the main job: record -> train -> evaluate -> promote (reuses finished runs)",
    ),
    "zoo": (
        "tutorial_utils.experiments.zoo",
        "the model zoo comparison's table and promotion (the zoo job runs it: notebooks/jobs/zoo.md)",
    ),
    "promote": (
        "tutorial_utils.report.promote",
        "copy a finished run's real logs, results and a video into logs/ and assets/",
    ),
    "logs": ("tutorial_utils.logs.diagnosis", "parse run logs and diagnose which stage failed"),
    "lab": ("tutorial_utils.report.lab", "JupyterLab on the chapters (127.0.0.1, token file); `lab publish DIR`"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m tutorial_utils <command> [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


#: exit codes every command shares (a command may add its own: ``serve`` 3, a policy it cannot load)
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 70, 130
#: set to 1 to see the traceback of an error a command did not expect
DEBUG_ENV = "TUTORIAL_DEBUG"


def _one_line(exc: BaseException, limit: int = 600) -> str:
    from tutorial_utils.secrets import redact

    text = " ".join(redact(str(exc)[: limit * 2]).split())
    return text if len(text) <= limit else text[:limit] + "..."


def main(argv: list[str] | None = None) -> int:
    """Run one command. Exit codes: 0 done, 1 a check or a step failed, 2 bad input (usage, a
    teaching error), 3 ``serve`` could not load its policy, 70 an error the command did not
    expect (one line; ``TUTORIAL_DEBUG=1`` shows its traceback), 130 interrupted. No traceback
    reaches the user unless asked for."""
    import os

    from tutorial_utils.errors import DiskFull, TutorialError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"unknown command {_one_line(ValueError(repr(name)), 80)}; commands: {', '.join(COMMANDS)} "
            "(python -m tutorial_utils --help)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    from tutorial_utils.secrets import RedactingStream

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(out), RedactingStream(err)  # no token reaches the terminal
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (DiskFull, TutorialError) as exc:  # a teaching error a command did not catch itself
        print(f"error: {_one_line(exc, 2000)}", file=sys.stderr)
        return EXIT_FAILED if isinstance(exc, DiskFull) else EXIT_BAD_INPUT
    except Exception as exc:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        kind = "the disk is full: free space and rerun" if getattr(exc, "errno", None) == 28 else None
        print(
            f"error: {name}: {type(exc).__name__}: {_one_line(exc)}"
            + (
                f" ({kind})"
                if kind
                else f". This is unexpected: rerun with {DEBUG_ENV}=1 for the traceback and report it."
            ),
            file=sys.stderr,
        )
        return EXIT_FAILED if kind else EXIT_INTERNAL
    finally:
        sys.stdout, sys.stderr = out, err


if __name__ == "__main__":
    raise SystemExit(main())
