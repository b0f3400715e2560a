"""Autograde a folder of submitted notebooks: one bad file never stops the others."""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import GRADING_DIR, ROOT, SOURCE_DIR
from .release import nbgrader, release
from .repair import repair

DEFAULT_NOTEBOOK_TIMEOUT = 1800


@dataclass
class Result:
    student_id: str
    file: str
    score: float = 0.0
    max_score: float = 0.0
    status: str = "error"  # "graded" or "error"
    message: str = ""

    @property
    def percent(self) -> float:
        return 100.0 * self.score / self.max_score if self.max_score else 0.0


@dataclass
class Report:
    assignment: str
    results: list[Result] = field(default_factory=list)
    csv_path: Path | None = None
    feedback_dir: Path | None = None

    def table(self) -> str:
        """A fixed-width summary, one line per submission."""
        rows = [("student", "score", "status", "note")]
        for r in sorted(self.results, key=lambda r: r.student_id):
            rows.append((r.student_id, f"{r.score:g}/{r.max_score:g}", r.status, r.message))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in rows]
        lines.insert(1, "-" * (sum(widths) + 10))
        graded = [r for r in self.results if r.status == "graded"]
        lines.append(f"{len(self.results)} submissions: {len(graded)} graded, "
                     f"{len(self.results) - len(graded)} with errors (scored 0)")
        return "\n".join(line.rstrip() for line in lines)


def student_id_from_name(path: Path, assignment: str) -> str:
    """``s123_attention.ipynb`` -> ``s123``; anything unusual becomes ``_``."""
    stem = path.stem
    stem = re.sub(rf"[_\-\s]*{re.escape(assignment)}$", "", stem, flags=re.I) or stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem).strip("._") or "unnamed"


def read_submission(path: Path) -> nbformat.NotebookNode:
    """Parse a submitted file as a notebook or raise ValueError with a one-line reason."""
    if path.suffix.lower() != ".ipynb":
        raise ValueError(f"not a notebook: {path.name} (expected a .ipynb file)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"corrupt notebook: {path.name} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"corrupt notebook: {path.name} is not valid JSON (line {exc.lineno})") from None
    if not isinstance(raw, dict) or "cells" not in raw and "worksheets" not in raw:
        raise ValueError(f"corrupt notebook: {path.name} has no cells")
    try:
        nb = nbformat.reads(json.dumps(raw), as_version=4)  # also upgrades v3 notebooks
    except Exception as exc:  # nbformat raises several types for malformed files
        raise ValueError(f"corrupt notebook: {path.name} ({type(exc).__name__})") from None
    if nb.nbformat_minor < 5:  # e.g. saved by Colab: give every cell the id nbformat 4.5 wants
        nb.nbformat_minor = 5
        for i, cell in enumerate(nb.cells):
            cid = str(cell.get("id") or cell.metadata.get("id") or f"cell-{i}")
            cell["id"] = re.sub(r"[^A-Za-z0-9_-]", "-", cid)[:64]
    return nb


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln or "died" in ln:
            return ln[:200]
    return lines[-1][:200] if lines else "unknown error"


def _scores(grading: Path, assignment: str, student: str) -> tuple[float, float]:
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{grading / 'gradebook.db'}") as gb:
        try:
            sub = gb.find_submission(assignment, student)
            return float(sub.score), float(sub.max_score)
        except MissingEntry:
            return 0.0, float(gb.find_assignment(assignment).max_score)


def grade(assignment: str, submissions: Path, out_dir: Path | None = None,
          grading_dir: Path | None = None, cell_timeout: int | None = None,
          notebook_timeout: int | None = None, root: Path = ROOT) -> Report:
    """Autograde every file in ``submissions`` and write grades.csv and feedback."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise SystemExit(f"no such folder of submissions: {submissions}")
    source_nbs = sorted((root / SOURCE_DIR / assignment).glob("*.ipynb"))
    if not source_nbs:
        raise SystemExit(f"unknown assignment {assignment!r}: no notebook in {SOURCE_DIR}/{assignment}/")
    nb_name = source_nbs[0].name
    grading = Path(grading_dir) if grading_dir else root / GRADING_DIR
    out_dir = Path(out_dir) if out_dir else grading / "reports" / assignment
    feedback_dir = out_dir / "feedback"
    feedback_dir.mkdir(parents=True, exist_ok=True)
    extra = [f"--Execute.timeout={cell_timeout}"] if cell_timeout else []

    # Record the assignment (cells, points, hidden tests) in the gradebook.
    release([assignment], out_dir=grading / "release", grading_dir=grading, root=root)
    released = nbformat.read(grading / "release" / assignment / nb_name, as_version=4)
    max_points = _scores(grading, assignment, "\0no-such-student")[1]

    report = Report(assignment, csv_path=out_dir / "grades.csv", feedback_dir=feedback_dir)
    seen: dict[str, str] = {}
    for path in sorted(p for p in submissions.iterdir() if p.is_file() and not p.name.startswith(".")):
        sid = student_id_from_name(path, assignment)
        result = Result(sid, path.name, max_score=max_points)
        report.results.append(result)
        if sid in seen:
            result.student_id = f"{sid} (duplicate)"
            result.message = f"second file for student {sid} ({seen[sid]} was graded)"
            continue
        seen[sid] = path.name
        try:
            nb = read_submission(path)
        except ValueError as exc:
            result.message = str(exc)
            continue
        notes = repair(nb, released)
        if notes:
            result.message = f"repaired before grading: {'; '.join(notes)}"
        target = grading / "submitted" / sid / assignment
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        nbformat.write(nb, target / nb_name)
        try:
            proc = nbgrader(["autograde", assignment, f"--student={sid}", "--force", *extra],
                            root=root, grading_dir=grading,
                            timeout=notebook_timeout or DEFAULT_NOTEBOOK_TIMEOUT)
        except subprocess.TimeoutExpired:
            result.message = f"notebook ran longer than {notebook_timeout or DEFAULT_NOTEBOOK_TIMEOUT} s"
            continue
        autograded = grading / "autograded" / sid / assignment / nb_name
        log = proc.stdout + proc.stderr
        if proc.returncode != 0 or not autograded.exists():
            if "DeadKernelError" in log or "Kernel died" in log or "kernel died" in log.lower():
                result.message = "the kernel crashed while running the notebook"
            else:
                result.message = "autograde failed: " + _last_error_line(log)
            continue
        result.score, result.max_score = _scores(grading, assignment, sid)
        result.status = "graded"
        if "CellTimeoutError" in autograded.read_text(errors="replace"):
            result.message = (result.message + "; " if result.message else "") + \
                "a cell hit the time limit and was stopped"
        fb = nbgrader(["generate_feedback", assignment, f"--student={sid}", "--force"],
                      root=root, grading_dir=grading, timeout=600)
        html = grading / "feedback" / sid / assignment / nb_name.replace(".ipynb", ".html")
        if fb.returncode == 0 and html.exists():
            shutil.copy(html, feedback_dir / f"{sid}.html")
        else:
            result.message = (result.message + "; " if result.message else "") + \
                "feedback failed: " + _last_error_line(fb.stdout + fb.stderr)

    with open(report.csv_path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["student_id", "file", "score", "max_score", "percent", "status", "message"])
        for r in sorted(report.results, key=lambda r: r.student_id):
            writer.writerow([r.student_id, r.file, f"{r.score:g}", f"{r.max_score:g}",
                             f"{r.percent:.1f}", r.status, r.message])
    return report
