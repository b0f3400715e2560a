"""The hand-grading server holds against the web pages the instructor's browser also opens:
it answers only at its own address, only with this run's secret (printed in its URL, then a
cookie), changes grades only from its own pages, and shows a student's answer as inert HTML
(sanitised, and a Content-Security-Policy that runs no script), checked in Chromium."""
from __future__ import annotations

import html.parser
import http.client
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from autograder.records.handgrade import CSP, Answer, HandGradedCell, make_server
from conftest import ROOT, run

HOSTILE = """Attention weighs every *value* by how well its key matches the query.

<script>document.title = 'pwned by script'</script>
<img src=x onerror="document.title = 'pwned by onerror'">
<svg onload="document.title = 'pwned by svg'"></svg>
<iframe src="javascript:parent.document.title = 'pwned by iframe'"></iframe>
[click me](javascript:document.title='pwned by link')
<a href="#" onclick="document.title = 'pwned by click'">a link</a>
"""
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)


class FakeHandGrading:
    """Stands in for HandGrading (no gradebook needed): one written answer of each student."""

    assignment = "project_aether"

    def __init__(self):
        self.saved: list[tuple[str, dict]] = []
        self.scored: list[str] = []

    def cells(self):
        return [HandGradedCell("q1_answer", "Q1", "Q1 written answer", 2, "Why attention?", "**Full credit**: keys.",
                               [Answer("s1", HOSTILE, "", True, None, ""),
                                Answer("s2", "Because.", "", True, None, "")], cell_type="markdown")]

    def save(self, grade_id, entries):
        self.saved.append((grade_id, entries))
        self.scored = [sid for sid, (points, _) in entries.items() if points.strip()]
        return []


