"""A student's time is their own, and "graded" means judged.

One worker grades a notebook that spends all of its time (cells that sleep, a kernel that dies
and is replayed) and, after it, an honest one.  The worker is killed (as at its time limit)
while it judges the honest notebook: nbgrader has already made that student's rows in the
gradebook and written the sanitised notebook where the graded one goes, but the grader never
recorded that the judging finished, so the honest notebook is graded again on its own and
gets its 30 points.  Nothing of the run is left in the system's temporary folder.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

import nbformat

from autograder.backends import local as workers
from autograder.pipeline.run import grade
from conftest import filled_exercise
from test_tamper import _processes_naming

# three cells of 2.5 s, a crash, the replay of those three and four more: past the notebook's
# 12 s during the replay, each cell well within its own 5 s
WASTER_CELLS = ["import time\ntime.sleep(2.5)"] * 3 + ["import os\nos._exit(1)"] + ["import time\ntime.sleep(2.5)"] * 4
NOTEBOOK_TIMEOUT = 12


def _has_rows(db: Path, student: str) -> bool:
    """True once nbgrader has made ``student``'s submission rows in the gradebook ``db``."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute("SELECT count(*) FROM submitted_assignment WHERE student_id = ?",
                               (student,)).fetchone()[0] > 0
        finally:
            con.close()
    except sqlite3.Error:
        return False


def test_an_honest_student_next_to_a_time_waster_gets_full_marks(tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    waster = filled_exercise("attention")
    at = next(i for i, c in enumerate(waster.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "imports")
    waster.cells[at + 1:at + 1] = [nbformat.v4.new_code_cell(src) for src in WASTER_CELLS]
    nbformat.write(waster, subs / "a_waster_attention.ipynb")
    nbformat.write(filled_exercise("attention"), subs / "b_honest_attention.ipynb")

    runs = []
    run_job = workers.run_job

    def killed_while_grading_the_honest_one(job, timeout, worker=None):
        """The batch's worker is killed (as at its time limit) once it has begun the honest
        notebook: nbgrader has made that student's rows, the judging has not finished."""
        runs.append(list(job.students))
        if len(job.students) == 1:
            return run_job(job, timeout, worker)
        done, result = threading.Event(), []
        threading.Thread(target=lambda: (result.append(run_job(job, timeout, worker)), done.set()),
                         daemon=True).start()
        # nbgrader's first pass writes the sanitised notebook where the graded one will go, and
        # the student's rows exist (no scores yet): the judging is under way
        sanitised = job.folder / "autograded" / "b_honest" / job.assignment / "attention.ipynb"
        while not done.is_set() and not (sanitised.exists() and _has_rows(job.folder / "gradebook.db", "b_honest")):
            time.sleep(0.05)
        # the grading process that holds the batch (it names itself in the batch's folder)
        os.kill(int((job.folder / "worker.pid").read_text()), signal.SIGKILL)
        done.wait(120)
        return result[0]

    monkeypatch.setattr(workers, "run_job", killed_while_grading_the_honest_one)
    monkeypatch.setattr(workers, "batch_size", lambda n, w: n)  # both in one batch
    private = Path(tempfile.mkdtemp(prefix="cf", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", None)
    report = grade("attention", subs, grading_dir=tmp_path / "grading", cell_timeout=5,
                   notebook_timeout=NOTEBOOK_TIMEOUT, workers=1)
    by_id = report.by_student()
    honest, wasted = by_id["b_honest"], by_id["a_waster"]
    assert (honest.status, honest.score) == ("graded", 30.0), honest
    assert wasted.status == "graded" and f"ran longer than {NOTEBOOK_TIMEOUT} s" in wasted.message, wasted
    # the batch, then each submission it did not finish alone (the waster's feedback page was not
    # written either: the batch writes the pages after judging every notebook)
    assert runs[0] == ["a_waster", "b_honest"] and ["b_honest"] in runs[1:], runs
    assert sorted(str(p.relative_to(private)) for p in private.rglob("*")) == []
    left = _processes_naming(str(private))
    assert left == [], "\n".join(left)
    os.rmdir(private)
