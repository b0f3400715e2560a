"""Hand grades belong to the answer they were given for (issue 34, items 3 and 4).

project_aether is graded once (s1 all right, s2 as released) and s1's written answers are
hand-graded through the server's own pages.  Then: two tabs, one saving after the other has
saved newer points, is refused with both grades shown; s1 resubmits with answer q1 rewritten
and answer q3 as it was (bar trailing spaces): the run flags q1 in its summary and history,
q1 awaits a grader again (pending in grades.csv, not the old points, and marked on the
hand-grading page), q3 keeps its points and comment; a form loaded before the regrade and saved
after it is refused (answer version shown), and nothing of it reaches the gradebook.  On SQLite
and on PostgreSQL (tests/pg.py; those cases are in the ``scale`` tier).
"""
from __future__ import annotations

import csv
import html
import http.cookiejar
import re
import threading
import urllib.parse
import urllib.request

import nbformat
import pytest

from autograder.cli import main as cli
from autograder.pipeline.run import grade
from conftest import ROOT, filled_exercise
from pg import ON_BOTH, db, postgres_server  # noqa: F401 - fixtures

AETHER = ROOT / "exercises" / "project_aether" / "project_aether.ipynb"


def _rows(path):
    with open(path, newline="") as fh:
        return {r["student_id"]: r for r in csv.DictReader(fh)}


def _set_answer(nb, grade_id, text):
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = text
    return nb


class Tab:
    """A browser tab on the hand-grading server: loads a question's page and posts its form."""

    def __init__(self, server):
        self.base = f"http://127.0.0.1:{server.server_address[1]}"
        self.browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self.browser.addheaders = [("Origin", self.base)]
        self.browser.open(server.url)

    def load(self, gid: str) -> dict:
        """The form of question ``gid`` as the page fills it in."""
        page = self.browser.open(f"{self.base}/cell/{gid}").read().decode()
        self.page = page
        form = {}
        for name, value in re.findall(r"<input type='(?:hidden|number)'[^>]* name='([^']+)' value='([^']*)'", page):
            form[name] = html.unescape(value)
        for name, value in re.findall(r"<textarea name='([^']+)'>(.*?)</textarea>", page, re.S):
            form[name] = html.unescape(value)
        return form

    def save(self, gid: str, form: dict, **changes) -> str:
        data = urllib.parse.urlencode({**form, **changes}).encode()
        reply = self.browser.open(urllib.request.Request(f"{self.base}/cell/{gid}", data=data))
        return urllib.parse.unquote(reply.url)


@pytest.fixture(scope="module")
def aether(tmp_path_factory, db):
    """Graded with kernels, the record on SQLite or (``ON_BOTH``) on PostgreSQL.  (Not with the
    fake backend: a regrade of its making drops the comment of an unchanged hand-graded answer,
    which nbgrader's own regrade keeps.)"""
    from autograder.records.handgrade import HandGrading, make_server

    tmp = tmp_path_factory.mktemp("versions")
    subs = tmp / "subs"
    subs.mkdir()
    first = filled_exercise("project_aether")
    nbformat.write(first, subs / "s1_project_aether.ipynb")
    (subs / "s2_project_aether.ipynb").write_bytes(AETHER.read_bytes())
    grading, out = tmp / "grading", tmp / "out"
    grade("project_aether", subs, out_dir=out, grading_dir=grading, workers=1,
          db_url=db.args()[1] if db.postgresql else None)
    server = make_server(HandGrading("project_aether", grading, ROOT), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {"tmp": tmp, "grading": grading, "out": out, "server": server, "first": first}
    finally:
        server.shutdown()
        server.server_close()


@ON_BOTH
def test_a_second_tab_never_overwrites_newer_points(aether):
    server = aether["server"]
    a, b = Tab(server), Tab(server)
    form_a, form_b = a.load("q3_answer"), b.load("q3_answer")
    assert form_a["version__s1"] and form_a["version__s1"] == form_b["version__s1"]
    assert "saved points for 1 answer" in b.save("q3_answer", form_b, points__s1="3.5", comment__s1="good on q3")
    said = a.save("q3_answer", form_a, points__s1="1", comment__s1="weak")
    assert "saved points for 0 answers" in said and "your 1 not saved" in said
    assert "another grader saved 3.5 points" in said and "grade version" in said
    # reloaded, the same tab saves (and a form left as shown writes nothing and is no problem)
    form = a.load("q3_answer")
    assert "graded: 3.5" in a.page and form["points__s1"] == "3.5"
    assert "saved points for 0 answers" in a.save("q3_answer", form) and "not saved" not in a.save("q3_answer", form)
    assert "saved points for 1 answer" in a.save("q1_answer", a.load("q1_answer"), points__s1="2",
                                                 comment__s1="both parts")


@ON_BOTH
def test_a_changed_written_answer_awaits_a_grader_again(aether, capsys):
    from autograder.records.handgrade import HandGrading

    server, grading, out = aether["server"], aether["grading"], aether["out"]
    hg = HandGrading("project_aether", grading, ROOT)  # the hand grades of the test above, whatever it did
    assert hg.save("q1_answer", {"s1": ("2", "both parts")}) == []
    assert hg.save("q3_answer", {"s1": ("3.5", "good on q3")}) == []
    stale = Tab(server)
    stale_form = stale.load("q1_answer")  # loaded before the regrade, saved after it
    assert stale_form["points__s1"] == "2"
    assert cli(["export", "project_aether", "--grading-dir", str(grading), "--out", str(out)]) == 0
    before = _rows(out / "grades.csv")["s1"]
    assert (before["manual"], before["pending"]) == ("5.5", "2")  # q1 2 + q3 3.5; q8 (2) still waits
    again = aether["tmp"] / "again"
    again.mkdir()
    nb = _set_answer(aether["first"], "q1_answer", "A completely different answer about encoders.")
    q3 = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q3_answer")
    q3.source = q3.source.replace("\n", "  \r\n") + "\n\n"  # the same answer, as another editor saved it
    nbformat.write(nb, again / "s1_project_aether.ipynb")
    report = grade("project_aether", again, out_dir=out, grading_dir=grading, workers=1)
    table = report.table()
    assert "written answer q1_answer changed since it was hand-graded (2 points before)" in table
    assert "q3_answer" not in table and "q1_answer answered anew" in table  # listed with the grades it changed
    row = _rows(out / "grades.csv")["s1"]
    assert (row["manual"], row["pending"]) == ("3.5", "4")  # q3 kept; q1 (2) and q8 (2) pending
    assert report.by_student()["s1"].pending == 4
    assert cli(["history", "project_aether", "--grading-dir", str(grading)]) == 0
    assert "q1_answer answered anew: awaiting a grader" in capsys.readouterr().out
    said = stale.save("q1_answer", stale_form, points__s1="1")
    assert "your 1 not saved: the answer changed since this page was loaded" in said and "answer version" in said
    fresh = Tab(server)
    form = fresh.load("q1_answer")
    assert "answered anew since it was hand-graded (2 points before)" in fresh.page
    assert "A completely different answer" in fresh.page and form["points__s1"] == ""
    page = fresh.load("q3_answer") and fresh.page
    assert "graded: 3.5" in page and "good on q3" in page
    assert cli(["export", "project_aether", "--grading-dir", str(grading), "--out", str(out)]) == 0
    assert _rows(out / "grades.csv")["s1"]["pending"] == "4"  # the refused save wrote nothing
