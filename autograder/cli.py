"""Command line: ``python -m autograder {release,grade} ...``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import ROOT, assignments


def _cmd_release(args) -> int:
    from .release import release

    for path in release(args.assignments or None, out_dir=args.out):
        print(f"released {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


def _cmd_collect(args) -> int:
    from .lms import collect, summary

    entries = collect(args.assignment, Path(args.source), Path(args.out), args.roster)
    print(summary(entries))
    print(f"\nreport: {Path(args.out) / '.collect_report.csv'}")
    return 0


def _cmd_grade(args) -> int:
    from .grade import GradingError, grade
    from .release import ReleaseError

    try:
        report = grade(args.assignment, Path(args.submissions), out_dir=args.out,
                       grading_dir=args.grading_dir, cell_timeout=args.cell_timeout,
                       notebook_timeout=args.notebook_timeout, workers=args.workers,
                       use_sandbox=args.sandbox, memory_mb=args.memory_mb, roster=args.roster)
    except (ReleaseError, GradingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.table())
    print(f"\ngrades: {report.csv_path} (and canvas.csv, moodle.csv, histogram.png, pass_rates.png)"
          f"\nfeedback: {report.feedback_dir}\ntime: {report.seconds:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder",
                                     description="Release and grade the course's nbgrader assignments.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="regenerate exercises/ from solutions/ (deterministic)")
    p.add_argument("assignments", nargs="*", help=f"default: all ({', '.join(assignments())})")
    p.add_argument("--out", type=Path, default=None, help="release directory (default: exercises/)")
    p.set_defaults(func=_cmd_release)

    p = sub.add_parser("collect", help="Canvas/Moodle bulk download (zip or folder) -> a folder for grade")
    p.add_argument("assignment")
    p.add_argument("source", help="the LMS zip, or a folder")
    p.add_argument("out", help="folder to write <student id>_<assignment>.ipynb files into")
    p.add_argument("--roster", type=Path, default=None, help="CSV with student_id,lms_id[,name,email,...]")
    p.set_defaults(func=_cmd_collect)

    p = sub.add_parser("grade", help="autograde a folder (or an LMS zip) of submitted notebooks")
    p.add_argument("assignment", help="assignment id, e.g. attention")
    p.add_argument("submissions", help="folder with one .ipynb per student (the student id is the file "
                                       "name), or a Canvas/Moodle zip (then see --roster)")
    p.add_argument("--roster", type=Path, default=None, help="CSV mapping LMS ids to student ids")
    p.add_argument("--out", type=Path, default=None,
                   help="where grades.csv and feedback go (default: grading/reports/ASSIGNMENT)")
    p.add_argument("--grading-dir", type=Path, default=None,
                   help="gradebook and nbgrader folders (default: grading/)")
    p.add_argument("--workers", type=int, default=None, help="parallel graders (default: CPU cores)")
    p.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto",
                   help="run student code in bubblewrap: auto (when available, else warn), on, off")
    p.add_argument("--memory-mb", type=int, default=None, help="memory limit per kernel: its address space, or its data segment when the kernels get the GPU")
    p.add_argument("--cell-timeout", type=int, default=None, help="seconds per cell (default 300)")
    p.add_argument("--notebook-timeout", type=int, default=None, help="seconds per notebook (default 1800)")
    p.set_defaults(func=_cmd_grade)

    args = parser.parse_args(argv)
    return args.func(args)
