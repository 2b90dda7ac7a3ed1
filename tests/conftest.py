"""Shared test set-up: the `ci` profile, one torch thread, runs and data in temporary folders, and
the `slow` mark from measured durations (``tests/durations.json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TUTORIAL_PROFILE", "ci")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

#: each test's measured duration (its call, seconds, on the 2-core build machine, two xdist
#: workers), written by ``make test-durations`` (``pytest --record-durations``)
DURATIONS = Path(__file__).with_name("durations.json")
#: a test measured at this or longer is marked ``slow`` and left out of ``make test-quick``
SLOW_S = 2.0
#: durations below this are not kept in the file (they never make a test slow)
KEEP_S = 0.5


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write each test's call duration into {DURATIONS.name} (the slow marks come from it)",
    )


def measured_durations() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def pytest_collection_modifyitems(config, items):
    measured = measured_durations()
    for item in items:
        if measured.get(item.nodeid, 0.0) >= SLOW_S and "slow" not in item.keywords:
            item.add_marker(pytest.mark.slow)


_DURATIONS_SEEN: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "call":
        _DURATIONS_SEEN[report.nodeid] = round(report.duration, 2)


def pytest_sessionfinish(session, exitstatus):
    if not session.config.getoption("record_durations") or hasattr(session.config, "workerinput"):
        return
    from tutorial_utils.secrets import redact

    merged = {**measured_durations(), **_DURATIONS_SEEN}
    kept = {k: v for k, v in sorted(merged.items(), key=lambda kv: -kv[1]) if v >= KEEP_S}
    if leaked := [k for k in kept if redact(k) != k]:
        raise pytest.UsageError(
            f"{DURATIONS.name} not written: test ids that look like a secret (a token as a parameter): "
            f"{[k.split('[')[0] for k in leaked]}. Fix: give that parametrize ids=[...] names"
        )
    DURATIONS.write_text(json.dumps(kept, indent=0) + "\n")


def write_notebook(path: Path, cells: list[tuple[str, str]], params: str | None = None) -> Path:
    """Write a MyST notebook: ``cells`` are (kind, source) with kind 'md' or 'code'; ``params``
    becomes the first code cell, tagged `parameters`."""
    head = (
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
        "    format_version: 0.13\n    jupytext_version: 1.19.6\nkernelspec:\n"
        "  display_name: Python 3 (ipykernel)\n  language: python\n  name: python3\n---\n\n"
    )
    body = []
    if params is not None:
        body.append("```{code-cell} ipython3\n:tags: [parameters]\n\n" + params.strip() + "\n```\n")
    for kind, src in cells:
        body.append(src.strip() + "\n" if kind == "md" else "```{code-cell} ipython3\n" + src.strip() + "\n```\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + "\n".join(body))
    return path


@pytest.fixture
def registry():
    """The policy registry, restored after the test: a test may ``register`` families of its own
    without leaving them behind for the tests that run after it."""
    from tutorial_utils import policies

    saved = dict(policies._REGISTRY)
    try:
        yield policies
    finally:
        policies._REGISTRY.clear()
        policies._REGISTRY.update(saved)


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """Point tutorial_utils.paths.RUNS at a temporary folder."""
    from tutorial_utils import paths

    d = tmp_path / "runs"
    monkeypatch.setattr(paths, "RUNS", d)
    return d


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs at ``tmp_path/disk`` (unmounted afterwards)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs here ({res.stderr.strip() or 'not root'}): the disk-full cases need one"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
