"""Judge a submission's tests outside its kernel.

``KernelSession`` drives one sandboxed kernel; ``RemoteStudent`` is ``student`` at grading
time (requests to the kernel, plain values back); ``judge_cell`` runs one test cell's code
in the grader's process and turns the outcome into a ``Verdict``.  nbgrader's side of it
is ``autograder.execute.JudgedExecute``.  Test cells run here, in the grader's process,
with ``student`` bound to the kernel.  The kernel receives requests ("call this function of the notebook on
these tensors") and sends back plain values (JSON + safetensors, see
``coursekit.remote``); references, comparisons and points are computed here.  Nothing
the student's code does to its own process (builtins, IPython hooks, patched torch,
displayhook, printed text on stderr) can reach a verdict, and no hidden-test line is ever
sent to the kernel.

Each test cell's outputs are written by the grader: what the test printed, and for a
failure one error line (the failing line of a visible test; for a hidden check only its
message or a generic sentence).  nbgrader's ``SaveAutoGrades`` then scores them as usual.
"""
from __future__ import annotations

import base64
import builtins
import contextlib
import functools
import io
import itertools
import json
import os
import secrets
import sys
import tempfile
import time
import traceback
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import nbformat
from .scratch import process_folder, remove_tree
from coursekit.remote import (CALLBACK_PREFIX, MAX_HEADER_BYTES, MAX_NODES, MAX_TENSOR_BYTES, REPLY_MSG,
                              ProtocolError, Ref,
                              _builtin_exception, _StudentBase, decode, find_instances,
                              pickle_request)

# ZeroMQ drops a kernel that sends a larger message part; each part is checked again before
# anything of it is parsed (``KernelSession._recv``)
MAX_MESSAGE_BYTES = MAX_TENSOR_BYTES + (1 << 20)
MAX_CONTENT_BYTES = 16 << 20                 # the JSON content of one message (outputs included)
MAX_FRAME_BYTES = 64 << 10                   # a message's header, parent header or metadata
MAX_TEXT_OUTPUT = 200_000                    # characters of stream output kept per cell
MAX_DATA_OUTPUT = 2_000_000                  # bytes of one rich output (image, HTML) kept
MAX_CELL_OUTPUT = 8_000_000                  # bytes of all outputs of one cell kept
MAX_NOTEBOOK_OUTPUT = 64_000_000             # bytes of all outputs of one notebook kept
HIDDEN_FAILURE = "a hidden check failed (see the first line of this cell for what it checks)"


class KernelDied(RuntimeError):
    """The kernel stopped (crashed, was killed, or could not be reached)."""

    student_caused = True  # coursekit.selfcheck.warn_only turns it into a warning


