"""SmolVLA: LeRobot 0.4.4's own code on a local stand-in VLM, in its own environment (.smolvla).

The smoke test runs the real thing end to end (``python -m tutorial_utils zoo smolvla-smoke``:
stand-in written, trained by the project's trainer, checkpoint reloaded, served over the
websocket); the rest checks the errors a reader meets on the way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tutorial_utils import paths, policies
from tutorial_utils.errors import ConfigError
from tutorial_utils.policies import smolvla
from tutorial_utils.policies.base import PolicyUnavailable


@pytest.mark.slow
def test_smoke_trains_reloads_and_serves_lerobots_smolvla_on_a_standin(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "zoo", "smolvla-smoke", "--run-dir", str(run), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=paths.REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "in the SmolVLA environment (PYTHONPATH=.smolvla)" in out.stdout
    res = json.loads((run / "smolvla_smoke.json").read_text())
    # LeRobot's SmolVLA, on the transformers/hub pair only this process saw
    assert res["versions"]["lerobot"] == "0.4.4" and res["versions"]["transformers"].startswith("4.57.")
    assert res["versions"]["huggingface_hub"].startswith("0.35.")
    assert res["stand_in"]["stands_in_for"] == smolvla.HUB_VLM and "random weights" in res["stand_in"]["what"]
    assert res["stand_in"]["tasks"] and res["stand_in"]["image_size"] == 64  # the synthetic dataset's tasks and size
    assert res["steps_done"] == 2 and len(res["losses"]) == 2 and all(v > 0 for v in res["losses"])
    assert 0 < res["params"]["trainable"] < res["params"]["total"]  # train_expert_only: the VLM is frozen
    assert res["chunk_shape"] == [1, 8, 7] and res["chunk_finite"] and res["reload_repeats"]
    assert res["round_trip_ms_p50"] > 0
    cfg = json.loads((run / "train" / "checkpoints" / "last" / "config.json").read_text())
    assert cfg["family"] == "smolvla" and cfg["policy"]["vlm_model_name"] == str(run / "standin_vlm")


def test_this_venv_cannot_import_smolvlas_transformers():
    """Why .smolvla exists: if this ever passes in .venv, drop the separate folder."""
    problem = smolvla.transformers_problem()
    assert problem is not None and "zoo smolvla-smoke" in problem


def test_a_standin_in_this_venv_says_how_to_run_it(tmp_path):
    (tmp_path / smolvla.STANDIN_FILE).write_text("{}")
    with pytest.raises(PolicyUnavailable, match="zoo smolvla-smoke"):
        policies.make("smolvla", {"vlm_model_name": str(tmp_path)})


def test_the_hub_vlm_still_gives_the_gpu_recipe():
    with pytest.raises(PolicyUnavailable) as err:
        policies.make("smolvla", {"vlm_model_name": smolvla.HUB_VLM})
    msg = str(err.value)
    assert "lerobot/smolvla_base" in msg and "GPU memory:" in msg and "zoo smolvla-smoke" in msg


def test_standin_image_size_must_be_a_multiple_of_32(tmp_path):
    with pytest.raises(ConfigError, match="multiple of 32"):
        smolvla.write_standin(tmp_path, ["pick up the bowl"], image_size=100)


def test_missing_environment_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(smolvla, "ENV_DIR", tmp_path / "absent")
    with pytest.raises(PolicyUnavailable, match="make setup"):
        smolvla.environment()
