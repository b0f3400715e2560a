"""nbconvert preprocessors used by the grading pipeline."""
from __future__ import annotations

import re

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
HIDDEN_RE = re.compile(r"[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*", re.S)
PLACEHOLDER = "# hidden tests ran here; their source is not shown"


def strip_hidden_source(source: str) -> str:
    """Replace every hidden-test region of a cell's source with a placeholder line."""
    return HIDDEN_RE.sub(PLACEHOLDER, source)


def short_error(output) -> None:
    """Reduce an error output to one line: a traceback would quote hidden-test lines."""
    ename, evalue = output.get("ename", "Error"), output.get("evalue", "")
    if ename == "AssertionError" and not evalue:
        evalue = "a hidden check failed (see the first line of this cell for what it checks)"
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
