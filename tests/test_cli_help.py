"""Every command of ``python -m tutorial_utils`` answers ``--help`` (an argparse help string with a
bare ``%`` breaks only there, so nothing else would notice)."""

from __future__ import annotations

import contextlib
import importlib
import io

import pytest

from tutorial_utils.cli import COMMANDS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_of_every_command(name):
    module = importlib.import_module(COMMANDS[name][0])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            rc = module.main(["--help"])
        except SystemExit as exc:
            rc = exc.code
    assert rc in (0, None), f"{name} --help exited {rc}"
    assert "usage" in out.getvalue().lower(), f"{name} --help printed no usage: {out.getvalue()[:200]!r}"
