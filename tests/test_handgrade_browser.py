"""Two tabs of a real browser on the hand-grading server (issue 34: a stale form never writes).

project_aether is graded without kernels (``fakebackend.FakeBackend``: the written answers wait
for a grader all the same).  Headless Debian ``chromium``, driven over the DevTools protocol
(``test_book_browser.DevTools``), opens the same question in two tabs; tab 1 saves points and a
comment, then tab 2, still showing the page as it was, saves other points: the page it gets back
says why nothing was saved, naming the grade version it showed and the one in the gradebook now,
and the gradebook keeps tab 1's grade.  Then a form loaded before a regrade of a changed answer
and saved after it is refused, naming both answer versions.  A screenshot of the refusal at
1280 px is kept in ``_build/handgrade/`` for a person to look at.
"""
from __future__ import annotations

import json
import re
import shutil
import threading
import time

import nbformat
import pytest

import fakebackend
from autograder.cli import main as cli
from conftest import ROOT
from test_book_browser import CHROMIUM, TIMEOUT, WIDTH, DevTools

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (scripts/env.sh installs it as root with apt-get): "
           "the browser test of the hand-grading page is skipped")

AETHER = ROOT / "exercises" / "project_aether" / "project_aether.ipynb"
SHOTS = ROOT / "_build" / "handgrade"


def _answers(**answers) -> nbformat.NotebookNode:
    """project_aether as released, with these written answers (grade id -> text)."""
    nb = nbformat.read(AETHER, as_version=4)
    for cell in nb.cells:
        text = answers.get(cell.metadata.get("nbgrader", {}).get("grade_id"))
        if text is not None:
            cell.source = text
    return nb


def _grade(folder, grading, nb) -> None:
    folder.mkdir()
    nbformat.write(nb, folder / "s1_project_aether.ipynb")
    assert cli(["grade", "project_aether", str(folder), "--grading-dir", str(grading)]) == 0


def _grade_of(grading, gid: str) -> tuple:
    """s1's hand grade of ``gid`` in the gradebook: (points, comment)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{grading / 'gradebook.db'}") as gb:
        grade = gb.find_grade(gid, "project_aether", "project_aether", "s1")
        comment = gb.find_comment(gid, "project_aether", "project_aether", "s1")
        return grade.manual_score, comment.manual_comment


class Tab:
    """One tab of the browser: a page target with a session of its own."""

    def __init__(self, tools: DevTools, url: str):
        self.tools = tools
        target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        tools.send("Page.enable", session=self.session)
        tools.send("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": 900, "deviceScaleFactor": 1,
                                                          "mobile": False}, session=self.session)
        self.go(url)

    def _loaded(self) -> None:
        """Wait for this tab's next load event (a redirect after a post ends in one); the other
        tab's events stay queued for it."""
        while True:
            for i, event in enumerate(self.tools.events):
                if event.get("method") == "Page.loadEventFired" and event.get("sessionId") == self.session:
                    del self.tools.events[i]
                    return
            self.tools.events.append(self.tools._read(TIMEOUT))

    def _forget_loads(self) -> None:
        self.tools.events[:] = [e for e in self.tools.events if not (
            e.get("method") == "Page.loadEventFired" and e.get("sessionId") == self.session)]

    def go(self, url: str) -> None:
        self._forget_loads()
        self.tools.send("Page.navigate", {"url": url}, session=self.session)
        self._loaded()

    def js(self, expression: str):
        """``expression`` evaluated in the page (DevTools is not bound by the page's CSP)."""
        reply = self.tools.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                session=self.session)
        return reply["result"].get("value")

    def fill_and_save(self, sid: str, points: str, comment: str | None = None) -> str:
        """Type points (and a comment) into ``sid``'s answer and press Save; the message shown."""
        set_value = "e.value = {v}; e.dispatchEvent(new Event('input', {{bubbles: true}}));"
        script = (f"(() => {{ let e = document.querySelector('[name=\"points__{sid}\"]'); "
                  + set_value.format(v=json.dumps(points))
                  + ("" if comment is None else f" e = document.querySelector('[name=\"comment__{sid}\"]'); "
                     + set_value.format(v=json.dumps(comment)))
                  + " document.querySelector('button[type=submit]').click(); })()")
        self._forget_loads()
        self.js(script)
        self._loaded()
        return self.message()

    def message(self) -> str:
        found = self.js("(document.querySelector('p.problem, p.graded') || {innerText: ''}).innerText")
        return found or "(no message; the page: " + (self.js("location.href + ' ' + document.body.innerText") or "")[:300] + ")"

    def screenshot(self, name: str) -> bytes:
        import base64

        png = base64.b64decode(self.tools.send("Page.captureScreenshot", {"format": "png"}, session=self.session)["data"])
        SHOTS.mkdir(parents=True, exist_ok=True)
        (SHOTS / name).write_bytes(png)
        return png


