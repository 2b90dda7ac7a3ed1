"""Numbers on pages come from runs or from the facts registry, not from the writer's memory.

A number typed into a page goes stale the moment its run is redone. This test scans the MyST
sources the book is built from (the prose of ``notebooks/*.md`` outside code cells, and
``book/*.md``) and fails on every typed number that is none of:

- **rendered**: a myst-nb ``{glue:text}`` role (or any other role), or a code cell's output: those
  are not in the prose at all;
- **a registry fact**: equal, at the precision it is written with, to a value of
  :mod:`tutorial_utils.report.facts` (the facts about other systems, each with its source); a number
  written with a measurement unit (``ms``, ``GB``, ``%``...) must also match the fact's unit;
- **allow-listed**: not a measurement. The whole allow-list:

  1. code and addresses: inline code (commands, parameter values, log lines to look for),
     roles, fenced and indented code blocks, directive options (``:width:``, ``:lines:``,
     ``:alt:``, which describes the drawn figure), math, link targets and URLs, HTML;
  2. names: a number inside a word (``libero_10``, ``h264``, ``Cosmos-Predict2.5-2B``,
     ``ResNet-18``, ``v2.1``) and the few proper names in :data:`NAMES`;
  3. versions: ``0.3.3``, ``1.x``, a number after ``>=``/``<=``/``==``;
  4. ordinals: list markers (``1.``) and numbers after :data:`ORDINAL_WORDS` (chapter 4,
     stages 6 to 8, ``Step 2``, task 4, init states 0-9);
  5. years: after "in"/"since" or in parentheses;
  6. sizes and shapes: ``128x128``, ``8 × 7`` (parameters of a camera or a tensor);
  7. small counts: an integer from 0 to 10 with no measurement unit and not in a fraction
     ("2 workers", "4 Euler steps"; but not "9 min", "3/5" or "4x").

Everything else is a measurement: glue it from the promoted file it comes from (``logs/``,
``assets/``), or, if it is a fact about another system, add it to ``tutorial_utils.report.facts``
with its source.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO
from tutorial_utils.report import facts

PAGES = sorted((REPO / "notebooks").glob("*.md")) + sorted((REPO / "book").glob("*.md"))

#: proper names that contain a number (a product, not a measurement)
NAMES = ("RTX 4090", "Python 3.11", "Python 3.8")
#: a number right after one of these words is an ordinal or an identifier, not a quantity
ORDINAL_WORDS = (
    r"(?:[Cc]hapters?|[Ss]tages?|[Ss]ections?|[Pp]arts?|[Ee]xercises?|[Tt]asks?|init states?|[Ee]pisodes?|Step)"
)
#: directives whose body is prose (their option lines are skipped); other fenced blocks are code
PROSE_DIRECTIVES = {"figure", "note", "tip", "warning", "important", "admonition", "seealso", "caution", "margin"}
SMALL_COUNT = 10

SCALES = {"k": 1e3, "K": 1e3, "thousand": 1e3, "M": 1e6, "million": 1e6, "B": 1e9, "billion": 1e9}
#: measurement units, canonical spelling
UNITS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), "ms"),
    **dict.fromkeys(("s", "sec", "second", "seconds"), "s"),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), "min"),
    **dict.fromkeys(("h", "hour", "hours"), "h"),
    **dict.fromkeys(("day", "days"), "day"),
    **dict.fromkeys(("%", "percent"), "%"),
    **dict.fromkeys(("x", "×"), "x"),
    **{u: u for u in ("kB", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "bytes", "fps", "Hz", "cm", "mm", "rad")},
    **dict.fromkeys(("px", "pixel", "pixels"), "px"),
    **dict.fromkeys(("degrees", "°"), "degrees"),
    **{u: u for u in ("samples/s", "steps/s", "episodes/hour", "requests")},
}

_NUM = re.compile(r"(?<![A-Za-z_\d.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e-?\d+)?")
_WORDS_AFTER = re.compile(r"[\s-]*([A-Za-z%°×][\w/%°×\s-]*)")
_SHAPE = re.compile(r"\d+(?:\.\d+)?\s*[x×]\s*\d")
_VERSION = re.compile(r"\d+(?:\.\d+){2,}|\d+\.x\b")
_ORDINALS = re.compile(ORDINAL_WORDS + r"\s+\d+(?:\s*(?:-|–|to|and|or|,)\s*\d+)*")
_LIST_MARKER = re.compile(r"(?:^|\|)\s*\d+\.\s")
_YEAR = re.compile(r"(?:\b(?:in|since)\s+|\()(?:19|20)\d\d\b")
_COMPARE = re.compile(r"(?:>=|<=|==|~=)\s*$")
_INLINE_DROP = [
    re.compile(r"\{[\w:.-]+\}`[^`]*`"),  # roles, {glue:text}`name` included
    re.compile(r"(`+)(?:(?!\1).)+\1"),  # inline code
    re.compile(r"\[[^\]]*\]\([^)]*\)"),  # links, their text included
    re.compile(r"<https?://[^>]*>|https?://\S+"),  # URLs
    re.compile(r"\$[^$]+\$"),  # inline math
    re.compile(r"<[^>]+>"),  # HTML tags
]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the prose of a MyST page, with code, math, roles and links removed."""
    text = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), path.read_text(), flags=re.S)
    lines = text.split("\n")
    out: list[tuple[int, str]] = []
    i = 0
    if lines and lines[0].strip() == "---":  # front matter (the jupytext header)
        i = next(j for j in range(1, len(lines)) if lines[j].strip() == "---") + 1
    fence: tuple[str, bool] | None = None  # (closing marker, body is prose)
    in_math = False
    prev_blank = True
    for n in range(i, len(lines)):
        line = lines[n]
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence[0]) and set(stripped) <= set(fence[0][0]):
                fence = None
            elif fence[1] and not re.match(r"\s*:[\w-]+:", line):
                out.append((n + 1, line))
            continue
        m = re.match(r"\s*(`{3,}|~{3,}|:{3,})\s*(\{([\w-]+)\})?", line)
        if m:
            fence = (m.group(1), m.group(3) in PROSE_DIRECTIVES)
            continue
        if stripped.startswith("$$"):
            in_math = not (in_math or (stripped.endswith("$$") and len(stripped) > 2))
            continue
        if in_math:
            continue
        if line.startswith(("    ", "\t")) and prev_blank:  # an indented code block
            continue
        prev_blank = not stripped
        if stripped.startswith("+++"):
            continue
        for pattern in _INLINE_DROP:
            line = pattern.sub(" ", line)
        out.append((n + 1, line))
    return out


