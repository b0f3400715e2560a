"""Checks for the book pages and their helpers, without executing the pages.

Executing the pages is nbval's job (``pytest --nbval-lax book/``); here we test
``coursekit.book`` and the structure every page in ``book/`` must have.
"""
from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display in CI

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from bookcheck import alt_problem, figures_in_cell  # noqa: E402
from coursekit import book  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "book").glob("*.ipynb"))
GLUE_ROLE = re.compile(r"\{glue(?::text|:any|:md|:)?\}`([^`]+)`")
GLUE_CALL = re.compile(r"""\bglue\(\s*f?["']([^"']+)["']""")
PLOT_CALL = re.compile(r"\b(plt\.(subplots|figure|plot|imshow|bar|hist|scatter)|heatmap)\(")
# names the graded assignment asks students to write; pages must not hand them out
ASSIGNMENT_NAMES = re.compile(
    r"\bdef (get_multihead_qkv|calculate_multihead_attention|apply_rope|generate_with_cache|kv_cache_bytes)\b|"
    r"\bclass (MultiHeadAttention|GroupedQueryAttention)\b")


def setup_cell_source() -> str:
    """The setup cell every page must start with: the release template, filled from course.yml.

    docs/CONVENTIONS.md shows the same template with placeholders; check that it still matches
    the template line for line, so the document cannot drift from what release writes."""
    from autograder.course.model import load
    from autograder.authoring.stamp import setup_source

    expected = setup_source(load(ROOT))
    text = (ROOT / "docs" / "CONVENTIONS.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert block, "CONVENTIONS.md has no python block with the setup cell"
    documented = textwrap.dedent(block.group(1)).strip()
    pattern = re.escape(documented).replace(re.escape("<owner>/<name>@<branch>"), r"\S+@\S+")
    assert re.fullmatch(pattern, expected), "docs/CONVENTIONS.md's setup cell differs from stamp"
    return expected


# --------------------------------------------------------------------------- glue


def test_glue_without_myst_nb_prints(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # makes `import myst_nb` fail
    assert book.glue("answer", np.float64(0.25)) is None
    assert capsys.readouterr().out.strip() == "answer = 0.25"


def test_glue_without_myst_nb_formats(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "myst_nb", None)
    book.glue("total", 22_829_056, fmt=",d")
    assert capsys.readouterr().out.strip() == "total = 22,829,056"


@pytest.mark.parametrize("profile", [None, "", "cpu", "full", " CPU "])
def test_page_scale_is_the_default_outside_the_smoke_profile(monkeypatch, profile):
    if profile is None:
        monkeypatch.delenv("COURSE_PROFILE", raising=False)
    else:
        monkeypatch.setenv("COURSE_PROFILE", profile)
    assert book.page_scale(1) == 1 and isinstance(book.page_scale(1), int)
    assert book.page_scale(3) == 3


def test_page_scale_is_a_fraction_of_the_default_in_the_smoke_profile(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert 0 < book.page_scale(1) == book.SMOKE_FRACTION < 1
    assert book.page_scale(4) == 4 * book.SMOKE_FRACTION


def test_page_scale_names_a_profile_it_does_not_know_and_a_bad_default(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "tiny")
    with pytest.raises(ValueError, match=r"^COURSE_PROFILE='tiny' is not a profile: use one of full, cpu, smoke$"):
        book.page_scale(1)
    monkeypatch.delenv("COURSE_PROFILE")
    for bad in (0, -1, "2", True):
        with pytest.raises(ValueError, match=r"^page_scale: the default scale must be a positive number"):
            book.page_scale(bad)


def test_check_claim_fails_at_the_book_scale_and_prints_a_note_at_the_smoke_scale(monkeypatch, capsys):
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    book.check_claim(True, "holds")
    with pytest.raises(AssertionError, match="^the model beats the baseline$"):
        book.check_claim(False, "the model beats the baseline")
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    book.check_claim(False, "the model beats the baseline")
    out = capsys.readouterr().out
    assert "COURSE_PROFILE=smoke" in out and "not checked here: the model beats the baseline" in out


def test_glue_with_myst_nb_stores_plain_python_values(monkeypatch):
    stored = {}
    fake = type(sys)("myst_nb")
    fake.glue = lambda name, value, display=True: stored.update({name: (value, display)})
    monkeypatch.setitem(sys.modules, "myst_nb", fake)
    torch = pytest.importorskip("torch")
    book.glue("a", np.float32(1.5))
    book.glue("b", torch.tensor(3))
    book.glue("c", np.int64(7), fmt="03d")
    assert stored == {"a": (1.5, False), "b": (3, False), "c": ("007", False)}
    # glue:text parses the text/plain repr with literal_eval: it must not read np.float64(...)
    assert type(stored["a"][0]) is float and type(stored["b"][0]) is int


def test_plain_leaves_other_values_alone():
    assert book._plain("text") == "text"
    assert book._plain(True) is True
    assert book._plain([1, 2]) == [1, 2]


# ------------------------------------------------------------------------ plotting


def test_heatmap_draws_on_axes():
    fig, ax = plt.subplots()
    try:
        im = book.heatmap(ax, np.arange(6.0).reshape(2, 3), ["a", "b", "c"], ["x", "y"],
                          "weights", xlabel="key", ylabel="query", annotate=True)
        assert list(ax.images) == [im]
        assert ax.get_title() == "weights"
        assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y"]
        assert len(ax.texts) == 6  # one annotation per cell
        assert len(fig.axes) == 2  # the colour bar
        np.testing.assert_array_equal(im.get_array(), np.arange(6.0).reshape(2, 3))
    finally:
        plt.close(fig)


def test_heatmap_accepts_tensors_and_rejects_vectors():
    torch = pytest.importorskip("torch")
    fig, ax = plt.subplots()
    try:
        book.heatmap(ax, torch.eye(3, requires_grad=True), colorbar=False)
        assert len(fig.axes) == 1 and ax.get_title() == ""
        with pytest.raises(ValueError):
            book.heatmap(ax, np.ones(3))
    finally:
        plt.close(fig)


def test_show_attaches_alt_text_and_caption(monkeypatch):
    IPython = pytest.importorskip("IPython")
    import IPython.display

    shown = []
    fig, _ = plt.subplots()
    px = book.smallest_text_px(fig)  # what the renderer sizes the figure by (tests/test_book_figures.py)
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())  # as inside a notebook
    monkeypatch.setattr(IPython.display, "display", lambda obj, metadata=None: shown.append((obj, metadata)))
    alt = "A line plot of the loss against the step, falling from 2.3 to 0.4 nats."
    book.show(fig, alt=alt, caption="The loss  falls.")
    assert shown == [(fig, {"image/png": {"alt": alt, "caption": "The loss falls.", "text_px": px}})]
    assert not plt.fignum_exists(fig.number)  # closed: the inline backend does not show it again


@pytest.mark.parametrize("alt, caption", [("", None), ("a plot", None), (None, None),
                                          ("A plot of $x^2$ against x for x from minus one to one.", None),
                                          ("A plot of the loss against the step, falling steadily.", "  ")])
def test_show_refuses_alt_text_that_describes_nothing(alt, caption):
    fig, _ = plt.subplots()
    try:
        with pytest.raises(ValueError, match="show\\(\\)"):
            book.show(fig, alt=alt, caption=caption)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("alt, ok", [
    ("", False), ("70119dc5e1.png", False), ("../_images/70119dc5e1.png", False), ("A loss curve.", False),
    ("A log-scale plot of the error against the step, falling in a straight line to 1e-9.", True)])
def test_alt_problem_tells_description_from_file_name(alt, ok):
    assert (alt_problem({"src": "70119dc5e1.png", "alt": alt}) is None) == ok


def test_fit_loglog_slope_and_style():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    assert book.fit_loglog_slope(x, 3 * x**2) == pytest.approx(2.0)
    book.set_style()
    assert matplotlib.rcParams["axes.grid"] is True


# -------------------------------------------------------------------- page structure


def test_there_are_pages():
    assert PAGES, "book/ has no notebooks"


@pytest.fixture(params=PAGES, ids=[p.name for p in PAGES])
def page(request):
    return request.param, nbformat.read(request.param, as_version=4)


def test_page_is_valid_python3_notebook(page):
    path, nb = page
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", path.name
    assert all("id" in cell for cell in nb.cells), f"{path.name}: cells without ids"


def test_page_has_no_outputs_or_execution_counts(page):
    path, nb = page
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}:{cell.id} has outputs"
            assert cell.execution_count is None, f"{path.name}:{cell.id} has an execution count"


def test_page_starts_with_title_then_setup_cell(page):
    path, nb = page
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), path.name
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert first_code.source.strip() == setup_cell_source(), f"{path.name}: first code cell"