@pytest.fixture
def handgrading(tmp_path, monkeypatch):
    """project_aether graded once for s1 (written answers q1 and q3), its hand-grading server
    running, and a headless chromium (no network namespace: it must reach the server)."""
    from autograder.records.handgrade import HandGrading, make_server

    fakebackend.install(monkeypatch)
    monkeypatch.delenv("COURSE_FAULT", raising=False)
    grading = tmp_path / "grading"
    _grade(tmp_path / "first", grading, _answers(q1_answer="Encoders read the whole sentence at once.",
                                                 q3_answer="Attention weighs every position."))
    server = make_server(HandGrading("project_aether", grading, ROOT), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "chromium-profile").mkdir()
    tools = DevTools([], tmp_path / "chromium-profile")
    try:
        yield {"tmp": tmp_path, "grading": grading, "server": server, "tools": tools,
               "base": f"http://127.0.0.1:{server.server_address[1]}"}
    finally:
        tools.close()
        server.shutdown()
        server.server_close()


def _versions(text: str, what: str) -> tuple[str, str]:
    found = re.search(rf"{what} version (\w+) on the page, (\w+) now", text)
    assert found, f"no {what} versions in the message: {text!r}"
    return found[1], found[2]


def test_a_stale_tab_never_writes_over_a_newer_grade(handgrading):
    from autograder.records.handgrade import grade_version

    tools, base, grading = handgrading["tools"], handgrading["base"], handgrading["grading"]
    one = Tab(tools, handgrading["server"].url)  # the secret moves into the browser's cookie
    one.go(f"{base}/cell/q3_answer")
    two = Tab(tools, f"{base}/cell/q3_answer")
    assert "Attention weighs every position." in one.js("document.body.innerText")
    shown = two.js("document.querySelector('[name=\"version__s1\"]').value")

    said = one.fill_and_save("s1", "3.5", "Clear, but say what the weights are computed from.")
    assert said.startswith("saved points for 1 answer") and "not saved" not in said, said
    assert _grade_of(grading, "q3_answer") == (3.5, "Clear, but say what the weights are computed from.")

    said = two.fill_and_save("s1", "1", "Too short.")  # tab 2 still shows the page of before
    assert "your 1 not saved: another grader saved 3.5 points since this page was loaded" in said, said
    on_page, now = _versions(said, "grade")
    assert on_page == shown.partition(".")[2] != now
    assert now == grade_version(3.5, "Clear, but say what the weights are computed from.")
    assert two.js("getComputedStyle(document.querySelector('p.problem')).display") != "none"
    png = two.screenshot("stale-grade-refused-1280.png")
    assert png.startswith(b"\x89PNG")
    assert _grade_of(grading, "q3_answer") == (3.5, "Clear, but say what the weights are computed from.")

    # reloaded, tab 2 shows tab 1's grade
    two.go(f"{base}/cell/q3_answer")
    assert two.js("document.querySelector('[name=\"points__s1\"]').value") == "3.5"


def test_a_form_loaded_before_a_regrade_of_a_changed_answer_is_refused(handgrading):
    tools, base, grading = handgrading["tools"], handgrading["base"], handgrading["grading"]
    tab = Tab(tools, handgrading["server"].url)
    tab.go(f"{base}/cell/q1_answer")
    shown = tab.js("document.querySelector('[name=\"version__s1\"]').value")
    _grade(handgrading["tmp"] / "again", grading,  # s1 resubmits with q1 rewritten
           _answers(q1_answer="Decoders write one token at a time.", q3_answer="Attention weighs every position."))
    said = tab.fill_and_save("s1", "2", "Good.")
    assert "your 2 not saved: the answer changed since this page was loaded" in said, said
    on_page, now = _versions(said, "answer")
    assert on_page == shown.partition(".")[0] != now
    tab.screenshot("changed-answer-refused-1280.png")
    assert _grade_of(grading, "q1_answer") == (None, None)
    tab.go(f"{base}/cell/q1_answer")  # reloaded: the new answer, no grade
    assert "Decoders write one token at a time." in tab.js("document.body.innerText")
