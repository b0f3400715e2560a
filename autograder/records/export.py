"""Export: every file for the instructor, the students and the LMS, rebuilt from the whole
gradebook (``python -m autograder export ASSIGNMENT``; ``grade`` runs it at its end).

* ``grades.csv``: one row per student (roster students without a submission, and files nobody
  could be matched to, included, with the reason), points per question, and the auto,
  hand-graded, pending and total columns;
* ``canvas.csv`` and ``moodle.csv``: what those systems import (see README), one row per
  student the LMS knows, with a feedback line a student can act on;
* ``histogram.png`` and ``pass_rates.png`` (share of students with full points per question);
* optionally, every student's feedback page again (after hand grading).

Grading one student or a late batch changes only their rows: the files always describe the
whole class.  No cell of these files can start a formula in a spreadsheet (``csvsafe``); the
grade columns stay numbers.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from html import escape
from pathlib import Path

from autograder import ROOT
from autograder.course.paths import GradingPaths, nbgrader_env
from autograder.isolation.scratch import remove_tree
from autograder.text import csvsafe
from autograder.text.htmlsafe import CSP_META, page

from .classbook import NO_ANSWER, ClassRow, GradedCell, class_rows, graded_cells
from .classrecord import export_settings, read_intake
from .faults import fault
from .files import FEEDBACK_STAGING, Replacements, remove_dead_staging
from .gradebook import db_url

# Imports inside functions: matplotlib is imported when a histogram is drawn: an export without one (and the
# command line) does not load it.


MISSING = ("zero", "blank")   # what the LMS files give a student without a gradable file


def lms_score(result: "ExportResult", r: ClassRow) -> str:
    """A student's cell in canvas.csv and moodle.csv: the total; empty while written answers await
    a grader; for a student without a gradable file (no submission, or none that could be graded),
    0 or empty as ``result.missing`` says."""
    if r.status == "graded":
        return "" if r.pending else f"{r.total:g}"
    return "" if result.missing == "blank" else f"{r.total:g}"


@dataclass
class ExportResult:
    rows: list[ClassRow]
    cells: list[GradedCell]
    paths: dict
    missing: str = "zero"      # what canvas.csv and moodle.csv give a student without a gradable file

    @property
    def max_points(self) -> float:
        return sum(c.points for c in self.cells)

    @property
    def auto_max(self) -> float:
        return sum(c.points for c in self.cells if c.kind == "auto")


def questions(cells: list[GradedCell]) -> list[str]:
    out = []
    for c in cells:
        if c.question not in out:
            out.append(c.question)
    return out


def question_scores(row: ClassRow, cells: list[GradedCell]) -> dict[str, str]:
    """'Q1' -> '6' (or '4 + 2 pending' when a person has not graded part of it yet)."""
    out = {}
    for q in questions(cells):
        got, pending = 0.0, 0.0
        for c in cells:
            if c.question != q:
                continue
            grade = row.cells.get(c.grade_id)
            if grade is None:
                continue
            if grade.score is None:
                pending += c.points
            else:
                got += grade.score
        out[q] = "" if row.status != "graded" else f"{got:g}" + (f" + {pending:g} pending" if pending else "")
    return out


def not_graded_note(row: ClassRow) -> tuple[str, str]:
    """(what became of a student's file, what to do now), in plain text, for a student without a
    graded submission: the one builder of what such a student reads, on their feedback page
    (``_simple_page``) and in the LMS files' feedback line (``student_feedback``)."""
    if row.status == "no submission":
        what = "No submission was received for this assignment."
    else:
        what = f"Your file{(' ' + row.file) if row.file else ''} could not be graded: {row.reason}."
    return what, ("Hand in the .ipynb file you downloaded from Colab or Jupyter (File > Download), "
                  "and ask your instructor if the deadline has passed.")


def student_feedback(row: ClassRow, cells: list[GradedCell]) -> str:
    """One line a student can act on: what is missing, what waits for a person."""
    if row.status != "graded":
        return " ".join(not_graded_note(row))
    if NO_ANSWER in (row.notes or ""):
        return (f"No answer written: every answer cell of your notebook is still as it was released "
                f"({row.total:g} points). If you did write answers, you may have handed in the wrong file: "
                "hand in the .ipynb you downloaded after working (File > Download), and ask your instructor.")
    lost = [c for c in cells if c.kind == "auto" and row.cells.get(c.grade_id) is not None
            and (row.cells[c.grade_id].score or 0.0) < c.points]
    parts = [f"{row.auto:g} of {sum(c.points for c in cells if c.kind == 'auto'):g} points from the automatic tests"]
    if lost:
        qs = sorted({c.question for c in lost})
        parts.append("points lost in " + ", ".join(qs) + " (see the feedback page for each test)")
    if row.manual:
        parts.append(f"{row.manual:g} points from a grader")
    if row.pending:
        parts.append(f"{row.pending:g} points of written answers are still waiting for a grader")
    if row.late:
        parts.append("submitted late")
    return "; ".join(parts) + "."


def export(assignment: str, grading: Path, out_dir: Path, released_nb, lms_column: str,
           canvas_id: int | None = None, feedback: bool = False, root: Path | None = None,
           pages: bool = True, provenance: str = "", missing: str | None = None,
           canvas_column: str | None = None) -> ExportResult:
    """Write every export of ``assignment`` from the class record in ``grading`` into ``out_dir``:
    the CSV files, the plots and (``pages``) a feedback page for every student of the class;
    ``feedback`` first renders the graded students' pages again from the gradebook (after hand
    grading).  ``missing`` ("zero" or "blank"): what canvas.csv and moodle.csv give a student of the
    class without a gradable file; ``canvas_column``: canvas.csv's grade column, as a Canvas
    gradebook export names it.  Either, when not given, is what the last grading run was told
    (``grade --missing``, ``grade --roster <Canvas export>``), else "zero" and the name of
    course.yml."""
    grading, out_dir = Path(grading), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = export_settings(db_url(grading), assignment)
    missing = missing or saved.get("missing") or "zero"
    if missing not in MISSING:
        raise ValueError(f"missing must be one of {', '.join(MISSING)}, not {missing!r}")
    canvas_column = canvas_column or saved.get("canvas_column")
    cells = graded_cells(released_nb)
    rows = class_rows(grading, assignment, released_nb)
    result = ExportResult(rows, cells, {
        "grades": out_dir / "grades.csv", "canvas": out_dir / "canvas.csv", "moodle": out_dir / "moodle.csv",
        "histogram": out_dir / "histogram.png", "pass_rates": out_dir / "pass_rates.png"}, missing)
    # every file written whole under a temporary name first, then all renamed into place: a kill
    # or a full disk while they are written leaves the exports of before, every one of them; the
    # feedback pages nbgrader renders again (``feedback``) too, in its folders and in the exports
    with contextlib.ExitStack() as stack:
        staged = stack.enter_context(_staged_feedback(
            assignment, grading, [r.student_id for r in rows if r.status == "graded"], root)) if feedback else {}
        out = stack.enter_context(Replacements())
        for target, source in staged.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            with out.open(target, "wb") as fh:
                fh.write(source.read_bytes())
        _grades_csv(result, result.paths["grades"], out)
        _canvas_csv(result, result.paths["canvas"], canvas_column or lms_column, None if canvas_column else canvas_id,
                    out)
        _moodle_csv(result, result.paths["moodle"], lms_column, out)
        _plots(result, assignment, out)
        stale = feedback_pages(result, grading, out_dir / "feedback", assignment, provenance, out,
                               sources=staged) if pages else []
        out.commit()
    for old in stale:
        old.unlink()
    return result


def feedback_pages(result: ExportResult, grading: Path, folder: Path, assignment: str, provenance: str = "",
                   out: Replacements | None = None, sources: dict | None = None) -> list[Path]:
    """A page for every student of the class: a graded student's own feedback page, and for
    everyone else a short page that says why there is no grade.  The folder holds nothing else:
    returns the pages of students no longer in the class, for the caller to remove once the new
    pages are in place (written through ``out``; without it they are put in place here).
    ``sources``: feedback pages rendered anew but not yet in place (their place -> where they are
    staged), read instead of the pages they will replace."""
    if out is None:
        with Replacements() as mine:
            stale = feedback_pages(result, grading, folder, assignment, provenance, mine, sources)
            mine.commit()
        for old in stale:
            old.unlink()
        return []
    folder.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for row in result.rows:
        if row.student_id.startswith("?"):
            continue  # a file nobody could be matched to: grades.csv lists it
        target = folder / f"{row.student_id}.html"
        wanted.add(target.name)
        here = grading / "feedback" / row.student_id / assignment
        found = {p: p for p in here.glob("*.html")} | {k: v for k, v in (sources or {}).items() if k.parent == here}
        source = [found[k] for k in sorted(found)]
        if row.status == "graded" and source:  # bidi controls shown wherever they are (htmlsafe.page)
            text = source[0].read_bytes().decode("utf-8", "surrogateescape")
            with out.open(target, "wb") as fh:
                fh.write(page(text).encode("utf-8", "surrogateescape"))
        else:
            with out.open(target, "w", encoding="utf-8") as fh:
                fh.write(page(_simple_page(assignment, row, provenance)))
    return [old for old in folder.glob("*.html") if old.name not in wanted]


@contextlib.contextmanager
def _own(out: Replacements | None):
    """``out``, or (None) a Replacements of the block's own, committed when the block ends."""
    if out is not None:
        yield out
        return
    with Replacements() as mine:
        yield mine
        mine.commit()


def _simple_page(assignment: str, row: ClassRow, provenance: str = "") -> str:
    """The page of a student with no graded submission: the reason, in words, and what to do."""
    what, todo = not_graded_note(row)
    late = "<p>It was submitted late.</p>" if row.late else ""
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{CSP_META}<title>{escape(assignment)}: "
            f"feedback for {escape(row.student_id)}</title></head><body><h1>{escape(assignment)}: "
            f"{escape(row.student_id)}</h1><p>{escape(what)}</p>{late}<p>Score: 0 of {row.max_score:g}</p>"
            f"<p>{escape(todo)}</p>"
            "<footer style='margin:2em 0;color:#666;font-size:small' class='grading-provenance'>Graded by the "
            f"course autograder: {escape(provenance or 'the page rebuilt from the class record')}</footer>"
            "</body></html>")


