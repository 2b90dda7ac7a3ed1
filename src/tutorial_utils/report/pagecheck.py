"""Look at the built book as a reader does: what a page *shows* that no test of the code sees.

:func:`check_page` reads one built HTML page and returns what is wrong with it, one
:class:`Finding` per problem:

- ``object-repr``: an object's repr where a figure or table belongs (``<Figure size 1300x380 with
  3 Axes>``, ``<... object at 0x7f...>``);
- ``pipe-table``: a Markdown table printed as text (``| a | b |`` over ``|---|---|``);
- ``raw-table``: a DataFrame shown as pandas prints it by default: cells cut to ``...``, a
  ``2 rows × 24 columns`` footer, or a first column of bare row numbers (0, 1, 2, ...) that names
  nothing (``page.setup`` shows tables without these);
- ``machine-path``: a path of the build machine (its home, the checkout, the temporary folder,
  the runs and data folders, the Hugging Face cache) anywhere on the page;
- ``warning``: a Python warning or traceback in a cell's output;
- ``unresolved-role``: a MyST role or substitution that was printed instead of resolved
  (``{glue:text}`x` ``, ``{{ name }}``, a ``problematic`` node);
- ``broken-media``: an image or video whose file is missing or empty, or whose inline data does
  not decode; ``small-video``: a video shown narrower than :data:`MIN_VIDEO_PX`;
- ``next-link``: a "Next" paragraph whose link is not the next page of the table of contents.

:func:`check_site` runs it over every page of ``_build/html``; :func:`check_sources` looks at
the Markdown a reader reads without a build (the job notebooks, the README, ``book/``) for
``typed-number``: a result typed by hand (a success rate, a duration) instead of rendered from a
file. ``python -m tutorial_utils.report.pagecheck [_build/html]`` prints the findings of both.
"""

from __future__ import annotations

import base64
import binascii
import html
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from tutorial_utils import paths

#: the narrowest a video may be shown (CSS pixels): a rollout at 128 px is a thumbnail
MIN_VIDEO_PX = 240
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass(frozen=True)
class Finding:
    page: str
    check: str
    detail: str

    def __str__(self) -> str:
        return f"{self.page}: {self.check}: {self.detail}"


class _Page(HTMLParser):
    """Splits a page into text chunks, each tagged with where it sits: in a code cell's input,
    in a cell's output, in ``<code>``/``<pre>``, or plain prose. Scripts and styles are skipped
    (but a saved widget state is kept: it is shown). Collects media and links on the way."""

    def __init__(self, widget_state_shown: bool = True):
        super().__init__(convert_charrefs=True)
        self.widget_state_shown = widget_state_shown
        self.stack: list[tuple[str, set[str]]] = []
        self.chunks: list[tuple[str, str]] = []  # (region, text)
        self.media: list[tuple[str, dict[str, str]]] = []
        self.next_paras: list[tuple[str, list[str]]] = []  # (text, hrefs) of paragraphs opening "Next"
        self.right_next: str | None = None
        self._skip = 0
        self._para: list | None = None
        self._para_links: list[str] = []
        self._in_right_next = False

    def _region(self) -> str:
        classes = [c for _, cs in self.stack for c in cs]
        tags = [t for t, _ in self.stack]
        if "cell_input" in classes:
            return "input"
        if "cell_output" in classes or "output" in classes:
            return "output"
        if "code" in tags or "pre" in tags:
            return "code"
        return "prose"

    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        if tag in ("script", "style"):
            if self.widget_state_shown and a.get("type") == "application/vnd.jupyter.widget-state+json":
                self.stack.append(("widget-state", {"output"}))
            else:
                self._skip += 1
                self.stack.append((tag, set()))
            return
        if tag in ("img", "video", "source", "audio"):
            self.media.append((tag, a))
        if tag == "a":
            classes = set(a.get("class", "").split())
            if "right-next" in classes and self.right_next is None:
                self.right_next = a.get("href", "")
            if self._para is not None and a.get("href"):
                self._para_links.append(a["href"])
        if tag == "p":
            self._para, self._para_links = [], []
        if tag not in VOID:
            self.stack.append((tag, set(a.get("class", "").split())))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID and self.stack and self.stack[-1][0] == tag:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag == "p" and self._para is not None:
            text = " ".join("".join(self._para).split())
            if re.match(r"(Next\b|Up next\b)", text):
                self.next_paras.append((text, list(self._para_links)))
            self._para = None
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                popped = self.stack[i:]
                del self.stack[i:]
                self._skip -= sum(1 for t, _ in popped if t in ("script", "style"))
                break

    def handle_data(self, data):
        if self._skip > 0:
            return
        self.chunks.append((self._region(), data))
        if self._para is not None:
            self._para.append(data)


