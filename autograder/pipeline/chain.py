"""What the stages of a grading run hand on (``autograder.pipeline.stages``, run in order by
``autograder.pipeline.run.grade``).

One ``RunContext`` holds what every stage may read and none changes: the assignment, its
settings as given, the paths, the class record's URL, the backend, the run's own folder and the
clock.  Each stage returns a result of its own: a frozen dataclass that is the previous stage's
result plus what that stage learned (``Screened`` is ``Submissions`` plus the students it added,
``Prepared`` is ``Screened`` plus the release and the checked settings, and so on).  So nothing a
stage sets waits in a shared object for a later stage to find, and what ``commit`` and ``export``
use can be read off their argument's type.  The last stage, ``export``, returns the ``Report``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, TypeVar

from autograder.course.cells import Release
from autograder.course.model import Assignment, Course
from autograder.course.paths import GradingPaths
from autograder.course.settings import GradingSettings
from autograder.records.classrecord import Change

from .collect import Entry, lms_index
from .intake import Submission

if TYPE_CHECKING:  # the backends are imported when the run picks one (tests put a fake one there)
    from autograder.backends import Backend, Outcome

__all__ = ["Ahead", "RunContext", "Release", "Collected", "Submissions", "Screened", "Prepared", "Judged", "Committed",
           "extend"]


@dataclass(frozen=True, slots=True)
class RunContext:
    """What every stage of one run shares, fixed before the first stage."""

    assignment: str
    source: Path                      # the zip or folder given
    course: Course
    spec: Assignment
    settings: GradingSettings         # as given; ``Prepared.settings`` is the copy checked where kernels run
    paths: GradingPaths
    url: str                          # the class record
    folder: Path                      # the run's own folder, removed when the run ends
    out_dir: Path                     # where the exports go
    backend: Backend
    roster: Mapping[str, dict]        # the class: student id -> roster row (read only)
    roster_given: bool                # the roster came with this run (it replaces the record's)
    add_students: bool                # students off the roster are added, not refused
    canvas_column: str | None         # the assignment's column in a Canvas gradebook export given
    missing: str | None               # "zero" or "blank": roster students without a gradable file
    warnings: tuple[str, ...]         # for the instructor, said before the stages' own
    started: float                    # time.monotonic() when the run began

    def by_lms(self) -> dict:
        """LMS id -> roster row, for matching the files of an LMS download."""
        return lms_index(self.roster.values())

    def collected_here(self) -> Path | None:
        """The folder an LMS zip was unpacked into, while it is in the run's folder (``commit``
        moves it into the grading folder)."""
        folder = self.folder / "collected"
        return folder if folder.is_dir() else None


class Ahead:
    """``fn()`` started now in a thread of its own; ``result()`` waits for it and returns its value
    or raises its exception.  A daemon: a run that stops early does not wait for it."""

    def __init__(self, fn):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name="course-ahead")
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass(frozen=True, slots=True)
class Collected:
    """collect: the files a run was given, a folder, and what became of each entry of the LMS download."""

    folder: Path
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class Submissions:
    """read: every file read into a ``Submission`` (or the reason it cannot be graded)."""

    submissions: tuple[Submission, ...]
    fingerprint: str                  # one hash of the files given (``stages.fingerprint``)
    sandbox_check: Ahead | None       # the sandbox's self-test, started beside the reading


@dataclass(frozen=True, slots=True)
class Screened(Submissions):
    """screen: the same, with other assignments' files and students off the roster refused."""

    added: tuple[str, ...]            # students added to the roster (--add-students)


@dataclass(frozen=True, slots=True)
class Prepared(Screened):
    """prepare: the release in the gradebook, the settings checked where kernels run."""

    release: Release
    settings: GradingSettings         # with bwrap, gpu and provenance as checked
    staging_gradebook: Path | None    # a copy of the gradebook holding the release, for the workers
    warnings: tuple[str, ...]         # the sandbox's and the offline models'


@dataclass(frozen=True, slots=True)
class Judged(Prepared):
    """judge: one ``Outcome`` per judged submission."""

    outcomes: Mapping[str, Outcome]   # student id -> Outcome (read only)


@dataclass(frozen=True, slots=True)
class Committed(Judged):
    """commit: the run in the class record, with its history entry; its files in place."""

    run_id: str
    changes: tuple[Change, ...]       # the grades it changed
    rehand: tuple[tuple[str, str, float], ...]  # (student, grade id, old points): hand grades left behind
    graded_before: bool               # an earlier run graded this assignment
    same_as: int | None               # the earlier run that graded the very same files


R = TypeVar("R")


def extend(kind: type[R], earlier, **more) -> R:
    """A result of type ``kind`` (a subclass of ``earlier``'s type): ``earlier``'s fields, with
    ``more`` added or in place of some."""
    values = {f.name: getattr(earlier, f.name) for f in fields(earlier)}
    values.update(more)
    return kind(**values)
