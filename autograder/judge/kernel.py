"""One student's kernel, driven from the grader's process.

``KernelSession`` starts a kernel in its sandbox (``autograder.isolation``), runs the
student's cells in it with time limits (interrupt, then kill), and carries the grader's
requests to the handler inside it (``coursekit.remote.server``).  Every message from the
kernel is checked part by part before any of it is parsed, and what a cell prints is kept
within bounds.  Judging the tests is ``autograder.judge.runner``'s.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from autograder.course.schema import BY_NAME
from autograder.isolation.scratch import process_folder, remove_tree
from coursekit.remote.client import callback_error, callback_parts
from coursekit.remote.codec import (CALLBACK_PREFIX, MAX_HEADER_BYTES, MAX_NODES, MAX_TENSOR_BYTES, REPLY_MSG,
                                   REQUEST_KEY, ProtocolError, RemoteTimeout)

# Imports inside functions: jupyter_client and zmq are imported when a kernel is started or spoken to: the
# modules that import this one for its constants and exceptions (the budget, the runner) do not load them.

# ZeroMQ drops a kernel that sends a larger message part; each part is checked again before
# anything of it is parsed (``KernelSession._recv``)
MAX_MESSAGE_BYTES = MAX_TENSOR_BYTES + (1 << 20)
MAX_CONTENT_BYTES = 16 << 20                 # the JSON content of one message (outputs included)
MAX_FRAME_BYTES = 64 << 10                   # a message's header, parent header or metadata
MAX_TEXT_OUTPUT = 200_000                    # characters of stream output kept per cell
MAX_DATA_OUTPUT = 2_000_000                  # bytes of one rich output (image, HTML) kept
MAX_CELL_OUTPUT = 8_000_000                  # bytes of all outputs of one cell kept
MAX_NOTEBOOK_OUTPUT = 64_000_000             # bytes of all outputs of one notebook kept


class KernelDied(RuntimeError):
    """The kernel stopped (crashed, was killed, or could not be reached)."""

    student_caused = True  # coursekit.selfcheck.warn_only turns it into a warning


class KernelKilled(KernelDied):
    """The kernel did not stop when interrupted at a time limit, and was killed: the limit's
    doing (``TestBudget`` counts it as the test's timeout when the test's clock set the limit)."""


# ---------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------

@dataclass
class CellRun:
    outputs: list
    execution_count: int | None = None
    status: str = "ok"          # ok, error, timeout, died
    ename: str = ""
    evalue: str = ""
    note: str = ""


class _Watch:
    """The time limit of one execution: past ``timeout`` the kernel is interrupted; if it is
    still busy the session's ``grace`` seconds later (the ``interrupt_grace`` setting) it is
    killed; once a second, whether it is still alive."""

    def __init__(self, session: "KernelSession", timeout: float):
        self.session, self.deadline = session, time.monotonic() + timeout
        self.interrupted_at: float | None = None
        self.last_alive = time.monotonic()

    def check(self) -> str | None:
        """None, or what just happened: "interrupted", "killed" (after the grace period; the
        kernel is stopped), "dead" (it stopped by itself)."""
        now = time.monotonic()
        if self.interrupted_at is None and now > self.deadline:
            self.interrupted_at = now
            with contextlib.suppress(Exception):
                self.session.km.interrupt_kernel()
            return "interrupted"
        if self.interrupted_at is not None and now - self.interrupted_at > self.session.grace:
            self.session.stop()
            return "killed"
        if now - self.last_alive > 1:
            self.last_alive = now
            if not self.session.alive():
                return "dead"
        return None


_CONTEXT: dict = {}


def _zmq_context():
    """This process's ZeroMQ context for every kernel it speaks to: messages larger than a kernel
    may send are dropped, and a closed socket drops what it had not sent (no linger)."""
    import zmq

    pid = os.getpid()
    if _CONTEXT.get("pid") != pid:  # a forked child makes its own
        context = zmq.Context()
        context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        context.setsockopt(zmq.LINGER, 0)
        _CONTEXT.update(pid=pid, context=context)
    return _CONTEXT["context"]


class KernelSession:
    """One sandboxed kernel, driven synchronously over jupyter_client's blocking client."""

    def __init__(self, kernel_name: str, workdir: Path, env: dict,
                 extra_arguments: list[str] | None = None, ipc: bool = True, startup_timeout: float = 120,
                 copy: Path | None = None, conn_base: Path | None = None,
                 grace: float = BY_NAME["interrupt_grace"].default):
        self.kernel_name, self.workdir = kernel_name, Path(workdir)
        self.grace = grace  # seconds an interrupted kernel has to stop before it is killed
        self.conn_base = conn_base  # where connection folders go (a zygote's folder); default /tmp
        self.env, self.extra_arguments, self.ipc = dict(env), list(extra_arguments or []), ipc
        self.startup_timeout, self.copy = startup_timeout, copy
        self.km = self.kc = None
        self.context = None
        self.starts = 0
        self.copy_pending = False
        self.conn_dirs: list[Path] = []

    # lifetime ---------------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> None:
        """Start a fresh kernel and put the request handler into it, within ``timeout`` s
        (at most ``startup_timeout``).  Raises KernelDied."""
        self.launch()
        self.connect(timeout=timeout)

    def launch(self) -> None:
        """Start a fresh kernel process, without waiting for it (``connect`` waits).  A kernel
        launched ahead of time starts up (and imports what ``preload`` names) while the
        grader is busy with the previous submission.  Raises KernelDied."""
        from jupyter_client import KernelManager

        self.stop()
        self.starts += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        # UNIX socket paths are limited to about 100 bytes: the connection folder must be short
        conn = Path(tempfile.mkdtemp(prefix="ck", dir=self.conn_base or process_folder()))
        self.conn_dirs.append(conn)
        # the process's one ZeroMQ context for the manager and the client: a context of the manager's
        # own is ended with a linger of 0.1 s, and ending one costs ~0.02 s of every submission
        self.context = _zmq_context()
        km = KernelManager(kernel_name=self.kernel_name, context=self.context)
        km.connection_file = str(conn / "kernel.json")
        if self.ipc:
            km.transport = "ipc"  # no network inside the sandbox, not even loopback
            km.ip = str(conn / "k")
        env = dict(os.environ, **self.env, COURSE_SANDBOX_WORKDIR=str(self.workdir))
        if self.copy is not None:
            env["COURSE_SANDBOX_COPY"] = str(self.copy)
        self.km = km
        try:
            km.start_kernel(cwd=str(self.workdir), env=env, extra_arguments=self.extra_arguments)
        except Exception as exc:  # noqa: BLE001 - whatever failed, nothing may keep running
            self.stop()
            raise KernelDied(f"the kernel did not start ({type(exc).__name__}: {exc})"[:300]) from None
        self.copy_pending = self.copy is None  # no copy in the sandbox yet: ``connect`` sends it

    def launched(self) -> bool:
        """True when a kernel was launched and not yet connected to."""
        return self.km is not None and self.kc is None

    def connect(self, copy: Path | None = None, timeout: float | None = None) -> None:
        """Wait until the launched kernel answers; put the request handler into it, and the
        submission's copy (``copy``, for a kernel launched before its submission was known)
        into its working folder, both before any student code runs.  Raises KernelDied."""
        if copy is not None:
            self.copy = copy
        wait = self.startup_timeout if timeout is None else max(0.5, min(self.startup_timeout, timeout))
        deadline = time.monotonic() + wait
        km = self.km
        try:
            self.kc = km.client(context=self.context)
            self.kc.start_channels()
            self._wait_ready(deadline)
        except Exception as exc:  # noqa: BLE001 - whatever failed, nothing may keep running
            self.stop()
            raise KernelDied(f"the kernel did not start ({type(exc).__name__}: {exc})"[:300]) from None
        # the request handler goes in before any student code runs
        code = "from coursekit.remote import install_server as _course_install\n_course_install()\ndel _course_install"
        if self.copy_pending and self.copy is not None and self.copy.is_file():
            data = base64.b64encode(self.copy.read_bytes()).decode()
            code += (f"\nimport base64 as _b64\nwith open({self.copy.name!r}, 'wb') as _f:\n"
                     f"    _f.write(_b64.b64decode({data!r}))\ndel _b64, _f")
        run = self.execute(code, timeout=max(1.0, min(120.0, deadline - time.monotonic())), silent=True)
        if run.status != "ok":
            self.stop()
            raise KernelDied(f"the kernel could not load the course package ({run.ename}: {run.evalue})")
        self.copy_pending = False

    def _wait_ready(self, deadline: float) -> None:
        """Ask for the kernel's info until it answers on the shell channel and a message has come
        through IOPub (a subscription made just now misses what was published before it was in
        place).  jupyter_client's ``wait_for_ready`` does the same, then waits until IOPub has
        been quiet for 0.2 s: a third of a kernel's start, and needless here, where every loop
        reads only its own request's messages."""
        while True:
            msg_id = self.kc.kernel_info()
            replied = heard = False
            step = time.monotonic() + 1.0  # no answer within a second: ask again
            while time.monotonic() < min(step, deadline) and not (replied and heard):
                got = self._poll(0.05)
                if got is None or got[1] is None:
                    continue
                chan, msg = got
                heard = heard or chan == "iopub"
                if chan == "shell" and msg.get("parent_header", {}).get("msg_id") == msg_id:
                    replied = True
                    self.kc._handle_kernel_info_reply(msg)  # the protocol version it speaks
                    step = min(step, time.monotonic() + 0.2)  # IOPub's own messages follow at once
            if replied and heard:
                return
            if not self.alive():
                raise RuntimeError("the kernel died before it answered")
            if time.monotonic() >= deadline:
                raise RuntimeError("the kernel did not answer in time")

    def alive(self) -> bool:
        try:
            return self.km is not None and self.km.is_alive()
        except Exception:  # noqa: BLE001
            return False

    def stop(self) -> None:
        """Kill the kernel (its process group, which takes the sandbox with it)."""
        if self.kc is not None:
            with contextlib.suppress(Exception):
                self.kc.stop_channels()
        if self.km is not None:
            with contextlib.suppress(Exception):
                self._kill_now()
            with contextlib.suppress(Exception):
                self.km.shutdown_kernel(now=True)  # finds it gone: clears jupyter_client's state
            with contextlib.suppress(Exception):
                self.km.cleanup_resources()
        self.km = self.kc = self.context = None  # the context stays, for the next kernel (its sockets are closed)
        for conn in self.conn_dirs:
            remove_tree(conn)  # never follows links the kernel made, never fails on odd trees
        self.conn_dirs.clear()

    def _kill_now(self) -> None:
        """SIGKILL to the kernel's process group (its launcher; the zygote's child then kills the
        kernel, bubblewrap's dies with its parent), and wait for the launcher to end.  jupyter_client's
        ``shutdown_kernel(now=True)`` does the same but checks every 0.1 s whether it has ended,
        and the first check comes before it has: ~0.1 s of every submission spent asleep."""
        provisioner = getattr(self.km, "provisioner", None)
        proc = getattr(provisioner, "process", None)
        if proc is None:
            return
        try:
            os.killpg(provisioner.pgid, signal.SIGKILL)
        except (OSError, TypeError):
            proc.kill()
        proc.wait(timeout=5)

    # running code -----------------------------------------------------------------------
    def _poll(self, timeout: float):
        """The next message from iopub, shell or stdin within ``timeout`` s: (channel, msg) or None."""
        import zmq

        poller = zmq.Poller()
        chans = {self.kc.iopub_channel.socket: "iopub", self.kc.shell_channel.socket: "shell",
                 self.kc.stdin_channel.socket: "stdin"}
        for sock in chans:
            poller.register(sock, zmq.POLLIN)
        ready = dict(poller.poll(max(0, int(timeout * 1000))))
        for sock, name in chans.items():
            if sock in ready:
                try:
                    return name, self._recv(sock)
                except Exception:  # noqa: BLE001 - a malformed message: drop it
                    return name, None
        return None

    def _messages(self, msg_id: str, watch: "_Watch"):
        """The messages of the request ``msg_id`` as they come, as (channel, message), and the time
        limit's events (interrupted, killed, dead) as ("event", name); the caller stops."""
        while True:
            event = watch.check()
            if event is not None:
                yield "event", event
            got = self._poll(0.2)
            if got is None:
                continue
            chan, msg = got
            if msg is not None and msg.get("parent_header", {}).get("msg_id") == msg_id:
                yield chan, msg

    def _recv(self, sock):
        """One message from the kernel, its size checked part by part before any of it is
        parsed.  Parts stay in the received frames (no copy): a reply's tensors are read in
        place by ``coursekit.remote.decode``.  A message whose content is too large arrives as
        its header with ``content = {"course_too_large": bytes}``; one whose frames are
        malformed or over size is dropped (None)."""
        import zmq

        session = self.kc.session
        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        _, parts = session.feed_identities(frames, copy=False)
        if len(parts) < 5 or any(len(f) > MAX_FRAME_BYTES for f in parts[:4]):
            return None
        buffers = [len(f) for f in parts[5:]]
        content = len(parts[4])
        header = session.unpack(bytes(parts[1].bytes)) if len(parts[1]) else {}
        reply = isinstance(header, dict) and header.get("msg_type") == REPLY_MSG
        if content > MAX_CONTENT_BYTES:
            why = f"a message of {content:,d} bytes (the grader reads {MAX_CONTENT_BYTES >> 20} MiB)"
        elif reply and (len(buffers) != 2 or buffers[0] > MAX_HEADER_BYTES):
            why = (f"a reply whose structure takes {buffers[0] if buffers else 0:,d} bytes "
                   f"(the grader reads {MAX_HEADER_BYTES >> 20} MiB)")
        elif reply and buffers[1] > MAX_TENSOR_BYTES:
            why = f"a reply with {buffers[1]:,d} bytes of tensors (the grader reads {MAX_TENSOR_BYTES >> 20} MiB)"
        elif not reply and sum(buffers) > MAX_FRAME_BYTES:
            why = f"a message with {sum(buffers):,d} bytes of binary buffers"
        else:
            raw = bytes(parts[4].bytes)
            too_many = raw.count(b"[") + raw.count(b"{") + raw.count(b",") > 2 * MAX_NODES
            why = f"a message of more than {MAX_NODES:,d} values" if too_many else ""
        if why:  # what the loops need to know: its type and request, and why it was not read
            parent = session.unpack(bytes(parts[2].bytes)) if len(parts[2]) else {}
            if not isinstance(header, dict) or not isinstance(parent, dict):
                return None
            return {"header": header, "msg_type": header.get("msg_type"), "parent_header": parent,
                    "metadata": {}, "content": {"course_too_large": content + sum(buffers), "course_why": why},
                    "buffers": []}
        return session.deserialize(parts, content=True, copy=False)

    def execute(self, code: str, timeout: float, silent: bool = False, store_history: bool = True) -> CellRun:
        """Run ``code``; collect its outputs (bounded).  On timeout: interrupt, and kill the
        kernel if it does not stop within a grace period."""
        if not self.alive():
            raise KernelDied("the kernel is not running")
        msg_id = self.kc.execute(code, silent=silent, store_history=store_history and not silent,
                                 allow_stdin=False, stop_on_error=False)
        run = CellRun(outputs=[])
        collector = _Outputs()
        reply = idle = False
        watch = _Watch(self, timeout)
        for chan, msg in self._messages(msg_id, watch):
            if chan == "event":
                if msg == "interrupted":
                    run.status, run.ename = "timeout", "CellTimeoutError"
                    run.evalue = f"the cell ran longer than {timeout:g} s and was interrupted"
                    continue
                run.status = "died"
                run.ename, run.evalue = ("", f"the cell ran longer than {timeout:g} s and did not stop when "
                                             "interrupted; its kernel was killed") if msg == "killed" else \
                    ("DeadKernelError", "the kernel died while running this cell")
                break
            if chan == "shell" and msg["msg_type"] == "execute_reply":
                reply = True
                content = msg.get("content", {})
                if "course_too_large" in content and run.status == "ok":
                    content = {"status": "error", "ename": "ReplyTooLarge",
                               "evalue": f"the kernel's reply to this cell ({content['course_too_large']:,d} bytes) "
                                         "was too large to read"}
                run.execution_count = content.get("execution_count")
                if content.get("status") == "error" and run.status == "ok":
                    run.status = "error"
                    run.ename, run.evalue = str(content.get("ename", ""))[:200], str(content.get("evalue", ""))[:2000]
            elif chan == "iopub":
                if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                    idle = True
                elif not silent:
                    collector.add(msg)
            if reply and idle:
                break
        run.outputs = collector.outputs
        if run.status in ("timeout", "died"):
            tb = f"{run.ename or 'CellTimeoutError'}: {run.evalue}"
            run.outputs.append(nbformat.v4.new_output("error", ename=run.ename or "CellTimeoutError",
                                                      evalue=run.evalue, traceback=[tb]))
        return run

    def request(self, payload: str, timeout: float, on_callback) -> tuple[bytes, bytes]:
        """Send one request to the kernel's handler; return the reply's (header, blob).
        ``on_callback(header, blob) -> str`` answers calls the student's code makes back."""
        if not self.alive():
            raise KernelDied("the kernel is not running")
        token = secrets.token_hex(8)
        # the payload travels in the request's metadata, not in its code: the code stays one short line
        # that IPython tokenizes, hashes (ipykernel names each cell by a pure-Python hash of its code)
        # and compiles in microseconds, where a payload of a few KB took ~0.5 ms
        content = {"code": f"__course_judge__.handle({token!r})", "silent": True, "store_history": False,
                   "user_expressions": {}, "allow_stdin": True, "stop_on_error": False}
        msg = self.kc.session.msg("execute_request", content, metadata={REQUEST_KEY: payload})
        self.kc.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        watch = _Watch(self, timeout)
        result = None
        reply = idle = False
        error = None
        oversize = ""
        for chan, msg in self._messages(msg_id, watch):
            if chan == "event":
                if msg == "killed":
                    raise KernelKilled(f"the student's code ran longer than {timeout:g} s and did not stop when "
                                       "interrupted; its kernel was killed")
                if msg == "dead":
                    raise KernelDied("the kernel died while the student's code ran")
                continue
            kind = msg.get("msg_type")
            if chan == "stdin" and kind == "input_request":
                if "course_too_large" in msg.get("content", {}):
                    self.kc.input(callback_error("the arguments of this call to the grader are too large", "ValueError"))
                    continue
                prompt = str(msg.get("content", {}).get("prompt", ""))
                if not prompt.startswith(CALLBACK_PREFIX):
                    self.kc.input("")  # the student's own input(): nobody types at grading time
                    continue
                try:
                    answer = on_callback(*callback_parts(prompt))
                except ProtocolError as exc:
                    answer = callback_error(str(exc))
                self.kc.input(answer)
            elif chan == "iopub" and kind == REPLY_MSG and "course_too_large" in msg.get("content", {}):
                oversize = str(msg["content"].get("course_why", "a reply too large to read"))
            elif chan == "iopub" and kind == REPLY_MSG and msg.get("content", {}).get("token") == token:
                bufs = msg.get("buffers") or []
                if len(bufs) == 2 and result is None:
                    result = (bufs[0], bufs[1])  # the received frames themselves: decode reads them in place
            elif chan == "iopub" and kind == "status" and msg["content"].get("execution_state") == "idle":
                idle = True
            elif chan == "shell" and kind == "execute_reply":
                reply = True
                if msg.get("content", {}).get("status") != "ok":
                    error = str(msg["content"].get("ename", "error"))
            if reply and idle:
                break
        if watch.interrupted_at is not None:
            raise RemoteTimeout(f"the student's code did not finish within {timeout:g} s")
        if result is None and oversize:
            raise ProtocolError(f"the notebook's code sent back {oversize}")
        if result is None:
            raise ProtocolError("the kernel did not answer the grader's request"
                                + (f" ({error})" if error else ""))
        return result


