"""Secrets (Hugging Face tokens) never reach stdout, logs, notebooks or git.

The book only ever reports whether a token is *set*. As a second line of defence, every file
the package writes from a job (executed notebooks, logs, status files) passes through
:func:`redact`, which replaces the value of any token present in the environment.
"""

from __future__ import annotations

import os
import re

#: Environment variables that hold secrets.
SECRET_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "WANDB_API_KEY")
_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{30,}")
MASK = "***"


def presence() -> dict[str, str]:
    """``{"HF_TOKEN": "set" | "missing", ...}``: never the value."""
    return {k: ("set" if os.environ.get(k) else "missing") for k in SECRET_VARS}


def secret_values() -> list[str]:
    vals = {os.environ.get(k, "") for k in SECRET_VARS}
    return sorted((v for v in vals if len(v) >= 8), key=len, reverse=True)


def redact(text: str) -> str:
    """Replace every secret value from the environment, and anything shaped like an HF token."""
    for v in secret_values():
        text = text.replace(v, MASK)
    return _TOKEN_RE.sub(MASK, text)


def scrubbed_env(extra_remove: tuple[str, ...] = ()) -> dict[str, str]:
    """A copy of the environment without the secret variables (for child processes that do
    not need them, e.g. a policy server that only loads local files)."""
    env = dict(os.environ)
    for k in SECRET_VARS + extra_remove:
        env.pop(k, None)
    return env
