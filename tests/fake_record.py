"""A judge without kernels, for the tests of the class record's files (tests/test_record_crash.py).

It stands in for the local backend (``autograder.backends.backend_for`` patched): each
submission gets the rows nbgrader would write (every automatic test given the fraction of its
points written in a comment of the notebook, ``# fake: code=C score=S``), a graded notebook and a
feedback page that shows the submission's own code ``C``, so a test can tell whose files a student has.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat

FAKE = "fake"
MARK = re.compile(r"# fake: code=(?P<code>\S+) score=(?P<score>[0-9.]+)")


def submission(code: str, score: float) -> bytes:
    """The released notebook of attention, marked with ``code`` and the fraction ``score``."""
    from conftest import ROOT

    nb = nbformat.read(ROOT / "exercises" / "attention" / "attention.ipynb", as_version=4)
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code")
    answer.source += f"\n# {FAKE}: code={code} score={score}\n"  # metadata would not survive intake
    return nbformat.writes(nb).encode()


def _mark(nb) -> dict:
    for cell in nb.cells:
        found = MARK.search(cell.source)
        if found:
            return {"code": found["code"], "score": float(found["score"])}
    return {}


class FakeBackend:
    def check(self, settings):
        from autograder.isolation.sandbox import SandboxInfo

        return SandboxInfo(bwrap=False, gpu=False), []

    def judge(self, batch) -> dict:
        from nbgrader.api import Gradebook, MissingEntry

        from autograder.course.paths import nbgrader_env
        from autograder.course.settings import environ
        from autograder.judge.worker import Outcome

        outcomes = {}
        for sid, nb in sorted(batch.notebooks.items()):
            mark = _mark(nb)
            folder = Path(batch.folder) / FAKE / sid
            folder.mkdir(parents=True)
            db = folder / "gradebook.db"
            shutil.copy(batch.gradebook, db)
            with environ({"PATH": nbgrader_env()["PATH"]}), Gradebook(f"sqlite:///{db}") as gb:
                gb.update_or_create_student(sid)
                try:  # the copy holds the class's record too
                    gb.remove_submission(batch.assignment, sid)
                except MissingEntry:
                    pass
                gb.add_submission(batch.assignment, sid)
                for grade in gb.find_submission(batch.assignment, sid).notebooks[0].grades:
                    if grade.cell.cell_type == "code":  # an automatic test
                        grade.auto_score = float(grade.max_score) * float(mark.get("score", 1.0))
                        grade.needs_manual_grade = False
                gb.db.commit()
            graded = folder / batch.nb_name
            nbformat.write(nb, graded)
            page = folder / batch.nb_name.replace(".ipynb", ".html")
            page.write_text(f"<html><body><p>feedback of {sid}: # {FAKE}: code={mark.get('code', '?')} "
                            f"score={mark.get('score', 1.0)}</p></body></html>")
            outcomes[sid] = Outcome(sid, True, gradebook=db, autograded=graded, feedback=page)
        return outcomes


def install(monkeypatch=None) -> None:
    """Runs judged by FakeBackend: with ``monkeypatch``, until it undoes its changes (in the test
    process: a real grading later in the same process must not be faked); without, for the rest
    of this process (a child process that runs one command)."""
    import autograder.backends

    if monkeypatch is None:
        autograder.backends.backend_for = lambda settings: FakeBackend()
    else:
        monkeypatch.setattr(autograder.backends, "backend_for", lambda settings: FakeBackend())
