"""The files of the class record: each student's graded notebook and feedback page.

They live in nbgrader's folders (``autograded/<student>/<assignment>/``,
``feedback/<student>/<assignment>/``).  A run that replaces or removes them first moves the old
ones into the history's archive (``history/<run>/<step>/<student>/``), so that ``undo`` can
put them back; an undo archives what it replaces in the same way, so it can be undone too.
The copies are made, and the new files staged, before the change's transaction commits
(``FileChanges``, below): a crash never leaves a grade without its files or an empty archive.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import uuid
from pathlib import Path

from autograder.course.paths import GradingPaths
from autograder.isolation.scratch import remove_tree

from .classrecord import history
from .faults import fault

STEPS = ("autograded", "feedback")


def stage_removal(grading: Path, assignment: str, students, run_id: str) -> "FileChanges":
    """The files of ``students`` of ``assignment`` staged for removal by run ``run_id`` (a copy
    into its archive first, for undo); the journal written.  ``apply`` once it has committed."""
    changes = FileChanges(grading, assignment, run_id, "remove")
    for student in students:
        changes.keep(student)
        for step in STEPS:
            changes.put_copy(changes.paths.step(step, student, assignment), None)
    changes.journal()
    return changes


def stage_restore(grading: Path, assignment: str, undo_id: str, undone) -> "FileChanges":
    """For ``undo`` (run ``undo_id``) of the runs ``undone`` (RunEntry, newest last): every
    student those runs touched is to get back the files they had before the oldest of them (its
    archive); what they have now is copied into the undo's archive.  Staged, journal written:
    ``apply`` once the undo has committed."""
    changes = FileChanges(grading, assignment, undo_id, "undo")
    paths = changes.paths
    plan: dict = {}
    for run in reversed(list(undone)):  # newest first: the oldest run's archive is the last word
        for student in run.data.get("students", []):
            changes.keep(student)
            for step in STEPS:
                kept = paths.archive(run.id) / step / student
                plan[(step, student)] = kept if kept.is_dir() else None
    for (step, student), kept in plan.items():
        changes.put_copy(paths.step(step, student, assignment), kept)
    changes.journal()
    return changes


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


# ----------------------------------------------------------------------------- crash consistency
#
# A change of the record (a grading run, remove, undo) stages every file it names *before* its
# transaction commits: the files it replaces are copied into its archive (undo's copies, in
# ``history/<run>/``, which only the record owns), the new ones are written under
# ``history/<run>/.new/``, and a journal (``history/<run>/pending.json``) lists the renames that
# put them in place.  The transaction is the decision: after it commits, ``apply`` makes the
# renames (no byte is written, so a full disk cannot stop it) and removes the journal.  A command
# killed on the way leaves the journal; the next command on the assignment (under its writer
# lock) finds it and completes the renames when the run is in the record, or removes what was
# staged when it is not (``recover``), with a line saying which.

JOURNAL = "pending.json"


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def replacing(path: Path, mode: str = "w", step: str = "", **kw):
    """``open(path, mode)`` on a temporary name beside ``path``, renamed over it when the block
    ends without an error: a reader (or a crash) sees the old file or the new one, whole.  On an
    error the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        with open(tmp, mode, **kw) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        fault(step or f"write {path.name}")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class Replacements:
    """Files written to temporary names (``open``) and renamed into place together (``commit``)
    once every one of them is whole: an error or a kill while any is written (a full disk)
    leaves every one of them as it was.  As a context manager: the temporary files of a block
    that raised are removed."""

    def __init__(self):
        self.pending: list[tuple[Path, Path]] = []

    @contextlib.contextmanager
    def open(self, path: Path, mode: str = "w", **kw):
        path = Path(path)
        tmp = _tmp_name(path)
        self.pending.append((tmp, path))
        with open(tmp, mode, **kw) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        fault(f"write {path.name}")

    def commit(self) -> None:
        fault("replace")
        for tmp, path in self.pending:
            os.replace(tmp, path)
        self.pending = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for tmp, _ in self.pending:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self.pending = []
        return False


