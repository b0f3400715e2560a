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

import html
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import compute_checksum

import autograder.backends as backends
from autograder.course.paths import nbgrader_env
from autograder.course.settings import environ
from autograder.isolation.sandbox import SandboxInfo
from autograder.judge.worker import Outcome

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
                nb = batch.notebooks[sid]
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


def install(monkeypatch=None, fake: FakeBackend | None = None) -> FakeBackend:
    """Runs judged by ``fake`` (a plain FakeBackend when none): with ``monkeypatch``, until it
    undoes its changes (a real grading later in the same process must not be faked); without,
    for the rest of this process (a child process that runs one command, ``DRIVER``)."""
    fake = fake if fake is not None else FakeBackend()
    if monkeypatch is None:
        backends.backend_for = lambda settings: fake
    else:
        monkeypatch.setattr(backends, "backend_for", lambda settings: fake)
    return fake


def use_fake_backend(monkeypatch, fake: FakeBackend) -> FakeBackend:
    """Every grading run of this test judges with ``fake`` (the seam: ``autograder.backends.backend_for``,
    which ``autograder.pipeline.run.open_run`` asks for the run's backend)."""
    return install(monkeypatch, fake)
