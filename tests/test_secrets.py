"""A planted token must appear in no stdout, executed notebook, status.json or log."""

import subprocess
import sys

import pytest

from conftest import REPO, write_notebook
from tutorial_utils import jobs, secrets

FAKE = "hf_" + "PlantedFakeTokenForTheLeakTest0123456789"


def _all_text(folder):
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_redact_masks_env_values_and_token_shapes(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "not-shaped-like-a-token-but-secret")
    text = f"a not-shaped-like-a-token-but-secret b {FAKE} c"
    assert secrets.redact(text) == "a *** b *** c"
    assert secrets.presence()["HF_TOKEN"] == "set"


@pytest.mark.slow
def test_doctor_never_prints_the_token(monkeypatch):
    env = {
        "HF_TOKEN": FAKE,
        "HUGGING_FACE_HUB_TOKEN": FAKE,
        "PATH": "/usr/bin:/bin",
        "HTTPS_PROXY": "http://user:proxypass123@proxy.local:3128",
    }
    out = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "doctor", "--no-gl"], capture_output=True, text=True, env=env
    )
    text = out.stdout + out.stderr
    assert "HF_TOKEN=set" in text
    assert FAKE not in text and "proxypass123" not in text


def test_job_outputs_never_hold_the_token(tmp_path, runs_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE)
    # a careless notebook that prints the token and writes it into its status
    nb = write_notebook(
        tmp_path / "leaky.md",
        [
            ("code", "import os\nprint('token is', os.environ['HF_TOKEN'])"),
            ("code", "from tutorial_utils import jobs\njobs.update_status(run_dir, note=os.environ['HF_TOKEN'])"),
        ],
        params="run_dir = ''",
    )
    res = jobs.run_notebook(nb)
    assert FAKE not in _all_text(res.run_dir)
    assert "token is ***" in (res.run_dir / "job.log").read_text()


@pytest.mark.slow
def test_machine_check_chapter_never_shows_the_token(runs_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE)
    res = jobs.run_notebook(REPO / "notebooks" / "01_machine_check.md")
    text = _all_text(res.run_dir)
    assert FAKE not in text and "'HF_TOKEN': 'set'" in text
