"""A backend that runs no kernel: each submission gets the outcome the test gave it.

It stands behind the same interface as the local and the Dask backends
(``autograder.backends.Backend``: ``check`` and ``judge``) and leaves what they leave: per
student a gradebook holding that student's rows (copied from the run's staging gradebook, so
the ids are the release's), a graded notebook and a feedback page.  Everything after the judge
(the class record and its history, undo, remove, the exports, the summary, the command line's
messages) then runs as it does after a real grading, in milliseconds instead of a kernel's
seconds.  What a kernel or the sandbox decides (a score from running the tests, a crash, a
limit) is tested with the real backends (tests/test_autograde.py, tests/test_toy_pipeline.py).

    fake = FakeBackend(lose={"dim=-2": ["test_calculate_multihead_attention_causal", ...]})
    use_fake_backend(monkeypatch, fake)      # every grade() from now on judges with ``fake``

The outcome of a submission, in this order:
  * ``fail``: {text: cause} -- a notebook with ``text`` in a cell is not graded, for ``cause``;
  * a notebook whose every answer cell is still as released (nbgrader's checksum) scores 0;
  * ``lose``: {text: [grade_id, ...]} -- a notebook with ``text`` in a cell scores 0 on those
    tests; every other test gets its full points.  A written answer waits for a grader, unless
    it is still as released: then it scores 0, as nbgrader scores it;
  * a mark ``# fake: code=C score=S`` in a cell (``submission(C, S)`` writes one) gives every test
    that fraction ``S`` of its points, and the feedback page shows the mark, so that a test can
    tell whose files a student has (tests/test_record_crash.py, tests/test_record_writer.py).

A command run in a child process is judged by the fake too when the child calls ``install()``
first (``DRIVER`` below), as the tests that kill a command half way through do.
"""
from __future__ import annotations

import hashlib
import html
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import compute_checksum

import autograder.backends as backends
import autograder.pipeline.stages as stages
from autograder.course.paths import nbgrader_env
from autograder.course.settings import environ
from autograder.isolation.sandbox import SandboxInfo
from autograder.judge.worker import Outcome
from conftest import RELEASES

RELEASED_ATTENTION = Path(__file__).resolve().parent.parent / "exercises" / "attention" / "attention.ipynb"

FAKE_NOTE = "judged by the test's fake backend"
MARK = re.compile(r"# fake: code=(?P<code>\S+) score=(?P<score>[0-9.]+)")
# ``python -c DRIVER ARGS``: the command line ``python -m autograder ARGS``, judged by the fake
# (the child needs tests/ on its PYTHONPATH)
DRIVER = ("import sys, fakebackend; fakebackend.install(); from autograder.cli import main; "
          "sys.exit(main(sys.argv[1:]))")


@dataclass
class FakeBackend:
    lose: dict = field(default_factory=dict)
    fail: dict = field(default_factory=dict)
    info: SandboxInfo = field(default_factory=lambda: SandboxInfo(bwrap=False, gpu=False))
    warnings: list = field(default_factory=list)
    judged: list = field(default_factory=list)   # the student ids of every batch judged, in order
    batches: list = field(default_factory=list)  # and the batches themselves

    def check(self, settings) -> tuple[SandboxInfo, list[str]]:
        return self.info, list(self.warnings)

    def judge(self, batch) -> dict[str, Outcome]:
        self.judged.append(sorted(batch.notebooks))
        self.batches.append(batch)
        folder = Path(batch.folder) / "fake"
        folder.mkdir(parents=True, exist_ok=True)
        db = folder / "gradebook.db"
        shutil.copy(batch.gradebook, db)
        outcomes: dict[str, Outcome] = {}
        with environ({"PATH": nbgrader_env()["PATH"]}), Gradebook(f"sqlite:///{db}") as gb, \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbgrader's add_submission: SQLAlchemy's autoflush notes
            for sid in sorted(batch.notebooks):
                nb = batch.notebooks[sid].load()
                text = "\n".join(cell.source for cell in nb.cells)
                cause = next((why for marker, why in self.fail.items() if marker in text), None)
                if cause is not None:
                    outcomes[sid] = Outcome(sid, False, cause=cause)
                    continue
                lost = {gid for marker, gids in self.lose.items() if marker in text for gid in gids}
                outcomes[sid] = self._graded(gb, batch, folder, db, sid, nb, lost, MARK.search(text))
        return outcomes

    def _graded(self, gb, batch, folder: Path, db: Path, sid: str, nb, lost: set, mark) -> Outcome:
        if not any(s.id == sid for s in gb.students):
            gb.add_student(sid)
        try:  # the staging gradebook holds the class's earlier grades: a regrade starts afresh, as nbgrader's does
            gb.remove_submission(batch.assignment, sid)
        except MissingEntry:
            pass
        submission = gb.add_submission(batch.assignment, sid)
        unanswered = _unanswered(gb, batch, nb)
        untouched = bool(unanswered) and unanswered == _answer_ids(nb)
        fraction = float(mark["score"]) if mark else 1.0
        for nb_row in submission.notebooks:
            for grade in nb_row.grades:
                cell = grade.cell
                if not _autograded(cell):  # a written answer: nbgrader scores an unchanged one 0
                    grade.auto_score = 0.0 if cell.name in unanswered else None
                    grade.needs_manual_grade = cell.name not in unanswered
                else:
                    grade.auto_score = 0.0 if cell.name in lost or untouched else float(cell.max_score) * fraction
                    grade.needs_manual_grade = False
        gb.db.commit()
        autograded = folder / "autograded" / sid / batch.nb_name
        feedback = folder / "feedback" / sid / batch.nb_name.replace(".ipynb", ".html")
        autograded.parent.mkdir(parents=True, exist_ok=True)
        feedback.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, autograded)
        late = " (late)" if sid in batch.late else ""
        marked = f" {html.escape(mark[0])}" if mark else ""
        feedback.write_text(f"<html><body><p>{html.escape(sid)}{late}: {FAKE_NOTE}{marked}</p></body></html>\n")
        return Outcome(sid, True, notes=(), timings={"total": 0.0}, gradebook=db, autograded=autograded,
                       feedback=feedback)


