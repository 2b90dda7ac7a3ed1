"""What a chapter's output looks like on the page: figures, numbers and tables a reader can read.

- :func:`show`: display a figure however it was built (pyplot or a bare ``Figure``), with its
  small text enlarged to be readable at the page's width;
- :func:`number`: a float written for reading (``23.54``, ``130.6``, ``160``, ``0.0526``);
- :func:`setup`: the chapters' pandas tables print their floats with :func:`number`;
- :func:`videos`: promoted rollout videos side by side, each with its caption, embedded in the page.

matplotlib, pandas and IPython are imported inside the functions.
"""

from __future__ import annotations

import math

#: the text column of the HTML book, in CSS pixels: a wider figure is shown scaled down to it
PAGE_PX = 700
#: the smallest text a shown figure may have, in CSS pixels at :data:`PAGE_PX`
MIN_TEXT_PX = 10.0


def readable(fig, page_px: int = PAGE_PX, min_text_px: float = MIN_TEXT_PX):
    """Enlarge every text of ``fig`` (titles, labels, ticks, legends, annotations) that would be
    smaller than ``min_text_px`` once the figure is scaled to ``page_px`` wide. Returns ``fig``."""
    from matplotlib.text import Text

    width_in = fig.get_figwidth()
    px_per_pt = min(page_px, width_in * 100) / (width_in * 72)  # shown at 100 dpi, at most page wide
    smallest_pt = min_text_px / px_per_pt
    for text in fig.findobj(Text):
        if text.get_text() and text.get_fontsize() < smallest_pt:
            text.set_fontsize(smallest_pt)
    return fig


def figure_png(fig, dpi: int = 80) -> bytes:
    """A Figure (pyplot's or not) as PNG bytes."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def show(fig, dpi: int = 100, page_px: int = PAGE_PX) -> None:
    """Show a figure in the notebook (and so on the book's page) however it was built: a
    ``matplotlib.figure.Figure`` made without pyplot (which IPython would print as ``<Figure size
    ...>``), a pyplot figure (closed after, so it is not shown twice), or anything with a
    ``figure`` attribute (an Axes). Small text is enlarged first (:func:`readable`); a figure wider
    than the page is shown at the page's width."""
    import matplotlib.pyplot as plt
    from IPython.display import Image, display
    from matplotlib._pylab_helpers import Gcf

    fig = getattr(fig, "figure", fig)
    if not hasattr(fig, "savefig"):
        raise TypeError(f"show() takes a matplotlib Figure (or an Axes), not {type(fig).__name__}")
    png = figure_png(readable(fig, page_px), dpi=dpi)
    width = min(page_px, round(fig.get_figwidth() * dpi))
    display(Image(data=png, format="png", width=width))
    if any(m.canvas.figure is fig for m in Gcf.get_all_fig_managers()):  # pyplot's: not shown twice
        plt.close(fig)


def number(x) -> str:
    """``x`` rounded for reading: whole numbers without a decimal point, three or four significant
    digits otherwise, thousands grouped (``160.0`` -> ``160``, ``23.540298`` -> ``23.54``,
    ``130.6`` -> ``130.6``, ``0.052598`` -> ``0.0526``, ``12345.6`` -> ``12,346``)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        return str(x)
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}" if abs(x) >= 10_000 else str(int(x))
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.4g}"
    if a >= 1e-4:
        return f"{x:.3g}"
    return f"{x:.2e}"


def setup() -> None:
    """The chapters' display settings: pandas prints floats with :func:`number` and every cell's
    text whole (no ``...`` cut at 50 characters), and in a notebook a table whose rows carry only
    pandas' default numbering (0, 1, 2, ...) is shown without that column, which names nothing."""
    import pandas as pd

    pd.set_option("display.float_format", number)
    pd.set_option("display.max_colwidth", None)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the notebooks
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, table_html)


def table_html(df) -> str:
    """``df`` as the HTML table the chapters show: pandas' own HTML (its display options apply),
    without the index column when the index is pandas' default numbering."""
    import pandas as pd

    numbered = (
        isinstance(df.index, pd.RangeIndex) and df.index.start == 0 and df.index.step == 1 and df.index.name is None
    )
    return df.to_html(
        index=not numbered,
        max_rows=pd.get_option("display.max_rows"),
        max_cols=pd.get_option("display.max_columns"),
        show_dimensions=pd.get_option("display.show_dimensions"),
        notebook=True,
    )


__all__ = ["PAGE_PX", "MIN_TEXT_PX", "figure_png", "readable", "show", "number", "setup", "table_html"]


#: the width of a rollout video on the page, in CSS pixels (two fit side by side in :data:`PAGE_PX`)
VIDEO_PX = 320


def videos_html(items, width: int = VIDEO_PX) -> str:
    """HTML for ``items`` (``(path, caption)`` pairs) as captioned videos that wrap side by side,
    each embedded as a data URI (the page needs no file beside it). A missing file raises
    FileNotFoundError naming it."""
    import base64
    import html
    from pathlib import Path

    figs = []
    for path, caption in items:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such video (promote the run that made it)")
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        figs.append(
            f'<figure style="margin:0;width:{width}px">'
            f'<video controls loop muted playsinline width="{width}">'
            f'<source src="data:video/mp4;base64,{data}" type="video/mp4"></video>'
            f'<figcaption style="font-size:0.85em">{html.escape(str(caption))}</figcaption></figure>'
        )
    return '<div style="display:flex;flex-wrap:wrap;gap:12px">' + "".join(figs) + "</div>"


def videos(items, width: int = VIDEO_PX) -> None:
    """Show ``items`` (``(path, caption)`` pairs) as captioned videos side by side (:func:`videos_html`)."""
    from IPython.display import HTML, display

    display(HTML(videos_html(items, width)))
