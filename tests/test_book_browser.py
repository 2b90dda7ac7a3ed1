"""Every page of the built book, in a real headless Chromium served from 127.0.0.1.

Needs `_build/html` (``make html``). Under ``make test`` (REQUIRE_BOOK=1) a missing build is
a failure, not a skip. Screenshots go to ``_build/screenshots/``. ``BOOK_ROOT=DIR`` serves another
copy of the site (e.g. one written by ``make publish DEST=DIR``) instead of ``_build/html``;
``test_published_copy_serves_cleanly_and_offline`` does that for one copy on its own.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO
from helpers import headless_chrome
from tutorial_utils.report import book

pytestmark = pytest.mark.browser
HTML = Path(os.environ.get("BOOK_ROOT") or REPO / "_build" / "html").resolve()
SHOTS = REPO / "_build" / "screenshots"
PAGES = [p.relative_to(REPO).with_suffix(".html").as_posix() for p in book.toc_files(REPO)]
#: an output that shows a widget (myst-nb writes its view as a script of this type)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _need_book():
    if not (HTML / "index.html").is_file():
        msg = f"{HTML}/index.html is missing: run `make html` first"
        if os.environ.get("REQUIRE_BOOK") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@contextlib.contextmanager
def _serve(root: Path):
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()


@pytest.fixture(scope="module")
def server():
    _need_book()
    with _serve(HTML) as url:
        yield url


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def driver():
    _need_book()
    with _chrome() as d:
        yield d


@pytest.fixture(scope="module")
def bare_driver():
    """A browser for pages a test writes itself (no built book needed)."""
    with _chrome() as d:
        yield d


@contextlib.contextmanager
def _chrome():
    d = headless_chrome(1280, 1600)
    try:
        yield d
    finally:
        d.quit()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


_LOCAL_REFS = """
const out = [];
const add = (kind, url) => { if (url) out.push([kind, url]); };
document.querySelectorAll('img[src]').forEach(e => add('img', e.src));
document.querySelectorAll('video[src], video source[src], audio source[src]').forEach(e => add('media', e.src));
document.querySelectorAll('a[href]').forEach(e => add('link', e.href));
document.querySelectorAll('link[rel=stylesheet][href], script[src]').forEach(e => add('asset', e.href || e.src));
return out;
"""


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_cleanly(page, server, driver):
    _check_page(page, server, driver)


def _check_page(page, server, driver, shot_prefix=""):
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(server + page)
    h1 = driver.execute_script(
        "const h = document.querySelector('main h1, article h1, h1'); return h ? h.textContent.trim() : '';"
    )
    assert h1, f"{page}: no <h1> title"
    assert h1.rstrip("#¶ ").strip()[:20] in driver.title, f"{page}: document title {driver.title!r} lacks {h1!r}"

    broken = []
    for kind, url in driver.execute_script(_LOCAL_REFS):
        parsed = urllib.parse.urlparse(url)
        if not url.startswith(server) or parsed.scheme not in ("http",):
            continue
        target = urllib.parse.urlunparse(parsed._replace(fragment=""))
        if _status(target) != 200:
            broken.append(f"{kind} {url}")
    assert not broken, f"{page}: broken local references: {broken}"
    bad_imgs = driver.execute_script(
        "return [...document.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth === 0).map(i => i.src);"
    )
    assert not bad_imgs, f"{page}: images that did not decode: {bad_imgs}"
    small = driver.execute_script(
        "return [...document.querySelectorAll('video')].filter(v => v.getBoundingClientRect().width < 240)"
        ".map(v => Math.round(v.getBoundingClientRect().width));"
    )
    assert not small, f"{page}: videos too small to watch (px wide): {small}"
    cut = driver.execute_script(_CUT_OUTPUTS)
    assert not cut, f"{page}: printed outputs whose lines run past the text column (assets/book.css wraps them): {cut}"

    if WIDGET_VIEW in driver.page_source:  # a page whose widget state no output shows has nothing to wait for
        driver.implicitly_wait(0)
        import time

        for _ in range(50):
            if driver.execute_script(
                "return document.querySelectorAll('.jupyter-widgets, .widget-box, .widget-slider').length"
            ):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"{page}: saved widget state did not render (vendored ipywidgets JS not loaded?)")

    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"{page}: JavaScript errors: {[e['message'] for e in errors]}"

    SHOTS.mkdir(parents=True, exist_ok=True)
    height = min(int(driver.execute_script("return document.documentElement.scrollHeight")), 12000)
    driver.set_window_size(1280, max(height, 800))
    driver.save_screenshot(str(SHOTS / (shot_prefix + page.replace("/", "__").removesuffix(".html") + ".png")))
    driver.set_window_size(1280, 1600)


#: the printed outputs (cell output <pre>) that need a sideways scroll to be read to the end
_CUT_OUTPUTS = """
return [...document.querySelectorAll('.cell_output pre')]
  .filter(p => p.scrollWidth > p.clientWidth + 2)
  .map(p => p.textContent.slice(0, 60));