def machine_paths() -> list[str]:
    """This machine's folders that must not appear on a page (longest first)."""
    found = {
        os.fspath(paths.REPO),
        os.fspath(paths.RUNS),
        os.fspath(paths.DATA),
        os.path.expanduser("~"),
        sys.prefix,  # the virtual environment (its python in a generated script)
        os.path.realpath(sys.prefix),
        tempfile.gettempdir(),
        os.path.realpath(tempfile.gettempdir()),
    }
    for var in ("HF_HOME", "TMPDIR", "TUTORIAL_RUNS_DIR", "TUTORIAL_DATA_DIR"):
        if os.environ.get(var):
            found.add(os.environ[var].rstrip("/"))
    return sorted((p for p in found if p and p != "/"), key=len, reverse=True)


_REPR = re.compile(
    r"<(Figure size [\d.]+x[\d.]+ with \d+ Axes|matplotlib\.[\w.]+ object|Axes: ?[^>]*|[\w.]+ object at 0x[0-9a-f]+)>"
)
_PIPE_RULE = re.compile(r"^\s*\|?\s*:?[-—–]{1,}:?\s*(\|\s*:?[-—–]{1,}:?\s*)+\|?\s*$", re.M)
_WARNING = re.compile(
    r"(Traceback \(most recent call last\)|\b[A-Z]\w*(Warning|Error): .*\n\s+warnings\.warn\(|"
    r"\b(UserWarning|DeprecationWarning|FutureWarning|RuntimeWarning|PendingDeprecationWarning|"
    r"ResourceWarning|SyntaxWarning|ImportWarning|UnicodeWarning|BytesWarning)\b)"
)
_DATAFRAME = re.compile(r"<table\b[^>]*\bclass=\"[^\"]*\bdataframe\b[^>]*>.*?</table>", re.S)
_CUT_CELL = re.compile(r"<td[^>]*>([^<]{0,60}?)\.\.\.</td>")
_DIMENSIONS = re.compile(r"<p>\d+ rows × \d+ columns</p>")
_BARE_NUMBERS = re.compile(r"<thead>\s*<tr[^>]*>\s*<th></th>.*?</tr>\s*</thead>\s*<tbody>\s*<tr>\s*<th>0</th>", re.S)


def _raw_tables(text: str) -> list[str]:
    """What pandas' default display left on the page (see ``raw-table``), one line each."""
    out = []
    for t in _DATAFRAME.finditer(text):
        table = t.group(0)
        if m := _CUT_CELL.search(table):
            out.append(f"a cell cut to '...': {html.unescape(m.group(1))[:60]!r}...")
        head = table.split("</thead>")[0]
        if _BARE_NUMBERS.search(table) and head.count("<tr") == 1:
            out.append(f"a first column of bare row numbers (0, 1, ...) in the table headed {_headers(head)!r}")
    out += [f"a truncated table: {m.group(0)[3:-4]!r}" for m in _DIMENSIONS.finditer(text)]
    return out


def _headers(head: str) -> str:
    return ", ".join(html.unescape(h) for h in re.findall(r"<th[^>]*>([^<]*)</th>", head) if h)[:80]


_ROLE = re.compile(r"\{(glue(:\w+)?|doc|ref|numref|eq|download|term|cite|sub-ref)\}`|\{\{\s*[\w.-]+\s*\}\}")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(px)?\s*$")


