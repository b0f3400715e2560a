"""The files of the class record: each student's graded notebook and feedback page.

They live in nbgrader's folders (``autograded/<student>/<assignment>/``,
``feedback/<student>/<assignment>/``).  A run that replaces or removes them first moves the old
ones into the history's archive (``history/<run>/<step>/<student>/``), so that ``undo`` can
put them back; an undo archives what it replaces in the same way, so it can be undone too.
"""
from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import threading
from pathlib import Path

from autograder.course.paths import GradingPaths

STEPS = ("autograded", "feedback")


def archive_student(grading: Path, assignment: str, student: str, run_id: str) -> None:
    """Move ``student``'s files of ``assignment`` into run ``run_id``'s archive."""
    paths = GradingPaths(Path(grading))
    for step in STEPS:
        folder = paths.step(step, student, assignment)
        if folder.exists():
            target = paths.archive(run_id) / step / student
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            shutil.move(str(folder), str(target))


def restore_files(grading: Path, assignment: str, undo_id: str, undone: list[str]) -> None:
    """After ``undo`` (run ``undo_id``) undid the runs ``undone`` (newest last): every student
    those runs touched gets back the files they had before the oldest of them; what they have
    now goes into the undo's archive."""
    from .classrecord import history

    paths = GradingPaths(Path(grading))
    runs = {r.id: r for r in history(paths.gradebook_url, assignment)}
    touched: set[str] = set()
    for run_id in reversed(undone):  # newest first: the oldest run's archive is the last word
        run = runs.get(run_id)
        for student in (run.data.get("students", []) if run else []):
            if student not in touched:  # what the student has now, once, into the undo's archive
                archive_student(grading, assignment, student, undo_id)
                touched.add(student)
            for step in STEPS:
                folder = paths.step(step, student, assignment)
                if folder.exists():
                    shutil.rmtree(folder)
                kept = paths.archive(run_id) / step / student
                if kept.exists():
                    folder.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copytree(kept, folder)


@contextlib.contextmanager
def held_interrupt():
    """Ctrl-C (SIGINT) held while the block runs (a transaction of the class record and the files
    it names); the list it yields is not empty when one came, and the caller stops then.  Only in
    the main thread, and only where Python's own handler is in place (an ignored SIGINT stays
    ignored)."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield came
        return

    def hold(signum, frame):
        if not came:
            print("\nCtrl-C: waiting until the class record and its files are written (seconds)",
                  file=sys.stderr, flush=True)
        came.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
