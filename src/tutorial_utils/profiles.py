"""Run sizes. Every notebook's ``parameters`` cell takes its defaults from here.

``TUTORIAL_PROFILE`` picks one of:

- ``ci``  (default): smoke sizes, seconds to a few minutes on a 2-core CPU. CI and the book build.
- ``cpu``: the real CPU path (recording, training and evaluation of the mini policy), tens of minutes.
- ``gpu``: a GPU server (bigger images, batches and trial counts; the ``dit4dit`` backend).

papermill's ``-p name value`` overrides any single parameter on top of the profile.
"""

from __future__ import annotations

import os
from typing import TypeVar

PROFILES = ("ci", "cpu", "gpu")
ENV_VAR = "TUTORIAL_PROFILE"
T = TypeVar("T")


def current() -> str:
    """The active profile; a clear error for an unknown value."""
    name = os.environ.get(ENV_VAR, "ci").strip().lower() or "ci"
    if name not in PROFILES:
        raise ValueError(
            f"{ENV_VAR}={name!r} is not a profile; use one of {', '.join(PROFILES)} "
            f"(for example `{ENV_VAR}=cpu make book`)."
        )
    return name


def pick(ci: T, cpu: T | None = None, gpu: T | None = None) -> T:
    """The value for the active profile. ``cpu`` falls back to ``ci``, ``gpu`` to ``cpu``."""
    name = current()
    if name == "ci":
        return ci
    if name == "cpu":
        return ci if cpu is None else cpu
    if gpu is not None:
        return gpu
    return ci if cpu is None else cpu