def remove_leftovers(folder: Path) -> None:
    """The temporary files of writers that were killed (``replacing``; their process is gone)."""
    for tmp in Path(folder).rglob(".*.tmp-*"):
        try:
            os.kill(int(tmp.name.rsplit("-", 2)[-2]), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                tmp.unlink()
        except (OSError, ValueError, IndexError):
            continue


FEEDBACK_STAGING = ".feedback.tmp"


def remove_dead_staging(grading: Path) -> None:
    """The staging folders of feedback pages (``export``) whose writer was killed (its process is gone)."""
    for old in Path(grading).glob(f"{FEEDBACK_STAGING}-*"):
        try:
            os.kill(int(old.name[len(FEEDBACK_STAGING) + 1:].split("-")[0]), 0)
        except ProcessLookupError:
            remove_tree(old)
        except (OSError, ValueError, IndexError):
            continue


def copy_tree(source: Path, target: Path) -> None:
    """``shutil.copytree``, except that a file that cannot be written raises its own OSError
    (a full disk stays ENOSPC, and says so in one line: ``disk_line``), where copytree would go
    on and end with one ``shutil.Error`` listing every failed file as text."""
    failed: list[OSError] = []

    def copy(src, dst):
        try:
            return shutil.copy2(src, dst)
        except OSError as exc:
            failed.append(exc)
            raise

    try:
        shutil.copytree(source, target, copy_function=copy)
    except shutil.Error:
        if failed:
            raise failed[0] from None
        raise


def disk_line(exc: OSError, where: Path, what: str) -> str:
    """One line for a write that failed (a full disk, above all): what happened and what did not."""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return f"{why} while writing in {where}: {what}"


class FileChanges:
    """The files one change of the record (run ``run_id``) puts in place or removes, staged
    before its transaction commits and put in place by ``apply`` after it (see above)."""

    def __init__(self, grading: Path, assignment: str, run_id: str, kind: str):
        self.paths = GradingPaths(Path(grading))
        self.assignment, self.run_id, self.kind = assignment, run_id, kind
        self.dir = self.paths.archive(run_id)
        self.ops: list[dict] = []
        self._started = False

    def _start(self) -> None:
        """The journal first, with no rename yet: a command killed while it stages leaves it,
        and the next one removes what was staged."""
        if not self._started:
            self._started = True
            self.journal(step="start journal")

    def _rel(self, path: Path) -> str:
        return str(Path(path).relative_to(self.paths.root))

    def keep(self, student: str) -> None:
        """A copy of ``student``'s current files into this run's archive (what undo restores)."""
        self._start()
        for step in STEPS:
            folder = self.paths.step(step, student, self.assignment)
            target = self.dir / step / student
            if folder.exists() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                fault("archive")
                tmp = _tmp_name(target)
                copy_tree(folder, tmp)
                os.replace(tmp, target)

    def _staged(self) -> Path:
        self._start()
        staged = self.dir / ".new" / str(len(self.ops))
        staged.parent.mkdir(parents=True, exist_ok=True)
        return staged

    def put_copy(self, target: Path, folder: Path | None) -> None:
        """The folder ``target`` is to be a copy of ``folder``, or to be removed (None)."""
        staged = None
        if folder is not None:
            staged = self._staged()
            fault("stage")
            copy_tree(folder, staged)
        self.ops.append({"target": self._rel(target), "new": self._rel(staged) if staged else None})

    def put_files(self, target: Path, files: dict | None) -> None:
        """The folder ``target`` is to hold exactly ``files`` (name -> a file to copy), or to be
        removed (None)."""
        staged = None
        if files is not None:
            staged = self._staged()
            staged.mkdir()
            for name, source in files.items():
                fault("stage")
                shutil.copyfile(source, staged / name)
        self.ops.append({"target": self._rel(target), "new": self._rel(staged) if staged else None})

    def put_text(self, target: Path, write) -> None:
        """The file ``target`` is to be what ``write(path)`` writes."""
        staged = self._staged()
        fault("stage")
        write(staged)
        self.ops.append({"target": self._rel(target), "new": self._rel(staged)})

    def put_moved(self, target: Path, source: Path) -> None:
        """The folder ``target`` is to be ``source`` (moved, on the same disk: no byte copied)."""
        staged = self._staged()
        os.replace(source, staged)
        self.ops.append({"target": self._rel(target), "new": self._rel(staged)})

    def journal(self, step: str = "") -> None:
        """The journal of the renames, written whole, last before the transaction commits."""
        self._started = True
        self.dir.mkdir(parents=True, exist_ok=True)
        with replacing(self.dir / JOURNAL, step=step) as fh:
            json.dump({"assignment": self.assignment, "kind": self.kind, "ops": self.ops}, fh)

    @classmethod
    def load(cls, journal: Path) -> "FileChanges":
        data = json.loads(Path(journal).read_text())
        grading = Path(journal).parents[2]
        self = cls(grading, data["assignment"], Path(journal).parent.name, data.get("kind", "grade"))
        self.ops = list(data["ops"])
        return self

    def apply(self) -> None:
        """Every rename of the journal, in order; safe to repeat after a crash (an op done
        already is skipped).  Then the journal and the staging folders go."""
        fault("apply")
        for i, op in enumerate(self.ops):
            target = self.paths.root / op["target"]
            new = self.paths.root / op["new"] if op["new"] else None
            trash = self.dir / ".trash" / str(i)
            if new is not None and not new.exists():
                continue  # put in place already
            if target.exists() or target.is_symlink():
                if trash.exists():
                    remove_tree(trash)
                trash.parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, trash)
            if new is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(new, target)
            fault("apply-op")
        for folder in (self.dir / ".trash", self.dir / ".new"):
            remove_tree(folder)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / JOURNAL).unlink()
        with contextlib.suppress(OSError):  # a run that replaced nothing keeps no archive
            self.dir.rmdir()

    def discard(self) -> None:
        """Everything staged for a change that did not reach the record (its transaction failed)."""
        remove_tree(self.dir)