def _media_problem(tag: str, attrs: dict[str, str], page_path: Path | None) -> str | None:
    src = attrs.get("src", "")
    if not src:
        return None if tag in ("video", "audio") else f"<{tag}> without src"
    if src.startswith("data:"):
        head, _, payload = src.partition(",")
        if not payload:
            return f"<{tag}> with empty inline data"
        if ";base64" in head:
            try:
                raw = base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                return f"<{tag}> inline data is not valid base64"
            if len(raw) < 16:
                return f"<{tag}> inline data of {len(raw)} bytes"
            if "image/png" in head and not raw.startswith(b"\x89PNG"):
                return f"<{tag}> inline PNG without a PNG header"
        return None
    if re.match(r"^[a-z][a-z0-9+.-]*:", src):  # http:, https:, file: ...
        return f"<{tag}> loads from outside the site: {src[:80]}" if not src.startswith("file:") else f"<{tag}> {src}"
    if page_path is None:
        return None
    target = (page_path.parent / src.split("#")[0].split("?")[0]).resolve()
    if not target.is_file():
        return f"<{tag}> {src}: no such file in the site"
    if target.stat().st_size == 0:
        return f"<{tag}> {src}: the file is empty"
    return None


def _width_px(attrs: dict[str, str]) -> float | None:
    m = _SIZE.match(attrs.get("width", ""))
    if m:
        return float(m.group(1))
    m = re.search(r"(?:^|;)\s*(?:max-)?width\s*:\s*(\d+(?:\.\d+)?)px", attrs.get("style", ""))
    return float(m.group(1)) if m else None


def _excerpt(text: str, start: int, end: int) -> str:
    return " ".join(text[max(0, start - 30) : end + 30].split())[:140]


def check_page(
    text: str,
    name: str = "page",
    page_path: Path | None = None,
    toc_next: str | None = None,
    forbidden_paths: list[str] | None = None,
) -> list[Finding]:
    """Every problem a reader would see on one built page (see the module doc). ``page_path``:
    where the page lies (for its images' and videos' files); ``toc_next``: the page the table of
    contents puts after it (a path relative to the site, e.g. ``notebooks/05_evaluation.html``);
    ``forbidden_paths``: this machine's folders (default :func:`machine_paths`)."""
    p = _Page(widget_state_shown=WIDGET_VIEW in text)  # saved widget state is shown only through a view
    p.feed(text)
    p.close()
    out: list[Finding] = []

    def add(check: str, detail: str) -> None:
        out.append(Finding(name, check, detail))

    shown = "".join(t for region, t in p.chunks if region != "input")
    outputs = "".join(t for region, t in p.chunks if region == "output")
    prose = "".join(t for region, t in p.chunks if region == "prose")

    for m in list(_REPR.finditer(shown))[:3]:
        add("object-repr", f"{m.group(0)!r} shown where its content belongs")
    for m in list(_PIPE_RULE.finditer(shown))[:3]:
        add("pipe-table", f"a Markdown table printed as text: {_excerpt(shown, m.start(), m.end())!r}")

    for problem in _raw_tables(text)[:3]:
        add("raw-table", problem)

    everything = "".join(t for _, t in p.chunks) + " ".join(
        v for _, a in p.media for k, v in a.items() if k in ("src", "poster") and not v.startswith("data:")
    )
    for folder in forbidden_paths if forbidden_paths is not None else machine_paths():
        rx = re.compile(re.escape(folder.rstrip("/")) + r"(?=[/\s'\"),:;\]]|$)")
        m = rx.search(everything)
        if m:
            add("machine-path", f"this machine's {folder!r} on the page: {_excerpt(everything, m.start(), m.end())!r}")

    for m in list(_WARNING.finditer(outputs))[:3]:
        add("warning", f"a Python warning or traceback in an output: {_excerpt(outputs, m.start(), m.end())!r}")

    if 'class="problematic"' in text:
        add("unresolved-role", "a role or reference Sphinx could not resolve (class 'problematic')")
    for m in list(_ROLE.finditer(prose + outputs))[:3]:
        add("unresolved-role", f"printed instead of resolved: {m.group(0)!r}")

    for tag, attrs in p.media:
        problem = _media_problem(tag, attrs, page_path)
        if problem:
            add("broken-media", problem)
        if tag == "video":
            width = _width_px(attrs)
            if width is not None and width < MIN_VIDEO_PX:
                add("small-video", f"a video {width:.0f} px wide (at least {MIN_VIDEO_PX} px to be read)")

    for para, links in p.next_paras:
        internal = [h for h in links if not re.match(r"^[a-z]+:", h) and not h.startswith("#")]
        if not internal:
            continue
        want = _norm(toc_next) if toc_next else (_norm(p.right_next) if p.right_next else None)
        if want is None:
            add("next-link", f"{para[:80]!r}: the last page of the book names a next page")
            continue
        base = Path(name).parent
        got = _norm((base / internal[0]).as_posix()) if toc_next else _norm(internal[0])
        if got != want:
            add("next-link", f"{para[:80]!r} links to {internal[0]!r}; the table of contents' next page is {want!r}")
    return out


