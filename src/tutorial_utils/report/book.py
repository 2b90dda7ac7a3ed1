"""The book's machinery: which notebooks the TOC lists, their ``.ipynb`` twins, the build.

- ``python -m tutorial_utils book ipynb [--dest DIR]``: write the ``.ipynb`` twins of every
  notebook in the TOC (beside the sources by default, for Jupyter users and papermill; a
  temporary folder for nbmake). Twins are git-ignored and excluded from the book's scan.
- ``python -m tutorial_utils book build``: the Jupyter Book 1 HTML build, warnings as errors,
  so a failing notebook or a broken reference fails it.
- ``python -m tutorial_utils book vendor``: fetch the ipywidgets JavaScript (npm) into
  ``_vendor/vendor`` so saved widget state renders offline.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tutorial_utils import paths

VENDOR_ROOT = paths.REPO / "_vendor"
VENDOR_DIR = VENDOR_ROOT / "vendor"
#: The offline book's JavaScript, from npm (docs/FACTS.md section 10): package -> [(member prefix in
#: the tarball, destination folder)]. ``_vendor`` is copied into ``_static`` (html_static_path);
#: ``_vendor_extra`` into the site root (html_extra_path), where the widget manager looks for its
#: fonts relative to the notebook pages.
#: The widget manager resolves its (Font Awesome) fonts against the module that asks for them,
#: relative to the page: depending on which module loads first that is
#: ``notebooks/@jupyter-widgets/`` or ``notebooks/@jupyter-widgets/html-manager/dist/``.
WIDGET_FONT_DIRS = (
    paths.REPO / "_vendor_extra" / "notebooks" / "@jupyter-widgets",
    paths.REPO / "_vendor_extra" / "notebooks" / "@jupyter-widgets" / "html-manager" / "dist",
)
VENDOR_FILES = {
    "requirejs@2.3.7": [("package/require.js", VENDOR_DIR)],
    "@jupyter-widgets/html-manager@1.0.6": [("package/dist/embed-amd.js", VENDOR_DIR)]
    + [(f"package/dist/*.{ext}", folder) for ext in ("woff2", "woff", "ttf") for folder in WIDGET_FONT_DIRS],
    "mathjax@3.2.2": [
        ("package/es5/tex-mml-chtml.js", VENDOR_DIR / "mathjax"),
        ("package/es5/output/chtml/fonts/woff-v2/*", VENDOR_DIR / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"),
    ],
}
VENDOR_STAMP = VENDOR_ROOT / ".vendored"
JB_HEADER_KEY = "jupytext"


def _toc_entries(node) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                out.append(node[key])
        for key in ("parts", "chapters", "sections"):
            for child in node.get(key, []) or []:
                out += _toc_entries(child)
    elif isinstance(node, list):
        for child in node:
            out += _toc_entries(child)
    return out


def toc_files(root: Path = paths.REPO) -> list[Path]:
    """Every source file the TOC lists, resolved to its ``.md`` (or ``.ipynb``) file."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = []
    for entry in _toc_entries(toc):
        base = root / entry
        for cand in (base, base.with_suffix(".md"), base.with_suffix(".ipynb")):
            if cand.is_file() and cand.suffix in (".md", ".ipynb"):
                files.append(cand)
                break
        else:
            raise FileNotFoundError(
                f"_toc.yml lists {entry!r} but neither {entry}.md nor {entry}.ipynb exists under {root}"
            )
    return files


def is_notebook(path: Path) -> bool:
    """A MyST page is a notebook when its front matter has a jupytext header."""
    if path.suffix == ".ipynb":
        return True
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return False
    end = text.find("\n---", 3)
    return end > 0 and f"\n{JB_HEADER_KEY}:" in "\n" + text[3:end]


def toc_notebooks(root: Path = paths.REPO) -> list[Path]:
    return [p for p in toc_files(root) if is_notebook(p)]


def job_notebooks(root: Path = paths.REPO) -> list[Path]:
    return sorted((root / "notebooks" / "jobs").glob("*.md"))


def write_twins(dest: Path | None = None, root: Path = paths.REPO, include_jobs: bool = True) -> list[Path]:
    """Write ``.ipynb`` twins of the TOC notebooks (and job notebooks) to ``dest`` (default:
    beside each source), and into ``dest`` the :data:`EXECUTED_STAMP` a build checks before it
    reuses their executed outputs (:func:`reuse_executed`). Returns the written paths."""
    import jupytext

    sources = toc_notebooks(root) + (job_notebooks(root) if include_jobs else [])
    written = []
    for src in sources:
        if src.suffix == ".ipynb":
            continue
        rel = src.relative_to(root).with_suffix(".ipynb")
        out = (dest / rel) if dest else (root / rel)
        out.parent.mkdir(parents=True, exist_ok=True)
        nb = jupytext.read(src)
        jupytext.write(nb, out, fmt="ipynb")
        written.append(out)
    if dest is not None:  # what their outputs will depend on, for a build that reuses them
        dest.mkdir(parents=True, exist_ok=True)
        (dest / EXECUTED_STAMP).write_text(executed_fingerprint(root) + "\n")
    return written


