"""The book's hand-written SVG diagrams stay readable at the width the page shows them.

The chapters embed `assets/*.svg` at `:width: 100%` of a text column about 700 px wide, so a
text drawn at `font-size` in a viewBox `W` wide reaches the reader at `font-size * 700 / W`.
Diagrams laid out 900-980 px wide with 12 px fonts came out at about 8.6 px (issue 23). This
test resolves every text's font size the way a browser does for these files (inline style,
then the file's own CSS rules, then the `font-size` attribute, then the parent's size) and
fails on any below 11 px at that width.
"""

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO

PAGE_WIDTH_PX = 700  # the book's text column, which `:width: 100%` fills
MIN_TEXT_PX = 11.0
SVG_NS = "{http://www.w3.org/2000/svg}"
BROWSER_DEFAULT_PX = 16.0
DIAGRAMS = sorted(p for p in (REPO / "assets").glob("*.svg") if p.name != "favicon.svg")


def _declarations(text: str) -> dict[str, str]:
    out = {}
    for decl in text.split(";"):
        if ":" in decl:
            key, value = decl.split(":", 1)
            out[key.strip().lower()] = value.strip()
    return out


def _css_font_rules(root: ET.Element, path: Path) -> list[tuple[tuple[int, int], str | None, str | None, str]]:
    """(specificity, element, class, font-size) for every CSS rule in the file that sets font-size."""
    rules = []
    for style in root.iter(f"{SVG_NS}style"):
        css = re.sub(r"/\*.*?\*/", "", style.text or "", flags=re.S)
        for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
            size = _declarations(body).get("font-size")
            if size is None:
                continue
            for selector in selectors.split(","):
                m = re.fullmatch(r"\s*([a-zA-Z]+)?(?:\.([\w-]+))?\s*", selector)
                if not m or not (m.group(1) or m.group(2)):
                    raise AssertionError(
                        f"{path.name}: CSS selector {selector.strip()!r} sets font-size but this test only "
                        "understands `element`, `.class` and `element.class`; use one of those."
                    )
                element, cls = m.group(1), m.group(2)
                rules.append(((int(cls is not None), int(element is not None)), element, cls, size))
    return rules


def _to_px(value: str, parent_px: float, where: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(px|em|%)?\s*", value)
    if not m:
        raise AssertionError(f"{where}: font-size {value!r} is not a number in px, em or %")
    number, unit = float(m.group(1)), m.group(2)
    if unit == "em":
        return number * parent_px
    if unit == "%":
        return number / 100 * parent_px
    return number


def _font_px(el: ET.Element, parent_px: float, rules, where: str) -> float:
    inline = _declarations(el.get("style", "")).get("font-size")
    if inline is not None:
        return _to_px(inline, parent_px, where)
    tag = el.tag.removeprefix(SVG_NS)
    classes = set(el.get("class", "").split())
    matching = [
        (spec, i, size)
        for i, (spec, element, cls, size) in enumerate(rules)
        if (element is None or element == tag) and (cls is None or cls in classes)
    ]
    if matching:
        return _to_px(max(matching)[2], parent_px, where)
    if el.get("font-size") is not None:
        return _to_px(el.get("font-size"), parent_px, where)
    return parent_px


def text_sizes_at_page_width(path: Path, page_width: float = PAGE_WIDTH_PX) -> list[tuple[str, float]]:
    """(the text, its size in px when the SVG is drawn `page_width` px wide) for every text in `path`."""
    root = ET.parse(path).getroot()
    view_box = root.get("viewBox")
    if view_box is None:
        raise AssertionError(f"{path.name}: no viewBox; give the root <svg> one so the page can scale it")
    width = float(view_box.replace(",", " ").split()[2])
    rules = _css_font_rules(root, path)
    scale = page_width / width
    out = []

    def walk(el: ET.Element, parent_px: float) -> None:
        if re.search(r"scale|matrix", el.get("transform", "")):
            raise AssertionError(f"{path.name}: a scaling transform on <{el.tag}>; this test cannot size its text")
        px = _font_px(el, parent_px, rules, path.name)
        if el.tag in (f"{SVG_NS}text", f"{SVG_NS}tspan") and (el.text or "").strip():
            out.append((el.text.strip(), px * scale))
        for child in el:
            walk(child, px)

    walk(root, BROWSER_DEFAULT_PX)
    return out


def test_there_are_diagrams_to_check():
    assert {p.name for p in DIAGRAMS} >= {"dit4dit_architecture.svg", "dit4dit_time_scales.svg", "eval_chain.svg"}


@pytest.mark.parametrize("path", DIAGRAMS, ids=lambda p: p.name)
def test_diagram_text_is_readable_at_page_width(path):
    sizes = text_sizes_at_page_width(path)
    assert sizes, f"{path.name}: found no text"
    small = [f"{size:.1f} px: {text!r}" for text, size in sizes if size < MIN_TEXT_PX]
    assert not small, (
        f"{path.name}: {len(small)} text(s) below {MIN_TEXT_PX:g} px when the page draws it {PAGE_WIDTH_PX} px wide "
        f"(font-size x {PAGE_WIDTH_PX} / viewBox width). Lay it out in a narrower viewBox or raise the font size:\n"
        + "\n".join(small[:20])
    )


@pytest.mark.parametrize("path", DIAGRAMS, ids=lambda p: p.name)
def test_diagram_is_self_contained(path):
    """No web font, stylesheet or image fetched from elsewhere: the book works offline."""
    text = path.read_text(encoding="utf-8")
    outside = [
        m.group(0)
        for m in re.finditer(r"(@import[^;]*|url\(\s*['\"]?(?!#)[^)]*\)|(?:xlink:)?href=\"(?!#)[^\"]*\")", text)
    ]
    assert not outside, f"{path.name} loads something from outside the file: {outside}"


def test_the_size_check_catches_a_wide_diagram(tmp_path):
    """A 980-wide viewBox with 12 px text (the old architecture figure) shows it at 8.6 px."""
    svg = tmp_path / "wide.svg"
    svg.write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 980 600" font-size="13">'
        "<defs><style>text { font-size: 13px; } .s { font-size: 12px; }</style></defs>"
        '<text class="s" x="0" y="20">small</text><g font-size="20"><text x="0" y="60">inherits 13 from CSS</text>'
        '<text style="font-size:1.5em" x="0" y="90">em of the group</text></g></svg>'
    )
    sizes = dict(text_sizes_at_page_width(svg))
    assert sizes["small"] == pytest.approx(12 * 700 / 980)  # 8.6 px
    assert sizes["inherits 13 from CSS"] == pytest.approx(13 * 700 / 980)
    assert sizes["em of the group"] == pytest.approx(30 * 700 / 980)