def test_setup_cell_input_is_folded_away(page):
    # readers of the book see its one line of output, not the pip-install code
    path, nb = page
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "hide-input" in first_code.metadata.get("tags", []), f"{path.name}: setup cell not tagged hide-input"


def test_page_shows_source_code_highlighted(page):
    # inspect.getsource printed as a string is plain, unhighlighted text: use book.show_source
    path, nb = page
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not re.search(r"print\(\s*inspect\.getsource", code), path.name


LECTURE_NOTES = re.compile(r"\b(Definition|Remark|Exercise|Example|Alert) 10\.\d+|lecture notes'|\bof the notes\b|"
                           r"\bin the notes\b|source material")
CITE_ROLE = re.compile(r"\{cite(?::[pt])?\}`([^`]+)`")


def bib_keys() -> set[str]:
    return set(re.findall(r"^@\w+\{([^,]+),", (ROOT / "book" / "references.bib").read_text(), flags=re.M))


def test_pages_are_self_contained_and_cite_papers(page):
    # an open book's readers do not have the course's lecture notes; they get the papers
    path, nb = page
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert not LECTURE_NOTES.search(prose), f"{path.name} refers to the lecture notes: {LECTURE_NOTES.search(prose)[0]!r}"
    cited = {k.strip() for group in CITE_ROLE.findall(prose) for k in group.split(",")}
    assert cited, f"{path.name} cites no paper ({{cite:p}}`key`, listed on book/references.md)"
    assert cited <= bib_keys(), f"{path.name} cites keys missing from book/references.bib: {sorted(cited - bib_keys())}"


