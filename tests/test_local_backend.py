"""The local backend's grading processes: started while the run reads its files (in ``check``),
one process grading batch after batch, and no more processes than the class needs."""
from __future__ import annotations

from pathlib import Path

import nbformat

from autograder.backends import local
from autograder.pipeline.run import grade
from conftest import filled_exercise


def _spy_on_check(monkeypatch) -> list:
    """The pids of the grading processes each ``check`` left running."""
    started = []
    real = local.LocalBackend.check

    def check(self, settings):
        out = real(self, settings)
        started.append([w.proc.pid for w in self._workers])
        return out

    monkeypatch.setattr(local.LocalBackend, "check", check)
    return started


def test_one_process_started_at_check_grades_every_batch(tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("a", "b", "c"):
        nbformat.write(filled_exercise("attention"), subs / f"{name}_attention.ipynb")
    started = _spy_on_check(monkeypatch)
    monkeypatch.setattr(local, "batch_size", lambda n, w: 1)  # three batches
    monkeypatch.setenv("COURSE_KEEP_WORKERS", "1")  # the run's folder stays, to read who graded what
    report = grade("attention", subs, grading_dir=tmp_path / "grading", workers=1)
    assert [(r.student_id, r.status, r.score) for r in report.results] == \
        [("a", "graded", 30.0), ("b", "graded", 30.0), ("c", "graded", 30.0)], report.table()
    assert len(started) == 1 and len(started[0]) == 1, started
    holders = sorted((tmp_path / "grading" / "runs").glob("*/workers/w*/worker.pid"))
    assert len(holders) == 3, holders
    assert {int(p.read_text()) for p in holders} == set(started[0])  # the process that started ahead


def test_a_class_of_one_starts_one_process(tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(filled_exercise("attention"), subs / "a_attention.ipynb")
    started = _spy_on_check(monkeypatch)
    report = grade("attention", subs, grading_dir=tmp_path / "grading", workers=2)
    assert report.by_student()["a"].score == 30.0, report.table()
    assert [len(pids) for pids in started] == [1], started
    assert not any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in started[0])


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


class _OneJob:
    """What ``run_job`` needs of a job: its folder, its students, an environment, an outcome."""

    def __init__(self, folder: Path):
        self.folder, self.students = folder, ["s1"]

    def env(self) -> dict:
        return {}

    def outcome(self, sid: str, log: str = "", timed_out: bool = False):
        return (sid, log, timed_out)


def test_a_process_that_dies_in_a_job_is_told_as_a_death_with_its_last_words(tmp_path):
    """A grading process that dies in a job (killed, out of memory) is not reported as a time
    limit, and what it said on the way out reaches the outcome instead of an exception."""
    import os
    import sys

    worker = local.Worker(1, dict(os.environ), command=[
        sys.executable, "-c", "import os, sys; sys.stdin.readline(); "
        "sys.stderr.write('MemoryError: the last words\\n'); sys.stderr.flush(); os._exit(3)"])
    run = local.run_job(_OneJob(tmp_path), 60, worker)
    assert run.timed_out is False, run
    sid, log, timed_out = run.outcomes["s1"]
    assert not timed_out and "MemoryError: the last words" in log, run.outcomes
    assert not worker.alive()


def test_a_batch_whose_grading_raises_is_graded_again_and_never_left_without_a_cause(tmp_path, monkeypatch):
    """An exception in the grader's own thread for a batch costs that batch a second try, and a
    submission still without a record at the end is told why rather than left blank."""
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("a", "b"):
        nbformat.write(filled_exercise("attention"), subs / f"{name}_attention.ipynb")
    real, calls = local.run_job, []

    def flaky(job, timeout, worker=None):
        calls.append(list(job.students))
        if len(calls) == 1 or job.students == ["b"]:
            raise ValueError("I/O operation on closed file")
        return real(job, timeout, worker)

    monkeypatch.setattr(local, "run_job", flaky)
    monkeypatch.setattr(local, "batch_size", lambda n, w: n)  # both in one batch
    report = grade("attention", subs, grading_dir=tmp_path / "grading", workers=1)
    by_id = report.by_student()
    assert (by_id["a"].status, by_id["a"].score) == ("graded", 30.0), report.table()
    assert by_id["b"].status == "error" and "I/O operation on closed file" in by_id["b"].message, report.table()
    assert calls == [["a", "b"], ["a"], ["b"]], calls
