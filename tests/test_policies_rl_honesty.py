"""TD-MPC and SAC say exactly what ran: `train policy=sac` stops with a teaching error (never a
crash), the code's docstrings agree on what the trainer trains, and no message sends a reader to a
chapter that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tutorial_utils import policies
from tutorial_utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tutorial_utils"


def test_train_policy_sac_is_a_teaching_error_before_anything_is_written(tmp_path, capsys):
    from tutorial_utils.train.cli import main
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.loop import train

    out = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        train(TrainConfig.from_overrides({"policy": "sac", "steps": 1, "output_dir": str(out)}))
    text = str(err.value)
    for what in (
        "not trained by `python -m tutorial_utils train`",  # what does not work
        "three networks",  # why
        "2 update steps",  # what ran
        "24-frame synthetic source",
        "never been trained on the recorded demonstrations",
        "never evaluated",
        "SACPolicy.update",  # what works
        "lerobot.rl.learner",  # where to go
    ):
        assert what in text, what
    families = text.rsplit("pick a family the trainer trains: ", 1)[1].rstrip(".").split(", ")
    assert "tdmpc" in families and "mini" in families and "sac" not in families
    assert not out.exists()  # refused before the run directory exists

    assert main(["--output-dir", str(tmp_path / "cli"), "policy=sac", "steps=1"]) != 0
    err_text = capsys.readouterr().err
    assert "not trained by" in err_text and "Traceback" not in err_text


def test_the_trainer_refuses_only_sac():
    assert policies.trainer_refusal("sac")
    for name in ("mini", "mlp", "act", "diffusion", "vqbet", "tdmpc"):
        assert policies.trainer_refusal(name) == "", name


def test_docstrings_agree_that_the_trainer_trains_tdmpc_and_say_what_ran():
    from tutorial_utils.policies import lerobot_rl

    docs = {
        "policies.trainable": policies.trainable.__doc__,
        "policies module": policies.__doc__,
        "lerobot_rl module": lerobot_rl.__doc__,
    }
    for where, doc in docs.items():
        assert "does not feed yet" not in doc and "cannot train them yet" not in doc, where
    assert "train policy=tdmpc" in lerobot_rl.__doc__
    for doc in (lerobot_rl.__doc__, policies.__doc__):
        assert "2-step smoke test" in doc or "2 optimisation steps" in doc
        assert "never" in doc and "evaluated" in doc
    sac = policies.family("sac").what_ran
    assert "24-frame synthetic source" in sac and "never been trained on the recorded demonstrations" in sac
    assert "no SAC success rate exists" in sac
    # TD-MPC ran for real once: the docs name the promoted result it produced, and it exists
    tdmpc = policies.family("tdmpc").what_ran
    assert "evaluated in LIBERO" in tdmpc and "not been trained online" in tdmpc
    promoted = ROOT / "logs" / "positive_control_tdmpc_cpu.json"
    assert "logs/positive_control_tdmpc_cpu.json" in tdmpc and promoted.is_file()
    import json

    rows = json.loads(promoted.read_text())["rows"]
    assert [r["family"] for r in rows] == ["tdmpc"] and rows[0]["episodes"] >= 20
    # the imitation-term run: its evaluation exists, served the policy head alone, and the text says
    # what kind of result it is
    bc = ROOT / "logs" / "tdmpc_bc_eval_results.json"
    assert "logs/tdmpc_bc_eval_results.json" in tdmpc and "behaviour-cloning result" in tdmpc and bc.is_file()
    assert json.loads(bc.read_text())["total_episodes"] >= 20


def test_the_zoo_says_what_ran_instead_of_pointing_to_a_missing_chapter():
    from tutorial_utils.experiments import catalog

    with pytest.raises(ConfigError) as err:
        catalog.parse_families("sac")
    assert "chapter" not in str(err.value) and "never" in str(err.value)


def test_every_chapter_a_message_names_exists():
    chapters = {int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.md")}
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "see its chapter" not in text, path
        for m in re.finditer(r"\bchapter (\d+)\b", text, re.IGNORECASE):
            assert int(m.group(1)) in chapters, f"{path.relative_to(ROOT)}: 'chapter {m.group(1)}' does not exist"
