"""Grade a class: a run is a list of stages, each handing one typed result to the next.

    collect   an LMS zip or a folder                    -> Collected (a folder, every entry's row)
    read      each file read, rebuilt, repaired, scanned -> [Submission]
    screen    another assignment's files, students off the roster: refused; the wrong zip stops here
    prepare   the sandbox proved where kernels run, the release, the offline models
    judge     the backend (local processes or Dask)      -> {student: Outcome}
    commit    the class record, in one transaction with its history; its files staged before, renamed after
    export    grades.csv, canvas.csv, moodle.csv, plots, a feedback page per student -> Report

Nothing reaches the class record before ``commit``: until then the run works in a folder of its
own (``grading/runs/<id>/``), removed when it ends, however it ends.  A run stopped with Ctrl-C
or killed before ``commit`` leaves the record as it was; a Ctrl-C during ``commit`` waits until the
record and its files are written, and then (as one during ``export``) stops the run with
``StoppedAfterCommit``: the run is in the history, and ``export`` rebuilds what it did not write.
A run killed during ``commit`` leaves a journal of its files (``records.files.FileChanges``): the
next command on the assignment completes the run when its transaction committed, else removes
what it staged, and says which.  A full disk at any step is one line (GradingError): before the
commit nothing of the run is in the record; after it, the run is, and the exports stay as before.
"""
from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autograder import ROOT
from autograder.course.errors import GradingError, StoppedAfterCommit
from autograder.course.model import CourseFileError, UnknownAssignment, load as load_course
from autograder.course.paths import GradingPaths
from autograder.course.settings import GradingSettings
from autograder.isolation.scratch import OWNER, remove_tree
from autograder.records import classrecord, gradebook
from autograder.records.files import disk_line, held_interrupt, recover
from autograder.records.writer import RecordBusy, writing

from . import stages
from .intake import student_id_from_name
from .results import Report, Result

__all__ = ["grade", "GradingError", "student_id_from_name", "Report", "Result", "STAGES"]

STAGES = (stages.collect, stages.read, stages.screen, stages.prepare, stages.judge, stages.commit, stages.export)


@dataclass
class Run:
    """What every stage of one run shares: the assignment, its settings, where things go."""

    assignment: str
    source: Path
    course: object
    spec: object
    settings: GradingSettings
    paths: GradingPaths
    url: str
    report: Report
    roster: dict = field(default_factory=dict)     # the class: student id -> roster row
    roster_given: bool = False
    canvas_column: str | None = None                # the assignment's column in a Canvas gradebook export given
    missing: str | None = None                      # "zero" or "blank": roster students without a gradable file
    add_students: bool = False
    folder: Path | None = None                      # the run's own folder
    started: float = field(default_factory=time.monotonic)
    # filled in by the stages
    backend: object = None
    checking: object = None                         # the sandbox's self-test, started by read (stages.Ahead)
    rel: object = None
    release: object = None
    info: object = None
    staging_gradebook: Path | None = None
    subs: list = field(default_factory=list)
    added: list = field(default_factory=list)
    run_id: str = ""
    changes: list = field(default_factory=list)
    fingerprint: str = ""                           # of the files given (stages.fingerprint)
    rehand: list = field(default_factory=list)      # [student, grade_id, old points]: hand grades left behind

    @property
    def by_lms(self) -> dict:
        """LMS id -> roster row, for matching the files of an LMS download."""
        from .collect import lms_index

        return lms_index(self.roster.values())

    @property
    def collected_folder(self) -> Path | None:
        folder = self.folder / "collected" if self.folder else None
        return folder if folder is not None and folder.is_dir() else None

    def settings_summary(self) -> dict:
        keep = ("cell_timeout", "notebook_timeout", "memory_mb", "workers", "sandbox", "cluster", "env", "bwrap", "gpu")
        return {k: v for k, v in asdict(self.settings).items() if k in keep}


def grade(assignment: str, submissions: Path, out_dir: Path | None = None,
          grading_dir: Path | None = None, cell_timeout: int | None = None,
          notebook_timeout: int | None = None, workers: int | None = None,
          use_sandbox: str = "auto", memory_mb: int | None = None,
          roster: Path | None = None, root: Path = ROOT, settings: GradingSettings | None = None,
          cluster: str | None = None, db_url: str | None = None, add_students: bool = False,
          missing: str | None = None, wait: bool = False) -> Report:
    """Autograde every file in ``submissions`` (a folder, or a Canvas/Moodle zip) into the class
    record and write grades, feedback and plots.  Raises GradingError (one line; nothing of the
    record changed) when the run cannot grade: an unknown assignment, the wrong zip, a broken
    sandbox, an unreachable database, another command changing the assignment's record (unless
    ``wait``: then it waits for that one, ``autograder.records.writer``)."""
    try:
        run = open_run(assignment, Path(submissions), out_dir, grading_dir, root, roster, add_students, db_url,
                       settings or dict(cell_timeout=cell_timeout, notebook_timeout=notebook_timeout, workers=workers,
                                        sandbox=use_sandbox, memory_mb=memory_mb, cluster=cluster))
    except OSError as exc:  # a full disk before the run could start: one line
        where = Path(exc.filename).parent if isinstance(exc.filename, str) else Path(grading_dir or "grading")
        raise GradingError(disk_line(exc, where, "nothing of this run reached the class record")) from None
    run.missing = missing
    try:
        try:
            with writing(run.url, assignment, f"grade {assignment}", wait=wait):
                return _run_stages(run)
        except RecordBusy as exc:
            raise GradingError(str(exc)) from None
    finally:
        if not os.environ.get("COURSE_KEEP_WORKERS"):  # keep the run's folder to debug a run
            remove_tree(run.folder)