def _allowed_spans(line: str) -> list[tuple[int, int]]:
    spans = [m.span() for p in (_ORDINALS, _LIST_MARKER, _YEAR, _VERSION) for m in p.finditer(line)]
    spans += [(m.start(), m.start() + len(name)) for name in NAMES for m in re.finditer(re.escape(name), line)]
    return spans


def _number(raw: str) -> float:
    return float(raw.replace(",", ""))


def _decimals(raw: str) -> int:
    mantissa = raw.split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


#: words after a number that say nothing about its unit ("163 M of ...", "1.0 and")
STOPWORDS = {
    "a",
    "an",
    "and",
    "are",
    "as",
    "at",
    "by",
    "for",
    "from",
    "in",
    "is",
    "of",
    "on",
    "or",
    "the",
    "to",
    "with",
}


def _same_word(a: str, b: str) -> bool:
    return a.lower().rstrip("s") == b.lower().rstrip("s")


def _words_after(after: str) -> list[str]:
    """Up to four words right after a number, hyphenated compounds split:
    "163 M trainable parameters, ..." -> ["M", "trainable", "parameters"]."""
    m = _WORDS_AFTER.match(after)
    return re.findall(r"[A-Za-z][\w/]*|%|°|×", m.group(1))[:4] if m else []


def _is_fact(value: float, raw: str, words: list[str], scale: float, before: str = "") -> bool:
    """``value`` (times ``scale``) is a registry value at the precision ``raw`` is written with,
    and the words around it agree with the fact's unit: the same measurement unit ("48 GB"), the
    fact's noun within the next words ("432 human teleoperated episodes", not "432 frames") or
    right before it ("block 17"), or a stopword next ("163 M of ...")."""
    unit = UNITS.get(words[0]) if words else None
    exact = "e" in raw  # 1e-4: compare exactly
    tol = 0.5 * 10 ** (-_decimals(raw)) * scale + 1e-12
    for name, v in facts.numbers():
        if not (v == value if exact else abs(v - value * scale) <= tol):
            continue
        fact_unit = facts.fact(name)["unit"]
        head = fact_unit.split(" ")[0] if fact_unit else ""
        if unit is not None or head in UNITS:
            if unit == UNITS.get(head):
                return True
        elif (
            not words
            or not head
            or words[0].lower() in STOPWORDS
            or any(_same_word(w, head) for w in words)
            or any(_same_word(before, u) for u in re.findall(r"[a-z]+", fact_unit.lower()))
        ):
            return True
    return False