class RemoteTimeout(RuntimeError):
    """The student's code did not answer a request within the time limit."""

    student_caused = True


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
    still busy 10 s later it is killed; once a second, whether it is still alive."""

    GRACE = 10

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
        if self.interrupted_at is not None and now - self.interrupted_at > self.GRACE:
            self.session.stop()
            return "killed"
        if now - self.last_alive > 1:
            self.last_alive = now
            if not self.session.alive():
                return "dead"
        return None


class KernelSession:
    """One sandboxed kernel, driven synchronously over jupyter_client's blocking client."""

    def __init__(self, kernel_name: str, workdir: Path, env: dict,
                 extra_arguments: list[str] | None = None, ipc: bool = True, startup_timeout: float = 120,
                 copy: Path | None = None, conn_base: Path | None = None):
        self.kernel_name, self.workdir = kernel_name, Path(workdir)
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
        km = KernelManager(kernel_name=self.kernel_name)
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
        import zmq

        if copy is not None:
            self.copy = copy
        wait = self.startup_timeout if timeout is None else max(0.5, min(self.startup_timeout, timeout))
        deadline = time.monotonic() + wait
        km = self.km
        try:
            self.context = zmq.Context()
            self.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            self.kc = km.client(context=self.context)
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=wait)
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
                self.km.shutdown_kernel(now=True)
            with contextlib.suppress(Exception):
                self.km.cleanup_resources()
        if self.context is not None:
            with contextlib.suppress(Exception):
                self.context.destroy(linger=0)
        self.km = self.kc = self.context = None
        for conn in self.conn_dirs:
            remove_tree(conn)  # never follows links the kernel made, never fails on odd trees
        self.conn_dirs.clear()

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
        while not (reply and idle):
            event = watch.check()
            if event == "interrupted":
                run.status, run.ename = "timeout", "CellTimeoutError"
                run.evalue = f"the cell ran longer than {timeout:g} s and was interrupted"
            elif event == "killed":
                run.status, run.evalue = "died", (f"the cell ran longer than {timeout:g} s and did not stop "
                                                  "when interrupted; its kernel was killed")
                break
            elif event == "dead":
                run.status, run.ename, run.evalue = "died", "DeadKernelError", "the kernel died while running this cell"
                break
            got = self._poll(0.2)
            if got is None:
                continue
            chan, msg = got
            if msg is None or msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
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
        msg_id = self.kc.execute(f"__course_judge__.handle({token!r}, {payload!r})", silent=True,
                                 store_history=False, allow_stdin=True, stop_on_error=False)
        watch = _Watch(self, timeout)
        result = None
        reply = idle = False
        error = None
        oversize = ""
        while not (idle and reply):
            event = watch.check()
            if event == "killed":
                raise KernelDied(f"the student's code ran longer than {timeout:g} s and did not stop when "
                                 "interrupted; its kernel was killed")
            if event == "dead":
                raise KernelDied("the kernel died while the student's code ran")
            got = self._poll(0.2)
            if got is None:
                continue
            chan, msg = got
            if msg is None or msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg.get("msg_type")
            if chan == "stdin" and kind == "input_request":
                if "course_too_large" in msg.get("content", {}):
                    self.kc.input(pickle_request({"error": ("ValueError", "the arguments of this call to the grader "
                                                                          "are too large")}, {}, {}))
                    continue
                prompt = str(msg.get("content", {}).get("prompt", ""))
                if not prompt.startswith(CALLBACK_PREFIX):
                    self.kc.input("")  # the student's own input(): nobody types at grading time
                    continue
                try:
                    answer = on_callback(*_callback_parts(prompt))
                except ProtocolError as exc:
                    answer = pickle_request({"error": ("RuntimeError", str(exc))}, {}, {})
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
        if watch.interrupted_at is not None:
            raise RemoteTimeout(f"the student's code did not finish within {timeout:g} s")
        if result is None and oversize:
            raise ProtocolError(f"the notebook's code sent back {oversize}")
        if result is None:
            raise ProtocolError("the kernel did not answer the grader's request"
                                + (f" ({error})" if error else ""))
        return result


def _callback_parts(prompt: str) -> tuple[bytes, bytes]:
    if not prompt.startswith(CALLBACK_PREFIX):
        raise ProtocolError("unexpected input request from the student's code")
    try:
        head, blob = prompt[len(CALLBACK_PREFIX):].split(":", 1)
        return base64.b64decode(head, validate=True), base64.b64decode(blob, validate=True)
    except ValueError:
        raise ProtocolError("malformed call from the student's code") from None


class _Outputs:
    """Builds a cell's outputs from IOPub messages, within size limits."""

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
                if self._room(len(text)):
                    self.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=text))
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
                if self._room(min(len(text), room)):
                    prev.text += text[:room]
                return
            text = text[:MAX_TEXT_OUTPUT]
            if self._room(len(text)):
                out.text = text
                self.outputs.append(out)
            return
        if kind == "error":
            out["traceback"] = [str(t)[:5000] for t in (out.get("traceback") or [])[:200]]
            out["evalue"] = str(out.get("evalue", ""))[:5000]
            if self._room(sum(len(t) for t in out["traceback"])):
                self.outputs.append(out)
            return
        data = out.get("data", {})
        for mime in list(data):
            value = data[mime]
            n = len(json.dumps(value)) if not isinstance(value, str) else len(value)
            if n > MAX_DATA_OUTPUT:
                data.pop(mime)
                data.setdefault("text/plain", f"[{mime} output of {n:,d} bytes not kept: too large]")
        if self._room(sum(len(v) if isinstance(v, str) else 100 for v in data.values())):
            self.outputs.append(out)


