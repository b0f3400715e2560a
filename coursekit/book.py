"""Helpers for the book pages: gluing computed numbers into prose, and a few
plotting conveniences so every page looks the same.

Gluing
------
A page computes a number in a code cell and calls ``glue("name", value)``; the
prose then cites it with a MyST role instead of typing it in::

    The error is {glue:text}`err:.2e` and the total is {glue:text}`total:,d`.

``glue:text`` formats the glued ``text/plain`` value with the format spec after
the last colon (the spec must end with its type letter: ``f``, ``e``, ``d``,
``g``, ``%`` or ``s``).  A value glued with ``fmt=`` is stored as an already
formatted string and is cited without a spec: {glue:text}`name`.

When ``myst_nb`` is not installed (e.g. on Colab) ``glue`` prints
``name = value`` instead, so the pages run anywhere.

Figures
-------
A page shows a figure with ``show(fig, alt=..., caption=...)`` instead of ``plt.show()``.
The alt text says what the figure shows and what to take from it, for readers who cannot
see it (screen readers read it aloud); it is an f-string, so it can quote the page's own
computed numbers.  The caption is one short sentence printed under the figure in the book.
Both travel in the output's metadata (``{"image/png": {"alt": ..., "caption": ...}}``),
where the book's renderer (``coursekit.sphinx_book.FigureRenderer``) reads them.

``show`` also stores the height of the figure's smallest text in pixels of the image
(``"text_px"``). The book never shows a figure smaller than the size at which that text is
``MIN_TEXT_PX`` pixels high: where the text column is narrower (a phone), the figure keeps
that size and scrolls sideways inside its frame (``book/_static/course.css``).

Scale
-----
A page whose experiment trains or measures for long sets ``SCALE = page_scale(1)`` in its
imports cell and sizes the experiment from ``SCALE`` alone (steps, rows, held-out items).  The
book runs it at the default.  ``COURSE_PROFILE=smoke`` in the environment (the course's Colab
tier, which asks only whether every cell runs on Colab's packages) makes ``page_scale`` return
``SMOKE_FRACTION`` of the default instead.  A conclusion that the page asserts at run time, and
that needs the default's amount of training, goes through ``check_claim``: at the smoke scale a
claim that does not hold prints a note instead of failing.
"""
from __future__ import annotations

import inspect
import numbers
import os
from typing import Any, Sequence

# Imports inside functions: matplotlib, numpy, IPython and myst_nb are imported by the functions that draw
# or glue: the book's build (sphinx_book) imports this module for its constants without them.

__all__ = ["check_claim", "glue", "heatmap", "fit_loglog_slope", "page_scale", "set_style", "show", "show_source"]

PROFILE_VARIABLE = "COURSE_PROFILE"
PROFILES = ("full", "cpu", "smoke")  # the exercises' profiles; a page tells only "smoke" from the rest
SMOKE_FRACTION = 1 / 8  # the share of its default scale a page runs at under COURSE_PROFILE=smoke


def smoke_run() -> bool:
    """Whether ``COURSE_PROFILE`` asks for the smoke scale (unset or empty: no)."""
    profile = os.environ.get(PROFILE_VARIABLE, "").strip().lower()
    if profile and profile not in PROFILES:
        raise ValueError(f"{PROFILE_VARIABLE}={os.environ[PROFILE_VARIABLE]!r} is not a profile: "
                         f"use one of {', '.join(PROFILES)}")
    return profile == "smoke"


def page_scale(default: int = 1) -> float:
    """A page's ``SCALE``: ``default`` as the book runs it; ``SMOKE_FRACTION`` of it (a float, so
    sizes are written ``round(n * SCALE)``) when ``COURSE_PROFILE=smoke``."""
    if isinstance(default, bool) or not isinstance(default, numbers.Real) or not default > 0:
        raise ValueError(f"page_scale: the default scale must be a positive number, not {default!r}")
    return default * SMOKE_FRACTION if smoke_run() else default


def check_claim(holds: bool, message: str) -> None:
    """Assert a conclusion the page draws from its experiment.  At the smoke scale the experiment
    is too small to show it, so a claim that does not hold prints a note there instead."""
    if holds:
        return
    if smoke_run():
        print(f"(smoke scale, COURSE_PROFILE=smoke: not checked here: {message})")
        return
    raise AssertionError(message)


def _plain(value: Any) -> Any:
    """Turn numpy / torch scalars into Python scalars.

    ``glue:text`` parses the ``text/plain`` repr with ``ast.literal_eval``; numpy 2
    writes ``np.float64(0.5)`` there, which it cannot parse.
    """
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        value = item()
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def glue(name: str, value: Any, fmt: str | None = None) -> None:
    """Store ``value`` under ``name`` for ``{glue:text}`` roles in the page's prose.

    ``fmt`` (a format spec such as ``",d"`` or ``".3f"``) stores the formatted
    string instead of the number.  Returns None, so a ``glue`` call on the last
    line of a cell does not echo the value.
    """
    value = _plain(value)
    if fmt is not None:
        value = format(value, fmt)
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:
        print(f"{name} = {value}")
    else:
        _myst_glue(name, value, display=False)


