"""What a request does on the notebook's side (in the notebook and in the kernel): ``Core``
resolves references and performs operations; the helpers walk, copy and compare the
tensor arguments of a call."""
from __future__ import annotations

import itertools
from typing import Any

from .codec import Handed, ProtocolError

# Imports inside functions: torch is imported where a tensor is handled: assignments without torch import
# this module without it.

MAX_CHANGE_CHECK_BYTES = 64 << 20  # tensor arguments larger than this are not checked for changes

class _NotFound:
    def __repr__(self):
        return "<missing>"


MISSING = _NotFound()

# ---------------------------------------------------------------------------------------
# What happens on the notebook's side (the same code in the notebook and in the kernel)
# ---------------------------------------------------------------------------------------

class Core:
    """Performs reference operations on a namespace and keeps the objects handed out."""

    def __init__(self, namespace: dict):
        self.ns = namespace
        self.objects: dict[int, Any] = {}
        self._ids: dict[int, int] = {}
        self._next = itertools.count(1)
        self._replaced: dict[int, dict] = {}

    def register(self, obj) -> int:
        key = id(obj)
        hid = self._ids.get(key)
        if hid is not None and self.objects.get(hid) is obj:
            return hid
        hid = next(self._next)
        self.objects[hid] = obj
        self._ids[key] = hid
        return hid

    def reset(self) -> None:
        """Forget the objects handed out (called between tests)."""
        self.objects.clear()
        self._ids.clear()

    def resolve(self, path: tuple):
        kind, arg = path[0]
        if kind == "global":
            if arg not in self.ns:
                raise NameError(f"name {arg!r} is not defined in the notebook")
            obj = self.ns[arg]
        elif kind == "handle":
            if arg not in self.objects:
                raise LookupError("a reference from an earlier test was used after it ended")
            obj = self.objects[arg]
        else:
            raise ProtocolError("bad reference")
        for step, a in path[1:]:
            obj = getattr(obj, a) if step == "attr" else obj[a]
        return obj

    def perform(self, op: str, path: tuple | None, args=(), kwargs=None, value=None):
        if op == "call":
            return self.resolve(path)(*args, **(kwargs or {}))
        if op == "get":
            return self.resolve(path)
        if op == "set":
            *head, (step, a) = path
            if not head:
                self.ns[a] = value
            else:
                target = self.resolve(tuple(head))
                if step == "attr":
                    setattr(target, a, value)
                else:
                    target[a] = value
            return None
        if op == "iter":
            return Iter(iter(self.resolve(path)))
        if op == "next":
            it = self.resolve(path)
            try:
                return (False, next(it.it))
            except StopIteration:
                return (True, None)
        if op == "len":
            return len(self.resolve(path))
        if op == "send":
            return Handed(value)
        if op == "replace":
            saved = {name: self.ns.get(name, MISSING) for name in value}
            self.ns.update(value)
            token = next(self._next)
            self._replaced[token] = saved
            return token
        if op == "restore":
            for name, old in self._replaced.pop(value, {}).items():
                if old is MISSING:
                    self.ns.pop(name, None)
                else:
                    self.ns[name] = old
            return None
        if op == "reset":
            self.reset()
            return None
        raise ProtocolError(f"unknown operation {op!r}")


class Iter:
    """An iterator handed out as a handle (never as data)."""

    def __init__(self, it):
        self.it = it




def find_instances(args, kwargs, cls) -> list:
    """Objects of ``cls`` among the arguments (top level and inside lists, tuples and dicts),
    in a fixed order: both ends of a call walk them the same way."""
    found = []

    def walk(v, depth=0):
        if depth > 8:
            return
        if isinstance(v, cls):
            found.append(v)
        elif type(v) in (list, tuple):
            for x in v:
                walk(x, depth + 1)
        elif type(v) is dict:
            for x in v.values():
                walk(x, depth + 1)

    walk(list(args), 0)
    walk(dict(kwargs), 0)
    return found


def tensor_args(args, kwargs, copies: bool = True) -> list:
    """Tensors among the arguments (``find_instances`` order), each with a copy to tell
    afterwards whether the call changed it in place (None when ``copies`` is false or the
    tensor is too large to copy back)."""
    import torch

    out = []
    for v in find_instances(args, kwargs, torch.Tensor):
        small = v.numel() * v.element_size() <= MAX_CHANGE_CHECK_BYTES and v.layout == torch.strided \
            and v.device.type != "meta"
        out.append((v, torch.Tensor.detach(v).clone() if small and copies else None))
    return out


def changed_positions(before: list) -> list[int]:
    """Positions (``tensor_args`` order) of the tensors a call changed in place."""
    return [i for i, (t, copy_before) in enumerate(before)
            if copy_before is not None and not same_tensor(t, copy_before)]


def copy_tensors(value, depth: int = 0):
    """``value`` with every tensor in it (inside lists, tuples and dicts) replaced by a copy:
    the notebook's code receives copies, as it does at grading time."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.Tensor.detach(value).clone().requires_grad_(value.requires_grad)
    if depth > 8:
        return value
    if type(value) in (list, tuple):
        return type(value)(copy_tensors(v, depth + 1) for v in value)
    if type(value) is dict:
        return {k: copy_tensors(v, depth + 1) for k, v in value.items()}
    return value


def same_tensor(t, before) -> bool:
    import torch

    now = torch.Tensor.detach(t)
    if now.shape != before.shape or now.dtype != before.dtype or now.device != before.device:
        return False
    if torch.equal(now, before):
        return True
    if now.is_floating_point() or now.is_complex():  # NaN != NaN: equal where both are NaN
        return bool(((now == before) | (now.isnan() & before.isnan())).all())
    return False