# ---------------------------------------------------------------------------------------
# The grader's `student`
# ---------------------------------------------------------------------------------------

_ALLOWED_LEAVES = (type(None), bool, int, float, complex, str, bytes, slice, range)
_FUNCTIONS = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.BuiltinMethodType,
              functools.partial)


class RemoteStudent(_StudentBase):
    """``student`` at grading time: every operation is a request to the kernel."""

    def __init__(self, session: KernelSession, timeout: float, source_cells: list[str]):
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_timeout", timeout)
        object.__setattr__(self, "_cells", list(source_cells))
        object.__setattr__(self, "_callbacks", {})  # token -> function, for the rest of the test
        object.__setattr__(self, "_tokens", itertools.count(1))
        object.__setattr__(self, "_in_callback", False)

    @property
    def source(self):
        from coursekit.sourcecheck import SourceView

        return SourceView(self._cells)

    def _check_args(self, value, depth=0) -> None:
        """Only data, references, generators, functions and classes may travel as arguments."""
        import torch

        if depth > 32:
            raise TypeError("arguments nested too deeply")
        if isinstance(value, (Ref, torch.Tensor, torch.Generator, torch.dtype, torch.device, type)) \
                or isinstance(value, _ALLOWED_LEAVES) or _is_numpy(value) or isinstance(value, _FUNCTIONS):
            return
        if isinstance(value, (list, tuple, set, frozenset)):
            for v in value:
                self._check_args(v, depth + 1)
            return
        if isinstance(value, dict):
            for k, v in value.items():
                self._check_args(k, depth + 1)
                self._check_args(v, depth + 1)
            return
        raise TypeError(f"a {type(value).__name__} cannot be passed to the notebook's code as an argument: "
                        "build it there (student.<helper>(...)) or copy it with student.send(obj)")

    def _op(self, op, path, args=(), kwargs=None, value=None):
        if self._in_callback:
            raise RuntimeError("a function the notebook's code calls back cannot itself ask the notebook: "
                               "it receives plain values (tensors, numbers, generators' states)")
        callbacks: dict = self._callbacks  # functions stay callable while the kernel holds them
        generators: dict = {}
        args, kwargs = tuple(args), dict(kwargs or {})
        if op != "send":
            self._check_args((args, kwargs, value))
        payload = pickle_request({"op": op, "path": path, "args": args, "kwargs": kwargs, "value": value},
                                 callbacks, generators, self._tokens)

        def on_callback(header: bytes, blob: bytes) -> str:
            import torch

            gens: list = []
            object.__setattr__(self, "_in_callback", True)
            try:
                call = decode(header, blob, self._make_handle)
                fn = callbacks[call["token"]]
                gens = find_instances(call["args"], call["kwargs"], torch.Generator)
                reply = {"value": fn(*call["args"], **call["kwargs"])}
            except Exception as exc:  # noqa: BLE001 - travels back and is raised in the student's code
                reply = {"error": (type(exc).__name__, str(exc)[:2000])}
            finally:
                object.__setattr__(self, "_in_callback", False)
            reply["generators"] = [g.get_state() for g in gens]  # what the function drew moves them on
            try:
                return pickle_request(reply, callbacks, generators, self._tokens)
            except Exception as exc:  # noqa: BLE001 - a value that cannot travel
                return pickle_request({"error": ("TypeError", f"cannot send the result back: {exc}")},
                                      callbacks, generators, self._tokens)

        header, blob = self._session.request(payload, self._timeout, on_callback)
        reply = decode(header, blob, self._make_handle)
        if not isinstance(reply, dict) or not ("result" in reply or "error" in reply):
            raise ProtocolError("malformed reply")
        if "error" in reply:
            err = reply["error"]
            if not isinstance(err, dict):
                raise ProtocolError("malformed error")
            if err.get("protocol"):
                raise ProtocolError(str(err.get("message", ""))[:500])
            if err.get("interrupted"):
                raise RemoteTimeout(f"the student's code did not finish within {self._timeout:g} s")
            exc = _builtin_exception(str(err.get("type", "Exception"))[:100], str(err.get("message", ""))[:2000])
            exc.from_student = True  # type: ignore[attr-defined]
            raise exc
        self._sync_back(reply, generators, call=op == "call")
        return reply["result"]

    def _sync_back(self, reply, generators, call: bool) -> None:
        """What a call gives back besides its result: the state of each generator it drew
        from (a generator is a stream the call consumes), and which tensor arguments it changed
        in place (positions only: the test's own tensors are never written to)."""
        import torch

        states = reply.get("generators") or {}
        if isinstance(states, dict):
            for tok, state in states.items():
                gen = generators.get(tok)
                if gen is not None and isinstance(state, torch.Tensor) and state.dtype == torch.uint8:
                    with contextlib.suppress(RuntimeError):
                        gen.set_state(state.cpu())
        if call:
            changed = reply.get("changed")
            changed = [i for i in changed if type(i) is int] if isinstance(changed, list) else []
            object.__setattr__(self, "_changed_inputs", changed[:1000])

    def _make_handle(self, hid: int, kind: str, text: str) -> Ref:
        return Ref(self, (("handle", hid),), (kind, text))

    def _reset(self) -> None:
        """Forget the kernel objects and functions handed out during a test."""
        with contextlib.suppress(Exception):
            self._op("reset", None)
        self._callbacks.clear()


