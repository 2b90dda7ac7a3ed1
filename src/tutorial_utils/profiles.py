"""Run sizes. Every notebook's ``parameters`` cell takes its defaults from here.

``TUTORIAL_PROFILE`` picks one of:

- ``ci``  (default): smoke sizes, seconds to a few minutes on a 2-core CPU. CI and the book build.
- ``cpu``: the real CPU path (recording, training and evaluation of the mini policy), tens of minutes.
- ``gpu``: a GPU server (bigger images, batches and trial counts; the ``dit4dit`` backend).

papermill's ``-p name value`` overrides any single parameter on top of the profile.

A job's parameters declare their per-profile values on their config class
(``tutorial_utils.params.param(ci_value, help, cpu=..., gpu=...)``); :func:`pick` is what the
generated ``parameters`` cells and the chapters' own cells call.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

PROFILES = ("ci", "cpu", "gpu")
ENV_VAR = "TUTORIAL_PROFILE"
T = TypeVar("T")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


_UNSET: Any = _Unset()


def current() -> str:
    """The active profile; a clear error for an unknown value."""
    name = os.environ.get(ENV_VAR, "ci").strip().lower() or "ci"
    if name not in PROFILES:
        raise ValueError(
            f"{ENV_VAR}={name!r} is not a profile; use one of {', '.join(PROFILES)} "
            f"(for example `{ENV_VAR}=cpu make book`)."
        )
    return name


def pick(ci: T, cpu: T = _UNSET, gpu: T = _UNSET) -> T:
    """The value for the active profile. An omitted ``cpu`` falls back to ``ci``, an omitted ``gpu``
    to ``cpu``. ``None`` is a value like any other (``pick(ci=20, cpu=None)`` is None under cpu:
    "no override", never "fall back to ci")."""
    name = current()
    cpu = ci if cpu is _UNSET else cpu
    if name == "ci":
        return ci
    if name == "cpu":
        return cpu
    return cpu if gpu is _UNSET else gpu
