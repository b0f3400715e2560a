"""The stages of a grading run, each ``stage(ctx, previous) -> result`` (run in order by
``autograder.pipeline.run.grade``): ``ctx`` is the run's frozen ``RunContext``, ``previous`` the
result of the stage before, and each result is a frozen dataclass of ``autograder.pipeline.chain``
(the previous one plus what the stage learned).  No stage changes what it was given: a changed
submission is a copy (``dataclasses.replace``).

Nothing reaches the class record before ``commit``: the stages before it read, check and judge
into the run's own folder; ``commit`` writes the run into the record in one transaction (with
its history), its files staged before and renamed into place after; ``export`` rebuilds every file for the instructor,
the students and the LMS from the record.
"""
from __future__ import annotations

import hashlib
import platform
import time
import uuid
from dataclasses import asdict, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from autograder import RELEASE_DIR, SOURCE_DIR
from autograder.authoring.release import release
from autograder.course.cells import answers_in, graded_cells, normalised_answer
from autograder.course.errors import GradingError, StoppedAfterCommit
from autograder.course.offline_models import warm_models
from autograder.course.paths import write_atomic
from autograder.course.settings import GradingSettings
from autograder.records import classrecord, export as record_exports, gradebook  # tests replace its export()
from autograder.records.classbook import NO_ANSWER
from autograder.records.files import FileChanges, disk_line, replacing
from autograder.text import csvsafe
from autograder.text.outputs import HANDED_IN_FILE, write_handed_in
from autograder.text.packed import PackedNotebook

from . import tamper
from .chain import (Ahead, Collected, Committed, Judged, Prepared, Release, RunContext, Screened, Submissions,
                    extend)
from .collect import Entry, collect as unpack, read_report
from .intake import (IntakeError, Submission, colliding_names, collision_reason, read_submission,
                     student_id_from_name)
from .repair import repair
from .results import Report, Result
from .screen import screen_assignment

if TYPE_CHECKING:  # imported by the run when it picks its backend
    from autograder.backends import Outcome

NOTHING_REACHED = "nothing of this run reached the class record"


def after_commit_line(exc: OSError, ctx: RunContext, run_id: str) -> str:
    """One line for a write that failed once the run was in the class record."""
    return disk_line(exc, ctx.out_dir, f"the run is in the class record (run {run_id[:8]}), with its graded "
                     "notebooks and feedback; its exports are as they were before it: "
                     f"python -m autograder export {ctx.assignment} writes them")


# ----------------------------------------------------------------------------- release

def released_notebook(ctx: RunContext) -> Release:
    """The student notebook of the assignment as released (exercises/, generated from solutions/)."""
    return Release.read(ctx.paths.course / RELEASE_DIR, ctx.assignment)


def prepare_release(assignment: str, grading: Path, root: Path) -> Release:
    """Record the assignment in the gradebook, unless this grading folder already holds the
    release of exactly these sources (a second batch of the same class)."""
    stamp = grading / "release" / f".{assignment}.sources"
    sources = _release_fingerprint(root, assignment)
    if not (stamp.exists() and stamp.read_text() == sources
            and gradebook.has_assignment(gradebook.db_url(grading), assignment)
            and (grading / "release" / assignment / f"{assignment}.ipynb").exists()):
        release([assignment], out_dir=grading / "release", grading_dir=grading, root=root,
                checks_dir=grading / "release" / ".checks")
        write_atomic(stamp, sources)
    return Release.read(grading / "release", assignment)


