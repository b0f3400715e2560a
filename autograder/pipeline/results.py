"""What a grading run hands from stage to stage, and what it returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autograder.text.visible import visible


@dataclass(frozen=True)
class Result:
    """One student's outcome (every roster student and every file gets one), built whole by the
    export stage."""

    student_id: str
    file: str
    score: float = 0.0
    max_score: float = 0.0
    status: str = "error"  # "graded" or "error"
    message: str = ""
    tests: dict = field(default_factory=dict)  # grade_id -> (score, max_score)
    flags: list[str] = field(default_factory=list)
    late: bool = False
    pending: float = 0.0  # points of written answers that wait for a person

    @property
    def percent(self) -> float:
        return 100.0 * self.score / self.max_score if self.max_score else 0.0


@dataclass(frozen=True)
class Report:
    """The results of a run, with where its files went (like otter's GradingResults); built whole
    by the export stage, the run's last."""

    assignment: str
    results: list[Result] = field(default_factory=list)
    csv_path: Path | None = None
    feedback_dir: Path | None = None
    out_dir: Path | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    absent: list[Result] = field(default_factory=list)   # students of the roster with no grade, not in this run
    run_id: str = ""                                     # the run in the history (python -m autograder history)
    changes: list = field(default_factory=list)          # grades it changed (records.classrecord.Change)
    graded_before: bool = False                          # an earlier run graded this assignment
    same_as: int | None = None                           # the earlier run that graded the very same files
    missing: str = "zero"                                # what the LMS files give a student without a grade
    missing_students: list = field(default_factory=list)  # students of the class without a gradable file

    def by_student(self) -> dict[str, Result]:
        return {r.student_id: r for r in self.results}

    def table(self) -> str:
        """A fixed-width summary, one line per submission."""
        rows = [("student", "score", "status", "note")]
        for r in sorted(self.results, key=lambda r: r.student_id) + self.absent:
            note = r.message
            if r.flags:
                note = (note + "; " if note else "") + "FLAGGED for review: " + "; ".join(r.flags)
            rows.append((r.student_id, f"{r.score:g}/{r.max_score:g}", r.status, note))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in rows]
        lines.insert(1, "-" * (sum(widths) + 10))
        graded = [r for r in self.results if r.status == "graded"]
        missing = [r for r in self.absent if r.status == "no submission"]
        lines.append(f"{_count(len(self.results), 'file')}: {len(graded)} graded, "
                     f"{len(self.results) - len(graded)} not graded (the note says why)"
                     + (f"; {_count(len(missing), 'student')} of the roster handed nothing in" if missing else ""))
        changed = [c for c in self.changes if c.old != "no grade"]  # grades that existed before this run
        if changed:
            lines.append(f"{len(changed)} grade{'s' if len(changed) != 1 else ''} changed: "
                         + ", ".join(str(c) for c in changed[:20]) + (", ..." if len(changed) > 20 else "")
                         + f" (to take this run back: python -m autograder undo {self.assignment})")
        elif self.graded_before and not self.changes:
            lines.append(f"no grade changed: the same {_count(len(self.results), 'file')} as run {self.same_as} "
                         "were graded again, with the same results" if self.same_as is not None else
                         "no grade changed: every student's grade is what it was before this run")
        if self.missing_students:
            n = len(self.missing_students)
            lines.append(f"{_count(n, 'student')} of the class without a gradable file: canvas.csv and moodle.csv "
                         + ("give them 0 (--missing zero; --missing blank leaves the cell empty)"
                            if self.missing == "zero" else
                            "leave their grade empty (--missing blank; --missing zero gives them 0)"))
        return visible("\n".join(w for w in self.warnings) + ("\n" if self.warnings else "") +
                       "\n".join(line.rstrip() for line in lines))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