def test_references_page_lists_the_bibliography():
    page = (ROOT / "book" / "references.md").read_text()
    assert "```{bibliography}" in page
    assert {"vaswani2017attention", "devlin2019bert", "radford2018gpt", "radford2019gpt2", "brown2020gpt3",
            "liu2019roberta", "hu2022lora", "dosovitskiy2021vit", "ouyang2022instructgpt"} <= bib_keys()


def test_page_plots(page):
    path, nb = page
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert PLOT_CALL.search(code), f"{path.name} makes no plot"


SHOW_CALL = re.compile(r"\bshow\(")


def test_every_figure_is_shown_with_alt_text_and_a_caption(page):
    # plt.show() would give the figure no alt text: a screen reader reads the image's file name
    path, nb = page
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        assert "plt.show(" not in cell.source, \
            f"{path.name}:{cell.id} calls plt.show(): use show(fig, alt=..., caption=...) from coursekit.book"
        figures, shown = figures_in_cell(cell.source), len(SHOW_CALL.findall(cell.source))
        assert shown >= figures, f"{path.name}:{cell.id} makes {figures} figure(s) but shows {shown}"
        calls = SHOW_CALL.split(cell.source)[1:]
        for call in calls[:figures]:
            assert "alt=" in call and "caption=" in call, f"{path.name}:{cell.id}: show() without alt= and caption="


GLUED_HEADING = re.compile(r"[^\s#]#{1,6} \S")  # "...nonsense.## GPT-2": a heading that starts no line


def test_headings_start_a_line():
    pages = [(p.name, c.source) for p in PAGES for c in nbformat.read(p, as_version=4).cells
             if c.cell_type == "markdown"] + [(p.name, p.read_text()) for p in (ROOT / "book").glob("*.md")]
    for name, text in pages:
        prose = re.sub(r"`[^`]*`", "", re.sub(r"\$[^$]*\$", "", text))  # code and math may hold a #
        glued = GLUED_HEADING.search(prose)
        assert not glued, f"{name}: a heading glued to the text before it: {glued.group(0)!r}"


def test_every_glued_name_in_prose_is_glued_in_code(page):
    path, nb = page
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    cited = {ref.rsplit(":", 1)[0] if ":" in ref else ref for ref in GLUE_ROLE.findall(prose)}
    glued = set(GLUE_CALL.findall(code))
    # names built with f-strings (e.g. f"p4_slope_{key}_{metric}") match by their prefix
    prefixes = {g.split("{", 1)[0] for g in glued if "{" in g}
    missing = {c for c in cited if c not in glued and not any(c.startswith(p) for p in prefixes)}
    assert not missing, f"{path.name}: cited but never glued: {sorted(missing)}"