def _autograded(cell) -> bool:
    """A code cell nbgrader grades by running it (a test cell, or an autograded answer)."""
    return cell.cell_type == "code"


def _answer_ids(nb) -> set:
    return {c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if isinstance(c.metadata.get("nbgrader"), dict) and c.metadata["nbgrader"].get("solution")}


def _unanswered(gb, batch, nb) -> set:
    """The answer cells of ``nb`` still as released (nbgrader's test: the cell's checksum is the
    release's).  When every answer is, the notebook was handed in untouched: every test fails."""
    name = Path(batch.nb_name).stem
    out = set()
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if not (isinstance(meta, dict) and meta.get("solution")):
            continue
        try:
            released = gb.find_source_cell(meta["grade_id"], name, batch.assignment).checksum
        except MissingEntry:
            continue
        if compute_checksum(cell) == released:
            out.add(meta["grade_id"])
    return out


def submission(code: str, score: float) -> bytes:
    """attention as released, with an answer marked ``code`` and scoring the fraction ``score``
    of every test (in the answer's source: cell metadata would not survive intake)."""
    nb = nbformat.read(RELEASED_ATTENTION, as_version=4)
    answer = next(c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution"))
    answer.source += f"\n# fake: code={code} score={score}\n"
    return nbformat.writes(nb).encode()


def release_once(real):
    """``autograder.pipeline.stages.release`` for faked runs: the release of one assignment into a
    fresh grading folder (no gradebook yet) is made once per test session with ``real``, into a
    folder of its own, and copied from there after (the gradebook file and the release/ folder,
    all that ``real`` writes there), saving `nbgrader generate_assignment` (5-8 s a run); anything
    else is ``real`` itself.  tests/conftest.py puts it in place for every run of the test session
    (real gradings too); the real release runs in the first run of each assignment and where this
    falls back to it."""
    def release(names, out_dir=None, grading_dir=None, root=None, checks_dir=None):
        kept = os.environ.get(RELEASES)  # this session's folder (tests/conftest.py); children inherit it
        grading = Path(grading_dir) if grading_dir is not None else None
        if (not kept or grading is None or root is None or len(names or ()) != 1
                or Path(out_dir) != grading / "release" or Path(checks_dir) != grading / "release" / ".checks"
                or (grading / "gradebook.db").exists() or (grading / "gradebook.url").exists()):
            return real(names, out_dir=out_dir, grading_dir=grading_dir, root=root, checks_dir=checks_dir)
        key = hashlib.sha256(f"{Path(root).resolve()}\0{names[0]}\0{stages._release_fingerprint(Path(root), names[0])}"
                             .encode()).hexdigest()[:24]
        template = Path(kept) / key
        if not template.exists():
            fresh = Path(kept) / f".{key}.{os.getpid()}"
            shutil.rmtree(fresh, ignore_errors=True)
            real(names, out_dir=fresh / "release", grading_dir=fresh, root=root, checks_dir=fresh / "release" / ".checks")
            try:
                os.rename(fresh, template)
            except OSError:  # another process made it first
                shutil.rmtree(fresh, ignore_errors=True)
        grading.mkdir(parents=True, exist_ok=True)
        shutil.copytree(template / "release", grading / "release", dirs_exist_ok=True)
        shutil.copy(template / "gradebook.db", grading / "gradebook.db")
        return sorted(p for p in (grading / "release").rglob("*") if p.is_file())

    release.real = real
    return release


def install(monkeypatch=None, fake: FakeBackend | None = None) -> FakeBackend:
    """Runs judged by ``fake`` (a plain FakeBackend when none), and recording a release made once
    (``release_once``): with ``monkeypatch``, until it undoes its changes (a real grading later
    in the same process must not be faked); without, for the rest of this process (a child
    process that runs one command, ``DRIVER``)."""
    fake = fake if fake is not None else FakeBackend()
    real = getattr(stages.release, "real", stages.release)
    if monkeypatch is None:
        backends.backend_for = lambda settings: fake
        stages.release = release_once(real)
    else:
        monkeypatch.setattr(backends, "backend_for", lambda settings: fake)
        monkeypatch.setattr(stages, "release", release_once(real))
    return fake


def use_fake_backend(monkeypatch, fake: FakeBackend) -> FakeBackend:
    """Every grading run of this test judges with ``fake`` (the seam: ``autograder.backends.backend_for``,
    which ``autograder.pipeline.run.open_run`` asks for the run's backend)."""
    return install(monkeypatch, fake)
