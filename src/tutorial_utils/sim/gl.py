"""Offscreen OpenGL for MuJoCo: which backend (EGL, OSMesa) works here, and the fix when none does.

Each probe opens a MuJoCo offscreen context in a child process (a failing GL library can abort
the process that loads it). Used by :mod:`tutorial_utils.sim.libero_env` to choose ``MUJOCO_GL``
and by the doctor (``python -m tutorial_utils doctor``, :mod:`tutorial_utils.report.doctor`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

#: MuJoCo offscreen backends and the Debian packages that provide them.
GL_PACKAGES = {"egl": "libegl1 libegl-mesa0 libgl1-mesa-dri", "osmesa": "libosmesa6"}
_GL_PROBE = "import mujoco\nctx = mujoco.GLContext(32, 32)\nctx.make_current()\nctx.free()\nprint('ok')\n"


def probe_gl(backend: str, timeout: float = 60.0) -> tuple[bool, str]:
    """Try a MuJoCo offscreen context with ``MUJOCO_GL=backend`` in a child process."""
    if backend not in GL_PACKAGES:
        raise ValueError(f"unknown GL backend {backend!r}; use one of {', '.join(GL_PACKAGES)}")
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        out = subprocess.run(
            [sys.executable, "-c", _GL_PROBE], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    if out.returncode == 0 and out.stdout.strip().endswith("ok"):
        return True, "works"
    lines = [ln for ln in (out.stderr or out.stdout).strip().splitlines() if ln.strip()]
    return False, lines[-1] if lines else f"exit code {out.returncode}"


def gl_failure_kind(detail: str) -> tuple[str, str]:
    """(kind, name) of a failed GL probe: ``("module", "mujoco")`` when a Python module is not
    importable (a pip problem), else ``("library", "")``: a system library or GL driver problem."""
    import re

    m = re.search(r"No module named '([^']+)'", detail or "")
    if m:
        return "module", m.group(1).split(".")[0]
    return "library", ""


def gl_backends(backends: tuple[str, ...] = ("egl", "osmesa")) -> dict[str, dict[str, Any]]:
    out = {}
    for b in backends:
        ok, detail = probe_gl(b)
        out[b] = {
            "ok": ok,
            "detail": detail,
            "package": GL_PACKAGES[b],
            "kind": None if ok else gl_failure_kind(detail)[0],
        }
    return out


def gl_verdict(results: dict[str, dict[str, Any]]) -> tuple[str | None, str]:
    """The backend to use and a message; when none works, the fix for the kind of failure: a
    Python module that is not importable (pip, in this interpreter) is not a missing system
    library (the Debian GL packages)."""
    working = [b for b, r in results.items() if r["ok"]]
    if working:
        return working[0], f"MuJoCo renders offscreen with MUJOCO_GL={working[0]}"
    modules = sorted({gl_failure_kind(r.get("detail", ""))[1] for r in results.values()} - {""})
    if modules:
        names = " ".join(modules)
        return None, (
            f"the Python module {', '.join(modules)} is not importable by {sys.executable} (a Python package, "
            f"not a system library): install it into this environment with `{sys.executable} -m pip install "
            f"{names}` (or `pip install -r requirements.txt`), then rerun `python -m tutorial_utils doctor`"
        )
    pkgs = " ".join(GL_PACKAGES[b] for b in results)
    details = "; ".join(f"{b}: {r.get('detail', '')}" for b, r in results.items())
    return None, (
        f"no offscreen GL backend works ({details}): a system GL library is missing; install the Debian "
        f"packages with `sudo apt-get install -y {pkgs}`"
    )
