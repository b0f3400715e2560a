"""The class as a whole: every student's standing on an assignment, question by question.

``class_rows`` joins the gradebook's grades with what the class record keeps of each file
(``records.classrecord``: intake rows) and the class's roster into one ``ClassRow`` per student,
the input of every export (``autograder/records/export.py``).  Nothing is lost: a roster student
with no file, a PDF, an unreadable notebook or an unmatched LMS file each get a row with the
reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autograder.course.cells import GradedCell, graded_cells  # noqa: F401 - part of this module's API

from .classrecord import read_intake, read_roster
from .gradebook import db_url, sqlite_path

# Imports inside functions: nbgrader.api is imported where the gradebook is read: the summary and the
# exports that import this module load nbgrader only then.

# the note the record keeps for a notebook handed in as it was released (the read stage writes it,
# the exports tell the student what it means)
NO_ANSWER = "no answer written: every answer cell is still as it was released"


@dataclass
class CellGrade:
    score: float | None      # None: waiting for a person
    max_score: float
    comment: str = ""


@dataclass
class ClassRow:
    """One student's standing on the assignment."""

    student_id: str
    status: str                      # "graded", "not graded" (a reason says why), "no submission"
    reason: str = ""
    max_score: float = 0.0
    auto: float = 0.0                # points of the tests
    manual: float = 0.0              # points a person gave
    pending: float = 0.0             # points still waiting for a person
    cells: dict = field(default_factory=dict)   # grade_id -> CellGrade
    lms: dict = field(default_factory=dict)     # lms_id, name, email, login, section
    late: bool = False
    file: str = ""
    notes: str = ""

    @property
    def total(self) -> float:
        return self.auto + self.manual

    def summary(self, auto_max: float) -> str:
        """'auto 22/22, 8 points await hand grading' and the like."""
        if self.status != "graded":
            return f"0 ({self.reason or self.status})"
        text = f"auto {self.auto:g}/{auto_max:g}"
        if self.manual:
            text += f", hand-graded {self.manual:g}"
        if self.pending:
            text += f", {self.pending:g} points await hand grading"
        return text


# ----------------------------------------------------------------------------- the join

def gradebook_rows(url: str, assignment: str, cells: list[GradedCell]) -> dict[str, ClassRow]:
    """Every submission of ``assignment`` in the gradebook at ``url``, as rows."""
    from nbgrader.api import Gradebook

    kinds = {c.grade_id: c for c in cells}
    rows: dict[str, ClassRow] = {}
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return rows
    with Gradebook(url) as gb:
        try:
            submissions = gb.assignment_submissions(assignment)
        except Exception:  # noqa: BLE001 - no such assignment yet: nobody graded
            return rows
        for sub in submissions:
            row = ClassRow(sub.student.id, "graded")
            comments = {}
            for nb in sub.notebooks:
                for c in nb.comments:
                    comments[c.name] = c.manual_comment or ""
                for g in nb.grades:
                    info = kinds.get(g.name)
                    pending = g.manual_score is None and (g.auto_score is None or g.needs_manual_grade)
                    if info is not None and info.kind == "manual":
                        score = g.manual_score if g.manual_score is not None else (
                            None if pending else float(g.auto_score or 0.0))
                    else:
                        score = float(g.score or 0.0)
                        pending = False
                    row.cells[g.name] = CellGrade(None if score is None else float(score), float(g.max_score),
                                                  comments.get(g.name, ""))
                    row.max_score += float(g.max_score)
                    if info is not None and info.kind == "manual":
                        if score is None:
                            row.pending += float(g.max_score)
                        else:
                            row.manual += float(score)
                    else:
                        row.auto += float(score)
            rows[row.student_id] = row
    return rows


def class_rows(grading: Path, assignment: str, released_nb) -> list[ClassRow]:
    """One row per roster student, per graded submission, and per file that could not be
    matched to anyone, sorted by student id."""
    cells = graded_cells(released_nb)
    max_points = sum(c.points for c in cells)
    url = db_url(grading)
    rows = gradebook_rows(url, assignment, cells)
    intake = read_intake(url, assignment)
    roster = read_roster(url)
    for key, info in intake.items():
        sid = info.get("student_id") or ""
        if sid and sid in rows:
            row = rows[sid]
        else:
            row = ClassRow(sid or f"? ({info.get('file', key)})", "not graded", max_score=max_points)
            if sid:
                rows[sid] = row
            else:
                rows[row.student_id] = row
        row.file = info.get("file", "")
        row.late = bool(info.get("late"))
        row.notes = info.get("notes", "")
        row.lms.update({k: v for k, v in (info.get("lms") or {}).items() if v})
        if row.status != "graded":
            row.reason = info.get("reason") or "could not be graded"
    for sid, entry in roster.items():
        row = rows.get(sid)
        if row is None:
            row = rows[sid] = ClassRow(sid, "no submission", reason="no submission", max_score=max_points)
        # the roster is the instructor's list: its values win over what an LMS file name says
        # (a Canvas file carries a lower-case slug such as "adaada", not the student's name)
        for key in ("lms_id", "name", "email", "login", "section"):
            if entry.get(key, "").strip():
                row.lms[key] = entry[key].strip()
    for row in rows.values():
        row.max_score = row.max_score or max_points
    return sorted(rows.values(), key=lambda r: r.student_id)