def _is_numpy(value) -> bool:
    mod = type(value).__module__ or ""
    return mod == "numpy" or mod.startswith("numpy.")


# ---------------------------------------------------------------------------------------
# Judging one test cell
# ---------------------------------------------------------------------------------------

@dataclass
class Verdict:
    grade_id: str
    passed: bool
    printed: str = ""
    ename: str = ""
    message: str = ""
    kernel_died: bool = False

    def outputs(self) -> list:
        outs = []
        if self.printed.strip():
            outs.append(nbformat.v4.new_output("stream", name="stdout", text=self.printed[:MAX_TEXT_OUTPUT]))
        if not self.passed:
            outs.append(nbformat.v4.new_output("error", ename=self.ename or "AssertionError", evalue=self.message,
                                               traceback=[f"{self.ename or 'AssertionError'}: {self.message}"]))
        return outs


def _hidden_lines(source: str) -> set[int]:
    """Line numbers (1-based) of a cell's source that lie in a hidden-test region."""
    hidden, inside = set(), False
    for i, line in enumerate(source.splitlines(), 1):
        if "### BEGIN HIDDEN TESTS" in line:
            inside = True
        if inside:
            hidden.add(i)
        if "### END HIDDEN TESTS" in line:
            inside = False
    return hidden


def judge_cell(source: str, grade_id: str, namespace: dict) -> Verdict:
    """Run a test cell's code in ``namespace`` (the grader's) and say how it went."""
    filename = f"<test {grade_id}>"
    printed = io.StringIO()
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:
        return Verdict(grade_id, False, ename="SyntaxError", message=f"the test does not compile: {exc}")
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(code, namespace)
    except KernelDied as exc:
        return Verdict(grade_id, False, printed.getvalue(), "KernelDied", str(exc), kernel_died=True)
    except RemoteTimeout as exc:
        return Verdict(grade_id, False, printed.getvalue(), "TimeoutError", str(exc))
    except ProtocolError as exc:
        return Verdict(grade_id, False, printed.getvalue(), "ProtocolError",
                       f"the notebook's kernel did not send back a result ({exc})")
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a verdict
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) and not getattr(exc, "from_student", False):
            raise
        return Verdict(grade_id, False, printed.getvalue(), *_failure(exc, source, filename))
    return Verdict(grade_id, True, printed.getvalue())