def _release_fingerprint(root: Path, assignment: str) -> str:
    """sha256 of what a release depends on: the source notebooks and the nbgrader configuration."""
    h = hashlib.sha256()
    files = sorted((root / SOURCE_DIR / assignment).rglob("*")) + [root / "nbgrader_config.py",
                                                                  Path(__file__).parents[1] / "judge" / "nbconfig.py"]
    for f in files:
        if f.is_file():  # the grader's own nbconfig.py lies outside a course kept elsewhere (root=)
            name = f.relative_to(root) if f.is_relative_to(root) else Path("autograder", "judge", f.name)
            h.update(str(name).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# ----------------------------------------------------------------------------- 1. collect

def collect(ctx: RunContext, source: Path) -> Collected:
    """An LMS zip unpacked into the run's folder (every entry gets a row), or a folder of
    ``<student>_<assignment>.ipynb`` files (made by ``collect``, or by hand)."""
    source = Path(source)
    if source.is_file():
        try:
            entries = unpack(ctx.assignment, source, ctx.folder / "collected", by_lms=ctx.by_lms())
        except SystemExit as exc:  # a zip that cannot be read at all: one line
            raise GradingError(str(exc.code)) from None
        return Collected(ctx.folder / "collected", tuple(entries))
    if not source.is_dir():
        raise GradingError(f"no such zip file or folder: {source}")
    entries = read_report(source)
    if not entries:  # a plain folder: each file is an entry of its own
        entries = [Entry(p.name, target=p.name, status="collected") for p in sorted(source.iterdir())
                   if p.is_file() and not p.name.startswith(".")]
    return Collected(source, tuple(entries))


# ----------------------------------------------------------------------------- 2. read

def read(ctx: RunContext, collected: Collected) -> Submissions:
    """Every file read, rebuilt and repaired into a Submission, or given the reason it cannot be
    graded; every entry of the download that is not a notebook keeps its row (as a remark on its
    student's row when that student has a notebook here too).  The sandbox's self-test (seconds,
    in processes of its own) starts first and runs beside the reading; ``prepare`` takes its
    answer."""
    sandbox_check = None
    if any(e.target for e in collected.entries):
        backend, settings = ctx.backend, ctx.settings
        backend.expected = sum(1 for e in collected.entries if e.target)  # local: no more processes than files
        sandbox_check = Ahead(lambda: backend.check(settings))
    rel = released_notebook(ctx)
    shown = {c for _, cells in ctx.spec.handed_in_outputs for c in cells}  # kept for hand grading
    subs: list[Submission] = []
    seen: dict[str, int] = {}  # student id -> the position of their graded file in subs
    # two students never share an id (José_x.ipynb and Josè_x.ipynb both make Jos): both refused
    collisions = {n: (sid, names) for sid, names in colliding_names(
        [e.target for e in collected.entries if e.target], ctx.assignment).items() for n in names}
    for e in (e for e in collected.entries if e.target):
        path = collected.folder / e.target
        if e.target in collisions:
            subs.append(Submission(f"? ({path.name})", path.name, source=e.source,
                                   error=collision_reason(*collisions[e.target], ctx.assignment)))
            continue
        try:
            sid = student_id_from_name(path, ctx.assignment)
        except ValueError as exc:
            subs.append(Submission(f"? ({path.name})", path.name, error=str(exc), source=e.source))
            continue
        if sid in seen:
            subs.append(Submission(f"{sid} (duplicate)", path.name, source=e.source,
                                   error=f"second file for student {sid} ({subs[seen[sid]].file} was graded)"))
            continue
        seen[sid] = len(subs)
        subs.append(_read_one(path, sid, e, rel, shown))
    for e in (e for e in collected.entries if not e.target):
        if e.student_id in seen:  # e.g. an older Canvas file beside the one graded
            at = seen[e.student_id]
            subs[at] = replace(subs[at], remarks=subs[at].remarks + (f"{Path(e.source).name}: {e.status}",))
            continue
        subs.append(Submission(e.student_id or f"? ({e.source})", Path(e.source).name, error=e.status,
                               late=e.late, source=e.source, lms={"lms_id": e.lms_id, "name": e.name}))
    return Submissions(tuple(subs), fingerprint(collected), sandbox_check)


def _read_one(path: Path, sid: str, e: Entry, rel: Release, shown: set) -> Submission:
    """One student's notebook read, rebuilt, repaired and scanned; or the one line why it cannot be."""
    handed_in: dict[str, str] = {}  # read_submission fills it
    nb, notes, flags, remarks, grade_ids, error = None, (), (), (), frozenset(), None
    try:
        read_nb, found = read_submission(path, handed_in, shown)
        if untouched(read_nb, rel.nb):
            remarks = (NO_ANSWER,)
        grade_ids = frozenset(c.metadata["nbgrader"]["grade_id"] for c in read_nb.cells
                              if isinstance(c.metadata.get("nbgrader"), dict)
                              and c.metadata["nbgrader"].get("grade_id"))
        found += repair(read_nb, rel.nb)
        nb, notes = read_nb, tuple(found)
        flags = tuple(tamper.scan(read_nb, rel.nb))
    except IntakeError as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - one file never stops the class
        error = f"could not read {path.name}: {type(exc).__name__}: {exc}"[:300]
    packed = PackedNotebook(nb) if nb is not None else None  # it waits for the judge compressed
    return Submission(sid, path.name, nb=packed, error=error, notes=notes, flags=flags, late=e.late,
                      lms={"lms_id": e.lms_id, "name": e.name}, source=e.source, grade_ids=grade_ids,
                      remarks=remarks, handed_in=handed_in)


def _answers(nb) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(line.rstrip() for line in c.source.strip().splitlines())
            for c in nb.cells if isinstance(c.metadata.get("nbgrader"), dict)
            and c.metadata["nbgrader"].get("solution") and c.metadata["nbgrader"].get("grade_id")}


