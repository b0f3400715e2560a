"""The built book as files: executed pages hold their figures, the HTML shows them, math and
everything else comes from the build itself (no CDN), long outputs are collapsed, no page
shows a line of a solution or a hidden test.

The browser test (test_book_browser.py) then looks at the same pages in Chromium.
"""
from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest

import coursekit
from bookcheck import PAGES, ROOT, executed, figures_by_cell, images_in_outputs, read
from conftest import read_nb, secret_lines, source_notebooks

BUILD = ROOT / "_build"


@pytest.fixture(params=PAGES, ids=[p.name for p in PAGES])
def page(request, built_book):
    return request.param


def test_the_build_reads_no_environment_folder(tmp_path):
    """Sphinx skips the virtual environments in the checkout (.venv/, .venv-compat/ of test_compat)."""
    import yaml
    from sphinx.util.matching import get_matching_files

    patterns = yaml.safe_load((ROOT / "_config.yml").read_text())["exclude_patterns"]
    # a package's template page, like the one that stopped the build with a YAML error
    for rel in [".venv/lib/site-packages/pkg/card.md", ".venv-compat/lib/site-packages/pkg/card.md",
                ".venv-compat/card.md", "book/page.md"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("---\n{{ card_data }}\n---\n")
    read = sorted(get_matching_files(tmp_path, include_patterns=["**"], exclude_patterns=patterns))
    assert read == ["book/page.md"], f"the book build would read {read}"

def test_the_build_executed_no_page_that_nbval_ran(request):
    """Each page is executed once per suite run: the build takes every page that nbval ran in full in
    this session from the execution cache (tests/book_cache.py) instead of executing it again."""
    from book_cache import PLUGIN, built_from_cache

    cached = request.config.pluginmanager.get_plugin(PLUGIN).cached
    if not cached:
        pytest.skip("nbval ran no book page in full in this session (run the book's pages first)")
    request.getfixturevalue("built_book")  # the build, after nbval's runs
    again = [Path(p).name for p in sorted(cached) if built_from_cache(Path(p)) is not True]
    assert not again, f"the book build executed again what nbval had run: {again}"


def test_every_page_makes_figures():
    # the checks below compare against these counts: a page whose figures are not counted
    # here would pass them trivially
    for path in PAGES:
        assert sum(figures_by_cell(read(path)).values()) > 0, f"{path.name} makes no figure"


def test_executed_page_holds_an_image_for_every_figure(page):
    run = {c.id: c for c in executed(page, BUILD).cells if c.cell_type == "code"}
    for cell_id, want in figures_by_cell(read(page)).items():
        got = images_in_outputs(run[cell_id])
        assert got >= want, (f"{page.name}, cell {cell_id}: makes {want} figure(s) but its executed "
                             f"outputs hold {got} image(s); does the kernel inherit MPLBACKEND=Agg?")


def test_built_html_shows_every_figure(page, built_book):
    html = (built_book / "book" / f"{page.stem}.html").read_text()
    images = re.findall(r'<img[^>]+src="(\.\./_images/[^"]+)"', html)
    want = sum(figures_by_cell(read(page)).values())
    assert len(images) >= want, f"{page.name}: {len(images)} figure images in the HTML, {want} made"
    for src in images:
        assert (built_book / "book" / src).resolve().is_file(), f"{page.name}: {src} missing"


def test_executable_pages_have_a_colab_button(built_book):
    for page in (ROOT / "book").glob("*.ipynb"):
        html = (built_book / "book" / f"{page.stem}.html").read_text()
        target = f"colab.research.google.com/github/{coursekit.REPO}/blob/main/book/{page.name}"
        assert target in html, f"{page.name}: no Open-in-Colab button"


def test_pages_load_nothing_from_a_cdn(built_book):
    # scripts, styles and fonts that a page loads: all from the build, so the book works offline
    loads = re.compile(r'<(?:script|link)\b[^>]*(?:src|href)="(https?://[^"]+)"')
    for html in sorted((built_book / "book").glob("*.html")):
        remote = [u for u in loads.findall(html.read_text()) if not u.startswith(
            ("https://github.com/", "https://colab.research.google.com/"))]
        assert not remote, f"{html.name} loads {remote}"
    text = (built_book / "book" / f"{PAGES[0].stem}.html").read_text()
    assert re.search(r'<script[^>]+src="\.\./_static/mathjax/tex-mml-chtml\.js', text), \
        "MathJax is not served from _static (is it installed? scripts/env.sh installs it with npm)"
    assert (built_book / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").is_dir()


LONG_OUTPUT = 30  # lines of printed text beyond which a reader should not have to scroll past them
FOLDED = {"hide-output", "output_scroll", "remove-output"}


def test_long_outputs_are_folded(page):
    source = {c.id: c for c in read(page).cells}
    for cell in executed(page, BUILD).cells:
        if cell.cell_type != "code":
            continue
        streams = [o.get("text", "") for o in cell.outputs if o.output_type == "stream"]
        text = "".join(streams)
        if len(streams) > 1 and streams[0].endswith("".join(streams[1:])):
            text = streams[0]  # a page the build executed: myst-nb put the merged text in the first stream
        text += "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs
                        if o.output_type in ("execute_result", "display_data") and "text/html" not in o.get("data", {}))
        if text.count("\n") > LONG_OUTPUT:
            tags = set(source[cell.id].metadata.get("tags", []))
            assert tags & FOLDED, (f"{page.name}, cell {cell.id}: {text.count(chr(10))} lines of output; "
                                   f"tag the cell hide-output or output_scroll")


# ------------------------------------------------------------------- no solution in the book

def _html_text(path) -> set[str]:
    raw = path.read_text(errors="replace")
    text = unescape(re.sub(r"<[^>]+>", "", raw))
    return {ln.strip() for ln in text.splitlines()}


# Statements every PyTorch training loop has: a book page that trains a model shows them too,
# and that gives nothing away. Everything else in a solution or hidden test counts as a leak.
TRAINING_LOOP_IDIOMS = re.compile(
    r"^(loss\.backward\(\)|optimizer\.step\(\)|scheduler\.step\(\)|optimizer\.zero_grad\((set_to_none=True)?\)"
    r"|model\.(train|eval)\(\))$")


def test_no_solution_or_hidden_test_in_built_html(built_book):
    secrets = set()
    for src in source_notebooks():
        secrets |= secret_lines(read_nb(src))
    secrets = {ln for ln in secrets if not TRAINING_LOOP_IDIOMS.match(ln)}
    assert len(secrets) > 100
    pages = list(built_book.rglob("*.html"))
    assert len(pages) >= 3
    for page in pages:
        leaked = secrets & _html_text(page)
        assert not leaked, f"{page.relative_to(built_book)} shows solution/hidden lines: {sorted(leaked)[:3]}"
    assert not (built_book / "solutions").exists() and not (built_book / "exercises").exists()
