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