def _grades_csv(result: ExportResult, path: Path, out: Replacements | None = None) -> None:
    qs = questions(result.cells)
    with _own(out) as own, own.open(path, "w", newline="", encoding="utf-8") as fh:
        w = csvsafe.writer(fh)
        w.writerow(["student_id", "status", "auto", "manual", "pending", "total", "max_score", "percent",
                    *qs, "late", "file", "reason", "notes"])
        for r in result.rows:
            per_q = question_scores(r, result.cells)
            pct = 100 * r.total / r.max_score if r.max_score else 0.0
            w.writerow([r.student_id, r.status, f"{r.auto:g}", f"{r.manual:g}", f"{r.pending:g}", f"{r.total:g}",
                        f"{r.max_score:g}", f"{pct:.1f}", *[per_q[q] for q in qs], "yes" if r.late else "",
                        r.file, r.reason, r.notes])


def _canvas_csv(result: ExportResult, path: Path, column: str, canvas_id: int | None,
                out: Replacements | None = None) -> None:
    """Canvas' gradebook import: Student, ID, SIS User ID, SIS Login ID, Section, then one
    column per assignment, named "<name> (<assignment id>)" when the id is known (Canvas
    matches on it); the first row holds the points possible."""
    header = f"{column} ({canvas_id})" if canvas_id else column
    with _own(out) as own, own.open(path, "w", newline="", encoding="utf-8") as fh:
        w = csvsafe.writer(fh)
        w.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", header])
        w.writerow(["    Points Possible", "", "", "", "", f"{result.max_points:g}"])
        for r in result.rows:
            if r.student_id.startswith("?"):
                continue  # a file nobody could be matched to: grades.csv lists it, the LMS cannot
            score = lms_score(result, r)
            w.writerow([r.lms.get("name", r.student_id), r.lms.get("lms_id", ""), r.student_id,
                        r.lms.get("login", ""), r.lms.get("section", ""), score])


