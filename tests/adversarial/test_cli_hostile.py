"""No traceback reaches a user (issue 26): every command of ``python -m tutorial_utils`` on
hostile input (a FIFO, a symlink to /dev/zero, deeply nested or wrongly typed JSON, a run named
through a symlink, a tampered bundle, bad parameters) answers in a few short lines on stderr
with a documented exit code, within a time limit (a FIFO never blocks a command):

    0 done, 1 a check or a step failed, 2 bad input, 3 serve could not load its policy,
    70 an error the command did not expect (never on these inputs).

``make publish`` passes DEST through the environment: a quote or a ``$(shell ...)`` in it is
part of the folder name, never run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_" + "CliHostilePlantedToken0123456789abcdef"  # planted fake, split for scanners


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    h = tmp_path_factory.mktemp("hostile")
    os.mkfifo(h / "fifo")
    (h / "zero.json").symlink_to("/dev/zero")
    (h / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    # a dataset whose metadata is a FIFO / endless / deep
    for name, make in (
        ("ds_fifo", lambda p: os.mkfifo(p)),
        ("ds_zero", lambda p: p.symlink_to("/dev/zero")),
        ("ds_deep", lambda p: p.write_text('{"fps": ' + "[" * 100_000 + "]" * 100_000 + "}")),
    ):
        (h / name / "meta").mkdir(parents=True)
        make(h / name / "meta" / "info.json")
    # runs: a run whose files are hostile, and a run id that is a symlink out of the runs dir
    runs = h / "runs"
    bad = runs / "bad"
    bad.mkdir(parents=True)
    (bad / "train_config.json").write_text('{"train": ' + "[" * 100_000 + "]" * 100_000 + "}")
    os.mkfifo(bad / "status.json")
    (bad / "summary.json").symlink_to("/dev/zero")
    (bad / "control.json").write_text(json.dumps({"command": ["stop"] * 3, "time": "x"}))
    outside = h / "outside"
    outside.mkdir()
    (outside / "train_config.json").write_text(json.dumps({"train": {"steps": 1}}))
    (runs / "link").symlink_to(outside, target_is_directory=True)
    # a bundle with a wrong-typed manifest, one with weights linked out of it
    for name, files in (("bundle_types", ["model.safetensors"]), ("bundle_link", {})):
        b = h / name
        b.mkdir()
        (b / "manifest.json").write_text(json.dumps({"format": "tutorial_utils.bundle", "files": files}))
        (b / "config.json").write_text(json.dumps({"format": "tutorial_utils.policy", "family": "mlp", "policy": {}}))
    (h / "bundle_link" / "model.safetensors").symlink_to(h / "zero.json")
    return h


def _cases(h: Path) -> list[tuple[list[str], set[int]]]:
    runs = str(h / "runs")
    return [
        (["nonsense-command"], {2}),
        (["runs", "--runs-dir", runs, "list"], {0}),
        (["runs", "--runs-dir", runs, "show", "bad"], {0}),
        (["runs", "--runs-dir", runs, "show", "nope"], {2}),
        (["runs", "--runs-dir", runs, "delete", "link"], {2}),
        (["runs", "--runs-dir", runs, "resume", "bad"], {2}),
        (["runs", "--runs-dir", runs, "resume", "bad", "--from", str(h / "fifo")], {2}),
        (["runs", "--runs-dir", runs, "rollback", "bad", "step_1"], {2}),
        (["runs", "--runs-dir", runs, "prune", "bad", "-1"], {2}),
        (["runs", "--runs-dir", runs, "checkpoints", "bad"], {0, 2}),
        (["runs", "--runs-dir", runs, "diagnose", "bad"], {0, 1, 2}),
        (["runs", "export", str(h / "fifo"), str(h / "out_export")], {2}),
        (["runs", "verify", str(h / "bundle_types")], {2}),
        (["runs", "verify", str(h / "bundle_link")], {2}),
        (["runs", "verify", str(h / "fifo")], {2}),
        (["serve", "--policy", "mlp", "--checkpoint", str(h / "bundle_link"), "--port", "0"], {3}),
        (["dataset", "validate", str(h / "ds_fifo")], {1}),
        (["dataset", "validate", str(h / "ds_zero")], {1}),
        (["dataset", "validate", str(h / "ds_deep"), "--deep"], {1}),
        (["dataset", "info", str(h / "ds_zero")], {1, 2}),
        (["dataset", "validate", str(h / "fifo")], {1}),
        (["hub", "plan", "no-such-asset"], {1, 2}),
        (["train", f"steps={TOKEN}", "--dataset", str(h / "ds_zero")], {2}),
        (["train", "--dataset", str(h / "ds_zero"), "--output-dir", str(h / "train_out"), "steps=1"], {1, 2}),
        (["job", "run", str(h / "fifo")], {1, 2}),
        (["job", "run", str(h / "nope.md")], {1, 2}),
        (["promote", "train", str(h / "fifo")], {1, 2}),
        (["logs", "diagnose", str(h / "runs" / "bad")], {0, 1, 2}),
    ]


@pytest.mark.slow
def test_every_command_answers_hostile_input_in_a_short_line(hostile):
    env = {**os.environ, "HF_TOKEN": TOKEN, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    env.pop("TUTORIAL_DEBUG", None)
    failures = []
    for args, codes in _cases(hostile):
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "tutorial_utils", *args],
                capture_output=True,
                text=True,
                timeout=90,
                env=env,
                cwd=hostile,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            failures.append(f"{args}: hung for more than 90 s")
            continue
        err = proc.stderr
        problems = []
        if proc.returncode not in codes:
            problems.append(f"exit {proc.returncode}, expected {sorted(codes)}")
        if "Traceback" in err:
            problems.append("a traceback")
        if TOKEN in err or TOKEN in proc.stdout:
            problems.append("the token")
        if len(err) > 4000 or len([ln for ln in err.splitlines() if ln.strip()]) > 12:
            problems.append(f"{len(err)} chars of stderr")
        if problems:
            failures.append(f"{args}: {', '.join(problems)}\n{err[-1500:]}")
    assert not failures, "\n\n".join(failures)


def test_make_publish_passes_dest_through_the_environment(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    echo = tmp_path / "echo.sh"
    echo.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    dest = f'x"; touch {tmp_path}/pwned; echo "$(shell touch {tmp_path}/pwned2) $$HOME `id` $HOME'
    proc = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "publish", f"PY={echo}", f"DEST={dest}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == dest  # byte for byte, as the folder name
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "publish", f"PY={echo}"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage: make publish DEST=" in proc.stderr