def untouched(nb, released) -> bool:
    """True when every answer cell of ``nb`` is still the released stub (``# YOUR CODE HERE``,
    ``YOUR ANSWER HERE``): the student handed in the notebook as they got it.  Its grade (0, or
    what tests that need no answer give) is then no answer, not a wrong one."""
    stubs = _answers(released)
    if not stubs:
        return False
    mine = _answers(nb)
    return all(mine.get(gid, text) == text for gid, text in stubs.items())


def fingerprint(collected: Collected) -> str:
    """One hash of the files a run was given (each notebook's bytes, and what became of every other
    entry): two runs of the same zip or folder have the same."""
    h = hashlib.sha256()
    for e in sorted(collected.entries, key=lambda e: (e.source, e.target)):
        h.update(f"{e.source}\0{e.target}\0{'' if e.target else e.status}\0".encode("utf-8", "surrogatepass"))
        if e.target:
            try:
                h.update(hashlib.sha256((collected.folder / e.target).read_bytes()).digest())
            except OSError:
                h.update(b"unreadable")
    return h.hexdigest()


# ----------------------------------------------------------------------------- 3. screen

def screen(ctx: RunContext, read: Submissions) -> Screened:
    """Refuse, before anything is written, what does not belong to this run: files of another
    assignment (by their name or their graded cells), and students not on the class's roster
    (unless the instructor adds them, ``--add-students``).  When most of the batch belongs to
    another assignment, the run stops (the wrong zip), and nothing is written."""
    subs = list(screen_assignment(ctx, read.submissions))
    added: list[str] = []
    if ctx.roster:
        for at, sub in enumerate(subs):
            if sub.error or sub.student_id.startswith("?") or "(duplicate)" in sub.student_id:
                continue
            if sub.student_id not in ctx.roster:
                if ctx.add_students:
                    added.append(sub.student_id)
                else:
                    subs[at] = replace(sub, nb=None, error=(
                        f"not on the class roster: student {sub.student_id} ({sub.file}); "
                        "to add them, grade again with --add-students"))
    return extend(Screened, read, submissions=tuple(subs), added=tuple(added))


# ----------------------------------------------------------------------------- 4. prepare

def prepare(ctx: RunContext, screened: Screened) -> Prepared:
    """Before any student code runs: the sandbox proved to work where the kernels will run, the
    assignment released into the gradebook (and a copy of it for the workers to start from), the
    offline models built."""
    release = prepare_release(ctx.assignment, ctx.paths.root, ctx.paths.course)
    if not any(s.nb is not None and not s.error for s in screened.submissions):
        return extend(Prepared, screened, release=release, settings=ctx.settings, staging_gradebook=None,
                      warnings=())
    check = screened.sandbox_check
    info, found = check.result() if check is not None else ctx.backend.check(ctx.settings)
    warnings = list(found)
    settings = replace(ctx.settings, bwrap=info.bwrap, gpu=info.gpu, provenance=provenance(ctx.assignment, info))
    staging = gradebook.staging_copy(ctx.url, ctx.folder / "release.db", ctx.assignment)
    if not settings.cluster:  # a cluster's workers build their own (backends.cluster)
        warning = warm_models(settings.models, settings.env)
        if warning:
            warnings.append(warning)
    return extend(Prepared, screened, release=release, settings=settings, staging_gradebook=staging,
                  warnings=tuple(warnings))


