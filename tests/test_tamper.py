"""Every kind of bad submission in the corpus gets its intended score and a clear line, the
batch always finishes, nothing leaks, nothing outside the sandbox is read, written or reached,
and the gradebook stays consistent."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import sqlite3
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from autograder.isolation import sandbox
from autograder.pipeline.run import grade
from conftest import ROOT, assert_gradebook_consistent, read_nb, secret_lines
from tamper_corpus import BUDGET_REASONS, SOURCE, cases

SANDBOX = sandbox.bwrap_works()
# what one test may take (autograder.judge.budget), small enough that the budget cases stop in seconds;
# an honest test of this notebook takes well under a second and a few kB
BUDGET = dict(test_timeout=10, test_mb=256, test_memory_mb=1024)
# 5 s per cell: three cases hang on purpose (the honest cells of this notebook take well under 1 s);
# two of them do not stop when interrupted and are killed once the grace is over (the default 10 s
# would add 14 s of waiting to the corpus)
LIMITS = dict(cell_timeout=5, interrupt_grace=3)


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
    # the run's system temporary folder is a private one, to see what it leaves behind
    private = Path(tempfile.mkdtemp(prefix="ct", dir="/tmp"))
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = str(private), None
    try:
        report = grade("attention", subs, out_dir=out / "reports", grading_dir=grading,
                       settings=dict(workers=2, **LIMITS, **BUDGET))
    finally:
        if saved is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = saved
        tempfile.tempdir = None
    left = {"files": sorted(str(p.relative_to(private)) for p in private.rglob("*")),
            "processes": _processes_naming(str(private))}
    shutil.rmtree(private, ignore_errors=True)
    by_file = {r.file: r for r in report.results}
    return corpus, report, by_file, grading, out, left


def _processes_naming(text: str) -> list[str]:
    """Command lines of running processes that name ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(cmd[:2000])
    return found


def _result(by_file, case):
    matches = [r for f, r in by_file.items() if f.split(".")[0] == case.name
               or (case.name == "wrong_file_name" and f.startswith("Copy of"))
               or (case.name == "not_a_notebook" and f == "notebook.docx")]
    assert len(matches) == 1, f"{case.name}: {sorted(by_file)}"
    return matches[0]


def test_corpus_covers_every_kind(corpus_run):
    corpus, report, *_ = corpus_run
    assert len(corpus) >= 52
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
    *_, grading, out, _ = corpus_run
    if not SANDBOX:
        pytest.skip("needs bubblewrap")
    assert Path(places["sentinel"]).read_text() == "the instructor's file\n"
    links = [str(p) for p in list(grading.rglob("*")) + list(out.rglob("*")) if p.is_symlink()]
    assert links == [], links


def test_no_file_for_students_shows_a_hidden_test(corpus_run):
    """Feedback pages, the feedback folders and the reports: no line of a hidden test (and no
    copy of a solutions notebook) anywhere, whatever the submissions tried."""
    *_, grading, out, _ = corpus_run
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
    corpus, report, by_file, grading, _, _ = corpus_run
    con = sqlite3.connect(grading / "gradebook.db")
    tables = {t for (t,) in con.execute("select name from sqlite_master where type='table'")}
    assert "pwned" not in tables
    assert con.execute("select count(*) from grade where manual_score = 999").fetchone()[0] == 0
    graded = {r.student_id for r in report.results if r.status == "graded"}
    assert_gradebook_consistent(f"sqlite:///{grading / 'gradebook.db'}", "attention", graded)


def test_a_test_that_pulls_waits_or_computes_too_much_fails_with_its_reason(corpus_run):
    """A module whose parameters are 40 tensors of 64 MiB, or come one every 4 s, and an output that
    the test's own reference broadcasts to gigabytes: the tests they stop fail, each with the limit
    it reached, within the budget; the notebook's other tests grade as usual."""
    *_, grading, _, _ = corpus_run
    for sid, reasons in BUDGET_REASONS.items():
        nb = read_nb(grading / "autograded" / sid / "attention" / "attention.ipynb")
        said = {c.metadata["nbgrader"]["grade_id"]: [o.get("evalue", "") for o in c.outputs if o.output_type == "error"]
                for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}
        for gid, reason in reasons.items():
            assert said[gid] and said[gid][0].startswith(reason), f"{sid} {gid}: {said[gid]}"