_SPLIT_MIMES = ("image/svg+xml",)  # besides text/*: what nbformat stores line by line
_DEPTH = 4                          # an output's depth in the file: notebook, cells, a cell, its outputs


def _as_stored(output) -> dict:
    """``output`` as nbformat writes it: multi-line texts as lists of their lines."""
    out = dict(output)
    if isinstance(out.get("text"), str):
        out["text"] = out["text"].splitlines(True)
    if isinstance(out.get("data"), dict):
        out["data"] = {k: v.splitlines(True) if isinstance(v, str) and (k.startswith("text/") or k in _SPLIT_MIMES)
                       else v for k, v in out["data"].items()}
    return out


def stored_size(output) -> int:
    """The bytes ``output`` takes in the notebook file (JSON with an indent of 1, texts split into
    lines, as nbformat writes it, at the depth of a cell's outputs).  The output limits count this,
    not the characters of its values: 100,000 tiny outputs are 0.49 MB of values but 8.4 MB stored."""
    text = json.dumps(_as_stored(output), indent=1, sort_keys=True, ensure_ascii=False, default=str)
    return len(text.encode("utf-8", "surrogatepass")) + _DEPTH * (text.count("\n") + 1) + 2


def stored_text_size(text: str) -> int:
    """The bytes ``text`` adds to a stream output already in the file (its lines, each indented)."""
    return sum(len(json.dumps(line, ensure_ascii=False).encode("utf-8", "surrogatepass")) + _DEPTH + 4
               for line in text.splitlines(True))


