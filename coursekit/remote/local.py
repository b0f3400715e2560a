"""``student`` in the notebook: the same rules as at grading time, applied directly."""
from __future__ import annotations

import contextlib
import copy

from ..sourcecheck import SourceView
from .codec import decode, encode
from .core import Core, changed_positions, copy_tensors, tensor_args
from .refs import Ref, StudentBase, ref_path

# Imports inside functions: IPython (and __main__, outside IPython) give the notebook's namespace at call
# time: the kernel they run in is only known then.


class LocalStudent(StudentBase):
    """``student`` inside the notebook: the same rules as at grading time, applied directly.

    Results go through the same encoding as at grading time, so what a visible test sees
    in the notebook is what it sees when graded."""

    def __init__(self, namespace: dict | None = None):
        object.__setattr__(self, "_ns", namespace)
        object.__setattr__(self, "_core", None)

    def _namespace(self) -> dict:
        if self._ns is not None:
            return self._ns
        try:
            from IPython import get_ipython

            ip = get_ipython()
        except ImportError:
            ip = None
        if ip is None:
            import __main__

            return vars(__main__)
        return ip.user_ns

    def _get_core(self) -> Core:
        ns = self._namespace()
        core = self._core
        if core is None or core.ns is not ns:
            core = Core(ns)
            object.__setattr__(self, "_core", core)
        return core

    def _resolve_args(self, value):
        if isinstance(value, Ref):
            return self._get_core().resolve(ref_path(value))
        if type(value) in (list, tuple):
            return type(value)(self._resolve_args(v) for v in value)
        if type(value) is dict:
            return {k: self._resolve_args(v) for k, v in value.items()}
        return value

    def _op(self, op, path, args=(), kwargs=None, value=None):
        core = self._get_core()
        if op == "send":
            value = copy.deepcopy(value)
        elif op == "set":
            value = self._resolve_args(value)
        elif op == "replace":
            value = {k: self._resolve_args(v) for k, v in value.items()}
        args = copy_tensors(self._resolve_args(tuple(args)))
        kwargs = copy_tensors(self._resolve_args(dict(kwargs or {})))
        before = tensor_args(args, kwargs) if op == "call" else []
        try:
            result = core.perform(op, path, args, kwargs, value)
        except Exception as exc:
            with contextlib.suppress(Exception):
                exc.from_student = True  # as at grading time: the notebook's code raised it
            raise
        if op == "call":
            object.__setattr__(self, "_changed_inputs", changed_positions(before))
        header, blob = encode(result, core.register)
        return decode(header, blob, lambda hid, kind, text: Ref(self, (("handle", hid),), (kind, text)))

    @property
    def source(self):
        """The code this notebook ran (its cells, in order), for checks on how it is written."""
        ns = self._namespace()
        cells = [c for c in ns.get("In", []) if isinstance(c, str) and c.strip()]
        return SourceView(cells)


def local_student(namespace: dict | None = None) -> LocalStudent:
    return LocalStudent(namespace)