def provenance(assignment: str, info) -> str:
    """How a submission was graded, for the end of its feedback page."""
    versions = {}
    for dist in ("nbgrader", "torch", "transformers", "nbformat"):
        try:  # read from the installed metadata: importing torch here would cost seconds
            versions[dist] = version(dist)
        except PackageNotFoundError:
            pass
    parts = [f"assignment {assignment}", f"python {platform.python_version()}",
             *[f"{k} {v}" for k, v in versions.items()], f"device {info.device}", "seed 0",
             f"graded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             "sandbox " + ("bubblewrap" if info.bwrap else "off"), "tests judged outside the student's kernel"]
    return " \u00b7 ".join(parts)


# ----------------------------------------------------------------------------- 5. judge

def judge(ctx: RunContext, prepared: Prepared) -> Judged:
    """Every submission that can be graded, judged by the run's backend: one record each."""
    from autograder.backends import Batch, Outcome  # as in TYPE_CHECKING above: loaded when a run judges

    queue = {s.student_id: s.nb for s in prepared.submissions if s.nb is not None and not s.error}
    outcomes = {}
    if queue:
        late = frozenset(s.student_id for s in prepared.submissions if s.late)
        outcomes = dict(ctx.backend.judge(Batch(ctx.assignment, prepared.release.notebook, queue,
                                                prepared.staging_gradebook, prepared.settings, ctx.folder, late)))
        for sid in sorted(set(queue) - set(outcomes)):  # a backend's fault: told, never left blank
            outcomes[sid] = Outcome(sid, False, cause="not graded: the grading backend returned no result for "
                                    "this notebook (grade again; report it if it happens again)")
    # the notebooks were read for the judge alone (commit and export read the release's): the
    # results after it carry none, so a class's notebooks are not held to the end of the run
    submissions = tuple(replace(s, nb=None) if s.nb is not None else s for s in prepared.submissions)
    return extend(Judged, prepared, submissions=submissions, outcomes=MappingProxyType(dict(outcomes)))


# ----------------------------------------------------------------------------- 6. commit

def commit(ctx: RunContext, judged: Judged) -> Committed:
    """The run into the class record, in one transaction: the graded students' rows (a file that
    could not be graded this time leaves no older grade standing), what became of every file,
    the roster, and the history entry with everything it replaced.  Then the graded notebooks
    and feedback pages move into place, the ones they replace into the history's archive.
    A write that fails (a full disk) is one line saying whether the run reached the record; a
    Ctrl-C once it has (where the caller does not hold it) stops the run with StoppedAfterCommit."""
    try:
        change, graded_before, same_as = _change(ctx, judged)
    except OSError as exc:
        raise GradingError(disk_line(exc, ctx.paths.root, NOTHING_REACHED)) from None
    run_id = uuid.uuid4().hex
    staged = FileChanges(ctx.paths.root, ctx.assignment, run_id, "grade")
    try:  # every file the run names staged (and undo's copies made) before the transaction
        _stage_files(ctx, judged, staged)
        _stage_copies(ctx, change, staged)
        staged.journal()
        run_id, changes = classrecord.commit(ctx.url, change, run_id=run_id)
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt):  # a kill leaves the journal: the next start rolls back
            staged.discard()
        if isinstance(exc, OSError):
            raise GradingError(disk_line(exc, ctx.paths.root, NOTHING_REACHED)) from None
        if _disk_full(exc):
            raise GradingError(f"the gradebook could not be written ({_first_line(exc)}): nothing of this run "
                               "reached the class record") from None
        raise
    try:
        staged.apply()  # renames only: no byte to write, nothing a full disk stops
    except OSError as exc:
        raise GradingError(after_commit_line(exc, ctx, run_id)) from None
    except KeyboardInterrupt:
        raise StoppedAfterCommit(ctx.assignment, run_id) from None
    return extend(Committed, judged, run_id=run_id, changes=tuple(changes),
                  rehand=tuple(tuple(r) for r in change.rehand), graded_before=graded_before, same_as=same_as)


