"""Log parsers and the stage diagnosis (no LIBERO, no network)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import SERVER_NO_CONNECTION, SERVER_OK, TRAIN_OK, eval_log
from tutorial_utils import logs as L


def _run(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / name.replace("__", ".")).write_text(text)
    return L.diagnose(tmp_path)


# --- patterns and parsers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "const,values",
    [
        ("EVAL_TASK", {"task": "pick up the black bowl: then stop"}),
        ("EVAL_SUCCESSES", {"n": 9, "pct": 90.0}),
        ("TRAIN_TOTAL_PARAMS", {"n": 1_234_567, "m": 1.234567}),
        ("SERVER_LISTENING", {"host": "127.0.0.1", "port": 8000}),
        ("EVAL_STARTING_EPISODE", {"n": 12}),
    ],
)
def test_pattern_roundtrip(const, values):
    fmt = getattr(L, const)
    m = L.pattern(fmt).search("2026-01-01 INFO prefix: " + fmt.format(**values))
    assert m is not None
    assert m.group(next(iter(values))).replace(",", "") == str(next(iter(values.values()))).replace(",", "")


def test_parse_eval_log_with_prefixes_and_egl():
    res = L.parse_eval_log(eval_log(prefix="INFO:root:", egl=True))
    assert [t["task"] for t in res["tasks"]] == ["pick up the bowl", "put the bowl on the plate"]
    assert res["episodes"] == 3 and res["successes"] == 2
    assert res["tasks"][1]["episodes"] == [{"episode": 2, "success": True}, {"episode": 3, "success": False}]
    assert res["tasks"][1]["task_rate"] == 0.5
    assert res["total_rate"] == pytest.approx(2 / 3) and res["total_episodes"] == 3
    assert res["egl_after_total"] and not res["egl_before_total"]
    assert res["errors"] == ["OpenGL.raw.EGL._errors.EGLError: EGLError(err = EGL_NOT_INITIALIZED)"]


def test_parse_eval_log_from_path(tmp_path):
    p = tmp_path / "eval_libero_spatial.log"
    p.write_text(eval_log(finish=False))
    res = L.parse_eval_log(p)
    assert res["total_rate"] is None and res["running_total_rate"] == pytest.approx(2 / 3)


def test_documented_eval_lines_leave_out_what_libero_prints(tmp_path):
    clean = eval_log()
    noisy = "[robosuite WARNING] No private macro file found!\n" + clean.replace("Task:", "[info] loading\nTask:", 1)
    p = tmp_path / "eval_libero_spatial.log"
    p.write_text(noisy + "EGL_NOT_INITIALIZED\n")
    assert L.documented_eval_lines(p) == clean.splitlines() and len(clean.splitlines()) == 2 + 4 * 3 + 2 * 2 + 2


def test_parse_server_log():
    res = L.parse_server_log(
        SERVER_OK
        + "x WARNING tutorial_utils.serve: "
        + L.SERVER_REQUEST_ERROR.format(addr="a", error="ObservationError: missing key")
        + "\n"
    )
    assert res["running"] and res["listening"] == ["127.0.0.1:8000"]
    assert res["connections_open"] == 1 and res["connections_closed"] == 1
    assert res["request_errors"] == ["ObservationError: missing key"]
    assert not res["port_in_use"]


def test_parse_train_log():
    res = L.parse_train_log(TRAIN_OK)
    assert res["total_params"] == 2_345_678 and res["frozen_params"] == 2_000_000 and res["trainable_ratio"] == 14.74
    assert res["total_steps"] == 2 and res["dataloader_len"] == 52970 and res["run_id"] == "smoke"
    assert res["steps"][0] == {
        "step": 1,
        "losses": {"action_dit_loss": 1.25, "future_video_loss": 0.5, "total_loss": 1.75},
    }
    assert res["steps"][1]["losses"]["total_loss"] == 0.9
    assert res["steps"][1]["losses"]["action_dit_loss"] != res["steps"][1]["losses"]["action_dit_loss"]  # nan
    assert res["final_model"] == "runs/x/final_model"


# --- diagnosis: evaluation ----------------------------------------------------------------------------


def test_diagnose_ok_with_harmless_egl(tmp_path):
    d = _run(tmp_path, server__log=SERVER_OK, eval_libero_spatial__log=eval_log(egl=True))
    assert d.ok and all(d.signs.values())
    assert d.figures["successes"] == 2
    assert any("harmless" in n for n in d.notes)
    assert "verdict: OK" in str(d)


def test_diagnose_no_server_log(tmp_path):
    d = _run(tmp_path, eval_libero_spatial__log="")
    assert d.failed_stage == "server" and "never started" in d.causes[0]


def test_diagnose_port_in_use(tmp_path):
    text = f"{L.SERVER_RUNNING.format(host='127.0.0.1', port=8000)}\nERROR: [Errno 98] port 8000 on 127.0.0.1 is already in use\n"
    d = _run(tmp_path, server__log=text.replace("server running", "starting"))
    assert d.failed_stage == "server" and "already in use" in d.causes[0]


def test_diagnose_server_crash_at_startup(tmp_path):
    text = "Traceback (most recent call last):\n  File \"x.py\", line 1\nModuleNotFoundError: No module named 'torch'\n"
    d = _run(tmp_path, server__log=text)
    assert d.failed_stage == "server" and any("No module named 'torch'" in c for c in d.causes)


def test_diagnose_listening_but_no_connection(tmp_path):
    d = _run(tmp_path, server__log=SERVER_NO_CONNECTION, eval_libero_spatial__log="")
    assert d.failed_stage == "client connect"
    assert d.signs["server listening"] and not d.signs["connection open"]
    assert any("not started" in c for c in d.causes) and any("port" in c for c in d.causes)


def test_diagnose_connected_but_no_tasks(tmp_path):
    ev = 'Traceback (most recent call last):\n  File "libero_env.py"\ntutorial_utils.sim.libero_env.GLBackendError: no offscreen GL backend works\n'
    d = _run(tmp_path, server__log=SERVER_OK, eval_libero_spatial__log=ev)
    assert d.failed_stage == "LIBERO setup"
    assert any("LIBERO_CONFIG_PATH" in c for c in d.causes) and any("EGL" in c or "GL" in c for c in d.causes)
    assert any("GLBackendError" in c for c in d.causes)


def test_diagnose_server_died_mid_evaluation(tmp_path):
    ev = eval_log(finish=False) + (
        'Starting episode 4...\nTraceback (most recent call last):\n  File "evaluate.py"\n'
        "tutorial_utils.serve.ServerDied: the policy server closed the connection\n"
    )
    d = _run(tmp_path, server__log=SERVER_OK, eval_libero_spatial__log=ev)
    assert d.failed_stage == "evaluation" and not d.signs["total success rate"]
    assert "ServerDied" in d.causes[0]
    assert "FAILED at stage 'evaluation'" in str(d)


def test_diagnose_egl_before_any_task(tmp_path):
    d = _run(tmp_path, server__log=SERVER_OK, eval_libero_spatial__log="EGLError: EGL_NOT_INITIALIZED\n")
    assert d.failed_stage == "LIBERO setup" and "osmesa" in d.causes[0]


def test_diagnose_promoted_files_by_name(tmp_path):
    (tmp_path / "eval_server.log").write_text(SERVER_OK)
    (tmp_path / "eval_libero_spatial.log").write_text(eval_log())
    d = L.diagnose(server_log=tmp_path / "eval_server.log", eval_log=tmp_path / "eval_libero_spatial.log")
    assert d.ok
    # in a directory the server log is never mistaken for the client's
    assert L.diagnose(tmp_path).ok


# --- diagnosis: training -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keep,stage,cause",
    [
        (0, "model setup", "xxx.yaml"),
        (6, "data loading", "logging_frequency"),
        (8, "training", "killed"),
    ],
)
def test_diagnose_training_stages(tmp_path, keep, stage, cause):
    text = "\n".join(TRAIN_OK.splitlines()[:keep]) + "\n"
    d = _run(tmp_path, train__log=text)
    assert d.kind == "training" and d.failed_stage == stage
    assert any(cause in c for c in d.causes)


def test_diagnose_training_ok(tmp_path):
    d = _run(tmp_path, train__log=TRAIN_OK)
    assert d.ok and d.figures["last_step"] == 2 and d.figures["final_model"] == "runs/x/final_model"


def test_diagnose_empty_and_missing(tmp_path):
    d = L.diagnose(tmp_path)
    assert d.failed_stage == "no logs"
    with pytest.raises(FileNotFoundError, match="job list"):
        L.diagnose(tmp_path / "nope")


def test_cli(tmp_path):
    (tmp_path / "server.log").write_text(SERVER_OK)
    (tmp_path / "eval_libero_spatial.log").write_text(eval_log())

    def run(*a):
        return subprocess.run(
            [sys.executable, "-m", "tutorial_utils", "logs", *a], capture_output=True, text=True, timeout=60
        )

    ok = run("diagnose", str(tmp_path))
    assert ok.returncode == 0 and "verdict: OK" in ok.stdout
    js = run("diagnose", str(tmp_path), "--json")
    assert json.loads(js.stdout)["ok"] is True
    (tmp_path / "eval_libero_spatial.log").write_text(eval_log(finish=False))
    bad = run("diagnose", str(tmp_path))
    assert bad.returncode == 1 and "evaluation" in bad.stdout
    parsed = run("parse", "eval", str(tmp_path / "eval_libero_spatial.log"))
    assert json.loads(parsed.stdout)["episodes"] == 3


def test_parse_losses_reads_upstream_metrics_with_the_stray_paren():
    text = "{'action_dit_loss': 0.5, 'learning_rate/action_model': 0.0001, 'data_time': 1.2, 'epoch': 0.0})"
    assert L.parse_losses(text) == {
        "action_dit_loss": 0.5,
        "learning_rate/action_model": 0.0001,
        "data_time": 1.2,
        "epoch": 0.0,
    }
    # not a Python literal (a tensor repr): the fallback keeps keys with a slash too
    assert L.parse_losses("{'total_loss': tensor(0.9), 'learning_rate/backbone': 1e-05})") == {
        "total_loss": 0.9,
        "learning_rate/backbone": 1e-05,
    }


def test_train_signs_are_read_one_way_from_our_log_and_upstreams():
    """The train job, the diagnosis of our log and of upstream's all take their signs from train_signs."""
    lines = [
        L.TRAIN_TOTAL_PARAMS.format(n=1000, m=0.001),
        L.TRAIN_STEP_LOSS.format(run_id="r", step=1, losses="total_loss: 0.5"),
        L.TRAIN_COMPLETE.format(path="/x/final_model"),
    ]
    for k in range(4):
        signs = L.train_signs(L.parse_train_log("\n".join(lines[:k]) + "\n"))
        assert list(signs) == list(L.TRAIN_SIGNS) and list(signs.values()) == [True] * k + [False] * (3 - k)
