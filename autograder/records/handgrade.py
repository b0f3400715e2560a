"""Hand grading, question by question across the class.

    python -m autograder handgrade ASSIGNMENT [--port 8765]

serves, on this machine only (127.0.0.1), one page per hand-graded cell of the assignment:
the question and its mark scheme at the top, then every student's answer, each with a
points field and a comment box.  "Save" writes the points and comments into the nbgrader
gradebook (manual score and comment of that cell), so nbgrader's formgrader, the feedback
pages and the exports agree.  Then ``python -m autograder export ASSIGNMENT`` rebuilds
``grades.csv``, the LMS files and every feedback page with the hand grades.

Security model.  Any web page the instructor's browser opens can send requests to
127.0.0.1, and a name it controls can be rebound to 127.0.0.1 (DNS rebinding).  So the
server answers only requests whose ``Host`` is its own address and port (``127.0.0.1:PORT``
or ``localhost:PORT``), and only requests that carry the secret of this run: a random token
made at start, printed in the URL (``http://127.0.0.1:PORT/?token=...``) and then kept in an
HttpOnly, SameSite=Strict cookie, as Jupyter does.  A request that changes grades must also
come from the server's own pages (its ``Origin``, or without one its ``Referer``) and carry
the form token, which only pages served to the secret's holder contain.  Students' written
answers are shown as markdown rendered to HTML and cleaned by an allow-list sanitiser
(``nh3``), with their source beside it; every page is sent with a Content-Security-Policy that
allows no script at all, and no image from elsewhere.

Outputs as handed in.  Grading re-runs every notebook with the settings of ``course.yml`` (the
LLM lab: always the offline model), so the outputs in the graded notebook may not be the ones
a written answer talks about (a student who ran SmolLM2 or an API quotes those).  For the cells
``course.yml`` names under ``handed_in_outputs``, each answer shows the outputs of those cells
twice, side by side: "as handed in" (kept from the submitted file at intake, plain text,
bounded) and the grader's re-run.  Both are the student's text: escaped, bidi controls shown.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
from sqlalchemy.exc import SQLAlchemyError

from autograder.course.cells import Release, answer_version, answers_in
from autograder.course.model import load
from autograder.text.htmlsafe import markdown_to_html, page  # page(): bidi controls shown wherever they are
from autograder.text.outputs import output_text, read_handed_in

from .classbook import graded_cells
from .classrecord import RecordError, history
from .faults import fault
from .gradebook import db_url
from .writer import RecordBusy, writing

# Imports inside functions: nbgrader.api is imported where a grade is read or saved: building the pages does
# not load nbgrader.


def grade_version(points, comment) -> str:
    """The version of a hand grade: a checksum of its points and comment (12 hex digits)."""
    text = f"{'' if points is None else float(points)!r}\x1f{(comment or '').strip()}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


@dataclass
class Answer:
    student_id: str
    text: str              # the cell's source as the student left it
    output: str            # text output of a code cell (for code read by a person)
    answered: bool         # False: the cell is as released (it scored 0 automatically)
    points: float | None   # the manual score in the gradebook, if any
    comment: str
    answer_version: str = ""   # a checksum of the answer as shown (course.cells.answer_version)
    grade_version: str = ""    # a checksum of the grade as shown (its points and comment)
    note: str = ""             # e.g. the answer changed since it was hand-graded
    # (cell grade id, its outputs as handed in or None when none were kept, the grader's re-run)
    outputs: list = field(default_factory=list)


@dataclass
class HandGradedCell:
    grade_id: str
    question: str
    label: str
    max_points: float
    prompt: str            # the question text (the released markdown cell before the answer)
    mark_scheme: str       # from solutions/: what a full-credit answer contains
    answers: list[Answer] = field(default_factory=list)
    cell_type: str = "markdown"   # "markdown": a written answer; "code": code a person reads
    shown: tuple = ()             # the cells whose outputs as handed in its grader sees (course.yml)

    @property
    def done(self) -> int:
        return sum(1 for a in self.answers if a.points is not None or not a.answered)


class HandGrading:
    """The hand-graded cells of one assignment, read from the grading folder and the gradebook."""

    def __init__(self, assignment: str, grading: Path, root: Path):
        self.assignment, self.grading, self.root = assignment, Path(grading), Path(root)
        try:
            release = Release.read(self.grading / "release", assignment)
        except FileNotFoundError:
            raise FileNotFoundError(f"{assignment} has not been graded in {self.grading} yet (no release there)") from None
        self.notebook, self.released = release.notebook, release.nb
        self.source = nbformat.read(self.root / "solutions" / assignment / self.notebook, as_version=4)
        try:
            self.spec = load(self.root).assignment(assignment)
        except (KeyError, ValueError, OSError):
            self.spec = None

    def cells(self) -> list[HandGradedCell]:
        from nbgrader.api import Gradebook, MissingEntry

        by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): (i, c) for i, c in enumerate(self.released.cells)}
        schemes = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in self.source.cells}
        out = []
        for info in graded_cells(self.released):
            if info.kind != "manual":
                continue
            index, cell = by_id[info.grade_id]
            prompt = next((c.source for c in reversed(self.released.cells[:index]) if c.cell_type == "markdown"), "")
            shown = self.spec.shown_outputs(info.grade_id) if self.spec is not None else ()
            out.append(HandGradedCell(info.grade_id, info.question, info.label, info.points, prompt,
                                      schemes.get(info.grade_id, ""), cell_type=cell.cell_type, shown=shown))
        again = self._answered_anew()
        with Gradebook(db_url(self.grading)) as gb:
            for sub in gb.assignment_submissions(self.assignment):
                sid = sub.student.id
                path = self.grading / "autograded" / sid / self.assignment / self.notebook
                try:
                    nb = nbformat.read(path, as_version=4)
                except (OSError, ValueError):
                    continue
                cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
                handed_in = read_handed_in(path.parent) if any(hc.shown for hc in out) else None
                for hc in out:
                    cell = cells.get(hc.grade_id)
                    try:
                        grade = gb.find_grade(hc.grade_id, self.notebook[:-6], self.assignment, sid)
                        comment = gb.find_comment(hc.grade_id, self.notebook[:-6], self.assignment, sid)
                    except MissingEntry:
                        continue
                    answered = grade.auto_score is None or grade.manual_score is not None
                    output = "".join(o.get("text", "") for o in (cell.get("outputs", []) if cell else [])
                                     if o.get("output_type") == "stream")
                    text = cell.source if cell is not None else ""
                    before = again.get((sid, hc.grade_id))
                    note = (f"answered anew since it was hand-graded ({before:g} points before)"
                            if before is not None and grade.manual_score is None else "")
                    runs = [(gid, None if handed_in is None else handed_in.get(gid, ""),
                             output_text(cells[gid].get("outputs")) if gid in cells else "") for gid in hc.shown]
                    hc.answers.append(Answer(sid, text, output[-5000:], answered, grade.manual_score,
                                             comment.manual_comment or "", answer_version(text),
                                             grade_version(grade.manual_score, comment.manual_comment), note,
                                             runs))
        for hc in out:
            hc.answers.sort(key=lambda a: (not a.answered, a.student_id))
        return out

    def _answered_anew(self) -> dict:
        """(student, grade_id) -> the points of a hand grade a regrade left behind because the
        answer changed (the history's latest word on it)."""
        out: dict = {}
        try:
            runs = history(db_url(self.grading), self.assignment)
        except RecordError:
            return out
        for run in runs:
            if run.data.get("undone_by") or run.kind == "undo":
                continue
            for sid in run.data.get("students", []):  # a later run of theirs speaks anew
                for key in [k for k in out if k[0] == sid]:
                    del out[key]
            for sid, gid, points in run.data.get("rehand", []):
                out[(sid, gid)] = float(points)
        return out

    def save(self, grade_id: str, entries: dict[str, tuple[str, str]], versions: dict | None = None) -> list[str]:
        """Write points and comments (student id -> (points text, comment)); blank points leave
        a grade as it is.  ``versions`` (student id -> (answer version, grade version, points
        and comment as the page showed them), from the page's form): an entry left as shown
        is not written, and one whose answer or grade changed since the page was made is
        refused (a regrade's new answer, another grader's newer points).  Returns one line per
        problem (nothing is written for that student); ``self.scored`` then holds the students
        whose points were written.  Saving holds the assignment's writer lock; while another
        command holds it nothing is saved (one line naming it)."""
        self.scored: list[str] = []
        try:
            with writing(db_url(self.grading), self.assignment, f"handgrade save {self.assignment}"):
                return self._save(grade_id, entries, versions or {})
        except RecordBusy as exc:
            return [f"nothing saved: {exc}".replace("or with --wait to wait for it", "then save again")]
        except (OSError, SQLAlchemyError) as exc:  # a full disk: the transaction rolled back, whole
            self.scored = []
            why = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0])
            return [f"nothing saved ({why}); every grade of this page is as it was: free some space and save again"]

    def _save(self, grade_id: str, entries: dict, versions: dict) -> list[str]:
        from nbgrader.api import Gradebook, MissingEntry

        info = {c.grade_id: c for c in graded_cells(self.released) if c.kind == "manual"}.get(grade_id)
        if info is None:
            return [f"{grade_id} is not a hand-graded cell of {self.assignment}"]
        problems: list[str] = []
        with Gradebook(db_url(self.grading)) as gb:
            for sid, (points, text) in entries.items():
                try:
                    grade = gb.find_grade(grade_id, self.notebook[:-6], self.assignment, sid)
                    comment = gb.find_comment(grade_id, self.notebook[:-6], self.assignment, sid)
                except MissingEntry:
                    problems.append(f"{sid}: no such submission")
                    continue
                if sid in versions:
                    answer_v, grade_v, shown_points, shown_comment = versions[sid]
                    if (points.strip(), text.strip()) == (shown_points.strip(), shown_comment.strip()):
                        continue  # left as the page showed it: nothing to write
                    yours = f"your {points.strip() or 'comment'}"
                    now_answer = self._answer_version(sid, grade_id)
                    if now_answer != answer_v:
                        problems.append(f"{sid}: {yours} not saved: the answer changed since this page was loaded "
                                        f"(a resubmission was graded; answer version {answer_v} on the page, "
                                        f"{now_answer} now); reload the page and grade the new answer")
                        continue
                    now_grade = grade_version(grade.manual_score, comment.manual_comment)
                    if now_grade != grade_v:
                        theirs = "no points" if grade.manual_score is None else f"{grade.manual_score:g} points"
                        problems.append(f"{sid}: {yours} not saved: another grader saved {theirs} since this page "
                                        f"was loaded (grade version {grade_v} on the page, {now_grade} now); "
                                        "reload the page to see them")
                        continue
                points = points.strip()
                if points:
                    try:
                        value = float(points)
                    except ValueError:
                        problems.append(f"{sid}: {points!r} is not a number")
                        continue
                    if not 0 <= value <= info.points:
                        problems.append(f"{sid}: {value:g} is outside 0..{info.points:g}")
                        continue
                    grade.manual_score = value
                    grade.needs_manual_grade = False
                    self.scored.append(sid)
                comment.manual_comment = text.strip() or None
                fault(f"save {sid}")
            # one transaction for the whole page: a kill or a full disk leaves every grade of it
            # as it was, or every one saved (a save writes no page: export renders them, staged)
            fault("save commit")
            gb.db.commit()
        return problems

    def _answer_version(self, sid: str, grade_id: str) -> str:
        """The version of ``sid``'s answer to ``grade_id`` as graded now (their graded notebook)."""
        found = answers_in(self.grading / "autograded" / sid / self.assignment / self.notebook, [grade_id])
        return answer_version((found or {}).get(grade_id, ""))


