"""The class record with Dask workers (issue 34, item 11: the kinds that involve workers), on
SQLite and on PostgreSQL.  The tasks run on the real workers of a ``LocalCluster`` (two worker
processes, as tests/test_scale.py starts them) and judge without kernels (tests/fake_cluster.py),
so what is checked is what the record makes of them:

* two ``grade --cluster ... --wait`` runs started together on one grading folder, a few pairs
  in a row, keep every grade, each the student's own (graded notebook and feedback page of
  its own submission);
* a worker killed in the middle of its task loses no grade: its submission is judged again on
  another worker and recorded once, with its own files, the gradebook consistent.

The same with kernels and SQLite: tests/test_scale.py (a worker that dies mid-run; a submission
that takes down every worker it is given to is reported not graded, with the reason).
"""
from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import nbformat
import pytest

import fake_cluster
import fakebackend
from conftest import assert_gradebook_consistent
from pg import ON_BOTH, db, postgres_server  # noqa: F401 - fixtures
from test_record_writer import fake_pairs_at_once
from dask_cluster import dask_cluster  # noqa: F401 - the module's local Dask cluster (a fixture)

CLUSTER_DRIVER = ("import sys, fake_cluster; fake_cluster.install(); from autograder.cli import main; "
                  "sys.exit(main(sys.argv[1:]))")
PAIRS = int(os.environ.get("COURSE_STRESS_PAIRS", "2"))




def _url(db, tmp: Path) -> str:
    """Where the record of the grading folder ``tmp/grading`` goes."""
    return db.args()[1] if db.postgresql else f"sqlite:///{tmp / 'grading' / 'gradebook.db'}"


@ON_BOTH
def test_two_cluster_runs_started_together_lose_and_swap_no_grade(dask_cluster, db, tmp_path):
    cluster, _ = dask_cluster
    url = _url(db, tmp_path)
    rows, codes, failed = fake_pairs_at_once(tmp_path, url, PAIRS, driver=CLUSTER_DRIVER,
                                             extra=("--cluster", cluster.scheduler_address))
    assert not failed, failed[:3]
    expected = {f"s{i:02d}{who}": ("graded", total) for i in range(PAIRS) for who, total in (("a", "30"), ("b", "15"))}
    assert rows == expected
    assert all(found == {sid} for sid, found in codes.items()), \
        {sid: found for sid, found in codes.items() if found != {sid}}
    assert_gradebook_consistent(url, "attention", set(expected))


def _submission(code: str, score: float, die_once: Path | None = None) -> bytes:
    nb = nbformat.reads(fakebackend.submission(code, score).decode(), as_version=4)
    if die_once is not None:
        cell = next(c for c in nb.cells if fakebackend.MARK.search(c.source))
        cell.source += f"# die-once: {die_once}\n"
    return nbformat.writes(nb).encode()


@ON_BOTH
def test_a_worker_killed_mid_task_loses_no_grade(dask_cluster, db, tmp_path, monkeypatch):
    from autograder.pipeline.run import grade

    cluster, client = dask_cluster
    client.wait_for_workers(2, timeout=120)
    pids = set(client.run(os.getpid).values())
    fake_cluster.install(monkeypatch)
    died = tmp_path / "died"
    subs = tmp_path / "subs"
    subs.mkdir()
    for sid, score, die in (("s1", 1.0, died), ("s2", 0.5, None), ("s3", 1.0, None)):
        (subs / f"{sid}_attention.ipynb").write_bytes(_submission(sid, score, die))
    url = _url(db, tmp_path)
    grading = tmp_path / "grading"
    report = grade("attention", subs, out_dir=tmp_path / "out", grading_dir=grading, cluster=cluster.scheduler_address,
                   db_url=None if url.startswith("sqlite") else url)
    assert died.exists() and int(died.read_text()) in pids, "no worker died judging s1"
    assert {r.student_id: r.status for r in report.results} == {"s1": "graded", "s2": "graded", "s3": "graded"}, \
        report.table()
    with open(tmp_path / "out" / "grades.csv", newline="") as fh:
        assert {r["student_id"]: r["total"] for r in csv.DictReader(fh)} == {"s1": "30", "s2": "15", "s3": "30"}
    for sid in ("s1", "s2", "s3"):
        for path in (grading / "feedback" / sid / "attention" / "attention.html",
                     grading / "autograded" / sid / "attention" / "attention.ipynb"):
            assert fakebackend.MARK.search(path.read_text())["code"] == sid, path
    assert_gradebook_consistent(url, "attention", {"s1", "s2", "s3"})  # judged twice, recorded once
    deadline = time.monotonic() + 120  # the nanny restarted the killed worker for the next test
    while len(client.run(os.getpid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
