"""What the book's tests need to know about a page without running it.

Shared by ``test_book_build.py`` (the executed notebooks and the HTML) and
``test_book_browser.py`` (the pages in Chromium).
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "book").glob("*.ipynb"))

# A page makes a figure with plt.subplots(...) or plt.figure(...); the conventions ask for
# nothing else (book.heatmap draws onto an existing axes).
FIGURE_CALL = re.compile(r"\bplt\.(subplots|figure)\(")
IMAGE_MIMES = ("image/png", "image/svg+xml", "image/jpeg")


def read(path: Path):
    return nbformat.read(path, as_version=4)


def figures_in_cell(source: str) -> int:
    """How many figures a code cell makes (each plt.subplots / plt.figure call is one)."""
    return len(FIGURE_CALL.findall(source))


def figures_by_cell(nb) -> dict[str, int]:
    """cell id -> number of figures, for the code cells of a page that make any."""
    counts = {c.id: figures_in_cell(c.source) for c in nb.cells if c.cell_type == "code"}
    return {cid: n for cid, n in counts.items() if n}


def images_in_outputs(cell) -> int:
    return sum(1 for o in cell.get("outputs", []) for m in IMAGE_MIMES if m in o.get("data", {}))


def executed(page: Path, build: Path):
    """The executed copy of a page that the book build wrote (myst-nb's jupyter_execute)."""
    return read(build / "jupyter_execute" / "book" / page.name)


MIN_ALT_WORDS = 8  # as coursekit.book.show requires (coursekit.book.MIN_ALT_WORDS)


def alt_problem(figure: dict) -> str | None:
    """Why the alt text of ``figure`` ({"src": image file name, "alt": its alt text}) would not
    serve a reader who cannot see the figure, or None if it would."""
    alt = figure["alt"].strip()
    if not alt:
        return "no alt text"
    stem = figure["src"].rsplit(".", 1)[0]
    if stem in alt or alt.lower().endswith((".png", ".jpg", ".jpeg", ".svg")) or "_images/" in alt:
        return f"alt text is a file name: {alt[:60]!r}"
    if len(alt.split()) < MIN_ALT_WORDS:
        return f"alt text says too little: {alt!r}"
    return None
