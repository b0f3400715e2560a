"""Every kind of bad submission in the corpus gets its intended score and a clear line,
the batch always finishes, and the gradebook stays consistent."""
from __future__ import annotations

import socket
import sqlite3
import threading

import pytest

from autograder import sandbox
from autograder.grade import grade
from tamper_corpus import cases

SANDBOX = sandbox.bwrap_works()


@pytest.fixture(scope="module")
def listener():
    """A TCP server on loopback that counts connections (there must be none)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.5)
    hits = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                hits.append(conn.recv(100))
                conn.close()
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join(2)
    srv.close()


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory, listener):
    port, hits = listener
    subs = tmp_path_factory.mktemp("corpus")
    out = tmp_path_factory.mktemp("corpus_out")
    grading = out / "grading"
    corpus = cases(port, grading)
    for case in corpus:
        case.write(subs)
    report = grade("attention", subs, out_dir=out, grading_dir=grading, cell_timeout=10, workers=2)
    by_file = {r.file: r for r in report.results}
    return corpus, report, by_file, grading, hits


def _result(by_file, case):
    matches = [r for f, r in by_file.items() if f.split(".")[0] == case.name
               or (case.name == "wrong_file_name" and f.startswith("Copy of"))
               or (case.name == "not_a_notebook" and f == "notebook.docx")]
    assert len(matches) == 1, f"{case.name}: {sorted(by_file)}"
    return matches[0]


def test_corpus_has_at_least_twenty_kinds(corpus_run):
    corpus, report, *_ = corpus_run
    assert len(corpus) >= 20
    assert len(report.results) == len(corpus), "every file gets a line in the summary"


@pytest.mark.parametrize("name", [c.name for c in cases(0, None)])
def test_each_case_gets_its_intended_score(corpus_run, name):
    corpus, report, by_file, *_ = corpus_run
    case = next(c for c in corpus if c.name == name)
    if case.sandbox and not SANDBOX:
        pytest.skip("needs bubblewrap (apt-get install bubblewrap)")
    r = _result(by_file, case)
    assert r.score == case.score, f"{name}: got {r.score}, want {case.score} ({r.message})"
    assert r.status == case.status, f"{name}: status {r.status} ({r.message})"
    assert case.note in r.message, f"{name}: summary line {r.message!r} lacks {case.note!r}"
    assert (report.feedback_dir / f"{r.student_id}.html").exists() or r.student_id.startswith("?")


def test_no_connection_reached_the_host(corpus_run):
    *_, hits = corpus_run
    if not SANDBOX:
        pytest.skip("needs bubblewrap")
    assert hits == []


def test_gradebook_stays_consistent(corpus_run):
    corpus, report, by_file, grading, _ = corpus_run
    con = sqlite3.connect(grading / "gradebook.db")
    tables = {t for (t,) in con.execute("select name from sqlite_master where type='table'")}
    assert "pwned" not in tables
    assert con.execute("select count(*) from grade where manual_score = 999").fetchone()[0] == 0
    graded = {r.student_id for r in report.results if r.status == "graded"}
    in_db = {s for (s,) in con.execute("select student_id from submitted_assignment")}
    assert graded == in_db
    # every submitted notebook has one grade row per graded cell (no duplicates, no orphans)
    n_cells = con.execute("select count(*) from grade_cells").fetchone()[0]
    for (nb_id, count) in con.execute("select notebook_id, count(*) from grade group by notebook_id"):
        assert count == n_cells
    orphans = con.execute("select count(*) from grade where notebook_id not in "
                          "(select id from submitted_notebook)").fetchone()[0]
    assert orphans == 0


def test_huge_output_is_truncated(corpus_run):
    *_, grading, _ = corpus_run
    nb = grading / "autograded" / "huge_output" / "attention" / "attention.ipynb"
    assert nb.stat().st_size < 2_000_000