def jb_command(root: Path = paths.REPO, builder: str = "html") -> list[str]:
    exe = Path(sys.executable).with_name("jupyter-book")
    return [os.fspath(exe), "build", os.fspath(root), "--builder", builder, "-W", "-n", "--keep-going"]


#: folders the chapters read at build time (the promoted real logs and media)
BUILD_INPUTS = ("logs", "assets", "_build/promoted")
INPUTS_STAMP = "_build/.inputs_fingerprint"


def inputs_fingerprint(root: Path = paths.REPO) -> str:
    """A hash of every file's path and contents under :data:`BUILD_INPUTS`, and of the main job's
    chain record (``runs/pipeline.json``: the dataset chapter shows the recording it names)."""
    h = hashlib.sha256()
    chain = paths.RUNS / "pipeline.json"
    if root == paths.REPO and chain.is_file():
        h.update(b"pipeline.json\0" + hashlib.sha256(chain.read_bytes()).digest())
    for folder in BUILD_INPUTS:
        base = root / folder
        for p in sorted(base.rglob("*")) if base.is_dir() else []:
            if p.is_file():
                h.update(f"{p.relative_to(root).as_posix()}\0".encode())
                h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


#: written by ``book ipynb --dest DIR`` into DIR: what the chapters' outputs depend on besides their
#: code (:func:`executed_fingerprint`); a build reuses those outputs only while it still matches
EXECUTED_STAMP = ".executed_from"