def _moodle_csv(result: ExportResult, path: Path, column: str, out: Replacements | None = None) -> None:
    """Moodle's grade import (Grades > Import > CSV file): identify users by "ID number" (or
    "Email address") and map the grade and feedback columns to the assignment's grade item."""
    with _own(out) as own, own.open(path, "w", newline="", encoding="utf-8") as fh:
        w = csvsafe.writer(fh)
        w.writerow(["ID number", "Email address", "Full name", column, f"Feedback: {column}"])
        for r in result.rows:
            if r.student_id.startswith("?"):
                continue
            score = lms_score(result, r)
            w.writerow([r.student_id, r.lms.get("email", ""), r.lms.get("name", ""), score,
                        student_feedback(r, result.cells)])


def _plots(result: ExportResult, assignment: str, out: Replacements | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # matplotlib's own style, whatever else in this process styled it (the book's set_style):
    # the same record draws the same bytes, so undo's restored exports and a new export agree
    with plt.style.context("default"):
        _draw_plots(result, assignment, out)


def _draw_plots(result: ExportResult, assignment: str, out: Replacements | None) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    graded = [r for r in result.rows if r.status == "graded"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    top = result.max_points or 1
    bins = min(30, int(top) + 1) if result.max_points else 10
    students = [r for r in result.rows if not r.student_id.startswith("?")]
    ax.hist([r.total for r in students], bins=bins, range=(0, top), color="#4c72b0", edgecolor="white")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # students come whole
    ax.set_xlabel(f"points (out of {result.max_points:g}; pending hand grading counts as 0)")
    ax.set_ylabel("students")
    ax.set_title(f"{assignment}: points of {len(students)} students ({len(graded)} graded, "
                 f"{len(students) - len(graded)} with 0: nothing gradable)")
    fig.tight_layout()
    with _own(out) as own, own.open(result.paths["histogram"], "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)

    qs = [q for q in questions(result.cells) if any(c.kind == "auto" for c in result.cells if c.question == q)]
    rates = []
    for q in qs:
        auto = [c for c in result.cells if c.question == q and c.kind == "auto"]
        full = [r for r in graded if all((r.cells.get(c.grade_id) and (r.cells[c.grade_id].score or 0) >= c.points)
                                         for c in auto)]
        rates.append(100 * len(full) / len(graded) if graded else 0.0)
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * max(len(qs), 3) + 1.2))
    ax.barh(qs[::-1], rates[::-1], color="#55a868")
    for y, rate in enumerate(rates[::-1]):
        ax.text(min(rate + 1, 92), y, f"{rate:.0f}%", va="center", fontsize=8)
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"students with every automatic test of the question passed (%, n = {len(graded)})")
    ax.set_title(f"{assignment}: questions, automatic tests")
    fig.tight_layout()
    with _own(out) as own, own.open(result.paths["pass_rates"], "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)


@contextlib.contextmanager
def _staged_feedback(assignment: str, grading: Path, students: list[str], root: Path | None = None):
    """The graded students' feedback pages rendered again from the gradebook into a staging folder
    of the grading folder (nbgrader writes there, never over the pages in place): yields their
    place in nbgrader's feedback folder -> the staged page, for the caller to put in place with
    its other files.  The staging folder goes when the block ends, and so do those of exports
    that were killed (their process is gone)."""
    grading = Path(grading)
    remove_dead_staging(grading)
    staging = grading / f"{FEEDBACK_STAGING}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir(parents=True)
        regenerate_feedback(assignment, grading, students, root, into=staging)
        fault("stage feedback")
        yield {grading / "feedback" / p.relative_to(staging): p for p in sorted(staging.rglob("*.html"))}
    finally:
        remove_tree(staging)


def regenerate_feedback(assignment: str, grading: Path, students: list[str], root: Path | None = None,
                        into: Path | None = None) -> None:
    """Every graded student's feedback page rendered again from the gradebook (hand grades
    included), into nbgrader's feedback folder, or (``into``) a folder laid out like it."""
    if not students:
        return
    paths = GradingPaths(Path(grading), root or ROOT)
    note = (f"feedback rebuilt from the gradebook {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
            "(automatic tests, and the points and comments of the graders)")
    late = sorted(i["student_id"] for i in read_intake(paths.gradebook_url, assignment).values()
                  if i.get("late") and i.get("student_id"))
    with tempfile.TemporaryDirectory(prefix="feedback-") as tmp:
        facts = Path(tmp) / "facts.json"
        facts.write_text(json.dumps({"provenance": note, "late": late}))
        flags = [f for f in paths.nbgrader_flags()
                 if not (into is not None and f.startswith("--CourseDirectory.feedback_directory="))]
        if into is not None:
            flags.append(f"--CourseDirectory.feedback_directory={into}")
        cmd = [sys.executable, "-m", "nbgrader", "generate_feedback", assignment, "--force", *flags,
               f"--FeedbackExporter.facts={facts}"]
        subprocess.run(cmd, cwd=paths.course, env=nbgrader_env(), capture_output=True, text=True)
