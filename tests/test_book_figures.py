"""The book's figures on every screen (issue 35, item 22), without building the book: the code
that only draws a figure is folded, and every figure carries what the book needs to keep its
smallest text legible (tests/test_book_browser.py measures it in the browser at 390 and 1280 px)."""
from __future__ import annotations

import base64
import io
import re

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bookcheck import PAGES, read  # noqa: E402
from coursekit import book  # noqa: E402

SHOWS = re.compile(r"\bshow\(")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_figure_code_is_folded(page):
    """A cell that shows a figure opens folded (tag hide-input); what it shows was computed in
    the visible cell above it, so the page reads as text, code and figure, not as plumbing."""
    unfolded = [i for i, c in enumerate(read(page).cells)
                if c.cell_type == "code" and SHOWS.search(c.source) and "hide-input" not in c.metadata.get("tags", [])]
    assert not unfolded, (f"{page.name}: cells {unfolded} show a figure but are not folded: move the "
                          "computation into the cell above and tag the plotting cell hide-input")


def test_show_measures_the_smallest_text():
    book.set_style()
    fig, axes = plt.subplots(1, 2)
    axes[0].plot([0, 1], label="a line")
    axes[0].legend(fontsize=7)
    axes[1].set_title("big", fontsize=20)
    px = book.smallest_text_px(fig)
    assert px == pytest.approx(7 * fig.dpi / 72, abs=0.01)  # the legend, not the 10-point tick labels
    axes[0].get_legend().remove()
    assert book.smallest_text_px(fig) == pytest.approx(plt.rcParams["font.size"] * fig.dpi / 72, abs=0.01)
    plt.close(fig)
    meta = book.figure_metadata("Two panels: a rising line on the left, a title on the right.", "Two panels.", px)
    assert meta["image/png"]["text_px"] == px


def _png(fig) -> str:
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return base64.b64encode(out.getvalue()).decode()


def test_renderer_gives_each_figure_its_legible_width(monkeypatch):
    from docutils import nodes
    from myst_nb.core.render import MimeData, NbElementRenderer

    from coursekit import sphinx_book

    fig = plt.figure(figsize=(13, 4), dpi=100)
    content = _png(fig)
    assert sphinx_book.png_width(content) == 1300
    assert sphinx_book.png_width("bm90IGEgcG5n") is None  # "not a png"
    monkeypatch.setattr(NbElementRenderer, "render_image", lambda self, data: [nodes.image(uri="_build/abc123.png")])
    renderer = object.__new__(sphinx_book.FigureRenderer)
    text_px = 8 * 100 / 72  # 8-point text at 100 dpi
    meta = book.figure_metadata("A wide figure of three panels with small legends in each.", "Wide.", text_px)
    [figure] = renderer.render_image(MimeData("image/png", content, output_metadata=meta))
    width = sphinx_book.legible_width(1300, text_px)
    assert width * text_px / 1300 >= book.MIN_TEXT_PX > (width - 1) * text_px / 1300
    assert f"course-minw-{width}" in figure["classes"]
    html = sphinx_book.accessible_body(f'<figure class="align-default course-figure course-minw-{width}" id="x">')
    assert f'style="--course-min-width: {width}px" tabindex="0"' in html
    # a figure without the measurement (shown before show() measured) keeps the theme's layout
    [plain] = renderer.render_image(MimeData("image/png", content, output_metadata=book.figure_metadata(
        "A wide figure of three panels with small legends in each.", "Wide.")))
    assert not [c for c in plain["classes"] if c.startswith("course-minw-")]