def executed_fingerprint(root: Path = paths.REPO, inputs: str | None = None) -> str:
    """:func:`inputs_fingerprint` (``inputs`` when the caller already has it) and every file of the
    ``tutorial_utils`` package the chapters call: two executions with the same fingerprint and the
    same cells print the same pages."""
    h = hashlib.sha256((inputs or inputs_fingerprint(root)).encode())
    pkg = Path(__file__).resolve().parents[1]
    for p in sorted(pkg.rglob("*.py")):
        h.update(f"{p.relative_to(pkg).as_posix()}\0".encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def reuse_executed(executed: Path, root: Path = paths.REPO, inputs: str | None = None) -> list[Path]:
    """Put the chapters that nbmake already executed (``make test-notebooks`` runs the twins in
    ``executed`` with ``--overwrite``) into the build's jupyter-cache, so the build shows exactly
    the outputs nbmake checked instead of executing every chapter a second time. A chapter is
    taken only when its twin ran every code cell without an error output, its cells are the
    source's, and ``executed`` was written from the same logs, assets and package
    (:data:`EXECUTED_STAMP`); anything else is executed by the build as usual. Returns the
    chapters taken. ``inputs``: :func:`inputs_fingerprint`, when the caller already computed it."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from myst_nb.core.read import read_myst_markdown_notebook

    stamp = executed / EXECUTED_STAMP
    if not stamp.is_file():
        print(
            f"book: {stamp} is missing (write the twins with `book ipynb --dest {executed}`, then run them with "
            "nbmake --overwrite); the build executes every chapter",
            flush=True,
        )
        return []
    if stamp.read_text().strip() != executed_fingerprint(root, inputs):
        print(
            f"book: {executed} was executed from other logs, assets or code; the build executes every chapter",
            flush=True,
        )
        return []
    cache = get_cache(os.fspath(root / "_build" / ".jupyter_cache"))
    taken = []
    for src in toc_notebooks(root):
        twin = executed / src.relative_to(root).with_suffix(".ipynb")
        if src.suffix != ".md" or not twin.is_file():
            continue
        nb = read_myst_markdown_notebook(src.read_text(encoding="utf-8"), add_source_map=True, path=src)
        ran = nbformat.read(twin, as_version=4)
        cells = [c for c in nb.cells if c.cell_type == "code"]
        ran_cells = [c for c in ran.cells if c.cell_type == "code"]
        same = [c.source for c in cells] == [c.source for c in ran_cells]
        clean_run = all(
            c.execution_count is not None and not any(o.get("output_type") == "error" for o in c.outputs)
            for c in ran_cells
        )
        if not (same and clean_run):
            print(f"book: {twin.name} is not a clean run of {src.name}; the build executes it", flush=True)
            continue
        for cell, done in zip(cells, ran_cells):
            cell.outputs, cell.execution_count = done.outputs, done.execution_count
        if "widgets" in ran.metadata:
            nb.metadata["widgets"] = ran.metadata["widgets"]
        cache.cache_notebook_bundle(CacheBundleIn(nb, os.fspath(src)), check_validity=False, overwrite=True)
        taken.append(src)
    return taken


def build(
    root: Path = paths.REPO,
    builder: str = "html",
    clean: bool = False,
    env: dict | None = None,
    executed: Path | None = None,
) -> int:
    """Build the book; non-zero on any warning, a failing notebook included.

    jupyter-cache reuses a notebook's outputs while its code is unchanged, so a chapter that
    reads ``logs/`` would keep showing the numbers of the previous run after the main job
    promoted new ones. When anything under ``logs/`` or ``assets/`` changed since the last
    successful build, the build starts clean (every chapter re-executed). ``executed``: the
    folder where nbmake just ran the chapters' twins (:func:`reuse_executed`); ``make test``
    passes it so each chapter runs once per test run.
    """
    stamp = root / INPUTS_STAMP
    fingerprint = inputs_fingerprint(root)
    built_before = (root / "_build" / ".jupyter_cache").exists()
    if not clean and built_before and (not stamp.is_file() or stamp.read_text().strip() != fingerprint):
        print("book: logs/ or assets/ changed since the last build; rebuilding every chapter", flush=True)
        clean = True
    if clean:
        shutil.rmtree(root / "_build" / ".jupyter_cache", ignore_errors=True)
        shutil.rmtree(root / "_build" / ".doctrees", ignore_errors=True)
        shutil.rmtree(root / "_build" / builder, ignore_errors=True)
        shutil.rmtree(root / "_build" / "jupyter_execute", ignore_errors=True)
    if executed is not None:
        taken = reuse_executed(Path(executed), root, inputs=fingerprint)
        print(f"book: {len(taken)} chapters' outputs reused from nbmake's run in {executed}", flush=True)
    run_env = {**os.environ, **(env or {})}
    run_env.setdefault("TUTORIAL_PROFILE", "ci")
    # the kernel must be this venv's python: put it first on PATH
    run_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{run_env.get('PATH', '')}"
    rc = subprocess.run(jb_command(root, builder), env=run_env).returncode
    if rc == 0:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(fingerprint + "\n")
    return rc


def vendor_widgets(stamp: Path = VENDOR_STAMP) -> list[Path]:
    """Fetch the book's JavaScript (require.js, the ipywidgets HTML manager and its fonts,
    MathJax) from npm, so pages render offline. Skipped when already done."""
    import fnmatch

    from tutorial_utils.io import atomic_write_bytes, atomic_write_text

    digest = hashlib.sha256(
        repr(sorted((k, [(m, os.fspath(d)) for m, d in v]) for k, v in VENDOR_FILES.items())).encode()
    ).hexdigest()[:16]
    if stamp.is_file():
        lines = stamp.read_text().split()
        if lines and lines[0] == digest and all(Path(p).is_file() for p in lines[1:]):
            return [Path(p) for p in lines[1:]]
    npm = shutil.which("npm")
    if not npm:
        raise RuntimeError(
            "the book's JavaScript is not vendored yet and npm is not installed: install Node.js/npm "
            "(Debian: `apt-get install -y npm`) and rerun `make vendor`"
        )
    got: list[Path] = []
    for spec, members in VENDOR_FILES.items():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([npm, "pack", spec, "--silent"], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
            tgz = next(Path(tmp).glob("*.tgz"))
            with tarfile.open(tgz) as tf:
                names = tf.getnames()
                for pattern, dest in members:
                    matched = [n for n in names if fnmatch.fnmatch(n, pattern)]
                    if not matched:
                        raise RuntimeError(f"{spec}: nothing matches {pattern} in the npm package")
                    for name in matched:
                        data = tf.extractfile(name)
                        out = dest / Path(name).name
                        atomic_write_bytes(out, data.read())
                        got.append(out)
    atomic_write_text(stamp, "\n".join([digest, *map(str, got)]) + "\n")
    return got


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tutorial_utils book")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("ipynb", help="write the .ipynb twins")
    t.add_argument("--dest", type=Path, default=None, help="folder for the twins (default: beside the sources)")
    b = sub.add_parser("build", help="build the HTML book (warnings are errors)")
    b.add_argument("--clean", action="store_true")
    b.add_argument(
        "--executed",
        type=Path,
        default=None,
        help="a folder of twins nbmake just ran (`book ipynb --dest DIR`, then nbmake --overwrite): "
        "reuse their outputs instead of executing the chapters again",
    )
    sub.add_parser("vendor", help="fetch the ipywidgets JS for offline widget state")
    sub.add_parser("list", help="list the TOC's pages and which are notebooks")
    args = ap.parse_args(argv)
    if args.cmd == "ipynb":
        for p in write_twins(args.dest):
            print(p)
        return 0
    if args.cmd == "build":
        vendor_widgets()
        return build(clean=args.clean, executed=args.executed)
    if args.cmd == "vendor":
        for p in vendor_widgets():
            print(p)
        return 0
    for p in toc_files():
        print(f"{'notebook' if is_notebook(p) else 'page    '}  {p.relative_to(paths.REPO)}")
    return 0