MIN_ALT_WORDS = 8  # a screen reader user should learn more than a title
MIN_TEXT_PX = 9  # the smallest text of a figure, as the book shows it, in CSS pixels


def smallest_text_px(fig) -> float:
    """The height of the smallest visible text of ``fig`` (titles, labels, tick labels,
    legends, annotations) in pixels of the saved image, after drawing it once."""
    import matplotlib as mpl
    from matplotlib.text import Text

    fig.canvas.draw()  # tick labels get their text when the figure is drawn
    dpi = mpl.rcParams["savefig.dpi"]
    dpi = fig.dpi if dpi == "figure" else float(dpi)
    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and t.get_alpha() != 0]
    return round(min(sizes) * dpi / 72, 2) if sizes else 0.0


def figure_metadata(alt: str, caption: str | None = None, text_px: float | None = None) -> dict:
    """The output metadata ``show`` attaches to a figure; checks the texts first."""
    if not isinstance(alt, str) or len(alt.split()) < MIN_ALT_WORDS:
        raise ValueError(f"show(): alt text must say in at least {MIN_ALT_WORDS} words what the figure "
                         f"shows and what to take from it, got {alt!r}")
    if "$" in alt or (caption and "$" in caption):
        raise ValueError("show(): alt text and caption are plain text, not TeX: write the symbols out "
                         f"(got {alt if '$' in alt else caption!r})")
    meta = {"alt": " ".join(alt.split())}
    if caption is not None:
        if not isinstance(caption, str) or not caption.strip():
            raise ValueError(f"show(): caption must be a non-empty sentence, got {caption!r}")
        meta["caption"] = " ".join(caption.split())
    if text_px:
        meta["text_px"] = float(text_px)
    return {"image/png": meta}


def show(fig=None, *, alt: str, caption: str | None = None) -> None:
    """Show ``fig`` (default: the current figure) with its alt text and caption, then close it.

    Use it where a page would call ``plt.show()``: inside a notebook the figure appears as
    usual, and the book puts ``alt`` on the image and ``caption`` under it (see the module
    docstring).  Outside a notebook it only closes the figure.
    """
    import matplotlib.pyplot as plt

    fig = plt.gcf() if fig is None else fig
    figure_metadata(alt, caption)  # the texts are checked before the figure is drawn
    metadata = figure_metadata(alt, caption, smallest_text_px(fig))
    try:
        from IPython import get_ipython
    except ImportError:
        shell = None
    else:
        shell = get_ipython()
    if shell is not None:
        from IPython.display import display

        display(fig, metadata=metadata)
    plt.close(fig)  # shown once: the inline backend would otherwise show it again at the end of the cell


def _inline_figures_in_kernels() -> None:
    """Inside a Jupyter kernel, draw figures inline even if the environment named a
    non-interactive backend (``MPLBACKEND=Agg``): there ``plt.show()`` shows nothing, and a
    page executed that way would reach the built book without its figures."""
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: nothing to display into
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):  # a terminal IPython keeps its backend
        return
    import matplotlib

    if matplotlib.get_backend().lower() == "agg":
        shell.run_line_magic("matplotlib", "inline")


def show_source(*objects):
    """The source code of functions or classes, shown as highlighted code.

    Returns an IPython ``Code`` object: the last line of a cell displays it with syntax
    colours in the book, in JupyterLab and on Colab (a printed ``inspect.getsource`` string
    is plain, unhighlighted text).  The code shown is the code that runs.
    """
    from IPython.display import Code

    return Code("\n\n\n".join(inspect.getsource(obj).rstrip() for obj in objects), language="python")


def set_style() -> None:
    """One look for every page: readable sizes, light grid, tight layout; figures inline."""
    import matplotlib as mpl

    _inline_figures_in_kernels()
    mpl.rcParams.update({
        "figure.figsize": (6.4, 4.0),
        "figure.dpi": 100,
        "figure.autolayout": True,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "font.size": 10,
        "legend.frameon": False,
    })


def heatmap(ax, matrix, xlabels: Sequence | None = None, ylabels: Sequence | None = None,
            title: str | None = None, *, xlabel: str | None = None,
            ylabel: str | None = None, cmap: str = "viridis", vmin=None, vmax=None,
            colorbar: bool = True, annotate: bool = False, fmt: str = ".2f"):
    """Draw a 2-D array onto ``ax`` (rows top to bottom) and return the image.

    Tick labels are drawn only when given; ``annotate`` writes each value in its
    cell (for small matrices such as attention weights).
    """
    import numpy as np

    data = matrix.detach().cpu().numpy() if hasattr(matrix, "detach") else np.asarray(matrix)
    if data.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D array, got shape {data.shape}")
    im = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                   interpolation="nearest")
    ax.grid(False)
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), [str(s) for s in xlabels], rotation=90)
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), [str(s) for s in ylabels])
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate:
        lo, hi = np.nanmin(data), np.nanmax(data)
        mid = (lo + hi) / 2
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                ax.text(j, i, format(data[i, j], fmt), ha="center", va="center",
                        fontsize=7, color="black" if data[i, j] > mid else "white")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return im


def fit_loglog_slope(x, y) -> float:
    """Least-squares slope of log(y) against log(x): the exponent p in y ~ x**p."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])