def _failure(exc: BaseException, source: str, filename: str) -> tuple[str, str]:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    line = frames[-1].lineno if frames else None
    hidden = line is not None and line in _hidden_lines(source)
    name = getattr(exc, "student_type", None) or type(exc).__name__
    text = str(exc)
    if getattr(exc, "from_student", False):
        if isinstance(exc, NotImplementedError):
            return name, "not answered yet: your code raised NotImplementedError"
        if isinstance(exc, NameError) and "not defined in the notebook" in text:
            return name, f"{text}: the cell that defines it did not run, or failed"
        return name, f"your code raised {name}" + (f": {text}" if text else "")
    if isinstance(exc, AssertionError):
        if text:
            return "AssertionError", text
        if hidden or line is None:
            return "AssertionError", HIDDEN_FAILURE
        return "AssertionError", "failed: " + source.splitlines()[line - 1].strip()
    if hidden:
        return name, f"{HIDDEN_FAILURE}: {name}" + (f": {text[:300]}" if text else "")
    return name, text[:2000]


def judge_namespace(context_sources: list[str], device: str) -> dict:
    """The namespace test cells run in: the notebook's imports and given helpers (the cells
    the course file lists as judge context, taken from the released source, never from the
    submission), and ``DEVICE`` set to the kernel's device."""
    import torch

    module = types.ModuleType("__judge__")  # dataclasses and pickle look classes up by module
    sys.modules["__judge__"] = module
    ns: dict = module.__dict__
    ns["__builtins__"] = builtins
    exec("import importlib, importlib.util, math, os, subprocess, sys\nimport torch", ns)
    ns["DEVICE"] = torch.device(device)
    ns["check"] = ns["handin_report"] = lambda *a, **k: None
    from coursekit.selfcheck import warn_only

    ns["warn_only"] = warn_only  # checks in visible tests that warn (printed into the test's output)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for src in context_sources:
            exec(compile(src, "<judge context>", "exec"), ns)
    return ns


_CONTEXT_CACHE: dict = {}


def cached_judge_namespace(context_sources: list[str], device: str) -> dict:
    key = (tuple(context_sources), device)
    if key not in _CONTEXT_CACHE:
        _CONTEXT_CACHE.clear()
        _CONTEXT_CACHE[key] = judge_namespace(context_sources, device)
    return dict(_CONTEXT_CACHE[key])


# ---------------------------------------------------------------------------------------
# A whole notebook
# ---------------------------------------------------------------------------------------

def _gid(cell) -> str | None:
    meta = cell.metadata.get("nbgrader") or {}
    return meta.get("grade_id") if isinstance(meta, dict) else None


def is_test_cell(cell) -> bool:
    meta = cell.metadata.get("nbgrader") or {}
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def context_sources(nb, grade_ids) -> list[str]:
    """The code of the judge-context cells (by grade id, in the given order) of the released
    notebook ``nb`` (never the submission's own copies: nbgrader restores locked cells)."""
    by_id = {_gid(c): c.source for c in nb.cells if _gid(c)}
    missing = [g for g in grade_ids if g not in by_id]
    if missing:
        raise RuntimeError(f"judge context cells missing from the released notebook: {missing}")
    return [by_id[g] for g in grade_ids]


def _size(outputs) -> int:
    """About how many bytes ``outputs`` take in the notebook."""
    total = 0
    for out in outputs:
        for value in [out.get("text", "")] + list((out.get("data") or {}).values()) + list(out.get("traceback") or []):
            total += len(value) if isinstance(value, str) else len(json.dumps(value))
    return total


def _where(cell, index: int) -> str:
    return f"'{_gid(cell)}'" if _gid(cell) else f"cell {index + 1}"


