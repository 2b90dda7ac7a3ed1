"""The reader's other two doors: JupyterLab on the chapters, and a copy of the built site.

- ``make lab`` (``python -m tutorial_utils lab [--port N] [--new-token]``): JupyterLab on this
  repository. The chapters are MyST ``.md`` files; jupytext's contents manager opens them as
  notebooks and saves them back to the ``.md`` (and its git-ignored ``.ipynb`` twin, as
  ``jupytext.toml`` pairs them). The server runs on this virtual environment's Python, so the
  kernel is the ``.venv`` one; it listens on 127.0.0.1 only, and its token lives in a 0600 file
  (:data:`TOKEN_FILE`) that is never printed: the server reads it through ``JUPYTER_TOKEN_FILE``
  and logs ``?token=...``. From a laptop, tunnel the port: ``ssh -L 8888:127.0.0.1:8888 server``.
- ``make publish DEST=DIR`` (``python -m tutorial_utils lab publish DIR``): copy ``_build/html``
  into ``DIR``, built beside it under a temporary name and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tutorial_utils import paths
from tutorial_utils.errors import TutorialError
from tutorial_utils.io import atomic_dir, atomic_path, atomic_write_text
from tutorial_utils.jobs import free_port  # noqa: F401  (re-exported: callers use it from here)

#: The token file: 0600, created on first use, reused so a bookmarked URL keeps working.
TOKEN_FILE = paths.REPO / ".make" / "lab_token"
#: Generated JupyterLab settings (git-ignored with the rest of ``.make/``).
LAB_DIR = paths.REPO / ".make" / "lab"
HOST = "127.0.0.1"
DEFAULT_PORT = 8888
#: jupytext's contents manager (jupytext >= 1.16 also enables it as a server extension; naming
#: it here makes the set-up independent of which server extensions happen to be enabled), with
#: the kernel's ``language_info`` added to opened notebooks so that opening a chapter does not
#: mark it modified (:mod:`tutorial_utils.report.lab_contents`)
CONTENTS_MANAGER = "tutorial_utils.report.lab_contents.BookContentsManager"
#: jupytext's notebook view for the file types of the chapters, so a double click on a ``.md``
#: opens a notebook (JupyterLab's default for ``.md`` is the text editor); and no calls to the
#: internet for news or updates (a GPU server often has no way out).
SETTINGS_OVERRIDES = {
    "@jupyterlab/docmanager-extension:plugin": {
        "defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}
    },
    "@jupyterlab/apputils-extension:notification": {"checkForUpdates": False, "fetchNews": "false"},
}
#: a marker in every folder ``publish`` writes: only such a folder is ever replaced
PUBLISH_MARKER = ".tutorial-book-site"


class LabError(TutorialError, RuntimeError):
    """The lab server could not start, or a publish destination is unsafe."""


# --- token and settings -------------------------------------------------------------------------
def ensure_token(path: Path = TOKEN_FILE, renew: bool = False) -> Path:
    """The token file at ``path``, created (mode 0600) when missing or when ``renew``.

    An existing file readable by others is made private again. Returns the path, never the token.
    """
    path = Path(path)
    text = path.read_text() if path.is_file() else ""
    token = "" if renew else text.strip()
    if not token or text != token:
        # Jupyter reads JUPYTER_TOKEN_FILE verbatim: no newline, or the token would not match
        with atomic_path(path) as tmp:  # mkstemp: the file is 0600 from the start
            os.chmod(tmp, 0o600)
            tmp.write_text(token or secrets.token_hex(24))
    elif path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    return path


def read_token(path: Path = TOKEN_FILE) -> str:
    """The token in ``path`` (for a program talking to the server; never print it)."""
    return Path(path).read_text().strip()


def write_settings(lab_dir: Path = LAB_DIR) -> Path:
    """Write :data:`SETTINGS_OVERRIDES` as ``overrides.json``; returns the settings folder, which
    becomes JupyterLab's ``app_settings_dir``. A user's own settings still take precedence."""
    settings = Path(lab_dir) / "settings"
    atomic_write_text(settings / "overrides.json", json.dumps(SETTINGS_OVERRIDES, indent=2) + "\n")
    return settings


def header_survives_save(chapter: Path) -> bool:
    """Whether saving ``chapter`` from JupyterLab keeps its jupytext/kernelspec header: the
    contents manager writes with the options of the nearest ``jupytext.toml``, and a
    ``notebook_metadata_filter`` of ``"-all"`` drops the header (the book then no longer sees a
    notebook). Checked with jupytext's own configuration loader and writer."""
    import jupytext
    from jupytext.config import find_jupytext_configuration_file, load_jupytext_configuration_file

    chapter = Path(chapter)
    config_file = find_jupytext_configuration_file(os.fspath(chapter.parent))
    fmt = {"extension": chapter.suffix, "format_name": "myst"}
    if config_file:
        load_jupytext_configuration_file(config_file).set_default_format_options(fmt)
    text = jupytext.writes(jupytext.read(chapter), fmt=fmt)
    return "\nkernelspec:" in text and text.startswith("---\n")