class _Outputs:
    """Builds a cell's outputs from IOPub messages, within size limits (counted as stored)."""

    def __init__(self):
        self.outputs: list = []
        self.size = 0
        self.clear_next = False
        self.dropped = False

    def _room(self, n: int) -> bool:
        if self.size + n > MAX_CELL_OUTPUT:
            if not self.dropped:
                self.dropped = True
                self.outputs.append(nbformat.v4.new_output(
                    "stream", name="stdout", text="\n... [more output was dropped: too large to keep]\n"))
            return False
        self.size += n
        return True

    def add(self, msg) -> None:
        kind = msg.get("msg_type")
        content = msg.get("content") or {}
        if "course_too_large" in content:
            if kind in ("stream", "display_data", "execute_result", "error", "update_display_data"):
                text = f"\n... [an output of {content['course_too_large']:,d} bytes was not kept: too large]\n"
                note = nbformat.v4.new_output("stream", name="stdout", text=text)
                if self._room(stored_size(note)):
                    self.outputs.append(note)
            return
        if kind == "clear_output":
            if content.get("wait"):
                self.clear_next = True
            else:
                self.outputs, self.size = [], 0
            return
        if kind not in ("stream", "display_data", "execute_result", "error"):
            return
        if self.clear_next:
            self.outputs, self.size, self.clear_next = [], 0, False
        try:
            out = nbformat.v4.output_from_msg(msg)
        except Exception:  # noqa: BLE001 - a malformed output: drop it
            return
        if kind == "stream":
            text = str(out.get("text", ""))
            prev = self.outputs[-1] if self.outputs else None
            if prev is not None and prev.output_type == "stream" and prev.name == out.name:
                room = MAX_TEXT_OUTPUT - len(prev.text)
                if room <= 0:
                    if not prev.text.endswith("[truncated]\n"):
                        prev.text += "\n... [output truncated]\n"
                    return
                if self._room(stored_text_size(text[:room])):
                    prev.text += text[:room]
                return
            out.text = text[:MAX_TEXT_OUTPUT]
            if self._room(stored_size(out)):
                self.outputs.append(out)
            return
        if kind == "error":
            out["traceback"] = [str(t)[:5000] for t in (out.get("traceback") or [])[:200]]
            out["evalue"] = str(out.get("evalue", ""))[:5000]
            if self._room(stored_size(out)):
                self.outputs.append(out)
            return
        data = out.get("data", {})
        for mime in list(data):
            value = data[mime]
            n = len(json.dumps(value)) if not isinstance(value, str) else len(value)
            if n > MAX_DATA_OUTPUT:
                data.pop(mime)
                data.setdefault("text/plain", f"[{mime} output of {n:,d} bytes not kept: too large]")
        if self._room(stored_size(out)):
            self.outputs.append(out)
