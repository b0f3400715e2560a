"""``student`` in the grader's process: every operation is a request to the kernel."""
from __future__ import annotations

import base64
import contextlib
import functools
import io
import itertools
import pickle
import sys
import types

from ..sourcecheck import SourceView
from .codec import CALLBACK_PREFIX, ProtocolError, RemoteTimeout, decode, student_exception
from .core import find_instances
from .refs import Ref, StudentBase, ref_path

# Imports inside functions: torch is imported where a tensor is handled: assignments without torch import
# the client without it.


# ---------------------------------------------------------------------------------------
# The grader's side of the request encoding
# ---------------------------------------------------------------------------------------

def pickle_request(request: dict, callbacks: dict, generators: dict, tokens=None) -> str:
    """Pickle a request for the kernel: references, functions (as callbacks) and generators
    (as their state) travel by persistent id.  ``tokens`` (an iterator) numbers the callbacks,
    so that a number is never reused within a grading session."""
    tokens = tokens if tokens is not None else itertools.count(len(callbacks) + 1)
    import torch

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Ref):
                return ("ref", ref_path(obj))
            if isinstance(obj, torch.Generator):
                token = len(generators) + 1
                generators[token] = obj
                return ("generator", bytes(obj.get_state().numpy().tobytes()), str(obj.device), token)
            if isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinMethodType)) \
                    and not _is_importable(obj):
                token = next(tokens)
                callbacks[token] = obj
                return ("callback", token, getattr(obj, "__name__", "function")[:100])
            return None

    buf = io.BytesIO()
    _Pickler(buf, protocol=5).dump(request)
    return base64.b64encode(buf.getvalue()).decode()


def _is_importable(fn) -> bool:
    """True for a function defined at the top level of an importable module (e.g.
    torch.relu, math.sqrt): those travel by name, not as callbacks."""
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", "")
    if not mod or mod in ("__main__", "__judge__") or "<" in qual:
        return False
    target = sys.modules.get(mod)
    for part in qual.split("."):
        target = getattr(target, part, None)
    return target is fn


def callback_error(message: str, kind: str = "RuntimeError") -> str:
    """The answer to a call back that cannot be made: an exception raised in the student's code."""
    return pickle_request({"error": (kind, message)}, {}, {})


def callback_parts(prompt: str) -> tuple[bytes, bytes]:
    """The (header, blob) of a call the student's code makes back to the grader."""
    if not prompt.startswith(CALLBACK_PREFIX):
        raise ProtocolError("unexpected input request from the student's code")
    try:
        head, blob = prompt[len(CALLBACK_PREFIX):].split(":", 1)
        return base64.b64decode(head, validate=True), base64.b64decode(blob, validate=True)
    except ValueError:
        raise ProtocolError("malformed call from the student's code") from None


# ---------------------------------------------------------------------------------------
# The grader's `student`
# ---------------------------------------------------------------------------------------

_ALLOWED_LEAVES = (type(None), bool, int, float, complex, str, bytes, slice, range)
_FUNCTIONS = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.BuiltinMethodType,
              functools.partial)


class RemoteStudent(StudentBase):
    """``student`` at grading time: every operation is a request to the kernel."""

    def __init__(self, session, timeout: float, source_cells: list[str]):
        """``session`` carries one request at a time to the kernel: ``session.request(payload,
        timeout, on_callback) -> (header, blob)`` (``autograder.judge.kernel.KernelSession``)."""
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_timeout", timeout)
        object.__setattr__(self, "_cells", list(source_cells))
        object.__setattr__(self, "_callbacks", {})  # token -> function, for the rest of the test
        object.__setattr__(self, "_tokens", itertools.count(1))
        object.__setattr__(self, "_in_callback", False)

    @property
    def source(self):
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
            exc = student_exception(str(err.get("type", "Exception"))[:100], str(err.get("message", ""))[:2000])
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