def test_page_does_not_hand_out_assignment_solutions(page):
    path, nb = page
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not ASSIGNMENT_NAMES.search(code), path.name


# ------------------------------------------------------------------- figures inline


class _FakeKernelShell:
    kernel = object()  # what an IPython shell inside a Jupyter kernel has

    def __init__(self):
        self.magics = []

    def run_line_magic(self, name, line):
        self.magics.append((name, line))


@pytest.mark.parametrize("backend, in_kernel, switched", [
    ("agg", True, True),        # MPLBACKEND=Agg inherited by a kernel: figures would vanish
    ("module://matplotlib_inline.backend_inline", True, False),
    ("agg", False, False),      # a script or the test process keeps its backend
])
def test_set_style_draws_figures_inline_in_kernels(monkeypatch, backend, in_kernel, switched):
    IPython = pytest.importorskip("IPython")
    shell = _FakeKernelShell() if in_kernel else None
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr(matplotlib, "get_backend", lambda: backend)
    book._inline_figures_in_kernels()
    assert (shell.magics if shell else []) == ([("matplotlib", "inline")] if switched else [])


# ------------------------------------------------------------- the book's Sphinx extension


def test_sphinx_extension_finds_mathjax(monkeypatch, tmp_path):
    from coursekit import sphinx_book

    monkeypatch.setattr(sys, "prefix", str(tmp_path / "nowhere"))
    monkeypatch.setenv("COURSE_MATHJAX_DIR", str(tmp_path))
    assert sphinx_book.find_mathjax() is None  # no entry script there
    (tmp_path / sphinx_book.ENTRY).write_text("// MathJax")
    assert sphinx_book.find_mathjax() == tmp_path


def test_figure_renderer_puts_alt_text_and_caption_on_the_image(monkeypatch):
    from docutils import nodes
    from myst_nb.core.render import MimeData, NbElementRenderer

    from coursekit import sphinx_book

    monkeypatch.setattr(NbElementRenderer, "render_image", lambda self, data: [nodes.image(uri="_build/abc123.png")])
    renderer = object.__new__(sphinx_book.FigureRenderer)
    meta = book.figure_metadata("A bar chart of three counts, the last one twice the others.", "Counts.")
    [figure] = renderer.render_image(MimeData("image/png", "", output_metadata=meta))
    assert isinstance(figure, nodes.figure) and figure["ids"] == ["fig-abc123"]
    image, caption = figure.children
    assert image["alt"] == meta["image/png"]["alt"] and caption.astext() == "Counts."
    # without metadata (a figure shown with plt.show) the image is left as myst-nb made it
    [plain] = renderer.render_image(MimeData("image/png", ""))
    assert isinstance(plain, nodes.image) and "alt" not in plain


def test_accessible_body_fixes_the_bibliography_and_the_cell_toggle():
    from coursekit.sphinx_book import accessible_body

    body = ('<div role="list" class="citation-list">\n<div class="citation" id="id3" role="doc-biblioentry">'
            '<span class="label">x</span></div>\n</div><details class="admonition hide above-input">\n'
            '<summary aria-label="Toggle hidden content">\n<p>Show code cell source</p>')
    fixed = accessible_body(body)
    assert 'role="doc-biblioentry"' not in fixed and '<div class="citation" id="id3" role="listitem">' in fixed
    assert "aria-label" not in fixed and "<summary>\n<p>Show code cell source</p>" in fixed


def test_sphinx_extension_keeps_one_copy_of_each_script():
    from sphinx.builders.html._assets import _JavaScript

    from coursekit import sphinx_book

    thebe = "const THEBE_JS_URL = 'x'"
    scripts = [_JavaScript("_static/a.js"), _JavaScript(None, body=thebe), _JavaScript("_static/b.js"),
               _JavaScript("", body=thebe), _JavaScript("_static/a.js"), _JavaScript(None, body="let y = 1")]
    context = {"script_files": scripts}
    sphinx_book._drop_repeated_scripts(None, "page", "page.html", context, None)
    assert context["script_files"] == [scripts[0], scripts[1], scripts[2], scripts[5]]