def _run_stages(run: Run) -> Report:
    """Every stage in turn, while this run holds the assignment's writer lock."""
    assignment = run.assignment
    value = run.source
    # a command killed half way through a change of this record: its files completed or removed
    run.report.warnings += recover(run.paths.root, run.url, assignment)
    try:
        for stage in STAGES:
            # the record's transaction and the files it names move together: a Ctrl-C then
            # waits until both are done, and stops the run after them
            with held_interrupt() if stage is stages.commit else contextlib.nullcontext() as held:
                try:
                    value = stage(run, value)
                except OSError as exc:
                    if not run.run_id:
                        raise GradingError(disk_line(exc, run.paths.root, "nothing of this run reached the "
                                                                          "class record")) from None
                    raise GradingError(disk_line(
                        exc, run.report.out_dir, f"the run is in the class record (run {run.run_id[:8]}), with its "
                        "graded notebooks and feedback; its exports are as they were before it: "
                        f"python -m autograder export {assignment} writes them")) from None
            if held:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        if run.run_id:  # the record holds the run already: say so, not "nothing reached it"
            raise StoppedAfterCommit(assignment, run.run_id) from None
        raise
    return value


def open_run(assignment: str, source: Path, out_dir, grading_dir, root: Path, roster: Path | None,
             add_students: bool, db_url: str | None, settings) -> Run:
    """Everything a run needs before its first stage; refuses (GradingError) before anything is written."""
    from autograder.backends import backend_for

    try:
        course = load_course(root)
        spec = course.assignment(assignment)
    except (CourseFileError, UnknownAssignment) as exc:
        raise GradingError(str(exc)) from None
    if not isinstance(settings, GradingSettings):
        settings = GradingSettings.for_assignment(spec, **settings)
    paths = GradingPaths.at(grading_dir, root)
    url = db_url or paths.gradebook_url
    try:
        gradebook.check_reachable(url)
    except gradebook.GradebookUnreachable as exc:
        raise GradingError(str(exc)) from None
    given, table = read_roster_file(roster, assignment, with_table=True) if roster is not None else (None, None)
    reused = None if db_url else gradebook.reused_url_note(paths.root)
    paths.record_url(db_url)
    out = Path(out_dir).resolve() if out_dir else paths.reports(assignment)
    report = Report(assignment, csv_path=out / "grades.csv", feedback_dir=out / "feedback", out_dir=out)
    if reused:
        report.warnings.append(reused)
    canvas_column = None
    if table is not None:
        report.warnings.append(table.describe(roster))
        canvas_column = table.column_for(spec.title, spec.lms_name, spec.canvas_id, assignment)
        if table.format == "canvas":
            report.warnings.append(f"canvas.csv column: {canvas_column!r}, as in the export" if canvas_column else
                                   f"canvas.csv column: no column of the export is {spec.lms_column!r} (or canvas_id "
                                   f"{spec.canvas_id}); canvas.csv names it {spec.lms_column!r} (set canvas_id or "
                                   "lms_name of the assignment in course.yml)")
    run = Run(assignment, source, course, spec, settings, paths, url, report,
              roster=given if given is not None else classrecord.read_roster(url), roster_given=given is not None,
              add_students=add_students, canvas_column=canvas_column)
    paths.runs.mkdir(parents=True, exist_ok=True)
    _remove_stale_runs(paths.runs)
    run.folder = paths.runs / uuid.uuid4().hex[:12]
    run.folder.mkdir()
    (run.folder / OWNER).write_text(str(os.getpid()))
    run.backend = backend_for(settings)
    return run


def _remove_stale_runs(runs: Path) -> None:
    """The folders of runs whose process was killed (their owner is gone): nothing in them
    reached the record, and nothing in them is needed."""
    for folder in runs.iterdir():
        try:
            pid = int((folder / OWNER).read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            remove_tree(folder)
        except (OSError, ValueError):
            continue


def read_roster_file(path: Path, assignment: str, with_table: bool = False):
    """student id -> row of a roster file (the course's roster CSV, or Canvas's or Moodle's export:
    ``collect.roster_table``); one line (GradingError) for a file that is missing or malformed.
    With ``with_table``: (that dict, the RosterTable)."""
    from .collect import RosterError, roster_table

    path = Path(path)
    if not path.is_file():
        raise GradingError(f"no such roster file: {path}")
    try:
        table = roster_table(path, assignment)  # a repeated student id or LMS id: refused here
    except RosterError as exc:
        raise GradingError(str(exc)) from None
    rows = {row["student_id"]: row for _, row in table.rows if row["student_id"]}
    return (rows, table) if with_table else rows
