"""Grade a class: a run is a list of stages, each handing one typed, frozen result to the next.

    collect   an LMS zip or a folder                     -> Collected (a folder, every entry's row)
    read      each file read, rebuilt, repaired, scanned -> Submissions
    screen    another assignment's files, students off the roster: refused; the wrong zip stops here -> Screened
    prepare   the sandbox proved where kernels run, the release, the offline models -> Prepared
    judge     the backend (local processes or Dask)      -> Judged (an Outcome per student)
    commit    the class record, in one transaction with its history; its files staged before, renamed after
                                                         -> Committed
    export    grades.csv, canvas.csv, moodle.csv, plots, a feedback page per student -> Report

What every stage shares is one frozen ``RunContext`` (``autograder.pipeline.chain``), made by
``open_run`` before the first stage; each result is the previous one plus what its stage learned.

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
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from coursekit import envvars

from autograder import ROOT
from autograder.course.errors import GradingError, StoppedAfterCommit
from autograder.course.model import CourseFileError, UnknownAssignment, load as load_course
from autograder.course.paths import GradingPaths
from autograder.course.settings import GradingSettings
from autograder.isolation.scratch import OWNER, remove_tree
from autograder.records import classrecord, gradebook
from autograder.records.files import disk_line, held_interrupt, recover
from autograder.records.writer import DatabaseInUse, RecordBusy, using_database, writing

from . import stages
from .chain import RunContext
from .collect import RosterError, load_roster
from .intake import student_id_from_name
from .results import Report, Result

# Imports inside functions: the backends are imported when the run picks one (tests put a fake one there).

__all__ = ["grade", "GradingError", "student_id_from_name", "Report", "Result", "RunContext"]


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
    sandbox, an unreachable database, another command changing the assignment's record, or (with a
    ``db_url`` that is not the folder's database) any other command working in the grading folder
    (unless ``wait``: then it waits for those, ``autograder.records.writer``)."""
    with contextlib.ExitStack() as holding:  # the folder's database, held until the run ends (records.writer)
        try:
            ctx = open_run(assignment, Path(submissions), out_dir, grading_dir, root, roster, add_students, db_url,
                           missing, settings or dict(cell_timeout=cell_timeout, notebook_timeout=notebook_timeout,
                                                     workers=workers, sandbox=use_sandbox, memory_mb=memory_mb,
                                                     cluster=cluster), holding, wait)
        except OSError as exc:  # a full disk before the run could start: one line
            where = Path(exc.filename).parent if isinstance(exc.filename, str) else Path(grading_dir or "grading")
            raise GradingError(disk_line(exc, where, stages.NOTHING_REACHED)) from None
        try:
            try:
                with writing(ctx.url, assignment, f"grade {assignment}", wait=wait):
                    # a command killed half way through a change of this record: its files completed or removed
                    recovered = recover(ctx.paths.root, ctx.url, assignment)
                    return run_stages(replace(ctx, warnings=ctx.warnings + tuple(recovered)))
            except RecordBusy as exc:
                raise GradingError(str(exc)) from None
        finally:
            if not envvars.get("COURSE_KEEP_WORKERS"):  # keep the run's folder to debug a run
                remove_tree(ctx.folder)


def run_stages(ctx: RunContext) -> Report:
    """The stages, in order, each given the result of the one before (while this run holds the
    assignment's writer lock).  docs/GRADING.md's table lists them (tests/test_layers.py)."""
    try:
        collected = stages.collect(ctx, ctx.source)
        read = stages.read(ctx, collected)
        screened = stages.screen(ctx, read)
        prepared = stages.prepare(ctx, screened)
        judged = stages.judge(ctx, prepared)
        del collected, read, screened, prepared  # and the class's notebooks with them: only the judge reads them
    except OSError as exc:  # a full disk: one line
        raise GradingError(disk_line(exc, ctx.paths.root, stages.NOTHING_REACHED)) from None
    # the record's transaction and the files it names move together: a Ctrl-C then waits until
    # both are done, and stops the run after them
    with held_interrupt() as held:
        committed = stages.commit(ctx, judged)
    if held:
        raise StoppedAfterCommit(ctx.assignment, committed.run_id)
    try:
        return stages.export(ctx, committed)
    except OSError as exc:
        raise GradingError(stages.after_commit_line(exc, ctx, committed.run_id)) from None
    except KeyboardInterrupt:  # the record holds the run already: say so, not "nothing reached it"
        raise StoppedAfterCommit(ctx.assignment, committed.run_id) from None


def open_run(assignment: str, source: Path, out_dir, grading_dir, root: Path, roster: Path | None,
             add_students: bool, db_url: str | None, missing: str | None, settings,
             holding: contextlib.ExitStack, wait: bool = False) -> RunContext:
    """Everything a run needs before its first stage; refuses (GradingError) before anything is
    written.  ``holding`` keeps the grading folder's database (``records.writer.using_database``,
    which also makes ``db_url`` the folder's database) until the caller's block ends."""
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
    try:
        held = holding.enter_context(using_database(paths.root, db_url, wait=wait))
    except DatabaseInUse as exc:
        raise GradingError(str(exc)) from None
    if held != url:  # another command changed the folder's database a moment ago: this run uses the new one
        try:
            gradebook.check_reachable(held)
        except gradebook.GradebookUnreachable as exc:
            raise GradingError(str(exc)) from None
        url = held
    out = Path(out_dir).resolve() if out_dir else paths.reports(assignment)
    warnings = [reused] if reused else []
    canvas_column = None
    if table is not None:
        warnings.append(table.describe(roster))
        canvas_column = table.column_for(spec.title, spec.lms_name, spec.canvas_id, assignment)
        if table.format == "canvas":
            warnings.append(f"canvas.csv column: {canvas_column!r}, as in the export" if canvas_column else
                            f"canvas.csv column: no column of the export is {spec.lms_column!r} (or canvas_id "
                            f"{spec.canvas_id}); canvas.csv names it {spec.lms_column!r} (set canvas_id or "
                            "lms_name of the assignment in course.yml)")
    class_roster = given if given is not None else classrecord.read_roster(url)
    started = time.monotonic()
    paths.runs.mkdir(parents=True, exist_ok=True)
    _remove_stale_runs(paths.runs)
    folder = paths.runs / uuid.uuid4().hex[:12]
    folder.mkdir()
    (folder / OWNER).write_text(str(os.getpid()))
    return RunContext(assignment=assignment, source=source, course=course, spec=spec, settings=settings,
                      paths=paths, url=url, folder=folder, out_dir=out, backend=backend_for(settings),
                      roster=MappingProxyType(dict(class_roster)), roster_given=given is not None,
                      add_students=add_students, canvas_column=canvas_column, missing=missing,
                      warnings=tuple(warnings), started=started)


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
    ``collect.load_roster``); one line (GradingError) for a file that is missing or malformed.
    With ``with_table``: (that dict, the RosterTable)."""
    try:
        rows, table = load_roster(path, assignment)  # a repeated student id or LMS id: refused here
    except RosterError as exc:
        raise GradingError(str(exc)) from None
    return (rows, table) if with_table else rows