def run_and_judge(nb, session: KernelSession, context: list[str], device: str, timeout: float,
                  notebook_timeout: float, max_restarts: int = 4, timings: dict | None = None) -> list[str]:
    """Run ``nb`` cell by cell in ``session`` (started here), judging its graded test cells
    in this process; every cell's outputs are replaced.  Returns notes for the instructor
    (time limits, kernel restarts).  ``timings`` (if given) receives the seconds spent
    starting the kernel, running the student's cells and judging the tests.

    One deadline holds for the whole submission: kernel starts, the student's cells, the
    requests its tests make and the replays after a restart all draw on the same
    ``notebook_timeout``.  A replay runs each cell exactly as it ran the first time (same
    request, outputs dropped), so the student's code cannot tell it is being replayed."""
    notes: list[str] = []
    clock = timings if timings is not None else {}
    for key in ("kernel_start", "cells", "tests"):
        clock.setdefault(key, 0.0)
    start = time.monotonic()
    deadline = start + notebook_timeout

    def left() -> float:
        return deadline - time.monotonic()

    over = f"the notebook ran longer than {notebook_timeout:g} s; the rest was not run"
    state = {"restarts": 0, "dead": False, "why": "the kernel had stopped earlier"}
    try:
        if session.launched():  # launched ahead of time (JudgedExecute's spare kernel)
            try:
                session.connect(timeout=max(1.0, left()))
            except KernelDied:
                session.start(timeout=max(1.0, left()))  # a spare that failed costs one more try
        else:
            session.start(timeout=max(1.0, left()))
    except KernelDied as exc:
        notes.append(str(exc))
        state["dead"] = True
        session.stop()
    clock["kernel_start"] += time.monotonic() - start
    student_cells = [c.source for c in nb.cells if c.cell_type == "code" and not is_test_cell(c)]
    student = RemoteStudent(session, timeout, student_cells)
    namespace = cached_judge_namespace(context, device)
    namespace["student"] = student
    ran_ok: list[str] = []     # cells that ran without error, to replay after a restart
    kept = 0                   # bytes of outputs kept so far

    def stop(note: str) -> None:
        notes.append(note)
        session.stop()
        state["dead"] = True
        if note == over:
            state["why"] = "the notebook's time limit was reached"

    def restart() -> None:
        """A fresh kernel that replays the cells that had run without error, within the
        notebook's own time limit."""
        if state["restarts"] >= max_restarts:
            return stop("the kernel stopped too often; the rest of the notebook was not run")
        state["restarts"] += 1
        try:
            if left() <= 0:
                return stop(over)
            session.start(timeout=left())
            for src in ran_ok:
                if left() <= 0:
                    return stop(over)
                run = session.execute(src, timeout=min(timeout, left()))
                if run.status == "timeout" and left() <= 0:
                    return stop(over)
                if run.status in ("died", "timeout"):
                    raise KernelDied(run.evalue)
        except KernelDied as exc:
            return stop(f"a fresh kernel could not replay the notebook ({exc}); the rest was not run")
        notes.append("a fresh kernel re-ran the cells before it, and the notebook went on")

    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if not state["dead"] and left() <= 0:
            stop(over)
        if is_test_cell(cell):
            cell.execution_count = None
            if state["dead"]:
                cell.outputs = Verdict(_gid(cell), False, ename="KernelDied",
                                       message=f"not judged: {state['why']}").outputs()
                continue
            object.__setattr__(student, "_timeout", max(0.5, min(timeout, left())))
            t0 = time.monotonic()
            verdict = judge_cell(cell.source, _gid(cell) or f"cell-{index}", namespace)
            student._reset()
            clock["tests"] += time.monotonic() - t0
            cell.outputs = verdict.outputs()
            if verdict.kernel_died or not session.alive():
                notes.append(f"the kernel died while test {_where(cell, index)} ran")
                restart()
            continue
        if state["dead"]:
            why = f"not run: {state['why']}"
            cell.outputs = [nbformat.v4.new_output("error", ename="NotRun", evalue=why, traceback=[why])]
            cell.execution_count = None
            continue
        t0 = time.monotonic()
        limit = min(timeout, left())
        try:
            run = session.execute(cell.source, timeout=limit)
        except KernelDied as exc:
            run = CellRun(outputs=[], status="died", ename="DeadKernelError", evalue=str(exc))
        clock["cells"] += time.monotonic() - t0
        kept += _size(run.outputs)
        cell.outputs = run.outputs if kept <= MAX_NOTEBOOK_OUTPUT else [nbformat.v4.new_output(
            "stream", name="stdout", text="[output not kept: the notebook's outputs passed "
                                          f"{MAX_NOTEBOOK_OUTPUT // 1_000_000} MB]\n")]
        cell.execution_count = run.execution_count
        if run.status == "ok":
            ran_ok.append(cell.source)
        elif run.status == "timeout":
            notes.append(f"{_where(cell, index)} ran longer than {limit:.0f} s and was interrupted")
        elif run.status == "died":
            notes.append(f"{_where(cell, index)}: {run.evalue}")
            restart()
    return notes
