"""One writer at a time per assignment (issue 34, item 1).

A second command that would change an assignment's class record while another one does
refuses with one line naming who holds it (exit status 2), or with --wait waits for it; a lock
left by a killed process is taken over with a line saying so; on SQLite and PostgreSQL alike.
Two ``grade`` runs started together on one fresh grading folder (--wait) both end with every
grade in place, each the student's own.  The 20-repetition stress check of the same with real
kernels: ``python benchmarks/concurrent_grades.py --repeat 20``; pairs of runs judged without
kernels, on SQLite and PostgreSQL: ``COURSE_STRESS_PAIRS=20 pytest tests/test_record_writer.py -k pairs``.
"""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main as cli
from autograder.records import writer
import fakebackend
from conftest import ROOT, WRONG_SOFTMAX, filled_exercise, set_solution
from pg import postgres, postgres_server  # noqa: F401 - the throwaway PostgreSQL server's fixtures

HOLD = """
import sys, time
from autograder.records.writer import writing
with writing(sys.argv[1], sys.argv[2], "grade attention"):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _holder(url: str, seconds: float = 60, assignment: str = "attention") -> subprocess.Popen:
    """A process that takes the writer lock of ``assignment`` and keeps it ``seconds``."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, url, assignment, str(seconds)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'grading' / 'gradebook.db'}"
    return request.getfixturevalue("postgres")


def test_a_second_writer_refuses_naming_the_holder_or_waits(url):
    proc = _holder(url, seconds=3)
    try:
        with pytest.raises(writer.RecordBusy) as busy:
            with writer.writing(url, "attention", "undo attention"):
                pass
        line = str(busy.value)
        assert "\n" not in line and f"pid {proc.pid}" in line and "grade attention" in line and "--wait" in line
        with writer.writing(url, "concepts", "grade concepts"):  # another assignment: its own lock
            pass
        said: list[str] = []
        start = time.monotonic()
        with writer.writing(url, "attention", "undo attention", wait=True, say=said.append):
            assert proc.wait(timeout=10) == 0  # only once the holder gave it back (and ends)
            with writer.writing(url, "attention", "export attention"):  # re-entrant in its own thread
                pass
        assert time.monotonic() - start > 1 and len(said) == 1 and f"pid {proc.pid}" in said[0]
        assert writer.holder(url, "attention") is None
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_of_a_killed_process_is_taken_over_with_a_line(url):
    proc = _holder(url)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    said: list[str] = []
    deadline = time.monotonic() + 20
    while True:  # PostgreSQL notices the dropped connection within moments
        try:
            with writer.writing(url, "attention", "grade attention", say=said.append):
                break
        except writer.RecordBusy:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    if "sqlite" in url:  # the file of the killed holder says who it was
        assert len(said) == 1 and "taking over" in said[0] and f"pid {proc.pid}" in said[0]


def test_grade_refuses_with_exit_2_while_another_command_writes(tmp_path, capsys):
    grading = tmp_path / "grading"
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(filled_exercise("attention"), subs / "s1_attention.ipynb")
    proc = _holder(f"sqlite:///{grading / 'gradebook.db'}")
    try:
        assert cli(["grade", "attention", str(subs), "--grading-dir", str(grading)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"pid {proc.pid}" in err and "being changed by another command" in err
        assert not (grading / "reports").exists() and not (grading / "release").exists()
    finally:
        proc.kill()
        proc.wait()


def two_grades_at_once(tmp: Path, wait: bool = True) -> tuple[dict, list[subprocess.CompletedProcess]]:
    """Two ``grade`` runs of attention started together on one fresh grading folder, s1 (all
    right, 30) in one and s2 (the wrong softmax, 24) in the other: grades.csv after both, and
    how each run ended."""
    grading = tmp / "grading"
    batches = []
    for sid, nb in (("s1", filled_exercise("attention")),
                    ("s2", set_solution(filled_exercise("attention"), "calculate_multihead_attention",
                                        WRONG_SOFTMAX))):
        folder = tmp / f"batch_{sid}"
        folder.mkdir()
        nbformat.write(nb, folder / f"{sid}_attention.ipynb")
        batches.append(folder)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "autograder", "grade", "attention", str(b), "--workers", "1",
                               "--grading-dir", str(grading), *(["--wait"] if wait else [])], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for b in batches]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    grades = grading / "reports" / "attention" / "grades.csv"
    rows = {}
    if grades.exists():
        with open(grades, newline="") as fh:
            rows = {r["student_id"]: (r["status"], r["total"]) for r in csv.DictReader(fh)}
    return rows, done


def test_two_grade_runs_started_together_lose_and_swap_no_grade(tmp_path):
    """Once with real kernels (the race itself is repeated without kernels, on both databases, by the
    pairs test below, and 20 times with kernels by benchmarks/concurrent_grades.py)."""
    rows, done = two_grades_at_once(tmp_path)
    for proc in done:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert rows == {"s1": ("graded", "30"), "s2": ("graded", "24")}
    assert sum("waiting for grade attention" in p.stderr for p in done) <= 1


# -------------------------------------------------------- many pairs, SQLite and PostgreSQL