@pytest.fixture()
def server():
    hg = FakeHandGrading()
    srv = make_server(hg, port=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv, hg, srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def _request(port, method, path, host=None, headers=None, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest(method, path, skip_host=True)
    conn.putheader("Host", f"127.0.0.1:{port}" if host is None else host)
    for key, value in (headers or {}).items():
        conn.putheader(key, value)
    data = urllib.parse.urlencode(body).encode() if body is not None else b""
    if body is not None:
        conn.putheader("Content-Type", "application/x-www-form-urlencoded")
        conn.putheader("Content-Length", str(len(data)))
    conn.endheaders(data or None)
    reply = conn.getresponse()
    text = reply.read().decode()
    conn.close()
    return reply, text


def _login(port, secret):
    reply, _ = _request(port, "GET", f"/?token={secret}")
    assert reply.status == 303 and reply.getheader("Location") == "/"  # the secret leaves the address bar
    cookie = reply.getheader("Set-Cookie")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    return {"Cookie": cookie.split(";")[0]}


def test_only_its_own_host_and_the_secret_get_an_answer(server):
    srv, _, port = server
    assert srv.url == f"http://127.0.0.1:{port}/?token={srv.secret}"
    # DNS rebinding: attacker.example resolved to 127.0.0.1; even with the secret it is refused
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1", ""):
        reply, text = _request(port, "GET", f"/cell/q1_answer?token={srv.secret}", host=host)
        assert reply.status == 403 and srv.token not in text, host
    for path in ("/", "/cell/q1_answer", "/cell/q1_answer?token=guess"):  # no secret: no page, no form token
        reply, text = _request(port, "GET", path)
        assert reply.status == 403 and srv.token not in text and "Because." not in text, path
    cookie = _login(port, srv.secret)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        reply, text = _request(port, "GET", "/cell/q1_answer", host=host, headers=cookie)
        assert reply.status == 200 and srv.token in text and "Because." in text
    reply, _ = _request(port, "GET", "/cell/q1_answer", headers={"Cookie": f"handgrade-{port}=forged"})
    assert reply.status == 403


def test_grades_change_only_from_its_own_pages(server):
    srv, hg, port = server
    cookie = _login(port, srv.secret)
    form = {"token": srv.token, "points__s1": "2", "comment__s1": "good", "points__s2": "", "comment__s2": "hm"}
    own = f"http://127.0.0.1:{port}"
    refused = [({}, form),                                                   # no Origin, no Referer
               ({"Origin": "http://attacker.example"}, form),                # another site's page
               ({"Origin": "null"}, form),                                   # a sandboxed frame
               ({"Referer": "http://attacker.example/x"}, form),
               ({"Origin": own}, {**form, "token": "forged"})]               # not our form
    for headers, body in refused:
        reply, _ = _request(port, "POST", "/cell/q1_answer", headers={**cookie, **headers}, body=body)
        assert reply.status == 403, headers
    reply, _ = _request(port, "POST", "/cell/q1_answer", headers={"Origin": own}, body=form)  # no secret
    assert reply.status == 403 and hg.saved == []
    for headers in ({"Origin": own}, {"Referer": f"{own}/cell/q1_answer"}):
        reply, _ = _request(port, "POST", "/cell/q1_answer", headers={**cookie, **headers}, body=form)
        assert reply.status == 303
        # only the answer that got points counts, not the comment-only one
        assert urllib.parse.unquote(reply.getheader("Location")).endswith("saved points for 1 answer")
    assert len(hg.saved) == 2


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attrs = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]


def test_a_written_answer_is_shown_as_inert_html(server):
    srv, _, port = server
    reply, text = _request(port, "GET", "/cell/q1_answer", headers=_login(port, srv.secret))
    csp = reply.getheader("Content-Security-Policy")
    assert csp == CSP and "default-src 'none'" in csp and "script-src" not in csp and "unsafe-inline" not in csp
    page = _Tags()
    page.feed(text)
    assert not {"script", "iframe", "svg", "object", "embed"} & set(page.tags)
    assert not [a for a in page.attrs if a[1].startswith("on") or "javascript:" in a[2].lower()]
    assert "<em>value</em>" in text  # rendered markdown
    assert "&lt;script&gt;document.title" in text  # and the source as the student wrote it, as text


def _dom(url: str, profile) -> str:
    proc = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={profile}", "--virtual-time-budget=3000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=60)
    return proc.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_no_student_script_runs_in_a_browser(server, tmp_path):
    """Chromium opens the page (the printed URL, then the cookie) and no script of the answer
    ran: the title is the page's own.  The same answer as raw HTML does run in Chromium
    without the policy, and does not with it (the check can fail)."""
    srv, _, port = server
    dom = _dom(f"http://127.0.0.1:{port}/cell/q1_answer?token={srv.secret}", tmp_path / "a")
    assert "Attention weighs every" in dom and "Save all grades" in dom
    assert "pwned" not in dom.split("</title>")[0]

    class Raw(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = f"<!DOCTYPE html><html><head><title>raw</title></head><body>{HOSTILE}</body></html>".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            if self.path == "/csp":
                self.send_header("Content-Security-Policy", CSP)
            self.end_headers()
            self.wfile.write(body)

    raw = ThreadingHTTPServer(("127.0.0.1", 0), Raw)
    threading.Thread(target=raw.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{raw.server_address[1]}"
        assert "pwned" in _dom(f"{base}/", tmp_path / "b").split("</title>")[0]
        assert "pwned" not in _dom(f"{base}/csp", tmp_path / "c").split("</title>")[0]
    finally:
        raw.shutdown()
        raw.server_close()


def test_a_second_handgrade_on_a_busy_port_is_one_line(tmp_path):
    grading = tmp_path / "grading"
    (grading / "release" / "project_aether").mkdir(parents=True)
    shutil.copy(ROOT / "exercises" / "project_aether" / "project_aether.ipynb", grading / "release" / "project_aether")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run([sys.executable, "-m", "autograder", "handgrade", "project_aether", "--port", str(port),
                    "--grading-dir", str(grading)], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_twenty_connections_at_once_are_all_answered():
    """A class's worth of connections arriving together (issue 34.3: 7 of 20 were reset by a
    listen queue of 5): each one is queued while the server is busy, and each gets its answer."""
    srv = make_server(FakeHandGrading(), port=0)
    port = srv.server_address[1]
    try:
        # the server not yet accepting: every connection must wait in its listen queue
        socks = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=1.5)
            socks.append(s)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        for s in socks:
            s.sendall(f"GET /cell/q1_answer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        for s in socks:
            s.settimeout(5)
            assert s.recv(64).startswith(b"HTTP/1.0 403"), "no answer"  # no secret: refused, but answered
            s.close()
        # and twenty at once, all with the secret, while the server runs
        cookie = _login(port, srv.secret)
        barrier, answers = threading.Barrier(20), []

        def one():
            barrier.wait()
            reply, text = _request(port, "GET", "/cell/q1_answer", headers=cookie)
            answers.append((reply.status, "Because." in text))

        threads = [threading.Thread(target=one) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert answers == [(200, True)] * 20
    finally:
        srv.shutdown()
        srv.server_close()
