"""Every kind of bad submission in the corpus gets its intended score and a clear line, the
batch always finishes, nothing leaks, nothing outside the sandbox is read, written or reached,
and the gradebook stays consistent."""
from __future__ import annotations

import html
import os
import re
import shutil
import socket
import sqlite3
import threading
import uuid
from pathlib import Path

import pytest

from autograder import sandbox
from autograder.grade import grade
from conftest import ROOT, assert_gradebook_consistent, read_nb, secret_lines
from tamper_corpus import SOURCE, cases

SANDBOX = sandbox.bwrap_works()


class _Listener:
    """A TCP server on loopback and a UNIX socket in /var/tmp that count connections."""

    def __init__(self):
        self.hits: list = []
        self.stop = threading.Event()
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        self.tcp.settimeout(0.3)
        base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path("/tmp")
        self.unix_path = str(base / f"course-tamper-{uuid.uuid4().hex[:8]}.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        self.unix.listen()
        self.unix.settimeout(0.3)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            for s in (self.tcp, self.unix):
                try:
                    conn, _ = s.accept()
                    self.hits.append(conn.recv(100))
                    conn.close()
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.tcp.close()
        self.unix.close()
        os.unlink(self.unix_path)


@pytest.fixture(scope="module")
def places():
    """What the corpus aims at: a file of the instructor in HOME, a UNIX socket, and a second
    clone of the course outside HOME and /tmp (next to this checkout)."""
    listener = _Listener()
    sentinel = Path.home() / f".course-tamper-sentinel-{uuid.uuid4().hex[:8]}"
    sentinel.write_text("the instructor's file\n")
    clone = ROOT.parent / f".course-second-clone-{uuid.uuid4().hex[:8]}"
    (clone / "solutions" / "attention").mkdir(parents=True)
    shutil.copy(SOURCE, clone / "solutions" / "attention" / "attention.ipynb")
    yield {"sentinel": str(sentinel), "socket": listener.unix_path,
           "clone": str(clone / "solutions" / "attention" / "attention.ipynb"), "listener": listener}
    listener.close()
    sentinel.unlink()
    shutil.rmtree(clone, ignore_errors=True)


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory, places):
    subs = tmp_path_factory.mktemp("corpus")
    out = tmp_path_factory.mktemp("corpus_out")
    grading = out / "grading"
    corpus = cases(places["listener"].tcp.getsockname()[1], grading, places)
    for case in corpus:
        case.write(subs)
    # 5 s per cell: three cases hang on purpose (the honest cells of this notebook take well under 1 s)
    report = grade("attention", subs, out_dir=out / "reports", grading_dir=grading, cell_timeout=5, workers=2)
    by_file = {r.file: r for r in report.results}
    return corpus, report, by_file, grading, out


def _result(by_file, case):
    matches = [r for f, r in by_file.items() if f.split(".")[0] == case.name
               or (case.name == "wrong_file_name" and f.startswith("Copy of"))
               or (case.name == "not_a_notebook" and f == "notebook.docx")]
    assert len(matches) == 1, f"{case.name}: {sorted(by_file)}"
    return matches[0]


def test_corpus_covers_every_kind(corpus_run):
    corpus, report, *_ = corpus_run
    assert len(corpus) >= 45
    assert len(report.results) == len(corpus), "every file gets a line in the summary"


@pytest.mark.parametrize("name", [c.name for c in cases(0, None)])
def test_each_case_gets_its_intended_score(corpus_run, name):
    corpus, report, by_file, *_ = corpus_run
    case = next(c for c in corpus if c.name == name)
    if case.sandbox and not SANDBOX:
        pytest.skip("needs bubblewrap (apt-get install bubblewrap)")
    r = _result(by_file, case)
    assert r.score == case.score, f"{name}: got {r.score}, want {case.score} ({r.message}; {r.tests})"
    assert r.status == case.status, f"{name}: status {r.status} ({r.message})"
    assert case.note in r.message, f"{name}: summary line {r.message!r} lacks {case.note!r}"
    if case.flagged:
        assert r.flags, f"{name}: the scan should point the instructor at it"
    assert (report.feedback_dir / f"{r.student_id}.html").exists() or r.student_id.startswith("?")


def test_no_full_marks_cheat_scores_anything(corpus_run):
    corpus, _, by_file, *_ = corpus_run
    cheats = [c for c in corpus if c.name.startswith("cheat_")]
    assert len(cheats) == 5
    assert {c.name: _result(by_file, c).score for c in cheats} == {c.name: 0 for c in cheats}


def test_no_connection_reached_the_host(corpus_run, places):
    if not SANDBOX:
        pytest.skip("needs bubblewrap")
    assert places["listener"].hits == []


def test_nothing_outside_the_sandbox_was_written(corpus_run, places):
    *_, grading, out = corpus_run
    if not SANDBOX:
        pytest.skip("needs bubblewrap")
    assert Path(places["sentinel"]).read_text() == "the instructor's file\n"
    links = [str(p) for p in list(grading.rglob("*")) + list(out.rglob("*")) if p.is_symlink()]
    assert links == [], links


def test_no_file_for_students_shows_a_hidden_test(corpus_run):
    """Feedback pages, the feedback folders and the reports: no line of a hidden test (and no
    copy of a solutions notebook) anywhere, whatever the submissions tried."""
    *_, grading, out = corpus_run
    if not SANDBOX:
        pytest.skip("needs bubblewrap: without it student code can read the instructor's files")
    hidden = set()
    for cell in read_nb(SOURCE).cells:
        for region in re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", cell.source, re.S):
            hidden |= {ln.strip() for ln in region.splitlines() if len(ln.strip()) >= 12}
    hidden &= secret_lines(read_nb(SOURCE))
    assert len(hidden) > 20
    files = [p for p in [*(out / "reports").rglob("*"), *(grading / "feedback").rglob("*")]
             if p.is_file() and p.suffix != ".png"]
    assert files
    for path in files:
        text = html.unescape(re.sub(r"<[^>]+>", "", path.read_text(errors="replace")))
        lines = {ln.strip() for ln in text.splitlines()}
        assert not hidden & lines, f"{path.name} shows hidden tests: {sorted(hidden & lines)[:3]}"
    assert {p.suffix for p in (grading / "feedback").rglob("*") if p.is_file()} <= {".html"}


def test_gradebook_stays_consistent(corpus_run):
    corpus, report, by_file, grading, _ = corpus_run
    con = sqlite3.connect(grading / "gradebook.db")
    tables = {t for (t,) in con.execute("select name from sqlite_master where type='table'")}
    assert "pwned" not in tables
    assert con.execute("select count(*) from grade where manual_score = 999").fetchone()[0] == 0
    graded = {r.student_id for r in report.results if r.status == "graded"}
    assert_gradebook_consistent(f"sqlite:///{grading / 'gradebook.db'}", "attention", graded)


def test_huge_outputs_are_truncated(corpus_run):
    *_, grading, _ = corpus_run
    for sid in ("huge_output", "html_flood"):
        nb = grading / "autograded" / sid / "attention" / "attention.ipynb"
        assert nb.stat().st_size < 10_000_000, sid
        page = grading / "feedback" / sid / "attention" / "attention.html"
        assert page.stat().st_size < 12_000_000, sid