"""


def test_the_cut_output_check_finds_a_long_line(bare_driver, tmp_path):
    page = tmp_path / "long.html"
    page.write_text(
        '<div class="cell_output" style="width:300px"><pre style="white-space:pre;overflow-x:auto">'
        + "a printed line far longer than its column " * 5
        + "</pre></div>"
    )
    bare_driver.get(page.as_uri())
    assert bare_driver.execute_script(_CUT_OUTPUTS) == [("a printed line far longer than its column " * 2)[:60]]
    page.write_text(page.read_text().replace("white-space:pre;", "white-space:pre-wrap;"))
    bare_driver.get(page.as_uri())
    assert bare_driver.execute_script(_CUT_OUTPUTS) == []


#: every resource a page fetched (scripts, styles, fonts, images, widget modules) and its origin
_RESOURCES = "return performance.getEntriesByType('resource').map(e => e.name);"


def test_published_copy_serves_cleanly_and_offline(driver, tmp_path):
    """``make publish DEST=...`` then the page check on that copy: the first page and a widget
    chapter load cleanly, and nothing they fetch comes from anywhere but the copy (no CDN)."""
    _need_book()
    dest = tmp_path / "site"
    out = subprocess.run(
        ["make", "--no-print-directory", "publish", f"DEST={dest}"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (dest / "index.html").is_file() and (dest / ".nojekyll").is_file()
    widget_pages = [p for p in PAGES if WIDGET_VIEW in (dest / p).read_text()]
    assert widget_pages, "no published page carries saved widget state"
    with _serve(dest) as url:
        for page in dict.fromkeys([PAGES[0], widget_pages[0]]):  # the TOC's root and a widget chapter
            _check_page(page, url, driver, shot_prefix="published__")
            fetched = driver.execute_script(_RESOURCES)
            assert fetched, f"{page}: the browser reported no resources at all"
            foreign = [r for r in fetched if not r.startswith(url)]
            assert not foreign, f"{page}: the published copy fetched from outside itself: {foreign}"
        assert any("/embed-amd.js" in r for r in fetched), f"{page}: the widget manager was not loaded"


#: the controls of the chapters' outputs (not the theme's own, such as the copy buttons), visible ones only
_CONTROLS = """
return [...document.querySelectorAll(
  '.cell_output .noUi-handle, .cell_output input[type=range], .cell_output button:not(.copybtn), .cell_output select')]
  .filter(e => e.offsetParent !== null);
"""
#: what the output around a control shows: its visible images and its text, minus the readouts
#: that only echo the control's own value (a slider that moves its number but no frame is dead)
_SHOWN = """
const out = arguments[0].closest('.cell_output');
const imgs = [...out.querySelectorAll('img')].filter(i => i.offsetParent !== null && i.getBoundingClientRect().width > 0)
  .map(i => i.src.length + ':' + i.src.slice(-80));
const copy = out.cloneNode(true);
copy.querySelectorAll('.widget-readout, .widget-label, button, select, .noUi-target').forEach(e => e.remove());
return imgs.join('|') + '#' + copy.textContent.replace(/\\s+/g, ' ');
"""


def _wait_for_widgets(driver, page):
    import time

    if WIDGET_VIEW not in driver.page_source:
        return
    for _ in range(50):
        if driver.execute_script("return document.querySelectorAll('.jupyter-widgets').length"):
            time.sleep(0.5)  # the rest of the page's widgets
            return
        time.sleep(0.2)
    pytest.fail(f"{page}: saved widget state did not render")


def _dead_controls(driver, url: str, page: str) -> list[str]:
    """The controls of ``url`` that change nothing they belong to when used."""
    import time

    from selenium.webdriver.common.keys import Keys

    driver.get(url)
    _wait_for_widgets(driver, page)
    dead = []
    for control in driver.execute_script(_CONTROLS):
        before = driver.execute_script(_SHOWN, control)
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", control)
        tag = control.tag_name
        if tag == "button":
            control.click()
        elif tag == "select":
            driver.execute_script(
                "arguments[0].selectedIndex = (arguments[0].selectedIndex + 1) % arguments[0].options.length;"
                "arguments[0].dispatchEvent(new Event('change', {bubbles: true}))",
                control,
            )
        else:  # a slider: its handle takes the arrow keys (noUiSlider, and <input type=range>)
            control.click()
            control.send_keys(Keys.ARROW_RIGHT)
        time.sleep(0.5)
        if driver.execute_script(_SHOWN, control) == before:
            label = control.get_attribute("aria-valuetext") or control.text or control.get_attribute("class")
            dead.append(f"<{tag}> {label!r}")
    return dead


@pytest.mark.parametrize("page", PAGES)
def test_every_control_changes_what_it_shows_or_is_absent(page, server, driver):
    """In the static book a slider or button either changes the figure or text it belongs to, or
    is not there: a control that moves and changes nothing reads as broken."""
    dead = _dead_controls(driver, server + page, page)
    assert not dead, f"{page}: controls that change nothing in the static HTML: {dead}"


def test_the_control_check_finds_a_dead_slider(bare_driver, tmp_path):
    """The check above on two small pages: a slider that switches images passes, one that only
    moves its own number is dead, and so is a button that does nothing."""
    out = '<div class="cell_output">{}</div>'
    live = out.format(
        '<input type="range" min="0" max="1" value="0" '
        "oninput=\"document.getElementById('a').hidden = this.value == 1; "
        "document.getElementById('b').hidden = this.value == 0\">"
        '<img id="a" width="20" height="20" src="data:image/gif;base64,R0lGODlhAQABAAAAACw="/>'
        '<img id="b" width="30" height="20" hidden src="data:image/gif;base64,R0lGODlhAQABAIAAAP///wAAACw="/>'
    )
    dead = out.format('<input type="range" min="0" max="1" value="0"><button>Stop</button><p>a frame</p>')
    (tmp_path / "live.html").write_text(f"<html><body>{live}</body></html>")
    (tmp_path / "dead.html").write_text(f"<html><body>{dead}</body></html>")
    with _serve(tmp_path) as url:
        assert _dead_controls(bare_driver, url + "live.html", "live.html") == []
        assert [d.split(" ")[0] for d in _dead_controls(bare_driver, url + "dead.html", "dead.html")] == [
            "<input>",
            "<button>",
        ]
