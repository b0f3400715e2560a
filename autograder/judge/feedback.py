"""nbconvert preprocessors and the feedback exporter used by the grading pipeline."""
from __future__ import annotations

import json
import re
from pathlib import Path

from coursekit.failures import HIDDEN_FAILURE
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, Unicode
from traitlets.config import Config

from autograder.course.cells import graded_cells
from autograder.text import htmlsafe

# Imports inside functions: nbgrader.api (with SQLAlchemy) is imported when a page needs the gradebook:
# rendering a page without one does not load the database layer.

BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
HIDDEN_RE = re.compile(r"[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*", re.S)
IMG_WITHOUT_ALT = re.compile(r"<img((?:(?!\balt=)[^>])*>)")
PLACEHOLDER = "# hidden tests ran here; their source is not shown"


def strip_hidden_source(source: str) -> str:
    """Replace every hidden-test region of a cell's source with a placeholder line."""
    return HIDDEN_RE.sub(PLACEHOLDER, source)


def short_error(output) -> None:
    """Reduce an error output to one line: a traceback would quote hidden-test lines."""
    ename, evalue = output.get("ename", "Error"), output.get("evalue", "")
    if ename == "AssertionError" and not evalue:
        evalue = HIDDEN_FAILURE
    output["traceback"] = [f"{ename}: {evalue}"]


class HideHiddenTests(Preprocessor):
    """For feedback: keep each test cell's docstring and result, drop hidden-test source."""

    enabled = Bool(True)  # nbconvert skips preprocessors that are not enabled

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and BEGIN_HIDDEN in cell.source:
            cell.source = strip_hidden_source(cell.source)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    short_error(output)
        return cell, resources


class FeedbackLabels(Preprocessor):
    """For feedback: name every graded cell in words (a test by its one-line description, a
    written answer by its question), mark answers that still wait for a grader, and add up
    the automatic, hand-graded and pending points for the page's summary."""

    enabled = Bool(True)

    def preprocess(self, nb, resources):
        labels = {c.grade_id: c for c in graded_cells(nb)}
        waiting = self._waiting(resources, [g for g, c in labels.items() if c.kind == "manual"])
        totals = {"auto": 0.0, "auto_max": 0.0, "manual": 0.0, "manual_max": 0.0, "pending": 0.0}
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader")
            if not meta:
                continue
            info = labels.get(meta.get("grade_id"))
            if meta.get("grade") and info is not None:
                meta["label"] = info.label
                points = float(meta.get("points", info.points))
                score = meta.get("score")
                if info.kind == "manual":
                    totals["manual_max"] += points
                    pending = score is None or meta["grade_id"] in waiting
                    meta["pending"] = pending
                    if pending:
                        totals["pending"] += points
                    else:
                        totals["manual"] += float(score)
                else:
                    totals["auto_max"] += points
                    totals["auto"] += float(score or 0.0)
                    meta["pending"] = False
            elif meta.get("solution"):
                meta["label"] = "Your answer"
        totals["total"] = totals["auto"] + totals["manual"]
        totals["max"] = totals["auto_max"] + totals["manual_max"]
        resources["course"] = totals
        self._causes(nb, labels)
        return nb, resources

    @staticmethod
    def _causes(nb, labels) -> None:
        """Next to the points a hidden test cost: what the visible tests of the same question warned
        about (already on the page, in the student's own outputs; nothing of the hidden test)."""
        warned: dict[str, list[str]] = {}
        for cell in nb.cells:
            info = labels.get(cell.metadata.get("nbgrader", {}).get("grade_id"))
            if info is None or info.kind != "auto" or not info.label.startswith(f"{info.question} visible"):
                continue
            text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            for line in text.splitlines():
                if line.startswith("Warning: ") and len(warned.setdefault(info.question, [])) < MAX_CAUSES:
                    warned[info.question].append(line.removeprefix("Warning: ")[:CAUSE_CHARS])
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            info = labels.get(meta.get("grade_id"))
            if (info is not None and info.kind == "auto" and info.label.startswith(f"{info.question} hidden")
                    and float(meta.get("score") or 0) < float(meta.get("points", info.points))):
                meta["causes"] = warned.get(info.question, [])

    @staticmethod
    def _waiting(resources, grade_ids) -> set:
        """The answers a person still has to grade (nbgrader reports their score as 0)."""
        from nbgrader.api import Gradebook, MissingEntry

        info = resources.get("nbgrader", {})
        if not grade_ids or "db_url" not in info:
            return set()
        out = set()
        with Gradebook(info["db_url"]) as gb:
            for gid in grade_ids:
                try:
                    g = gb.find_grade(gid, info["notebook"], info["assignment"], info["student"])
                except MissingEntry:
                    continue
                if g.manual_score is None and (g.auto_score is None or g.needs_manual_grade):
                    out.add(gid)
        return out


