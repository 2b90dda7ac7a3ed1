"""The one base class of the package's teaching errors, and the dataset error every stage shares.

Every error the package raises on purpose derives from :class:`TutorialError` (and from the
builtin it behaves like: ``ValueError`` for bad input, ``RuntimeError`` for a failed step), so a
CLI or a notebook can catch them all at once and print the message: it already names the file,
the key and the fix.
"""

from __future__ import annotations

import os


class TutorialError(Exception):
    """Base class of the package's errors; the message names what is wrong and how to fix it."""


class DatasetError(TutorialError, ValueError):
    """A dataset problem, phrased as: which file, which key, what was found, how to fix it."""

    def __init__(self, file: str | os.PathLike, key: str | None, problem: str, fix: str):
        self.file, self.key, self.problem, self.fix = str(file), key, problem, fix
        where = f"{file}" + (f" [{key}]" if key else "")
        super().__init__(f"{where}: {problem}. Fix: {fix}")


class ConfigError(TutorialError, ValueError):
    """A bad job parameter (unknown name, wrong type, out of range)."""
