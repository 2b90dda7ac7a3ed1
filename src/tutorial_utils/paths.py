"""Where things live. Every notebook and job uses these instead of relative paths, so a
notebook runs the same from the repo, from a temporary folder (nbmake) or under papermill."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (``src/tutorial_utils/paths.py`` -> three levels up).
REPO = Path(os.environ.get("TUTORIAL_REPO", Path(__file__).resolve().parents[2])).resolve()
#: Run directories of jobs (git-ignored). ``TUTORIAL_RUNS_DIR`` moves them to a data disk.
RUNS = Path(os.environ.get("TUTORIAL_RUNS_DIR", REPO / "runs")).resolve()
#: Datasets recorded or downloaded by the book (git-ignored). ``TUTORIAL_DATA_DIR`` moves them.
DATA = Path(os.environ.get("TUTORIAL_DATA_DIR", REPO / "data")).resolve()
#: Small real logs promoted from runs and embedded by the book (tracked).
LOGS = REPO / "logs"
#: SVG diagrams, small videos and images promoted from runs (tracked).
ASSETS = REPO / "assets"
NOTEBOOKS = REPO / "notebooks"
JOBS = NOTEBOOKS / "jobs"
BUILD = REPO / "_build"
#: Where a reader's ``make book`` promotes its own runs (git-ignored): ``logs/`` and ``assets/``
#: below it mirror the shipped reference in :data:`LOGS` and :data:`ASSETS`, and pages prefer them
#: (:func:`tutorial_utils.report.provenance.find`). ``TUTORIAL_PROMOTED_DIR`` moves it.
PROMOTED = Path(os.environ.get("TUTORIAL_PROMOTED_DIR", BUILD / "promoted")).resolve()


def _elsewhere() -> list[tuple[str, str]]:
    """This machine's other folders a page may name, most specific first: the Hugging Face cache,
    the temporary folder, the home directory."""
    import tempfile

    home = os.path.expanduser("~")
    hf = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or f"{home}/.cache", "huggingface")
    tmp = {tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())}
    out = [(hf, "$HF_HOME")] + [(t, "$TMPDIR") for t in sorted(tmp, key=len, reverse=True)]
    return [(p.rstrip(os.sep), name) for p, name in out if p and p != os.sep] + (
        [(home, "~")] if home != os.sep else []
    )


def _replace_folder(text: str, folder: str, name: str) -> str:
    """``folder`` -> ``name`` where it is a whole path component (``/tmp`` in ``/tmp/x``, not ``/tmpfoo``)."""
    import re

    return re.sub(re.escape(folder) + r"(?=/|\\|$|[\s'\"),:;\]])", lambda _: name, text)


def for_book(value):
    """``value`` (a string, or JSON-like dicts and lists of them) with this machine's locations
    made portable, for logs and results promoted into the book and for what a page prints: paths
    under the repository become relative (``runs/...``, ``data/...``), a runs or data folder moved
    outside it (``TUTORIAL_RUNS_DIR``, ``TUTORIAL_DATA_DIR``) is written as
    ``$TUTORIAL_RUNS_DIR/...``, and the Hugging Face cache, the temporary folder and the home
    directory as ``$HF_HOME``, ``$TMPDIR`` and ``~``."""
    if isinstance(value, str):
        for base, name in ((RUNS, "$TUTORIAL_RUNS_DIR"), (DATA, "$TUTORIAL_DATA_DIR")):
            if not base.is_relative_to(REPO):
                value = _replace_folder(value, os.fspath(base), name)
        value = value.replace(f"{REPO}{os.sep}", "")
        value = _replace_folder(value, os.fspath(REPO), ".")
        for folder, name in _elsewhere():
            value = _replace_folder(value, folder, name)
        return value
    if isinstance(value, dict):
        return {k: for_book(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [for_book(v) for v in value]
    return value


def from_book(path: str | os.PathLike) -> Path:
    """The inverse of :func:`for_book` for one path: ``$TUTORIAL_RUNS_DIR/...`` and
    ``$TUTORIAL_DATA_DIR/...`` under this machine's folders, a relative path under the repository."""
    text = os.fspath(path)
    for base, name in ((RUNS, "$TUTORIAL_RUNS_DIR/"), (DATA, "$TUTORIAL_DATA_DIR/")):
        if text.startswith(name):
            return base / text[len(name) :]
    for folder, name in _elsewhere():
        if text == name or text.startswith(name + "/"):
            return Path(folder + text[len(name) :])
    p = Path(text)
    return p if p.is_absolute() else REPO / p
