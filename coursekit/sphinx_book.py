"""Sphinx extension for the course's book: the built pages work offline and without errors.

* MathJax is served from the built book, so that math is typeset with no network.
* The executed copy of a page, ``_build/jupyter_execute/<page>.ipynb``, holds its outputs.
  When a page's outputs come from the execution cache, myst-nb 1.x renders the cached outputs
  but writes the copy from the unexecuted source; we put the cached outputs back in.
* Figures carry their alt text and caption: ``coursekit.book.show`` stores them in the
  output's metadata, and :class:`FigureRenderer` (myst-nb's renderer, chosen in
  ``_config.yml`` with ``nb_render_plugin: course``) puts the alt text on the image and wraps
  it in a numbered figure with the caption.  myst-nb itself reads only width and height there.
  A figure is never drawn smaller than the width at which its smallest text (``text_px``, which
  ``show`` measures) is ``coursekit.book.MIN_TEXT_PX`` pixels high: the figure gets that width
  as ``--course-min-width`` and, where the column is narrower (a phone), scrolls sideways in
  its frame, which the keyboard can reach (``book/_static/course.css``).
* Two fixes to the HTML of the page body for assistive technology (WCAG 2.1 A/AA, as axe-core
  checks it in tests/test_book_browser.py). docutils marks each bibliography entry with the
  deprecated ARIA role ``doc-biblioentry`` inside a ``role="list"`` that then has no list
  items (axe-core: aria-deprecated-role, aria-required-children); the entries get
  ``role="listitem"``, which DPUB-ARIA 1.1 asks for instead. myst-nb names the folded setup
  cell's toggle "Toggle hidden content" while it shows "Show code cell source" (WCAG 2.5.3,
  label-content-name-mismatch); without the aria-label its name is what it shows.
* A page never gets the same inline script twice. Scripts that extensions add while the
  build runs (sphinx-thebe's configuration, sphinx-togglebutton's selector) reach the page
  twice with Sphinx 7.4, and a second ``const THEBE_JS_URL = ...`` is a JavaScript error
  on every page.

MathJax
-------

``_config.yml`` points ``mathjax_path`` at ``mathjax/tex-mml-chtml.js``, which Sphinx reads
relative to the build's ``_static`` folder; this extension copies MathJax there at the end
of every HTML build.  MathJax itself is not in the repository: ``scripts/env.sh`` installs
the npm package ``mathjax`` (pinned) into the virtual environment, under
``<venv>/share/mathjax``; ``COURSE_MATHJAX_DIR`` may name another copy of its ``es5`` folder.

Where no copy is found the pages load MathJax from its CDN, as Sphinx does by default, and
the build says so: math then needs the network.
"""
from __future__ import annotations

import base64
import math
import os
import re
import shutil
import struct
import sys
from importlib.metadata import entry_points
from pathlib import Path

from docutils import nodes
from myst_nb.core.render import MimeData, NbElementRenderer

from . import envvars
from .book import MIN_TEXT_PX

# Imports inside functions: sphinx, nbformat and jupyter_cache are imported by the build's hooks that use
# them: the tests use this module's helpers (png_width, accessible_body, ...) without a Sphinx build.

ENTRY = "tex-mml-chtml.js"  # the combined component Sphinx loads by default (TeX and MathML in, HTML out)
CDN = f"https://cdn.jsdelivr.net/npm/mathjax@3/es5/{ENTRY}"
# What a page can need at run time besides the entry script: TeX extensions and fonts are
# loaded on demand, the menu and the accessibility parts when a reader turns them on.
PARTS = [ENTRY, "input", "output", "ui", "a11y", "adaptors", "sre"]


def find_mathjax() -> Path | None:
    """The ``es5`` folder of an installed MathJax 3, or None."""
    candidates = [envvars.get("COURSE_MATHJAX_DIR", ""),
                  str(Path(sys.prefix) / "share" / "mathjax" / "node_modules" / "mathjax" / "es5")]
    for candidate in candidates:
        if candidate and (Path(candidate) / ENTRY).is_file():
            return Path(candidate)
    return None


def _choose_source(app, config) -> None:
    from sphinx.util import logging

    app.course_mathjax_es5 = find_mathjax()  # read again when the build has finished
    if app.course_mathjax_es5 is None:
        logging.getLogger(__name__).info(
            "MathJax is not installed (scripts/env.sh installs it with npm): the pages load it "
            "from a CDN and show raw TeX without a network")
        config.mathjax_path = CDN


