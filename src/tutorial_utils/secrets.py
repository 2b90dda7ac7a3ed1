"""Secrets (Hugging Face tokens, URL credentials) never reach stdout, logs, notebooks or git.

The book only ever reports whether a token is *set*. As a second line of defence, every file
the package writes from a job (executed notebooks, logs, status files, ``params.yaml``) and
every file promoted into the book's ``logs/`` passes through :func:`redact`, which replaces
the value of any token present in the environment, anything shaped like a Hugging Face token,
and the credentials of URLs (``scheme://user:password@host`` -> ``scheme://***@host``).
"""

from __future__ import annotations

import os
import re
from typing import Any

#: Environment variables that hold secrets.
SECRET_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "WANDB_API_KEY")
#: Other variables whose values are masked wherever they appear (GitHub tokens for the bridge).
OTHER_SECRET_VARS = ("GITHUB_TOKEN", "GH_TOKEN", "GH_ENTERPRISE_TOKEN")
#: Token shapes, masked even when not in the environment: Hugging Face (``hf_`` + letters and
#: digits: long ones, and short ones with a digit, so ``hf_hub_download`` stays), GitHub
#: (``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``, ``github_pat_``).
_TOKEN_RE = re.compile(
    r"(?<![A-Za-z0-9_])(?:hf_(?:[A-Za-z0-9]{30,}|(?=[A-Za-z]*[0-9])[A-Za-z0-9]{4,})"
    r"|gh[pousr]_[A-Za-z0-9]{8,}|github_pat_[A-Za-z0-9_]{8,})(?![A-Za-z0-9])"
)
#: An Authorization header or a bearer credential: the scheme stays, the value goes.
_AUTH_RE = re.compile(
    r"(?i)(?P<head>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|token|basic)\s+)?"
    r"|\bbearer\s+)(?P<value>[^\s\"',;}\]]{4,})"
)
#: ``scheme://userinfo@``. The user info runs to the LAST ``@`` before whitespace, a quote or
#: the next URL, so a password holding ``@`` or ``/`` is masked whole. A scheme starts only at
#: the start of a run of scheme characters and is at most 32 long: linear time on any text
#: (a long base64 image in a notebook, ``ab+ab+ab+...``).
_URL_CRED_RE = re.compile(
    r"(?P<scheme>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{0,31}://)(?P<userinfo>(?:(?!://)[^\s'\"<>`])*)@"
)
#: Prefixes of well-known access tokens (a user name like these is a credential, not a name).
_TOKEN_PREFIXES = ("hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "sk-", "xox")
MASK = "***"


def presence() -> dict[str, str]:
    """``{"HF_TOKEN": "set" | "missing", ...}``: never the value."""
    return {k: ("set" if os.environ.get(k) else "missing") for k in SECRET_VARS}


def secret_values() -> list[str]:
    vals = {os.environ.get(k, "") for k in SECRET_VARS + OTHER_SECRET_VARS}
    keep = (v for v in vals if len(v) >= 8 or (len(v) >= 4 and v.lower().startswith(_TOKEN_PREFIXES)))
    return sorted(keep, key=len, reverse=True)


def _known_secret(text: str) -> bool:
    """A secret from the environment, an already masked value, an HF token or a known token prefix."""
    return bool(
        MASK in text
        or any(v in text for v in secret_values())
        or _TOKEN_RE.search(text)
        or text.lower().startswith(_TOKEN_PREFIXES)
    )


def looks_secret(text: str) -> bool:
    """Whether ``text`` (e.g. the user name of a URL) is a token rather than a plain name: a
    known secret (:func:`_known_secret`) or a long random-looking run of letters and digits."""
    if not text:
        return False
    return _known_secret(text) or (
        len(text) >= 20 and any(c.isdigit() for c in text) and any(c.isalpha() for c in text)
    )


def mask_url_credentials(text: str, keep_user: bool = False) -> str:
    """``scheme://user:password@host`` -> ``scheme://***@host``.

    With ``keep_user`` a plain user name stays (``scheme://user:***@host``, what ``doctor``
    shows); a user name that looks like a token (:func:`looks_secret`) or a user name without a
    password (the token-as-user-name form) is masked whole. User info without ``:`` that holds
    ``/`` is a path with an ``@`` in it (``/npm/pkg@1.0``), not a credential, and is left alone.
    """

    def repl(m: re.Match) -> str:
        scheme, info = m.group("scheme"), m.group("userinfo")
        if not info or ("/" in info and ":" not in info and not _known_secret(info)):
            return m.group(0)
        user, sep, _ = info.partition(":")
        if keep_user and sep and user and "/" not in user and not looks_secret(user):
            return f"{scheme}{user}:{MASK}@"
        return f"{scheme}{MASK}@"

    return _URL_CRED_RE.sub(repl, text)


def redact(text: str, keep_url_user: bool = False) -> str:
    """Replace every secret value from the environment (HF, W&B and GitHub tokens), URL
    credentials, Authorization / bearer header values, and anything shaped like an HF or a
    GitHub token. ``keep_url_user`` keeps plain URL user names (see
    :func:`mask_url_credentials`)."""
    for v in secret_values():
        text = text.replace(v, MASK)
    text = mask_url_credentials(text, keep_user=keep_url_user)
    text = _AUTH_RE.sub(lambda m: m.group("head") + MASK, text)
    return _TOKEN_RE.sub(MASK, text)


def redact_data(obj: Any) -> Any:
    """:func:`redact` applied to every string (keys included) of nested dicts, lists and tuples
    (before they are dumped as JSON or YAML, so an escaped secret cannot slip through)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_data(k): redact_data(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_data(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact_data(v) for v in obj)
    return obj


def scrubbed_env(extra_remove: tuple[str, ...] = ()) -> dict[str, str]:
    """A copy of the environment without the secret variables (for child processes that do
    not need them, e.g. a policy server that only loads local files)."""
    env = dict(os.environ)
    for k in SECRET_VARS + extra_remove:
        env.pop(k, None)
    return env


class RedactingStream:
    """A text stream that passes every write through :func:`redact` (``python -m
    tutorial_utils`` wraps stdout and stderr in it, the last line of defence for any message
    that quotes a value holding a token). Everything else is the wrapped stream's."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