def _norm(href: str) -> str:
    href = href.split("#")[0]
    parts: list[str] = []
    for seg in href.split("/"):
        if seg in ("", "."):
            continue
        if seg == ".." and parts:
            parts.pop()
        else:
            parts.append(seg)
    return "/".join(parts)


def toc_pages(root: Path = paths.REPO) -> list[str]:
    """The built pages in the table of contents' order (``notebooks/03_dataset.html``...)."""
    from tutorial_utils.report.book import toc_files

    return [f.relative_to(root).with_suffix(".html").as_posix() for f in toc_files(root)]


def check_site(site: Path, order: list[str] | None = None, forbidden_paths: list[str] | None = None) -> list[Finding]:
    """:func:`check_page` over every page of a built site; ``order``: the TOC's pages, for the
    Next links (default: this repository's TOC). The first page (``index.html``) redirects."""
    site = Path(site)
    order = order if order is not None else toc_pages()
    following = {page: (order[i + 1] if i + 1 < len(order) else None) for i, page in enumerate(order)}
    found: list[Finding] = []
    for page in sorted(site.rglob("*.html")):
        rel = page.relative_to(site).as_posix()
        if rel.startswith(("_static/", "_sources/", "_images/")) or rel in ("genindex.html", "search.html"):
            continue
        found += check_page(
            page.read_text(encoding="utf-8", errors="replace"),
            rel,
            page_path=page,
            toc_next=following.get(rel),
            forbidden_paths=forbidden_paths,
        )
    return found


# --- the pages a reader reads without a build ----------------------------------------------------

#: a result typed into prose: a rate, a count of successes, a run's duration
_TYPED = re.compile(
    r"(?<![\w.$/-])(\d+(?:\.\d+)?\s?%(?!\s*(?:Wilson|confidence|interval|CI)\b)|\d+\s?/\s?\d+\s+(?:episodes|successes|trials|starts)|"
    r"(?:about|took|takes|in|~)\s+\d+(?:\.\d+)?(?:\s*(?:to|-|–)\s*\d+(?:\.\d+)?)?\s*(?:minutes|min|hours|h|seconds)\b)"
)
#: lines a check does not read: code, fences, glue, tables of settings, links' targets
_FENCE = re.compile(r"^\s*(```|~~~|:::)")


def typed_numbers(text: str, name: str = "source") -> list[Finding]:
    """Results typed by hand into Markdown prose (outside code, fences and roles): a percentage,
    ``N/M episodes``, ``about 35 minutes``. A number that is a fact of a source, not a result of
    this book, is marked on its line with ``<!-- typed: why -->``."""
    out = []
    fenced = False
    for no, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or "<!-- typed:" in line or line.lstrip().startswith(("#|", "    ")):
            continue
        plain = re.sub(r"`[^`]*`", "", line)  # inline code and roles' arguments
        plain = re.sub(r"\{[\w:-]+\}", "", plain)
        for m in _TYPED.finditer(plain):
            out.append(Finding(f"{name}:{no}", "typed-number", f"{m.group(0)!r} typed by hand: {line.strip()[:100]!r}"))
    return out


def source_files(root: Path = paths.REPO) -> list[Path]:
    return (
        sorted((root / "notebooks" / "jobs").glob("*.md")) + sorted((root / "book").glob("*.md")) + [root / "README.md"]
    )


def check_sources(root: Path = paths.REPO) -> list[Finding]:
    """:func:`typed_numbers` over the job notebooks, ``book/`` and the README."""
    found = []
    for f in source_files(root):
        if f.is_file():
            found += typed_numbers(f.read_text(encoding="utf-8"), f.relative_to(root).as_posix())
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    site = Path(argv[0]) if argv else paths.BUILD / "html"
    found = check_site(site) + check_sources()
    for f in found:
        print(html.unescape(str(f)))
    print(f"{len(found)} finding(s) in {site}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