# ----------------------------------------------------------------------------- pages

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 1.5rem auto; padding: 0 1rem; color: #222; }
.scheme { background: #f4f8fb; border-left: 4px solid #4c72b0; padding: 0.5rem 1rem; }
.answer { border: 1px solid #ccc; border-radius: 4px; padding: 0.6rem 0.8rem; margin: 0.8rem 0; }
.answer pre { white-space: pre-wrap; background: #fafafa; padding: 0.5rem; margin: 0.3rem 0; }
.answer.blank { opacity: 0.6; }
.written { background: #fff; padding: 0 0.5rem; } .written img { max-width: 100%; }
details summary { color: #666; font-size: small; cursor: pointer; }
.graded { color: #3c763d; } .todo { color: #8a6d3b; } .problem { color: #a94442; }
textarea { width: 100%; height: 3.5em; }
input[type=number] { width: 6em; }
table td { padding: 0.2rem 0.8rem 0.2rem 0; }
.runs { display: grid; grid-template-columns: 1fr 1fr; gap: 0.6rem; margin: 0.4rem 0; }
.runs > p { grid-column: 1 / -1; margin: 0.4rem 0 0; }
.runs pre { max-height: 24rem; overflow: auto; }
.handed-in { border-left: 4px solid #8a6d3b; padding-left: 0.4rem; }
.rerun { border-left: 4px solid #4c72b0; padding-left: 0.4rem; }
.anchor-link { display: none; }  /* the heading anchors of the rendered question: no page of anchors here */
"""


# every page: no script of any kind, styles only this page's own block, images only from here
CSP = ("default-src 'none'; style-src 'sha256-" + base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
       + "'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


def _page(title: str, body: str) -> bytes:
    return page(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<style>{STYLE}</style></head><body>{body}</body></html>").encode()


def _markdown(text: str) -> str:
    """Markdown as safe HTML with its math as MathML (``autograder.text.htmlsafe``: no script, no
    event handler, no ``javascript:`` link): a student's answer, or the question and mark scheme."""
    return markdown_to_html(text)


def index_page(hg: HandGrading, cells: list[HandGradedCell]) -> bytes:
    rows = "".join(
        f"<tr><td><a href='/cell/{urllib.parse.quote(c.grade_id)}'>{html.escape(c.label)}</a></td>"
        f"<td>{c.max_points:g} points</td><td class='{'graded' if c.done == len(c.answers) else 'todo'}'>"
        f"{c.done} of {len(c.answers)} graded</td></tr>" for c in cells)
    body = (f"<h1>{html.escape(hg.assignment)}: hand grading</h1>"
            f"<p>One page per question: the mark scheme, then every student's answer. Unanswered cells "
            f"already scored 0 and need nothing. When you are done, run "
            f"<code>python -m autograder export {html.escape(hg.assignment)}</code>.</p>"
            f"<table>{rows or '<tr><td>This assignment has no hand-graded cells.</td></tr>'}</table>")
    return _page(f"{hg.assignment}: hand grading", body)


def _runs(a: Answer) -> str:
    """The outputs behind an answer: as the student handed them in, beside the grader's re-run."""
    if not a.outputs:
        return ""
    parts = ["<div class='runs'>"]
    for gid, handed_in, rerun in a.outputs:
        mine = ("<i>not kept: this notebook was graded before handed-in outputs were kept</i>" if handed_in is None
                else "<i>no output: the cell had not been run in the file handed in</i>" if not handed_in.strip()
                else f"<pre>{html.escape(handed_in)}</pre>")
        theirs = f"<pre>{html.escape(rerun)}</pre>" if rerun.strip() else "<i>no output in the grader's run</i>"
        parts.append(f"<p>cell <code>{html.escape(gid)}</code></p>"
                     f"<div class='handed-in'><b>as handed in</b> <small>(the student's own run)</small>{mine}</div>"
                     f"<div class='rerun'><b>grader's re-run</b> <small>(the grading settings)</small>{theirs}</div>")
    parts.append("</div>")
    return "".join(parts)


def cell_page(hg: HandGrading, cell: HandGradedCell, token: str, message: str = "") -> bytes:
    parts = [f"<p><a href='/'>&larr; all questions</a></p><h1>{html.escape(cell.label)} "
             f"<small>({cell.max_points:g} points)</small></h1>"]
    if message:
        parts.append(f"<p class='{'problem' if 'not' in message or 'outside' in message else 'graded'}'>"
                     f"{html.escape(message)}</p>")
    parts.append(f"<h2>Question</h2><div>{_markdown(cell.prompt)}</div>")
    parts.append(f"<h2>Mark scheme</h2><div class='scheme'>{_markdown(cell.mark_scheme)}</div>")
    parts.append(f"<h2>Answers ({cell.done} of {len(cell.answers)} graded)</h2>"
                 f"<form method='post' action='/cell/{urllib.parse.quote(cell.grade_id)}'>"
                 f"<input type='hidden' name='token' value='{token}'>")
    for a in cell.answers:
        sid = html.escape(a.student_id)
        state = ("no answer: scored 0" if not a.answered else
                 f"graded: {a.points:g}" if a.points is not None else
                 f"{a.note}: awaiting a grade" if a.note else "awaiting a grade")
        parts.append(
            f"<div class='answer{'' if a.answered else ' blank'}' id='s-{sid}'><b>{sid}</b> "
            f"<span class='{'graded' if a.points is not None or not a.answered else 'todo'}'>({state})</span>"
            + (f"<div class='written'>{_markdown(a.text)}</div><details><summary>source</summary>"
               f"<pre>{html.escape(a.text)}</pre></details>" if cell.cell_type == "markdown" else
               f"<pre>{html.escape(a.text)}</pre>")
            + (f"<pre>{html.escape(a.output)}</pre>" if a.output.strip() and cell.grade_id not in cell.shown else "")
            + _runs(a)
            + (f"<input type='hidden' name='version__{sid}' value='{html.escape(a.answer_version)}."
               f"{html.escape(a.grade_version)}'><input type='hidden' name='shown__{sid}' value='"
               f"{html.escape(json.dumps(['' if a.points is None else f'{a.points:g}', a.comment]))}'>"
               if a.answered and a.answer_version else "")
            + (f"<label>points <input type='number' step='0.5' min='0' max='{cell.max_points:g}' "
               f"name='points__{sid}' value='{'' if a.points is None else f'{a.points:g}'}'></label> "
               f"<label>comment for the student<textarea name='comment__{sid}'>{html.escape(a.comment)}"
               f"</textarea></label>" if a.answered else "")
            + "</div>")
    parts.append("<p><button type='submit'>Save all grades on this page</button></p></form>")
    return _page(f"{hg.assignment}: {cell.label}", "".join(parts))


class _Server(ThreadingHTTPServer):
    """One thread per connection, and room for a class's worth of connections arriving at once
    (the default listen queue of 5 reset the rest)."""

    request_queue_size = 128
    daemon_threads = True


def make_server(hg: HandGrading, port: int = 8765, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """The hand-grading web server (not started).  ``server.url`` is the address to open (it
    carries ``server.secret``, this run's secret); ``server.token`` guards its forms.  Raises
    OSError when the port is taken."""
    secret = secrets.token_urlsafe(32)
    token = secrets.token_urlsafe(16)
    lock = threading.Lock()
    hosts: set[str] = set()      # filled once the port is known (port 0: the system picks one)
    origins: set[str] = set()
    cookie = ""

    def has_secret(handler, query: dict) -> bool:
        given = list(query.get("token") or [])
        for part in (handler.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == cookie:
                given.append(value)
        return any(hmac.compare_digest(g.encode(), secret.encode()) for g in given)

    def refuse(handler, status: int, text: str) -> None:
        handler._send(status, _page("refused", f"<p>{html.escape(text)}</p>"))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8",
                  headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            # same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with a
            # form's POST, and the origin check below refused every save made in a real browser
            # (tests/test_handgrade_browser.py); other sites still get no referrer at all
            self.send_header("Referrer-Policy", "same-origin")
            self.send_header("Cache-Control", "no-store")
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _allowed(self) -> dict | None:
            """The query of a request from the instructor's browser (else it is refused, None)."""
            url = urllib.parse.urlparse(self.path)
            query = urllib.parse.parse_qs(url.query)
            if self.headers.get("Host") not in hosts:  # DNS rebinding: a foreign name for 127.0.0.1
                refuse(self, 403, f"This server answers only at {' or '.join(sorted(origins))}.")
                return None
            if not has_secret(self, query):
                refuse(self, 403, "Open the address that `python -m autograder handgrade` printed "
                                  "(it carries this run's secret).")
                return None
            if "token" in query:  # the secret moves into a cookie, out of the address bar
                rest = urllib.parse.urlencode({k: v for k, v in query.items() if k != "token"}, doseq=True)
                self._send(303, b"", headers={
                    "Location": url.path + (f"?{rest}" if rest else ""),
                    "Set-Cookie": f"{cookie}={secret}; HttpOnly; SameSite=Strict; Path=/"})
                return None
            return query

        def _cell(self, path: str):
            gid = urllib.parse.unquote(path[len("/cell/"):])
            return next((c for c in hg.cells() if c.grade_id == gid), None)

        def do_GET(self):
            query = self._allowed()
            if query is None:
                return
            path = urllib.parse.urlparse(self.path).path
            if path == "/":
                return self._send(200, index_page(hg, hg.cells()))
            if path.startswith("/cell/"):
                cell = self._cell(path)
                if cell is not None:
                    return self._send(200, cell_page(hg, cell, token, (query.get("msg") or [""])[0]))
            self._send(404, _page("not found", "<p>No such page. <a href='/'>All questions</a></p>"))

        def do_POST(self):
            if self._allowed() is None:
                return
            source = self.headers.get("Origin") or self.headers.get("Referer") or ""
            parsed = urllib.parse.urlparse(source)
            if f"{parsed.scheme}://{parsed.netloc}" not in origins:
                return refuse(self, 403, "This form is not from this server.")
            path = urllib.parse.urlparse(self.path).path
            length = min(int(self.headers.get("Content-Length") or 0), 10 << 20)
            form = urllib.parse.parse_qs(self.rfile.read(length).decode("utf-8", "replace"), keep_blank_values=True)
            if not hmac.compare_digest((form.get("token") or [""])[0].encode(), token.encode()) \
                    or not path.startswith("/cell/"):
                return refuse(self, 403, "This form is not from this server.")
            gid = urllib.parse.unquote(path[len("/cell/"):])
            entries, versions = {}, {}
            for key, values in form.items():
                if key.startswith("points__"):
                    sid = key[len("points__"):]
                    entries[sid] = (values[0], (form.get(f"comment__{sid}") or [""])[0])
                    version, shown = (form.get(f"version__{sid}") or [""])[0], (form.get(f"shown__{sid}") or [""])[0]
                    if version:  # what the page showed: a save against a changed answer or grade is refused
                        try:
                            shown_points, shown_comment = json.loads(shown)
                        except (ValueError, TypeError):
                            shown_points, shown_comment = None, None
                        answer_v, _, grade_v = version.partition(".")
                        versions[sid] = (answer_v, grade_v, str(shown_points), str(shown_comment)) \
                            if isinstance(shown_points, str) and isinstance(shown_comment, str) else \
                            (answer_v, grade_v, "\x00", "\x00")
            with lock:
                problems = hg.save(gid, entries, versions=versions) if versions else hg.save(gid, entries)
                scored = len(hg.scored)
            msg = f"saved points for {scored} answer{'s' if scored != 1 else ''}"
            if problems:
                msg += "; not saved: " + "; ".join(problems)
            self._send(303, b"", headers={"Location": f"/cell/{urllib.parse.quote(gid)}?msg={urllib.parse.quote(msg)}"})

    server = _Server((host, port), Handler)
    port = server.server_address[1]
    hosts.update({f"{host}:{port}"} | ({f"localhost:{port}"} if host == "127.0.0.1" else set()))
    origins.update(f"http://{h}" for h in hosts)
    cookie = f"handgrade-{port}"
    server.token = token  # type: ignore[attr-defined]
    server.secret = secret  # type: ignore[attr-defined]
    server.url = f"http://{host}:{port}/?token={secret}"  # type: ignore[attr-defined]
    return server
