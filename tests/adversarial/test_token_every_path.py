"""A token planted in the inputs of bridge and jobs error paths (issue 26) reaches no output
and no file: every message ``python -m tutorial_utils`` prints passes through ``redact``
(stdout and stderr are wrapped), whatever the command's own printing does. Hub and serve have
their own tests (test_hub_hostile.py, test_serving_fairness.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HF = "hf_" + "EveryPathPlantedToken0123456789abcdefgh"  # planted fake, split for scanners
GH = "ghp_EveryPathGithubToken0123456789abcdefgh"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_TOKEN": HF, "GITHUB_TOKEN": GH, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tutorial_utils", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["bridge", "check", "{tmp}/" + HF],
        ["bridge", "contract", "{tmp}/" + GH],
        ["bridge", "commands", "--checkout", "{tmp}/" + HF, "--dataset", "{tmp}/" + GH],
        ["job", "run", "{tmp}/" + HF + ".md"],
        ["job", "params", "{tmp}/" + GH + ".md"],
        ["runs", "show", "{tmp}/" + HF],
        ["dataset", "validate", "{tmp}/" + GH],
        ["train", "--dataset", "{tmp}/" + HF, "--output-dir", "{tmp}/out", "steps=1"],
    ],
)
def test_a_planted_token_reaches_no_output_and_no_file(tmp_path, args):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = _run(argv, tmp_path)
    assert proc.returncode != 0  # each of these is refused
    for text in (proc.stdout, proc.stderr):
        assert HF not in text and GH not in text, text
        assert "Traceback" not in text, text
    for p in tmp_path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            assert HF.encode() not in data and GH.encode() not in data, p
