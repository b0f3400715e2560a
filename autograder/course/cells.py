"""The graded cells of a released notebook: what each is worth and what it is called."""
from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

# Imports inside functions: nbformat (with the jsonschema it loads) is imported by the functions that read a
# notebook: the course settings, the kernel's launcher and the command line import this module without
# reading one.

_Q_HEADING = re.compile(r"^\s*#{1,6}\s*(Q\d+[a-z]?)\b", re.M)
_DOC = re.compile(r'^\s*"""(.*?)"""', re.S)


@dataclass(frozen=True)
class GradedCell:
    """A cell of the released notebook that carries points."""

    grade_id: str
    question: str          # "Q1", ... ("" when the notebook does not say)
    kind: str              # "auto" (a test) or "manual" (an answer a person grades)
    points: float
    label: str             # what a student reads: the test's one-line description, or "Q3 written answer"


def graded_cells(released_nb) -> list[GradedCell]:
    """The graded cells of a released notebook, in order, each with its question."""
    out, question = [], ""
    for cell in released_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown" and not meta.get("solution"):
            found = _Q_HEADING.findall(cell.source)
            if found:
                question = found[-1].upper()
        if not meta.get("grade"):
            continue
        if meta.get("solution"):
            kind = "manual"
            label = f"{question} written answer" if cell.cell_type == "markdown" else f"{question} code for a person to read"
        else:
            kind = "auto"
            doc = _DOC.match(cell.source)
            label = doc.group(1).strip().splitlines()[0] if doc else meta["grade_id"]
            m = re.match(r"(Q\d+[a-z]?)\b", label)
            if m:
                question = m.group(1).upper()
        out.append(GradedCell(meta["grade_id"], question or "?", kind, float(meta.get("points", 0)), label.strip()))
    return out


@dataclass(frozen=True, slots=True)
class Release:
    """The assignment as released (the student notebook, and its points)."""

    assignment: str
    notebook: str
    nb: object                # nbformat.NotebookNode
    max_points: float

    @classmethod
    def read(cls, folder: Path, assignment: str) -> "Release":
        """The release of ``assignment`` in ``folder`` (the course's ``exercises/``, or a grading
        folder's ``release/``): ``<folder>/<assignment>/<assignment>.ipynb`` and the points of its
        graded cells.  The one reader of a released notebook."""
        import nbformat

        name = f"{assignment}.ipynb"
        nb = nbformat.read(Path(folder) / assignment / name, as_version=4)
        return cls(assignment, name, nb, float(sum(c.points for c in graded_cells(nb))))


def normalised_answer(text: str) -> str:
    """A student's answer as compared between submissions: NFC, Unix line ends, no trailing
    spaces on a line, no blank lines around it (what a person grading it would not see)."""
    lines = unicodedata.normalize("NFC", text or "").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def answer_version(text: str) -> str:
    """The version of an answer: a checksum of its normalised text (12 hex digits)."""
    return hashlib.sha256(normalised_answer(text).encode("utf-8")).hexdigest()[:12]


def answers_in(path, grade_ids) -> dict | None:
    """grade_id -> the source of that cell in the notebook at ``path`` (None when it cannot be read)."""
    import nbformat

    try:
        nb = nbformat.read(str(path), as_version=4)
    except (OSError, ValueError, AttributeError):
        return None
    wanted = set(grade_ids)
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if isinstance(c.metadata.get("nbgrader"), dict) and c.metadata["nbgrader"].get("grade_id") in wanted}
