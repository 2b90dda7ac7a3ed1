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