MAX_CAUSES, CAUSE_CHARS = 5, 400  # warnings shown next to a hidden test's lost points, and their length
MEMO_MAX_CHARS = 20_000   # longer sources (a student's own) are converted each time
_memo: dict = {}          # (filter, arguments) -> HTML, for this process: one class's identical cells
MEMO_MAX_ENTRIES = 4096


def memoised(kind: str, convert):
    """``convert`` with one result per distinct short input, kept for the grading process: every
    page of a class shows the same prompts, examples and visible tests, and highlighting their
    code took a third of a page's time.  A long source (a student's own, possibly huge) is not
    kept, so the memo stays within MEMO_MAX_ENTRIES x MEMO_MAX_CHARS."""
    def call(source, *args, **kw):
        if not isinstance(source, str) or len(source) > MEMO_MAX_CHARS:
            return convert(source, *args, **kw)
        key = (kind, source, repr(args), repr(sorted(kw.items())))
        if key not in _memo:
            if len(_memo) >= MEMO_MAX_ENTRIES:
                _memo.clear()
            _memo[key] = convert(source, *args, **kw)
        return _memo[key]
    return call


class FeedbackExporter(HTMLExporter):
    """nbconvert's HTML exporter for pages that show a student's notebook to anyone: every
    piece of the student's markdown and outputs goes through ``autograder.text.htmlsafe`` (math as
    MathML, an allow-list sanitiser), JavaScript and widget outputs are never shown (their
    plain-text form is), and the page allows no script at all (``htmlsafe.CSP``).

    It also skips nbconvert's final pass through BeautifulSoup, which only gives images
    without alt text a placeholder and makes JupyterLab cells focusable (the feedback
    template has none), yet parses every token span of the highlighted code: about a third
    of the time a feedback page takes.  The alt text is added with a regular expression."""

    sanitize_html = Bool(True)
    facts = Unicode("", help="a JSON file with what the pages say besides the grades: 'provenance' (how they "
                             "were graded) and 'late' (students whose file came late)").tag(config=True)

    @property
    def default_config(self):
        c = super().default_config
        c.merge(Config({"NbConvertBase": {"display_data_priority": [
            "text/html", "text/markdown", "image/svg+xml", "text/latex", "image/png", "image/jpeg", "text/plain"]}}))
        return c

    def default_filters(self):
        yield from super().default_filters()
        yield ("markdown2html", memoised("markdown", lambda source, *a, **k: htmlsafe.markdown_to_html(source)))
        yield ("clean_html", htmlsafe.sanitize)
        yield ("latex2mathml", htmlsafe.latex_to_html)

    def _facts(self) -> dict:
        if not self.facts:
            return {}
        try:
            data = json.loads(Path(self.facts).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def from_notebook_node(self, nb, resources=None, **kw):
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        self.register_filter("highlight_code", self.filters.get(
            "highlight_code", memoised(f"highlight:{lexer}", Highlight2HTML(pygments_lexer=lexer, parent=self))))
        resources = self._init_resources(resources)
        facts = self._facts()
        student = (resources.get("nbgrader") or {}).get("student")
        resources["course_provenance"] = str(facts.get("provenance", ""))
        resources["course_late"] = student is not None and student in facts.get("late", [])
        self.register_filter("filter_data_type", WidgetsDataTypeFilter(
            notebook_metadata=self._nb_metadata, parent=self, resources=resources))
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        return IMG_WITHOUT_ALT.sub(r'<img alt="a figure from the notebook"\1', html), resources