def recover(grading: Path, url: str, assignment: str) -> list[str]:
    """Changes of ``assignment`` a killed command left half done (their journal is still there):
    completed when their run is in the record, removed when it is not; one line for each.  Only
    under the assignment's writer lock (``autograder.records.writer``)."""
    paths = GradingPaths(Path(grading))
    remove_leftovers(paths.reports(assignment))
    for folder in paths.step("feedback").glob(f"*/{assignment}"):  # an export's pages, half written
        remove_leftovers(folder)
    remove_dead_staging(paths.root)
    if paths.archive("x").parent.is_dir():  # a journal whose first write was cut short: a folder of nothing
        remove_leftovers(paths.archive("x").parent)
        for folder in paths.archive("x").parent.iterdir():
            with contextlib.suppress(OSError):
                folder.rmdir()
    lines = []
    journals = sorted(paths.root.glob(f"history/*/{JOURNAL}"))
    if not journals:
        return lines
    runs = {r.id: r for r in history(url, assignment)}
    for journal in journals:
        try:
            changes = FileChanges.load(journal)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            lines.append(f"the journal {journal} cannot be read ({exc}); left as it is")
            continue
        if changes.assignment != assignment:
            continue
        run = runs.get(changes.run_id)
        if run is not None:
            changes.apply()
            lines.append(f"run {run.seq} of {assignment} ({changes.kind}, {run.id[:8]}) was in the class record "
                         "but a stopped command had not put all its files in place: they are now")
        else:
            changes.discard()
            lines.append(f"a {changes.kind} of {assignment} stopped before its commit (run id {changes.run_id[:8]}) "
                         "left files staged: removed; the class record is as it was")
    return lines