def _change(ctx: RunContext, judged: Judged) -> tuple[classrecord.Commit, bool, int | None]:
    """What the run puts into the class record; whether an earlier run graded the assignment, and
    the earlier run that graded the very same files."""
    subs, outcomes = judged.submissions, judged.outcomes
    change = classrecord.Commit(ctx.assignment, kind="grade", data={
        "source": str(ctx.source), "files": [s.file for s in subs], "settings": settings_summary(judged.settings)})
    graded_before, same_as = False, None
    if judged.fingerprint:
        change.data["fingerprint"] = judged.fingerprint
        before = [r for r in classrecord.history(ctx.url, ctx.assignment) if r.kind == "grade"]
        same = [r for r in before if not r.data.get("undone_by") and r.data.get("fingerprint") == judged.fingerprint]
        graded_before = bool(before)
        same_as = same[-1].seq if same else None
    exports = {k: v for k, v in (("canvas_column", ctx.canvas_column), ("missing", ctx.missing)) if v}
    if exports:
        change.data["exports"] = exports
    for sid, out in outcomes.items():
        rows = classrecord.staged_rows(f"sqlite:///{out.gradebook}", ctx.assignment, [sid]) if out.graded else {}
        change.submissions[sid] = rows.get(sid) if out.graded else None
        if out.graded:
            change.answers[sid] = _written_answers_changed(ctx, judged.release, sid, out)
    for sub in subs:
        out = outcomes.get(sub.student_id)
        named = not sub.student_id.startswith("?") and "(duplicate)" not in sub.student_id
        reason = sub.error or ("" if out is None or out.graded else out.cause)
        notes = "; ".join(file_notes(sub, out))
        change.intake[sub.student_id if named else f"file:{sub.file}"] = {
            "student_id": sub.student_id if named else "", "file": sub.file, "reason": reason, "late": sub.late,
            "notes": notes, "lms": {k: v for k, v in sub.lms.items() if v}}
    if ctx.roster_given or judged.added:
        roster = dict(ctx.roster)
        for sid in judged.added:
            roster[sid] = {"student_id": sid, "added": "yes"}
        change.roster = roster
    return change, graded_before, same_as


def file_notes(sub: Submission, out: Outcome | None) -> list[str]:
    """What a file's row says besides its grade and the reason it was not graded, in order: the
    remarks on the other files of its student, the repairs made before grading, the judge's notes.
    The one builder of these notes: the class record keeps them (``commit``), the run's summary
    shows them (``export``)."""
    repaired = ["repaired before grading: " + "; ".join(sub.notes)] if sub.notes else []
    return [*sub.remarks, *repaired, *(out.notes if out is not None else [])]


def settings_summary(settings: GradingSettings) -> dict:
    """The settings a run's history entry keeps."""
    keep = ("cell_timeout", "notebook_timeout", "memory_mb", "workers", "sandbox", "cluster", "env", "bwrap", "gpu")
    return {k: v for k, v in asdict(settings).items() if k in keep}


def _disk_full(exc: BaseException) -> bool:
    """The database's own error for a full disk (SQLite: "database or disk is full")."""
    return "disk is full" in str(exc) or "No space left" in str(exc)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _written_answers_changed(ctx: RunContext, rel: Release, sid: str, out: Outcome) -> dict:
    """grade_id -> whether the student's answer to that hand-graded cell differs (normalised)
    from the one of their submission in the record (its graded notebook); an earlier notebook
    that cannot be read counts as changed: no hand grade moves onto an answer nobody saw."""
    manual = [c.grade_id for c in graded_cells(rel.nb) if c.kind == "manual"]
    if not manual:
        return {}
    old = answers_in(ctx.paths.step("autograded", sid, ctx.assignment) / rel.notebook, manual)
    new = answers_in(out.autograded, manual) if out.autograded is not None else None
    return {gid: old is None or new is None
            or normalised_answer(old.get(gid, "")) != normalised_answer(new.get(gid, "")) for gid in manual}


def _stage_files(ctx: RunContext, judged: Judged, staged: FileChanges) -> None:
    """Graded notebooks and feedback pages staged for nbgrader's folders; the files they replace
    (and those of a student whose new file could not be graded) copied into the run's archive.
    Beside a graded notebook: the outputs its student handed in, where course.yml keeps them."""
    name = judged.release.notebook
    handed_in = {s.student_id: s.handed_in for s in judged.submissions if ctx.spec.handed_in_outputs}
    for sid, out in judged.outcomes.items():
        staged.keep(sid)
        for step, new, filename in (("autograded", out.autograded, name),
                                    ("feedback", out.feedback, name.replace(".ipynb", ".html"))):
            files = {filename: new} if out.graded and new is not None else None
            if files and step == "autograded" and handed_in.get(sid) is not None:
                kept = Path(new).parent / f".handed-in-{len(staged.ops)}"   # the run's own scratch folder
                kept.mkdir(exist_ok=True)
                write_handed_in(kept, handed_in[sid])
                files[HANDED_IN_FILE] = kept / HANDED_IN_FILE
            staged.put_files(ctx.paths.step(step, sid, ctx.assignment), files)


