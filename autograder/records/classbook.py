"""The class as a whole: every student's standing on an assignment, from the gradebook and
what intake recorded, question by question.

``grade`` records here what it learned about each file (``record_intake``) and the roster it
was given (``save_roster``); ``class_rows`` then joins them with the gradebook into one
``ClassRow`` per student, the input of every export (``autograder/export.py``).  Nothing is
lost: a roster student with no file, a PDF, an unreadable notebook or an unmatched LMS file
each get a row with the reason.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from autograder.course.cells import GradedCell, graded_cells  # noqa: F401 - part of this module's API
from autograder.text import csvsafe

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


# ----------------------------------------------------------------------------- what grade records

def class_dir(grading: Path, assignment: str) -> Path:
    return Path(grading) / "class" / assignment


def save_roster(grading: Path, roster: Path | None) -> None:
    """Keep the roster beside the gradebook: later exports list every student on it."""
    if roster is None:
        return
    target = Path(grading) / "class" / "roster.csv"
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = csvsafe.read(Path(roster))  # written again, so that no cell of the copy can be a formula
    header = list(rows[0]) if rows else ["student_id", "lms_id"]
    csvsafe.write(target, [h for h in header if h is not None],
                  [[r.get(h) or "" for h in header if h is not None] for r in rows])


def read_roster(grading: Path) -> dict[str, dict]:
    """student id -> roster row (empty without a roster)."""
    path = Path(grading) / "class" / "roster.csv"
    if not path.exists():
        return {}
    return {r["student_id"].strip(): r for r in csvsafe.read(path) if (r.get("student_id") or "").strip()}


def record_intake(grading: Path, assignment: str, rows: list[dict]) -> None:
    """Merge this batch's facts into the assignment's intake record.  Each row: student_id
    (or a file name for files nobody could be matched to), file, reason ("" when the file
    was graded), late, lms fields.  A later batch replaces a student's earlier row."""
    path = class_dir(grading, assignment) / "intake.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    known = json.loads(path.read_text()) if path.exists() else {}
    for row in rows:
        known[row["key"]] = row
    path.write_text(json.dumps(known, indent=1, sort_keys=True))


def read_intake(grading: Path, assignment: str) -> dict[str, dict]:
    path = class_dir(grading, assignment) / "intake.json"
    return json.loads(path.read_text()) if path.exists() else {}


# ----------------------------------------------------------------------------- the join

def gradebook_rows(url: str, assignment: str, cells: list[GradedCell]) -> dict[str, ClassRow]:
    """Every submission of ``assignment`` in the gradebook at ``url``, as rows."""
    from nbgrader.api import Gradebook

    from .gradebook import sqlite_path

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
    from .gradebook import db_url

    rows = gradebook_rows(db_url(grading), assignment, cells)
    intake = read_intake(grading, assignment)
    roster = read_roster(grading)
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
        for key in ("lms_id", "name", "email", "login", "section"):
            if entry.get(key, "").strip() and not row.lms.get(key):
                row.lms[key] = entry[key].strip()
    for row in rows.values():
        row.max_score = row.max_score or max_points
    return sorted(rows.values(), key=lambda r: r.student_id)
