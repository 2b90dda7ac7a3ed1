"""The server's one parameter source: ``ServeConfig`` makes ``serve``'s options, and whoever starts a
server (the evaluation chain) builds its command line from an instance, so an option cannot drift."""

from __future__ import annotations

import dataclasses
import os

import pytest

from tutorial_utils import jobs, params
from tutorial_utils.serve.config import ServeConfig, server_argv

PROG = "python -m tutorial_utils serve"


def _parse(argv):
    return params.parse_cli(ServeConfig, argv, PROG, "test")


def test_argv_round_trips_through_the_generated_cli():
    cfg = ServeConfig(
        policy="mlp", checkpoint="/runs/x/checkpoints/last", port=0, infer_in_thread=True, max_frame_mb=2.5
    )
    argv = params.to_argv(cfg)
    assert argv == [
        "--policy", "mlp", "--checkpoint", "/runs/x/checkpoints/last", "--port", "0",
        "--infer-in-thread", "true", "--max-frame-mb", "2.5",
    ]  # fmt: skip
    assert _parse(argv) == cfg
    assert params.to_argv(ServeConfig()) == [] and _parse([]) == ServeConfig()
    full = params.to_argv(cfg, changed_only=False)
    assert "--checkpoint" in full and full[full.index("--debug") + 1] == "false"
    assert _parse(full) == cfg


def test_bool_options_are_flags_and_take_a_value():
    assert _parse(["--debug"]).debug is True
    assert _parse(["--debug", "false", "--infer-in-thread"]) == ServeConfig(debug=False, infer_in_thread=True)


def test_every_field_is_an_option_and_list_params_prints_them(capsys):
    from tutorial_utils.serve import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(ServeConfig):
        assert "--" + f.name.replace("_", "-") in out, f.name
    assert cli.main(["--list-params"]) == 0
    table = capsys.readouterr().out
    assert "| `max_frame_mb` | float | `16.0` |" in table and "| `checkpoint` | str or None | `None` |" in table


def test_a_bad_value_is_a_teaching_error(capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(["--max-frame-mb", "0"])
    assert exc.value.code == 2 and "max_frame_mb=0.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(["--port", "70000"])


def test_the_evaluation_hands_on_the_servers_fields():
    from tutorial_utils.evaluate.loop import EvalConfig

    ev = {f.name: f for f in dataclasses.fields(EvalConfig)}
    for name in ("policy", "checkpoint"):
        srv = next(f for f in dataclasses.fields(ServeConfig) if f.name == name)
        assert ev[name].metadata["help"] == srv.metadata["help"]
        assert params.profile_values(ev[name]) == params.profile_values(srv)
    assert EvalConfig().checkpoint is None and EvalConfig().port is None  # None: no override, no "" or 0


def test_the_chain_starts_the_server_with_server_argv(tmp_path, monkeypatch):
    """run_chain's server command is ServeConfig's argv (the checkpoint made absolute, a free port)."""
    from tutorial_utils.evaluate import chain
    from tutorial_utils.evaluate.loop import EvalConfig, StageFailed

    (tmp_path / "ck").mkdir()
    monkeypatch.chdir(tmp_path)
    seen = []

    class DeadServer:
        def __init__(self, cmd, **kw):
            seen.append(cmd)

        def poll(self):
            return 1  # exited at once: the chain stops at its server stage

    monkeypatch.setattr(chain.subprocess, "Popen", DeadServer)
    monkeypatch.setattr(jobs, "stop_process", lambda p, *a, **k: None)
    with pytest.raises(StageFailed):
        chain.run_chain(EvalConfig(policy="mlp", checkpoint="ck", server_timeout=5), tmp_path / "run")
    (cmd,) = seen
    assert cmd[:4] == server_argv(ServeConfig())[:4]
    got = _parse(cmd[4:])
    assert got.policy == "mlp" and got.checkpoint == os.fspath(tmp_path / "ck") and got.port > 0
    assert cmd == server_argv(got)
