"""A Dask task that judges without kernels, for the tests of the class record with Dask workers
(tests/test_record_cluster.py).

``install()`` puts ``grade_batch`` in place of ``autograder.backends.cluster.grade_batch``: the
real ``DaskBackend`` then sends its tasks to the real workers of a cluster, and each worker
judges as ``fakebackend.FakeBackend`` does (each automatic test gets the fraction of its points
written in the notebook, ``# fake: code=C score=S``; the graded notebook and the feedback page
show the code ``C``), in milliseconds.  A notebook with a line ``# die-once: PATH`` kills the
worker process that judges it (SIGKILL, half way through its task) unless the file PATH exists,
which it creates first: the first worker dies, the next one to get the task judges it.

The workers import this module by name: start them from a process whose ``sys.path`` has tests/
(a ``LocalCluster`` of the test process) or with ``PYTHONPATH`` naming it.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import tempfile
from pathlib import Path

DIE_ONCE = re.compile(r"# die-once: (?P<path>\S+)")


def grade_batch(spec):
    """``autograder.backends.cluster.grade_batch`` without kernels (runs on a Dask worker)."""
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.backends.cluster import BatchResult, TaskResult
    from autograder.course.paths import nbgrader_env
    from autograder.course.settings import environ
    from fakebackend import MARK

    results = []
    with tempfile.TemporaryDirectory(prefix="fake-task-") as tmp:
        db = Path(tmp) / "gradebook.db"
        db.write_bytes(spec.release_db)
        with environ({"PATH": nbgrader_env()["PATH"]}), Gradebook(f"sqlite:///{db}") as gb:
            for sid, text in zip(spec.students, spec.notebooks):
                nb = nbformat.reads(text, as_version=4)
                die = next((m["path"] for c in nb.cells for m in [DIE_ONCE.search(c.source)] if m), None)
                if die is not None and not Path(die).exists():
                    Path(die).write_text(f"{os.getpid()}\n")
                    os.kill(os.getpid(), signal.SIGKILL)  # the worker dies in the middle of its task
                found = next((MARK.search(c.source) for c in nb.cells if MARK.search(c.source)), None)
                mark = {"code": found["code"], "score": float(found["score"])} if found else {}
                gb.update_or_create_student(sid)
                try:
                    gb.remove_submission(spec.assignment, sid)
                except MissingEntry:
                    pass
                gb.add_submission(spec.assignment, sid)
                for grade in gb.find_submission(spec.assignment, sid).notebooks[0].grades:
                    if grade.cell.cell_type == "code":
                        grade.auto_score = float(grade.max_score) * float(mark.get("score", 1.0))
                        grade.needs_manual_grade = False
                gb.db.commit()
                page = (f"<html><body><p>feedback of {sid}: # fake: code={mark.get('code', '?')} "
                        f"score={mark.get('score', 1.0)}</p></body></html>")
                results.append(TaskResult(sid, True, [], "", socket.gethostname(),
                                          autograded=nbformat.writes(nb).encode(), feedback=page.encode(),
                                          timings={"total": 0.0}))
        return BatchResult(results, db.read_bytes())


def install(monkeypatch=None) -> None:
    """Dask tasks judged by ``grade_batch``: with ``monkeypatch`` until it undoes its changes,
    without for the rest of this process (a child process that runs one command)."""
    from autograder.backends import cluster

    if monkeypatch is None:
        cluster.grade_batch = grade_batch
    else:
        monkeypatch.setattr(cluster, "grade_batch", grade_batch)