def _stage_copies(ctx: RunContext, change: classrecord.Commit, staged: FileChanges) -> None:
    """A readable copy of the roster, and the notebooks this run collected from an LMS download."""
    saved = change.roster if change.roster is not None else classrecord.read_roster(ctx.url)
    if saved:
        columns = ["student_id", "lms_id", "name", "email", "login", "section"]
        staged.put_text(ctx.paths.roster_copy, lambda path: csvsafe.write(
            path, columns, [[row.get(c, "") for c in columns] for _, row in sorted(saved.items())]))
    collected = ctx.collected_here()
    if collected is not None and collected.is_relative_to(ctx.folder):
        staged.put_moved(ctx.paths.collected(ctx.assignment), collected)


# ----------------------------------------------------------------------------- 7. export

def export(ctx: RunContext, committed: Committed) -> Report:
    """Every file of the assignment rebuilt from the class record (grades.csv, canvas.csv,
    moodle.csv, plots, a feedback page for every student of the class), and the run's summary."""
    out_dir = ctx.out_dir
    rel, outcomes = committed.release, committed.outcomes
    result = record_exports.export(ctx.assignment, ctx.paths.root, out_dir, rel.nb, ctx.spec.lms_column,
                           ctx.spec.canvas_id, pages=True, provenance=committed.settings.provenance)
    rows = {row.student_id: row for row in result.rows}
    results = [_result(sub, outcomes.get(sub.student_id), rows.get(sub.student_id), rel, result.auto_max,
                       committed.rehand) for sub in committed.submissions]
    listed = {sub.student_id for sub in committed.submissions}
    absent = []
    for sid in sorted(ctx.roster):  # the class is the roster: whoever on it has no grade is listed
        row = rows.get(sid)
        if sid in listed or row is None or row.status == "graded":
            continue
        absent.append(Result(sid, row.file, max_score=rel.max_points,
                             status="no submission" if row.status == "no submission" else "error",
                             message=row.reason or row.status))
    ids = ctx.paths.collected(ctx.assignment) / ".lms_ids.csv"  # the LMS identities of this download
    if ctx.collected_here() is None and ids.exists() and ctx.source.is_file():
        with replacing(out_dir / "lms_ids.csv", "wb") as fh:
            fh.write(ids.read_bytes())
    return Report(ctx.assignment, results=results, csv_path=out_dir / "grades.csv",
                  feedback_dir=out_dir / "feedback", out_dir=out_dir,
                  warnings=list(ctx.warnings + committed.warnings), seconds=time.monotonic() - ctx.started,
                  absent=absent, run_id=committed.run_id, changes=list(committed.changes),
                  graded_before=committed.graded_before, same_as=committed.same_as, missing=result.missing,
                  missing_students=[r.student_id for r in result.rows
                                    if r.status != "graded" and not r.student_id.startswith("?")])


def _result(sub: Submission, out: Outcome | None, row, rel: Release, auto_max: float, rehand) -> Result:
    """One file's row of the run's summary, built whole: its grade from the class record's ``row``
    when it was graded, else why not; the notes the record keeps (``file_notes``); its flags."""
    graded = not sub.error and out is not None and out.graded and row is not None
    notes = [sub.error] if sub.error else []
    notes += file_notes(sub, out)
    if not sub.error and out is not None and not out.graded:
        notes.append(out.cause)
    if graded and row.pending:  # e.g. "auto 22/22, 8 points await hand grading"
        notes.append(row.summary(auto_max))
    if sub.late:
        notes.append("submitted LATE")
    flags = list(sub.flags) + [f"written answer {gid} changed since it was hand-graded ({points:g} points before): "
                               "awaiting a grader again" for student, gid, points in rehand
                               if student == sub.student_id]
    return Result(sub.student_id, sub.file, score=row.total if graded else 0.0, max_score=rel.max_points,
                  status="graded" if graded else "error", message="; ".join(n for n in notes if n),
                  tests={g: (c.score or 0.0, c.max_score) for g, c in row.cells.items()} if graded else {},
                  flags=flags, late=sub.late, pending=row.pending if graded else 0.0)