def test_huge_outputs_are_truncated(corpus_run):
    *_, grading, _, _ = corpus_run
    for sid in ("huge_output", "html_flood"):
        nb = grading / "autograded" / sid / "attention" / "attention.ipynb"
        assert nb.stat().st_size < 10_000_000, sid
        page = grading / "feedback" / sid / "attention" / "attention.html"
        assert page.stat().st_size < 12_000_000, sid


# ------------------------------------------------------------------------------ the edges

def test_nothing_of_the_kernels_is_left_on_the_host(corpus_run):
    """Connection folders, zygotes, kernels' scratch: nothing a kernel or a worker made is left
    in the system's temporary folder, and no process of the run keeps running.  (The kernel
    that tried to fill its connection folder was refused four times: fills_host_disk.)"""
    *_, grading, _, left = corpus_run
    assert left == {"files": [], "processes": []}, left
    nb = read_nb(grading / "autograded" / "fills_host_disk" / "attention" / "attention.ipynb")
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if SANDBOX:
        assert "refused 4 of 4" in printed, printed[:500]


def test_a_function_that_zeroes_the_tests_inputs_gains_nothing(corpus_run):
    """The judge's tensors are its own: code that zeroes its arguments in place scores exactly
    what the same code without the zeroing scores."""
    corpus, _, by_file, *_ = corpus_run
    scores = {c.name: _result(by_file, c).score for c in corpus if "zeroing" in c.name or "zeroes" in c.name}
    assert len(scores) == 2 and len(set(scores.values())) == 1, scores


def test_feedback_pages_run_no_student_script(corpus_run, tmp_path):
    """The feedback pages of notebooks whose markdown and outputs carry scripts, event handlers,
    JavaScript, SVG and markdown outputs, opened in Chromium with the network off: no script
    of the student's runs, nothing is fetched, the page says so in its Content-Security-Policy,
    and the student's math and the assignment's formulas are typeset (MathML)."""
    from test_book_browser import CHROMIUM, DevTools, _isolation

    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed")
    *_, out, _ = corpus_run
    prefix, _how = _isolation()
    (tmp_path / "profile").mkdir()
    tools = DevTools(prefix, tmp_path / "profile")
    try:
        target = next(t for t in tools.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        session = tools.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network"):
            tools.send(f"{domain}.enable", session=session)
        for name in ("markdown_xss", "output_xss"):
            page = out / "reports" / "feedback" / f"{name}.html"
            assert "Content-Security-Policy" in page.read_text()
            tools.events.clear()
            tools.send("Page.navigate", {"url": page.as_uri()}, session=session)
            tools.wait_for("Page.loadEventFired")
            seen = json.loads(tools.send("Runtime.evaluate", {"expression": """JSON.stringify({
                pwned: document.body.getAttribute('data-pwned'),
                maths: Array.from(document.querySelectorAll('math')).filter(m => m.getBoundingClientRect().width > 0).length,
                scripts: document.querySelectorAll('script').length,
                handlers: Array.from(document.querySelectorAll('*')).filter(e => Array.from(e.attributes).some(a => a.name.startsWith('on'))).length,
                })""", "returnByValue": True}, session=session)["result"]["value"])
            shot = tools.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
            (out / f"feedback-{name}.png").write_bytes(__import__("base64").b64decode(shot))
            requests = [e["params"]["request"]["url"] for e in tools.events if e.get("method") == "Network.requestWillBeSent"]
            dialogs = [e for e in tools.events if e.get("method") == "Page.javascriptDialogOpening"]
            assert seen["pwned"] is None and not dialogs, f"{name}: a student's script ran ({seen['pwned']})"
            assert seen["scripts"] == 0 and seen["handlers"] == 0, f"{name}: {seen}"
            assert not [u for u in requests if not u.startswith(("file://", "data:"))], f"{name}: {requests[:5]}"
            assert seen["maths"] >= 3, f"{name}: {seen['maths']} typeset formulas"
    finally:
        tools.close()
