"""Generated shell scripts are safe for every byte a path can hold (issue 26): `bridge commands`
with a runs_dir and a run_id holding newlines, quotes, `$` and backticks writes a commands.sh that
bash runs with those paths as names; nothing in them runs as a command. The full chain against the
fake upstream with such names is in tests/test_bridge.py (test_chapter7_commands_sh_runs_as_printed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tutorial_utils.bridge import commands as C
from tutorial_utils.errors import ConfigError

HOSTILE = [
    "a\ntouch PWNED_NL\nb",
    "q'uote\"d",
    "$(touch PWNED_SUBST)",
    "`touch PWNED_TICK`",
    "$HOME${IFS}x",
    "semi;touch PWNED_SEMI #",
    "tab\there\rcr",
    "\\\ntouch PWNED_CONT",
]


@pytest.mark.parametrize("where", ["run_id", "runs_dir"])
@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_commands_sh_runs_hostile_names_as_names(tmp_path, where, name):
    runs = tmp_path / "runs"
    kw = {"run_id": name} if where == "run_id" else {"runs_dir": str(runs / name)}
    cfg = C.BridgeConfig(checkout=str(tmp_path / "co"), models_dir=str(tmp_path / "m"), runs_dir=str(runs),
                         data_dir=str(tmp_path / "d"), model_python="/bin/true", libero_python="/bin/true",
                         accelerate="/bin/true")  # fmt: skip
    cfg = C.BridgeConfig(**{**cfg.__dict__, **kw})
    (tmp_path / "co").mkdir()
    script = C.dry_run(cfg)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    res = subprocess.run(["bash", str(script)], cwd=cwd, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)  # fmt: skip
    # every step ran with /bin/true: the server "exits before listening", the script stops there
    assert res.returncode == 1 and "the policy server exited before listening" in res.stderr, res.stderr
    assert not [p for p in tmp_path.rglob("PWNED*")], "a path was run as a command"
    run_dir = Path(cfg.resolved().run_dir)
    assert run_dir.is_dir() and (run_dir / "train.log").is_file()  # the name, byte for byte
    parsed = C.parse_commands_sh(script.read_bytes().decode())  # no newline translation: a \r stays
    assert parsed["train"].argv == C.train_command(cfg).argv and parsed["train"].log == C.train_command(cfg).log


def test_a_path_that_is_not_utf8_is_refused(tmp_path):
    cfg = C.BridgeConfig(checkout=str(tmp_path), models_dir=str(tmp_path), runs_dir=str(tmp_path / "r\udcfe"),
                         model_python="/bin/true")  # fmt: skip
    with pytest.raises(ConfigError, match="not UTF-8"):
        C.dry_run(cfg)