def myst_renderer() -> bool:
    """Whether JupyterLab can render the chapters' MyST (roles, directives, admonitions): the
    ``jupyterlab-myst`` extension (requirements.txt) is installed in this environment. Without
    it the chapters still open and run; their MyST shows as plain Markdown text."""
    return (Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyterlab-myst").is_dir()


# --- the server -----------------------------------------------------------------------------------
def command(
    root: Path = paths.REPO, port: int = DEFAULT_PORT, settings_dir: Path | None = None, python: str | None = None
) -> list[str]:
    """The JupyterLab command line: this Python (so the ``python3`` kernel is this venv's),
    127.0.0.1, exactly ``port`` (no silent move to another port the tunnel does not forward),
    no browser, the repository as the root, jupytext's contents manager."""
    cmd = [
        python or sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={int(port)}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={Path(root)}",
        f"--ServerApp.contents_manager_class={CONTENTS_MANAGER}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--ServerApp.allow_root=True")  # containers on GPU servers often run as root
    if settings_dir is not None:
        cmd.append(f"--LabApp.app_settings_dir={Path(settings_dir)}")
    return cmd


def environment(token_file: Path = TOKEN_FILE, base: dict | None = None) -> dict[str, str]:
    """The server's environment (kernels inherit it): the token by file, never by value; this
    venv's ``bin`` first on PATH (``!pip``, ``jupytext``, ``python`` in cells); the ``ci``
    profile unless ``TUTORIAL_PROFILE`` says otherwise."""
    env = dict(os.environ if base is None else base)
    env.pop("JUPYTER_TOKEN", None)  # it would win over the file
    env["JUPYTER_TOKEN_FILE"] = os.fspath(token_file)
    venv_bin = os.fspath(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    env.setdefault("TUTORIAL_PROFILE", "ci")
    return env


def port_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


def check_port(port: int) -> None:
    if not port_free(port):
        raise LabError(
            f"port {port} on {HOST} is taken (another lab, or another user of this server): "
            "choose another with `make lab LAB_PORT=8890` (and tunnel that port)"
        )


def instructions(port: int, token_file: Path = TOKEN_FILE) -> str:
    """What ``make lab`` prints: where to point the browser, how to read the token, the tunnel."""
    url = f"http://{HOST}:{port}/lab"
    return "\n".join(
        [
            f"JupyterLab on {url} (this machine only), root {paths.REPO}",
            "  chapters: notebooks/*.md open as notebooks (double click); saving writes the .md back",
            f"  token: in {token_file} (mode 0600, never printed); the full URL with it:",
            f'    echo "{url}?token=$(cat {token_file})"',
            f"  from a laptop, tunnel the port first, then open {url} there:",
            f"    ssh -N -L {port}:{HOST}:{port} user@gpu-server",
            "  stop it with Ctrl-C (twice)",
            *(
                []
                if myst_renderer()
                else [
                    "  note: jupyterlab-myst is not installed: MyST roles show as text (pip install -r requirements.txt)"
                ]
            ),
        ]
    )


def start(
    root: Path = paths.REPO,
    port: int = DEFAULT_PORT,
    token_file: Path = TOKEN_FILE,
    lab_dir: Path = LAB_DIR,
    env: dict | None = None,
    **popen,
) -> subprocess.Popen:
    """Start the server in the background exactly as ``make lab`` does (tests use this)."""
    check_port(port)
    ensure_token(token_file)
    cmd = command(root, port, write_settings(lab_dir))
    return subprocess.Popen(cmd, env=environment(token_file, env), **popen)


def wait_ready(port: int, token_file: Path = TOKEN_FILE, timeout: float = 90, proc=None) -> dict:
    """Poll ``/api/status`` (authenticated) until the server answers; its JSON."""
    req = urllib.request.Request(
        f"http://{HOST}:{port}/api/status", headers={"Authorization": f"token {read_token(token_file)}"}
    )
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise LabError(f"the lab server exited with code {proc.returncode} before it answered on port {port}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise LabError(f"the lab server on port {port} answered {e.code} to its own token ({token_file})") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise LabError(f"the lab server did not answer on port {port} within {timeout:.0f} s") from None
            time.sleep(0.5)


# --- publishing -----------------------------------------------------------------------------------
#: inside the repository, only these folders may receive a published copy (everything else
#: there is source)
PUBLISH_ALLOWED_IN_REPO = ("_build",)


def check_publish_dest(dest: Path, site: Path, repo: Path = paths.REPO) -> Path:
    """``dest`` resolved, or a :class:`LabError` when publishing there could destroy something:
    the repository or a folder above it, a source folder inside it, the site itself, or an
    existing non-empty folder that ``publish`` did not write."""
    dest, site, repo = Path(dest).expanduser().resolve(), Path(site).resolve(), Path(repo).resolve()
    if repo.is_relative_to(dest):
        raise LabError(f"DEST={dest} is the repository or a folder above it: choose a folder outside {repo}")
    if dest.is_relative_to(site) or site.is_relative_to(dest):
        raise LabError(f"DEST={dest} overlaps the built site {site}: choose another folder")
    if dest.is_relative_to(repo) and not any(dest.is_relative_to(repo / d) for d in PUBLISH_ALLOWED_IN_REPO):
        raise LabError(
            f"DEST={dest} is inside the repository's source folders: choose a folder outside {repo} "
            f"(or under {repo / '_build'})"
        )
    if dest.exists():
        if not dest.is_dir():
            raise LabError(f"DEST={dest} exists and is not a folder: remove it or choose another")
        if any(dest.iterdir()) and not (dest / PUBLISH_MARKER).is_file():
            raise LabError(
                f"DEST={dest} is a non-empty folder that `make publish` did not write (no {PUBLISH_MARKER}): "
                "empty it or choose another; it is never overwritten"
            )
    return dest


def publish(dest: str | os.PathLike, site: Path = paths.BUILD / "html") -> Path:
    """Copy the built site into ``dest``: built beside it under a temporary name, then renamed
    over it, so a web server never serves half a site. Adds ``.nojekyll`` (GitHub Pages from a
    folder or branch serves ``_static/`` only then) and the :data:`PUBLISH_MARKER`."""
    site = Path(site)
    if not (site / "index.html").is_file():
        raise LabError(f"{site / 'index.html'} is missing: build the book first (`make html`)")
    dest = check_publish_dest(Path(dest), site)
    with atomic_dir(dest) as tmp:
        os.chmod(tmp, 0o755)  # mkdtemp made it 0700: a web server must be able to read it
        shutil.copytree(site, tmp, dirs_exist_ok=True)
        (tmp / ".nojekyll").write_text("")
        (tmp / PUBLISH_MARKER).write_text(f"a copy of {site}, written by `make publish`; replaced by the next one\n")
    return dest


# --- the command ----------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        argv = ["start", *argv]
    ap = argparse.ArgumentParser(prog="python -m tutorial_utils lab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="JupyterLab on the chapters (default)")
    s.add_argument("--port", type=int, default=int(os.environ.get("LAB_PORT") or DEFAULT_PORT))
    s.add_argument("--new-token", action="store_true", help="replace the token (old URLs stop working)")
    p = sub.add_parser("publish", help="copy _build/html into a folder")
    p.add_argument("dest", type=Path)
    p.add_argument("--site", type=Path, default=paths.BUILD / "html")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "publish":
            print(f"published {args.site} -> {publish(args.dest, args.site)}")
            return 0
        check_port(args.port)
        token_file = ensure_token(TOKEN_FILE, renew=args.new_token)
        cmd = command(paths.REPO, args.port, write_settings(LAB_DIR))
    except LabError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 2
    print(instructions(args.port, token_file), flush=True)
    chapter = paths.NOTEBOOKS / "03_dataset.md"
    if chapter.is_file() and not header_survives_save(chapter):
        print(
            "  WARNING: saving a chapter here would drop its jupytext/kernelspec header: jupytext.toml's "
            'notebook_metadata_filter should be "jupytext,kernelspec,-all"',
            flush=True,
        )
    os.execve(cmd[0], cmd, environment(token_file))
    return 0  # not reached: the server replaced this process
