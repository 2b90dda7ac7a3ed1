"""Planted secrets: a fake Hugging Face token in the environment, in job parameters and in URLs
must reach no file a job writes (even when its runner is killed mid-cell), no promoted log and
no line of ``doctor``.

The runner that is killed runs in its own process group, started by the test and killed by
that group's id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import write_notebook
from helpers import wait_for
from tutorial_utils import jobs, logs, secrets
from tutorial_utils.io import promote_text
from tutorial_utils.report import doctor

FAKE = "hf_" + "PlantedFakeTokenForHostileTestsQwE"  # hf_ and 34 letters, the shape of a real token
PROXY_PASS = "pr0xy@pa/ss"


def _all_text(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


# --- redact() -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("http://user:s3cret@proxy:3128", "http://***@proxy:3128"),
        ("https://user:p@ss/w0rd@hub.example.org/api", "https://***@hub.example.org/api"),
        (f"https://{FAKE}@huggingface.co/x", "https://***@huggingface.co/x"),
        ("git clone https://ghp_abcdefABCDEF0123456789@github.com/o/r.git", "git clone https://***@github.com/o/r.git"),
        ("socks5://a:b@h:1 and http://c:d@e", "socks5://***@h:1 and http://***@e"),
        ('{"endpoint": "https://u:pw@hub.local"}', '{"endpoint": "https://***@hub.local"}'),
    ],
)
def test_redact_masks_url_credentials(text, want):
    assert secrets.redact(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("short hf_a1b2 token", "short *** token"),  # HF tokens of any length (with a digit)
        ("long hf_" + "Ab1" * 12, "long ***"),
        ("ghp_" + "A1b2" * 9 + " and gho_abcdEF123456", "*** and ***"),
        ("github_pat_11ABCDEFG0_abcdefghijklmnop", "***"),
        ("Authorization: Bearer abc.DEF-123_xyz", "Authorization: Bearer ***"),
        ('{"authorization": "token s3cretvalue"}', '{"authorization": "token ***"}'),
        ("proxy-authorization: Basic dXNlcjpwYXNz", "proxy-authorization: Basic ***"),
        ("got bearer eyJhbGciOi.xyz back", "got bearer *** back"),
        # names that only look like tokens stay
        (
            "hf_hub_download, hf_transfer, HF_TOKEN, HF_HUB_DISABLE_XET",
            "hf_hub_download, hf_transfer, HF_TOKEN, HF_HUB_DISABLE_XET",
        ),
    ],
)
def test_redact_masks_token_shapes_and_authorization_headers(text, want):
    assert secrets.redact(text) == want


def test_redact_masks_github_and_short_hf_tokens_from_the_environment(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "plainGithubSecretValue")
    monkeypatch.setenv("HF_TOKEN", "hf_abcd")  # short, letters only: the environment value says it
    assert secrets.redact("a plainGithubSecretValue b hf_abcd c") == "a *** b *** c"


def test_redact_leaves_urls_without_credentials_alone():
    for text in (
        "https://huggingface.co/datasets/x",
        "git+https://github.com/org/repo.git@v1.0",
        "https://cdn.jsdelivr.net/npm/pkg@1.0/f.js",
        "mail me at someone@example.org",
    ):
        assert secrets.redact(text) == text


def test_redact_takes_linear_time_on_hostile_text():
    """Every notebook save and log line passes through redact(): a long run of scheme-like
    characters (a base64 image, `ab+ab+...`) must not make it quadratic (that was 8 minutes)."""
    t0 = time.perf_counter()
    for text in ("ab+" * 300_000, "a." * 500_000, "http://" + "x" * 1_000_000, "a://" * 200_000):
        assert secrets.redact(text) == text
    assert time.perf_counter() - t0 < 10


def test_redact_data_reaches_nested_and_escaped_strings(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", 'tok"with\\quotes-0123')
    data = {"a": ['x tok"with\\quotes-0123 y', {"url": "http://u:p@h"}], "b": (FAKE,), "n": 3}
    clean = secrets.redact_data(data)
    assert clean == {"a": ["x *** y", {"url": "http://***@h"}], "b": ("***",), "n": 3}
    assert 'tok"with' not in json.dumps(clean)


# --- doctor ---------------------------------------------------------------------------------------

HOSTILE_ENV = {
    "HTTPS_PROXY": f"http://me:{PROXY_PASS}@proxy.local:3128",
    "HTTP_PROXY": f"http://{FAKE}@proxy.local:3128",
    "ALL_PROXY": "http://ghp_abcdefABCDEF0123456789:x-oauth-basic@proxy.local:1080",
    "https_proxy": "http://user:slash/in/pass@proxy.local:3128",
    "HF_ENDPOINT": "https://mirror-user:endpointpass99@hub.mirror.local",
}


def test_doctor_masks_proxy_passwords_token_user_names_and_hf_endpoint(monkeypatch):
    for k, v in HOSTILE_ENV.items():
        monkeypatch.setenv(k, v)
    hub = doctor.hub_settings()
    assert hub["HTTPS_PROXY"] == "http://me:***@proxy.local:3128"  # a plain user name stays
    assert hub["HTTP_PROXY"] == "http://***@proxy.local:3128"  # a token as the user name
    assert hub["ALL_PROXY"] == "http://***@proxy.local:1080"
    assert hub["https_proxy"] == "http://user:***@proxy.local:3128"
    assert hub["HF_ENDPOINT"] == "https://mirror-user:***@hub.mirror.local"
    text = json.dumps(hub)
    for secret in (PROXY_PASS, "pa/ss", FAKE, "ghp_", "slash/in/pass", "endpointpass99"):
        assert secret not in text, secret


def test_doctor_cli_prints_no_planted_secret():
    env = {"HF_TOKEN": FAKE, "PATH": "/usr/bin:/bin", **HOSTILE_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "doctor", "--no-gl"], capture_output=True, text=True, env=env
    )
    text = out.stdout + out.stderr
    assert "HF_TOKEN=set" in text and "HF_ENDPOINT=" in text
    for secret in (PROXY_PASS, "pa/ss", FAKE, "ghp_", "slash/in/pass", "endpointpass99"):
        assert secret not in text, secret


# --- jobs -----------------------------------------------------------------------------------------


def test_params_yaml_and_status_hold_no_planted_parameter(tmp_path, runs_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE)
    nb = write_notebook(tmp_path / "p.md", [("code", "print(len(note))")], params="note = ''\nrun_dir = ''")
    res = jobs.run_notebook(nb, {"note": f"token {FAKE} and https://u:pw123@hub.local"})
    params = yaml.safe_load((res.run_dir / jobs.PARAMS_FILE).read_text())
    assert params["parameters"]["note"] == "token *** and https://***@hub.local"
    text = _all_text(res.run_dir)
    assert FAKE not in text and "pw123" not in text


LEAKY = [
    ("code", "import os\nprint('token is', os.environ['HF_TOKEN'], 'note', note, flush=True)"),
    ("code", "from tutorial_utils import jobs\njobs.update_status(run_dir, note=os.environ['HF_TOKEN'])"),
    ("code", "import time\nprint('sleeping', flush=True)\ntime.sleep(300)"),
]


def test_killed_runner_leaves_no_raw_token_on_disk_or_stdout(tmp_path):
    """kill -9 of `job run` while a cell runs: the executed notebook saved so far, params.yaml,
    status.json and job.log are all redacted already (nothing is left to a final pass)."""
    nb = write_notebook(tmp_path / "leaky.md", LEAKY, params="note = ''\nrun_dir = ''")
    run = tmp_path / "run"
    out = tmp_path / "stdout.txt"
    env = {**os.environ, "HF_TOKEN": FAKE, "TUTORIAL_RUNS_DIR": str(tmp_path / "runs")}
    cmd = [sys.executable, "-m", "tutorial_utils", "job", "run", str(nb), "--run-dir", str(run), "-p", "note", FAKE]
    with open(out, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    executed = run / "leaky.ipynb"
    try:
        # papermill saved the notebook after the leaky cells ran; the runner is still going
        assert wait_for(
            lambda: executed.is_file() and "token is" in executed.read_text() and "note" in jobs.read_status(run),
            proc=proc,
        ), out.read_text()
        assert proc.poll() is None and "token is *** note ***" in executed.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    text = _all_text(run)
    assert FAKE not in text
    for name in ("leaky.ipynb", "params.yaml", "status.json", "job.log"):
        assert (run / name).is_file(), name
    assert FAKE not in out.read_text() and "token is ***" in out.read_text()


# --- promotion into the git-tracked logs/ ----------------------------------------------------------


def test_promote_text_redacts(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE)
    src = tmp_path / "train.log"
    src.write_text(f"login with {FAKE}\nproxy http://me:{PROXY_PASS}@proxy:3128\n")
    dest = promote_text(src, tmp_path / "logs" / "train.log")
    text = dest.read_text()
    assert FAKE not in text and PROXY_PASS not in text and "login with ***" in text


def test_promoted_training_and_evaluation_hold_no_secret(tmp_path, monkeypatch):
    from tutorial_utils.report import promote as P

    monkeypatch.setenv("HF_TOKEN", FAKE)
    train_run = tmp_path / "train"
    train_run.mkdir()
    (train_run / "train.log").write_text(f"token {FAKE}\n")
    (train_run / "summary.json").write_text(json.dumps({"dataset": f"https://u:{PROXY_PASS}@hub/x"}))
    done = P.training(train_run, logs_dir=tmp_path / "logs")
    assert set(done) == {"train.log", "summary.json"}

    run = tmp_path / "eval"
    run.mkdir()
    (run / "server.log").write_text(
        "\n".join(
            [
                logs.SERVER_RUNNING.format(host="127.0.0.1", port=1),
                logs.SERVER_LISTENING.format(host="127.0.0.1", port=1),
                logs.SERVER_CONNECTION_OPEN,
                f"loaded with {FAKE}",
            ]
        )
        + "\n"
    )
    (run / "eval_libero_spatial.log").write_text(
        "\n".join(
            [
                logs.EVAL_TASK.format(task="t"),
                logs.EVAL_STARTING_EPISODE.format(n=1),
                logs.EVAL_SUCCESS.format(success=True),
                logs.EVAL_TOTAL_RATE.format(rate=1.0),
            ]
        )
        + "\n"
    )
    results = {
        "suite": "libero_spatial",
        "config": {"output_dir": str(run), "checkpoint": f"https://{FAKE}@huggingface.co/m", "note": FAKE},
        "tasks": [{"task_id": 0, "task": "t", "episodes": [{"success": True, "video": None, "steps": 2}]}],
    }
    (run / "results.json").write_text(json.dumps(results))
    P.evaluation(run, tmp_path / "logs", tmp_path / "assets")
    text = _all_text(tmp_path / "logs")
    assert FAKE not in text and PROXY_PASS not in text
    promoted = json.loads((tmp_path / "logs" / "eval_results.json").read_text())
    assert promoted["config"]["checkpoint"] == "https://***@huggingface.co/m"