FAKE_DRIVER = ("import sys, fakebackend; fakebackend.install(); from autograder.cli import main; "
               "sys.exit(main(sys.argv[1:]))")
# pairs per database in the suite; the 20 of issue 34's check: COURSE_STRESS_PAIRS=20 pytest tests/test_record_writer.py -k pairs
PAIRS = int(os.environ.get("COURSE_STRESS_PAIRS", "5"))


def fake_pairs_at_once(tmp: Path, url: str, pairs: int = PAIRS, driver: str = FAKE_DRIVER,
                       extra: tuple = ()) -> tuple[dict, dict, list[str]]:
    """``pairs`` times, two ``grade`` runs of attention started together (--wait) on one grading
    folder whose record is ``url``, each with one new student, judged by the kernel-free fake of
    tests/fakebackend.py (a student ``sNNa`` scores 30, ``sNNb`` 15, and each graded notebook and
    feedback page carries its own student's id; ``driver`` and the command's ``extra`` words may
    judge otherwise, e.g. on Dask workers: tests/test_record_cluster.py).  Returns grades.csv (student -> (status, total)),
    whose code each student's graded notebook and feedback page show, and every failed run's end."""
    grading = tmp / "grading"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    env.pop("COURSE_FAULT", None)
    db = [] if url.startswith("sqlite") else ["--db-url", url]
    failed = []
    for i in range(pairs):
        procs = []
        for who, score in (("a", 1.0), ("b", 0.5)):
            sid = f"s{i:02d}{who}"
            folder = tmp / "batches" / sid
            folder.mkdir(parents=True)
            (folder / f"{sid}_attention.ipynb").write_bytes(fakebackend.submission(sid, score))
            procs.append(subprocess.Popen(
                [sys.executable, "-W", "ignore", "-c", driver, "grade", "attention", str(folder), "--wait",
                 "--grading-dir", str(grading), *db, *extra], cwd=ROOT, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                failed.append(f"pair {i}: exit {p.returncode}: {err[-2500:]}")
    with open(grading / "reports" / "attention" / "grades.csv", newline="") as fh:
        rows = {r["student_id"]: (r["status"], r["total"]) for r in csv.DictReader(fh)}
    codes = {}
    for sid in rows:
        page = grading / "feedback" / sid / "attention" / "attention.html"
        graded = grading / "autograded" / sid / "attention" / "attention.ipynb"
        codes[sid] = {fakebackend.MARK.search(p.read_text())["code"] if p.exists() else "-" for p in (page, graded)}
    return rows, codes, failed


def test_pairs_of_grade_runs_started_together_lose_and_swap_no_grade(tmp_path, url):
    """On SQLite and PostgreSQL: pairs of runs started together keep every grade, each the student's own."""
    rows, codes, failed = fake_pairs_at_once(tmp_path, url)
    assert not failed, failed[:3]
    expected = {f"s{i:02d}{who}": ("graded", total) for i in range(PAIRS) for who, total in (("a", "30"), ("b", "15"))}
    assert rows == expected
    assert all(found == {sid} for sid, found in codes.items()), \
        {sid: found for sid, found in codes.items() if found != {sid}}


# -------------------------------------------------------- one database per grading folder at a time

IN_FOLDER = """
import sys, time
from pathlib import Path
from autograder.records.writer import using_database
with using_database(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_run_cannot_change_the_database_of_a_folder_another_command_works_in(tmp_path, capsys, monkeypatch):
    """While a command works in a grading folder (with its database), grade --db-url naming another
    database refuses with one line (exit 2) and the folder keeps its database; the same database, or
    none named, is no change; with --wait the change waits for that command to end."""
    from autograder.course.paths import GradingPaths

    fakebackend.install(monkeypatch)  # judged without kernels
    grading, subs = tmp_path / "grading", tmp_path / "subs"
    subs.mkdir()
    (subs / "s1_attention.ipynb").write_bytes(fakebackend.submission("s1", 1.0))
    (grading / "runs").mkdir(parents=True)
    ours, other = f"sqlite:///{grading / 'gradebook.db'}", f"sqlite:///{tmp_path / 'other.db'}"
    proc = subprocess.Popen([sys.executable, "-c", IN_FOLDER, str(grading), "4"], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "held"
        assert cli(["grade", "attention", str(subs), "--grading-dir", str(grading), "--db-url", other]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "another command works in the grading folder" in err and "--wait" in err, err
        assert GradingPaths(grading).gradebook_url == ours and not (grading / "gradebook.url").exists()
        for same in ([], ["--db-url", ours]):  # no change of database: nothing to wait for
            capsys.readouterr()
            assert cli(["grade", "attention", str(subs), "--grading-dir", str(grading), *same]) == 0
            assert "another command works" not in capsys.readouterr().err
        assert proc.poll() is None  # all of that while the other command still worked
        start = time.monotonic()
        assert cli(["grade", "attention", str(subs), "--grading-dir", str(grading), "--db-url", other, "--wait"]) == 0
        assert proc.poll() is not None and time.monotonic() - start > 1
        assert GradingPaths(grading).gradebook_url == other
        assert "waiting for the other commands in the grading folder" in capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait()
