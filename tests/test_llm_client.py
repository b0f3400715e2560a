"""coursekit.llm's API client against a hostile server: a client library a student can trust.

A small HTTP server on 127.0.0.1 (threads, bounded loops; it stops when the module's tests
end, or by itself after SERVER_LIFE_S) answers each path with one kind of bad reply: 300 MiB
(announced or not, or as a gzip bomb), one byte every 0.5 s (in the body or in the headers),
text that is not JSON, bytes that are not UTF-8, JSON of the wrong shape, HTTP 500, 401,
what is not HTTP at all; it records the Authorization header of every request. Every bad
reply must raise LLMError naming the server; a reply stops at the size cap (the client's
peak memory grows by a bounded amount, measured in a subprocess); a 3 s deadline holds for
the whole request; OPENAI_API_KEY never reaches a server that is not OpenAI's. No model needed.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import pytest

from conftest import ROOT

MiB = 2 ** 20
HUGE = 300 * MiB
TRICKLE_S = 0.5
SERVER_LIFE_S = 600  # the server stops by itself after this, whatever happens to the tests
OPENAI_KEY = "sk-openai-" + os.urandom(12).hex()  # in the environment: must never reach this server
CLASS_KEY = "sk-class-" + os.urandom(12).hex()  # the key a student names for the class server


def _completion(kind="text", text="Oil prices rose"):
    choice = {"index": 0, "finish_reason": "length"}
    choice.update({"text": text, "logprobs": {"token_logprobs": [-1.5, -0.25]}} if kind == "text" else
                  {"message": {"role": "assistant", "content": text}, "logprobs": None})
    return json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()


class HostileServer:
    """One thread per connection; the path's first part says how to answer."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.seen = []  # (path, Authorization header or None, all headers)
        self.stop = threading.Event()
        self.started = time.monotonic()
        self._bomb = None
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, behaviour, host="127.0.0.1"):
        return f"http://{host}:{self.port}/{behaviour}/v1"

    def close(self):
        self.stop.set()
        self.sock.close()

    def _accept(self):
        while not self.stop.is_set() and time.monotonic() - self.started < SERVER_LIFE_S:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()
        self.sock.close()

    def _read_request(self, conn):
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            part = conn.recv(4096)
            if not part:
                return None, {}
            data += part
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        need = int(headers.get("content-length", 0))
        while len(body) < need:
            part = conn.recv(4096)
            if not part:
                break
            body += part
        return lines[0].split(" ")[1], headers

    def _serve(self, conn):
        conn.settimeout(60)
        try:
            path, headers = self._read_request(conn)
            if path is None:
                return
            self.seen.append((path, headers.get("authorization"), headers))
            behaviour = path.strip("/").split("/")[0]
            getattr(self, "_" + behaviour.replace("-", "_"))(conn, path)
        except OSError:
            pass  # the client hung up: that is what a bounded client does
        finally:
            conn.close()

    @staticmethod
    def _head(conn, status="200 OK", headers=(), length=None):
        lines = [f"HTTP/1.1 {status}", "Content-Type: application/json", "Connection: close", *headers]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())

    def _reply(self, conn, body, status="200 OK", headers=()):
        self._head(conn, status, headers, len(body))
        conn.sendall(body)

    # -- behaviours --------------------------------------------------------------------------
    def _good(self, conn, path):
        self._reply(conn, _completion("chat" if "/chat/" in path else "text"))

    def _huge(self, conn, path):  # 300 MiB, no length announced: the client must count
        self._head(conn)
        chunk = b"x" * MiB
        conn.sendall(b'{"choices": [{"text": "')
        for _ in range(HUGE // MiB):
            conn.sendall(chunk)

    def _huge_announced(self, conn, path):
        self._head(conn, length=HUGE)
        chunk = b" " * MiB
        for _ in range(HUGE // MiB):
            conn.sendall(chunk)

    def _gzip_bomb(self, conn, path):  # 300 MiB of JSON-ish text in about 300 KiB of gzip
        if self._bomb is None:
            z = zlib.compressobj(9, zlib.DEFLATED, 31)
            zeros = b" " * MiB
            self._bomb = b"".join([z.compress(zeros) for _ in range(HUGE // MiB)] + [z.flush()])
        self._reply(conn, self._bomb, headers=("Content-Encoding: gzip",))

    def _trickle(self, conn, path):  # a whole reply, one byte every 0.5 s (at most 60 s)
        body = _completion()
        self._head(conn, length=len(body))
        for i in range(min(len(body), int(60 / TRICKLE_S))):
            conn.sendall(body[i:i + 1])
            time.sleep(TRICKLE_S)

    def _trickle_headers(self, conn, path):  # even the status line comes a byte at a time
        for i, byte in enumerate(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" * 4):
            if i * TRICKLE_S > 60:
                break
            conn.sendall(bytes([byte]))
            time.sleep(TRICKLE_S)

    def _not_json(self, conn, path):
        self._reply(conn, b"<html><body>Welcome to nginx!</body></html>", headers=("X-Note: text",))

    def _not_utf8(self, conn, path):
        self._reply(conn, b'{"choices": [{"text": "caf\xe9 \xff\xfe"}]}')

    def _wrong_shape(self, conn, path):
        self._reply(conn, b'{"result": "ok", "data": [1, 2, 3]}')

    def _wrong_choice(self, conn, path):
        self._reply(conn, b'{"choices": [{"message": 3, "text": ["a"]}]}')

    def _a_list(self, conn, path):
        self._reply(conn, b"[1, 2, 3]")

    def _deep(self, conn, path):
        self._reply(conn, b"[" * 200000)

    def _error500(self, conn, path):
        self._reply(conn, b"Internal Server Error: the model crashed", status="500 Internal Server Error")

    def _busy(self, conn, path):  # asks the client to come back in 30 s: longer than its deadline
        self._reply(conn, b'{"error": {"message": "overloaded"}}', status="503 Service Unavailable",
                    headers=("Retry-After: 30",))

    def _error500_huge(self, conn, path):  # an error page of 300 MiB
        self._head(conn, status="500 Internal Server Error")
        chunk = b"e" * MiB
        for _ in range(HUGE // MiB):
            conn.sendall(chunk)

    def _unauthorized(self, conn, path):
        self._reply(conn, b'{"error": {"message": "invalid key"}}', status="401 Unauthorized")

    def _not_http(self, conn, path):
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")


@pytest.fixture(scope="module")
def server():
    s = HostileServer()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """The student's OpenAI key (and the rest of the openai client's variables) in the
    environment, as on a machine set up for the paid API; nothing else of the course's."""
    for name in list(os.environ):
        if name.startswith(("COURSE_LLM_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("OPENAI_ADMIN_KEY", OPENAI_KEY + "-admin")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-student")
    monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", f"Authorization: Bearer {OPENAI_KEY}-custom\nX-Custom: 1")


def _model(url, kind="text", timeout=20.0, **kw):
    from coursekit.llm import OpenAIModel

    return OpenAIModel("m", url, kind=kind, timeout=timeout, verbose=False, **kw)


def _fails(lm, server, what):
    """sample() raises LLMError, one line naming the server, matching ``what``; returns the line."""
    from coursekit.llm import LLMError

    with pytest.raises(LLMError) as err:
        lm.sample(["Oil prices"], 1, 8)
    line = str(err.value)
    assert f"127.0.0.1:{server.port}" in line and "\n" not in line, line
    assert err.value._render_traceback_() == [f"LLMError: {line}"]  # what a notebook shows
    assert any(w in line for w in what.split("|")), line
    assert OPENAI_KEY not in line and CLASS_KEY not in line
    return line


def test_a_good_reply_is_read(server):
    lm = _model(server.url("good"))
    [s] = lm.sample(["Oil prices"], 1, 8)
    assert s["text"] == "Oil prices rose" and s["logprobs"] == [-1.5, -0.25]
    assert lm.total == {"requests": 1, "prompt_tokens": 3, "completion_tokens": 2}
    [s] = _model(server.url("good"), kind="chat").sample(["Why?"], 1, 8)
    assert s["text"] == "Oil prices rose" and s["logprobs"] is None


@pytest.mark.parametrize("behaviour, what", [
    ("huge", "more than the 8 MiB"),
    ("huge-announced", "300 MiB|314,572,800 bytes"),
    ("gzip-bomb", "more than the 8 MiB"),
    ("not-json", "not JSON"),
    ("not-utf8", "not UTF-8"),
    ("wrong-shape", "without a list of 'choices'"),
    ("wrong-choice", "without a 'text'"),
    ("a-list", "without a list of 'choices'"),
    ("deep", "not JSON"),
    ("error500", "HTTP 500"),
    ("error500-huge", "more than the 8 MiB"),
    ("unauthorized", "HTTP 401"),
    ("not-http", "not valid HTTP"),
])
def test_every_bad_reply_is_one_llm_error_naming_the_server(server, behaviour, what):
    line = _fails(_model(server.url(behaviour)), server, what)
    if behaviour in ("not-json", "wrong-shape"):
        assert "COURSE_LLM_BASE_URL" in line  # what to change
    if behaviour == "unauthorized":  # no key was sent; the line says which to set
        assert "COURSE_LLM_API_KEY" in line and "OPENAI_API_KEY goes to api.openai.com only" in line


def test_a_server_error_in_chat_mode_names_the_text_kind(server):
    """transformers serve answers a chat request to a base model with HTTP 500: the line says what to set."""
    line = _fails(_model(server.url("error500"), kind="chat"), server, "HTTP 500")
    assert "COURSE_LLM_KIND=text" in line
    assert "COURSE_LLM_KIND" not in _fails(_model(server.url("error500")), server, "HTTP 500")


def test_chat_replies_of_the_wrong_shape(server):
    _fails(_model(server.url("wrong-choice"), kind="chat"), server, "without a message's text")
    _fails(_model(server.url("wrong-shape"), kind="chat"), server, "without a list of 'choices'")


def test_the_size_cap_is_a_setting(server, monkeypatch):
    """COURSE_LLM_MAX_REPLY_MB sets the cap: 0.0001 MiB (104 bytes) is less than a good reply."""
    from coursekit.llm import LLMError, load_llm

    monkeypatch.setenv("COURSE_LLM_MAX_REPLY_MB", "0.0001")
    lm = load_llm(backend="openai", model="m", base_url=server.url("good"), verbose=False)
    _fails(lm, server, "more than the 104 bytes")
    monkeypatch.setenv("COURSE_LLM_MAX_REPLY_MB", "lots")
    with pytest.raises(LLMError, match="COURSE_LLM_MAX_REPLY_MB='lots'"):
        load_llm(backend="openai", model="m", base_url=server.url("good"))


@pytest.mark.parametrize("behaviour", ["trickle", "trickle-headers"])
def test_one_deadline_for_the_whole_request(server, behaviour):
    """A server that sends a byte every 0.5 s: the 3 s deadline covers all reads together
    (per read, it would hold the client for the whole trickle: 60 s here)."""
    lm = _model(server.url(behaviour), timeout=3)
    start = time.monotonic()
    line = _fails(lm, server, "within 3 s (COURSE_LLM_TIMEOUT")
    took = time.monotonic() - start
    print(f"{behaviour}: LLMError after {took:.2f} s with a 3 s deadline: {line}")
    assert 2.5 <= took <= 3 + 2.5, took  # generous slack for a busy machine, far below 60 s


def test_retries_stay_within_the_deadline(server):
    """HTTP 500 is retried twice (0.5 s, 1 s apart); a Retry-After of 30 s is not waited for
    when the deadline is 3 s: the answer comes at once."""
    before = sum(p.startswith("/error500/") for p, _, _ in server.seen)
    _fails(_model(server.url("error500")), server, "HTTP 500")
    assert sum(p.startswith("/error500/") for p, _, _ in server.seen) - before == 3
    start = time.monotonic()
    _fails(_model(server.url("busy"), timeout=3), server, "HTTP 503")
    assert time.monotonic() - start < 2.5


def test_the_openai_key_never_reaches_another_server(server, monkeypatch):
    """OPENAI_API_KEY (and the openai client's other variables) in the environment: a server
    that is not api.openai.com gets no Authorization at all, unless the student names a key
    for it, which is then the only one it gets."""
    from coursekit.llm import api_key

    seen = len(server.seen)
    _model(server.url("good")).sample(["Oil prices"], 1, 8)
    _model(server.url("good", host="localhost"), kind="chat").sample(["Why?"], 1, 8)
    for _, auth, headers in server.seen[seen:]:
        assert auth is None, auth
        assert not any(OPENAI_KEY in v for v in headers.values()), headers
        assert "openai-organization" not in headers
    seen = len(server.seen)
    _model(server.url("good"), api_key=CLASS_KEY).sample(["Oil prices"], 1, 8)
    monkeypatch.setenv("COURSE_LLM_API_KEY", CLASS_KEY + "-env")
    _model(server.url("good")).sample(["Oil prices"], 1, 8)
    assert [auth for _, auth, _ in server.seen[seen:]] == [f"Bearer {CLASS_KEY}", f"Bearer {CLASS_KEY}-env"]
    # which key goes where, without a request
    assert api_key("https://api.openai.com/v1") == OPENAI_KEY
    assert api_key("https://api.openai.com/v1", key="sk-given") == "sk-given"
    monkeypatch.delenv("COURSE_LLM_API_KEY")
    for other in ("http://api.openai.com/v1", "https://api.openai.com.example.org/v1", "https://example.org/v1",
                  "http://localhost:11434/v1", "https://api.openai.com:8443/v1"):
        assert api_key(other) is None, other


def test_the_server_key_is_not_passed_into_graded_kernels():
    from autograder.isolation.policy import ENV_PREFIXES, SECRET

    assert "COURSE_LLM_API_KEY".startswith(ENV_PREFIXES) and SECRET.search("COURSE_LLM_API_KEY")


MEMORY_PROBE = textwrap.dedent("""
    import json, sys, tracemalloc
    from coursekit.llm import LLMError, OpenAIModel

    def status(field):  # KiB, from the kernel's account of this process
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])

    good, huge = sys.argv[1], sys.argv[2]
    OpenAIModel("m", good, kind="text", verbose=False).sample(["warm up"], 1, 8)  # imports, first request
    lm = OpenAIModel("m", huge, kind="text", verbose=False)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the resident size now
    rss = status("VmRSS")
    tracemalloc.start()
    try:
        lm.sample(["Oil prices"], 1, 8)
        error = None
    except LLMError as err:
        error = str(err)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({"rss_mib": rss / 1024, "peak_growth_mib": (status("VmHWM") - rss) / 1024,
                      "python_peak_mib": traced / 2**20, "error": error}))
""")


@pytest.mark.parametrize("behaviour", ["huge", "gzip-bomb"])
def test_memory_stays_bounded_under_a_300_mib_reply(server, behaviour):
    """In a fresh process (Linux: the peak resident size is reset just before the request):
    the peak grows by a few times the 8 MiB cap, not by 300 MiB."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("measures the peak resident size through Linux's /proc")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", MEMORY_PROBE, server.url("good"), server.url(behaviour)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{behaviour}: RSS {got['rss_mib']:.0f} MiB before the request; its peak grew by "
          f"{got['peak_growth_mib']:.1f} MiB; Python's allocations peaked at {got['python_peak_mib']:.1f} MiB")
    assert got["peak_growth_mib"] < 64 and got["python_peak_mib"] < 64, got
    assert got["error"] and "more than the 8 MiB" in got["error"], got