def typed_numbers(line: str) -> list[str]:
    """The numbers in one prose line that are neither allow-listed nor registry facts."""
    allowed = _allowed_spans(line)
    bad = []
    for m in _NUM.finditer(line):
        raw, start, end = m.group(0), m.start(), m.end()
        if any(a <= start and end <= b for a, b in allowed):
            continue
        before, after = line[:start], line[end:]
        token_start = re.search(r"[^\s(\[\"'“~≈]*$", before).group(0)
        if token_start and re.match(r"[A-Za-z_]", token_start):
            continue  # a name: libero_10, Cosmos-Predict2.5-2B, ResNet-18, L40
        if _SHAPE.match(line[start:]) or re.search(r"\d\s*[x×]\s*$", before):
            continue  # 128x128, 8 × 7
        if _COMPARE.search(before):
            continue  # a version constraint
        fraction = after.startswith("/") and after[1:2].isdigit() or re.search(r"\d/$", before)
        words = _words_after(after)
        scale = SCALES.get(words[0], 1.0) if words else 1.0
        if scale != 1.0:
            words = words[1:]
        unit = UNITS.get(words[0]) if words else None
        value = _number(raw)
        if (
            not fraction
            and unit is None
            and scale == 1.0
            and "." not in raw
            and "e" not in raw
            and 0 <= value <= SMALL_COUNT
        ):
            continue  # a small count
        word_before = re.search(r"([A-Za-z]*)\W*$", before).group(1)
        if _is_fact(value, raw, words, scale, word_before):
            continue
        bad.append(" ".join([raw, *words[:1]]) if unit or scale != 1.0 else raw)
    return bad


def findings(path: Path) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    return [
        f"{rel}:{n}: {', '.join(repr(b) for b in bad)} in {' '.join(text.split())[:110]!r}"
        for n, text in prose_lines(path)
        if (bad := typed_numbers(text))
    ]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_number_on_the_page_is_rendered_a_fact_or_allow_listed(path):
    found = findings(path)
    assert not found, (
        f"{len(found)} typed number(s) that are neither glued nor a tutorial_utils.report.facts value "
        "(glue run-derived numbers from logs/ or assets/; add facts about other systems to "
        "tutorial_utils.report.facts with their source):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "sentence",
    [
        "about 9 min for 50 episodes on 2 cores",
        "the headless expert takes ~30 ms a step",
        "the job trains at ~140 samples/s",
        "a median of 0.65 ms against 0.59 ms (1.10x), about 1,470 requests a second",
        "the expert solved 3/5 of the drawer episodes",
        "the dataset has 48 episodes",
        "fast is 5.6x faster",
        "98.6 % of 432 episodes take 2.5 GB",  # 98.6 and 432 are facts, but not in GB
    ],
)
def test_typed_measurements_are_flagged(sentence):
    assert typed_numbers(sentence), sentence


@pytest.mark.parametrize(
    "sentence",
    [
        "Stage 3 of chapter 4, stages 6 to 8, Step 1 and Step 2, task 6, init states 0-9",
        "1. the first item",
        "| 2. access | downloads |",
        "LeRobot 0.3.3 reads v2.1; huggingface_hub 1.x; Python >= 3.10 and Python 3.11",
        "two 128x128 cameras, an 8 × 7 chunk, 224x448 side by side",
        "libero_10 and Cosmos-Predict2.5-2B and ResNet-18 and an 8-D state, h264 in mp4",
        "2 workers, 4 Euler steps, 10 settle steps, one of 3 tasks",
        "the dataset has 432 episodes and 52,970 frames; upstream reports 98.6 %",
        "163 M of 10,641 M parameters (1.53 %), 80k steps on 64 processes, 1e-4",
        "an RTX 4090 (24 GB) may run out of memory",
        "published in 2024, (2023)",
    ],
)
def test_non_measurements_and_facts_pass(sentence):
    assert not typed_numbers(sentence), typed_numbers(sentence)


def test_code_roles_links_and_math_are_not_prose(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "---\njupytext:\n  x: 1234\n---\n\n# Title\n\n"
        "Run `sleep 900` then {glue:text}`wall_min` min, see [run 777](https://x.org/777).\n\n"
        "```{code-cell} ipython3\nprint(12345)\n```\n\n"
        "```{figure} a.svg\n:width: 640px\n:alt: 999 things\n\nA caption with 4321 widgets.\n```\n\n"
        "$$\nx = 0.123\n$$\n\n    indented 5555 code\n\nEnd with $t = 0.75$ and 31 ms.\n"
    )
    bad = [b for _, line in prose_lines(page) for b in typed_numbers(line)]
    assert bad == ["4321", "31 ms"], bad


def test_the_registry_is_well_formed():
    assert facts.FACTS
    for name, f in facts.FACTS.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert set(f) == {"value", "unit", "source"}, (name, set(f))
        values = f["value"] if isinstance(f["value"], tuple) else (f["value"],)
        assert values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values), name
        assert isinstance(f["unit"], str), name
        assert isinstance(f["source"], str) and len(f["source"]) > 10, f"{name}: say where the value comes from"
    assert facts.text("ipec_spatial_frames") == "52,970" and facts.text("dit4dit_success_libero_spatial") == "98.6"
    assert facts.text("dit4dit_trainable_parameters", scale=1e6, digits=0) == "163"
    with pytest.raises(KeyError, match="known"):
        facts.value("no_such_fact")
