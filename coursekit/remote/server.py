"""The request handler inside the student's kernel at grading time (``KernelServer``)."""
from __future__ import annotations

import base64
import io
import pickle

from .codec import CALLBACK_PREFIX, REPLY_MSG, REQUEST_KEY, ProtocolError, encode, safe_str, student_exception
from .core import Core, changed_positions, find_instances, tensor_args

# Imports inside functions: torch is imported where a tensor is handled, IPython where the kernel is:
# assignments without torch, and tests outside a kernel, import the server without them.


# ---------------------------------------------------------------------------------------
# In the kernel, at grading time: the server side of RemoteStudent
# ---------------------------------------------------------------------------------------

class _Callback:
    """Stands in the kernel for a function of the grader: calling it asks the grader."""

    def __init__(self, server: "KernelServer", token: int, name: str):
        self._server, self._token, self.__name__ = server, token, name

    def __call__(self, *args, **kwargs):
        return self._server.callback(self._token, args, kwargs)

    def __repr__(self):
        return f"<grader function {self.__name__}>"


class KernelServer:
    """Answers the grader's requests inside the student's kernel.

    Requests come as base64 pickles (the grader's own objects: pickle is safe in this
    direction); replies go out on IOPub as a ``course_judge_reply`` message whose two
    buffers are the JSON skeleton and the safetensors blob of ``encode``."""

    def __init__(self, shell):
        self.shell = shell
        self.kernel = shell.kernel
        self.core = Core(shell.user_ns)
        self._callbacks: dict[int, str] = {}

    # requests ---------------------------------------------------------------------------
    def _unpickler(self, data: bytes, generators: list):
        server = self
        import torch

        class _Unpickler(pickle.Unpickler):
            def persistent_load(self, pid):
                kind = pid[0]
                if kind == "ref":
                    return server.core.resolve(pid[1])
                if kind == "callback":
                    return _Callback(server, pid[1], pid[2])
                if kind == "generator":
                    g = torch.Generator(device=pid[2])
                    g.set_state(torch.frombuffer(bytearray(pid[1]), dtype=torch.uint8).clone())
                    generators.append((pid[3], g))
                    return g
                raise pickle.UnpicklingError("unknown persistent id")

        return _Unpickler(io.BytesIO(data))

    def handle(self, token: str) -> None:
        """Answer the request whose execute_request runs this call: its payload is in that
        message's metadata (``REQUEST_KEY``)."""
        parent = self.kernel.get_parent("shell")
        generators: list = []
        try:
            payload = (parent.get("metadata") or {}).get(REQUEST_KEY)
            if not isinstance(payload, str):
                raise ProtocolError("a request without its payload")
            req = self._unpickler(base64.b64decode(payload), generators).load()
            op, path = req["op"], req.get("path")
            args, kwargs, value = req.get("args", ()), req.get("kwargs", {}), req.get("value")
            before = tensor_args(args, kwargs) if op == "call" else []
            result = self.core.perform(op, path, args, kwargs, value)
            reply = {"result": result,
                     "generators": {tok: g.get_state() for tok, g in generators},
                     "changed": changed_positions(before)}
            header, blob = encode(reply, self.core.register)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported as data
            header, blob = encode({"error": error_info(exc)}, self.core.register)
        self.kernel.session.send(self.kernel.iopub_socket, REPLY_MSG, {"token": token},
                                 parent=parent, buffers=[header, blob])

    # callbacks --------------------------------------------------------------------------
    def callback(self, token: int, args, kwargs):
        """Call the grader's function ``token``: arguments go out as data (generators as their
        state, which comes back changed as the function drew from it)."""
        import torch

        header, blob = encode({"token": token, "args": list(args), "kwargs": dict(kwargs)}, self.core.register)
        prompt = CALLBACK_PREFIX + base64.b64encode(header).decode() + ":" + base64.b64encode(blob).decode()
        answer = self.kernel.raw_input(prompt)
        reply = self._unpickler(base64.b64decode(answer), []).load()
        gens = find_instances(args, kwargs, torch.Generator)
        for gen, state in zip(gens, reply.get("generators") or []):
            gen.set_state(state)
        if "error" in reply:
            raise student_exception(*reply["error"])
        return reply["value"]



def error_info(exc: BaseException) -> dict:
    if isinstance(exc, KeyboardInterrupt):
        return {"type": "KeyboardInterrupt", "message": "interrupted (time limit)", "interrupted": True}
    name = type(exc).__name__ if isinstance(type(exc).__name__, str) else "Exception"
    return {"type": name[:100], "message": safe_str(exc, 2000),
            "not_implemented": isinstance(exc, NotImplementedError),
            "protocol": isinstance(exc, (ProtocolError, pickle.UnpicklingError))}


def install_server(shell=None) -> KernelServer:
    """Put the request handler into the kernel (run once by the grader when the kernel starts)."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    server = KernelServer(shell)
    shell.user_ns["__course_judge__"] = server
    return server