def _check_figure_renderer(app, config) -> None:
    """The renderer ``course`` is an entry point of this package: an environment that installed
    an older version of it has none, and myst-nb would stop with "No Entry Point found"."""
    from sphinx.util import logging

    if config.nb_render_plugin == "course" and not entry_points(group="myst_nb.renderers", name="course"):
        logging.getLogger(__name__).warning(
            "the book's figure renderer is not installed (scripts/env.sh installs it with the course "
            "package): figures are built without their alt text and captions")
        config.nb_render_plugin = "default"


def _copy_into_static(app, exception) -> None:
    es5 = getattr(app, "course_mathjax_es5", None)
    if exception is not None or es5 is None or app.builder.format != "html":
        return
    dest = Path(app.outdir) / "_static" / Path(app.config.mathjax_path).parent
    dest.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        src = es5 / part
        if src.is_dir():
            shutil.copytree(src, dest / part, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, dest / part)


def _drop_repeated_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        filename = getattr(script, "filename", script) or ""  # None and "" both mean inline
        key = (str(filename), tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _executed_copies_with_outputs(app, exception) -> None:
    config = getattr(app.env, "mystnb_config", None)
    if exception is not None or config is None or not config.output_folder:
        return
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(config.execution_cache_path)
    for path in Path(config.output_folder).rglob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        if any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"):
            continue  # executed in this build: written with its outputs
        try:
            _, merged = cache.merge_match_into_notebook(nb)
        except KeyError:  # not in the cache, e.g. a page whose execution failed
            continue
        nbformat.write(merged, path)


def png_width(content: str | bytes) -> int | None:
    """The width in pixels of a PNG, base64-encoded (as notebooks store it) or raw; None if
    it is no PNG."""
    try:
        head = base64.b64decode(content[:64]) if isinstance(content, str) else content[:48]
    except (ValueError, TypeError):
        return None
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">I", head[16:20])[0]


def legible_width(natural: int, text_px: float) -> int:
    """The narrowest width, in CSS pixels, at which an image ``natural`` pixels wide whose
    smallest text is ``text_px`` pixels high shows that text at MIN_TEXT_PX or more."""
    return math.ceil(natural * MIN_TEXT_PX / text_px)


class FigureRenderer(NbElementRenderer):
    """myst-nb's renderer, plus the alt text and caption that ``coursekit.book.show`` stores
    in a figure output's metadata (registered as the myst-nb renderer ``course``)."""

    def render_image(self, data: MimeData) -> list[nodes.Element]:
        rendered = super().render_image(data)
        meta = (data.output_metadata or {}).get(data.mime_type, {})
        if len(rendered) != 1 or not isinstance(meta, dict):
            return rendered
        image = rendered[0]
        if meta.get("alt"):
            image["alt"] = str(meta["alt"])
        if not meta.get("caption"):
            return rendered
        figure = nodes.figure("", image, classes=["course-figure"])
        # an id makes Sphinx number the figure (numfig); the image's file name is its hash
        figure["ids"].append("fig-" + Path(image["uri"]).stem[:16])
        figure += nodes.caption(str(meta["caption"]), str(meta["caption"]))
        natural = png_width(data.content) if data.mime_type == "image/png" else None
        text_px = meta.get("text_px")
        if natural and isinstance(text_px, (int, float)) and text_px > 0:
            # classes carry the numbers to the HTML: accessible_body turns them into a style
            figure["classes"] += [f"course-minw-{legible_width(natural, text_px)}",
                                  f"course-text-{round(100 * text_px)}"]
        return [figure]


_BIBLIOENTRY = re.compile(r'(<div class="citation" id="[^"]*") role="doc-biblioentry"')
_TOGGLE_SUMMARY = '<summary aria-label="Toggle hidden content">'
_MIN_WIDTH = re.compile(r'<figure class="([^"]*\bcourse-minw-(\d+)\b[^"]*)"')


def accessible_body(body: str) -> str:
    """The page body with the two fixes of the module docstring, and each figure's legible
    width as a style (a figure that may scroll sideways can be reached with the keyboard)."""
    body = _BIBLIOENTRY.sub(r'\1 role="listitem"', body)
    body = _MIN_WIDTH.sub(r'<figure class="\1" style="--course-min-width: \2px" tabindex="0"', body)
    return body.replace(_TOGGLE_SUMMARY, "<summary>")


def _accessible_body(app, pagename, templatename, context, doctree) -> None:
    if context.get("body"):
        context["body"] = accessible_body(context["body"])


def setup(app):
    app.connect("config-inited", _choose_source)
    app.connect("config-inited", _check_figure_renderer)
    app.connect("html-page-context", _drop_repeated_scripts, priority=900)  # after the others added theirs
    app.connect("html-page-context", _accessible_body)
    app.connect("build-finished", _copy_into_static)
    app.connect("build-finished", _executed_copies_with_outputs)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
