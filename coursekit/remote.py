"""``student``: how test cells call a notebook's code, in the notebook and from the grader.

Every test cell of an assignment calls the notebook's functions and classes through
``student``::

    _out, _w = student.calculate_multihead_attention(_q.to(DEVICE), _k.to(DEVICE), _v.to(DEVICE))
    assert float((_out.cpu() - _ref).abs().max()) <= 1e-5

In the notebook (self-check, ``nbgrader validate``) ``student`` is a :class:`LocalStudent`
bound to the notebook's own namespace.  At grading time the very same test code runs in
the grader's process, outside the student's kernel, with ``student`` bound to that kernel
through a small request/reply protocol (``autograder.judge.RemoteStudent``): the grader
chooses the inputs, the kernel runs the student's code on them, and only plain values come
back.  Comparisons with references, and so the grade, happen where student code cannot
reach.  Both versions follow the same rules, so a visible test behaves the same way in
the notebook and at grading time:

* ``student.NAME`` refers to the notebook's global ``NAME``; ``.attr`` and ``[key]`` on it
  refer further (nothing is evaluated until it is called or fetched).
* Calling a reference runs the code there.  Arguments are data (tensors, numbers, strings,
  ``None``, lists, tuples, dicts and sets of these, ``torch.dtype``/``torch.device``),
  ``torch.Generator`` objects (their state travels both ways), other references, and plain
  functions, which the student's code can call back.  Tensors keep their device and travel
  as copies: whatever the code does to an argument, the caller's tensor stays as it was
  (``student.changed_inputs()`` tells which tensor arguments the last call changed in place,
  for a test that checks it).  A ``torch.Generator`` is the one argument that comes back
  changed: a call that draws from it moves it on, as a local call would.
* A result that is data comes back as a copy: tensors detached (same dtype and device, no
  gradient),
  mappings as ``dict``, other sequences as ``list``/``tuple``.  Anything else (a model, a
  data loader, a dataset) stays where it is and comes back as a reference to it.
* ``student.fetch(ref)`` evaluates a reference without calling it
  (``student.fetch(student.model.training)``); ``student.send(obj)`` puts a copy of a
  local object next to the notebook's code and returns a reference to it;
  ``with student.replaced(name=value): ...`` swaps a global of the notebook for the block;
  ``student.source`` reads the notebook's code (``coursekit.sourcecheck``).

Kernel to grader, nothing but JSON and safetensors travels (never pickle), in messages of
bounded size: whatever the student's code does, the grader only ever decodes data.
"""
from __future__ import annotations

import base64
import collections.abc
import contextlib
import copy
import io
import itertools
import json
import math
import pickle
import types
from typing import Any, Callable

__all__ = ["Ref", "LocalStudent", "StudentError", "ProtocolError", "RESERVED", "local_student",
           "encode", "decode", "Core", "KernelServer", "install_server"]

# names that `student` keeps for itself (a notebook global of one of these names is reached
# as student["name"]).
RESERVED = frozenset({"fetch", "send", "replaced", "source", "changed_inputs"})

# What one reply may hold.  The largest the assignments need is a fine-tuned model's weights
# (finetune's state_dict: 86.6 MiB of tensors, a few kB of structure).  The grader checks
# each limit before it parses anything: the tensors are read in place from the received
# message, and the structure, at most 1 MiB of JSON and 100,000 values, becomes at most about
# 16 MiB of Python objects.  So a reply of N bytes costs the grader about N + 16 MiB.
MAX_TENSOR_BYTES = 128 << 20     # the tensors of one reply
MAX_HEADER_BYTES = 1 << 20       # the JSON skeleton of one reply
MAX_REPLY_BYTES = MAX_TENSOR_BYTES + MAX_HEADER_BYTES
MAX_NODES = 100_000              # values in one reply
MAX_DEPTH = 64                   # nesting of containers
MAX_STR = MAX_HEADER_BYTES       # characters in one string
MAX_REPR = 300
MAX_SYNC_BACK_BYTES = 64 << 20   # tensor arguments larger than this are not checked for changes

REPLY_MSG = "course_judge_reply"
CALLBACK_PREFIX = "course_judge_callback:"

_DTYPES = {  # the dtypes that travel, by name (safetensors supports them all)
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64",
}


class StudentError(Exception):
    """An exception raised by the student's code, reported by type name and message."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name, self.message = type_name, message


class ProtocolError(RuntimeError):
    """What came back is not a well-formed result (a broken or tampered kernel)."""


class _NotFound:
    def __repr__(self):
        return "<missing>"


MISSING = _NotFound()


def _builtin_exception(type_name: str, message: str) -> BaseException:
    """The exception to raise on the caller's side for one raised by student code: the
    built-in class of that name (so ``except ValueError`` works), else StudentError."""
    import builtins

    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        try:
            exc = cls(message)
        except Exception:  # noqa: BLE001 - an exotic constructor: fall back to the generic class
            return StudentError(type_name, message)
        exc.student_type = type_name  # type: ignore[attr-defined]
        return exc
    return StudentError(type_name, message)


def _safe_str(obj: Any, limit: int = 2000) -> str:
    try:
        text = str(obj)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return "<unprintable>"
    return text if len(text) <= limit else text[:limit] + "..."


def _type_name(obj: Any) -> str:
    t = type(obj)
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", "?")
    return name if mod in ("builtins", "__main__", "") else f"{mod}.{name}"


# ---------------------------------------------------------------------------------------
# Wire format, kernel -> grader: a JSON skeleton and one safetensors blob
# ---------------------------------------------------------------------------------------

def encode(value: Any, register: Callable[[Any], int]) -> tuple[bytes, bytes]:
    """(JSON skeleton, safetensors blob) for ``value``; objects that are not data are
    passed to ``register`` and travel as handles."""
    import torch

    tensors: dict[str, Any] = {}
    budget = [MAX_NODES, MAX_TENSOR_BYTES]

    def tensor(t) -> dict:
        if t.device.type == "meta":
            return {"$meta": [int(s) for s in t.shape], "dtype": str(t.dtype).replace("torch.", "")}
        if t.layout != torch.strided:
            t = t.to_dense()
        dtype = str(t.dtype).replace("torch.", "")
        if dtype not in _DTYPES:
            return handle(t)
        size = t.numel() * t.element_size()
        budget[1] -= size
        if budget[1] < 0:
            raise ProtocolError("the result is too large to send back "
                                f"(more than {MAX_TENSOR_BYTES >> 20} MiB of tensors)")
        key = f"t{len(tensors)}"
        device = str(t.device)
        tensors[key] = torch.Tensor.detach(t).to("cpu", copy=True).contiguous()
        return {"$tensor": key, "device": device}

    def handle(obj) -> dict:
        return {"$handle": register(obj), "type": _type_name(obj),
                "repr": _safe_str(_repr(obj), MAX_REPR)}

    def walk(v, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise ProtocolError(f"the result has more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise ProtocolError(f"the result is nested more than {MAX_DEPTH} levels deep")
        t = type(v)
        if t is _Handed:
            return handle(v.obj)
        if v is None or t is bool:
            return v
        if t is int:
            if abs(v) < 1 << 4000:
                return v
            return handle(v)
        if t is float:
            return v if math.isfinite(v) else {"$float": repr(v)}
        if t is str:
            if len(v) > MAX_STR:
                raise ProtocolError(f"a string in the result is longer than {MAX_STR} characters")
            return v
        if t is complex:
            return {"$complex": [walk(v.real, depth + 1), walk(v.imag, depth + 1)]}
        if t in (bytes, bytearray):
            if len(v) > MAX_STR:
                raise ProtocolError("a bytes value in the result is too long")
            return {"$bytes": base64.b64encode(bytes(v)).decode()}
        if isinstance(v, torch.Tensor):
            return tensor(v)
        if t is torch.Generator:
            return {"$generator": tensor(v.get_state()), "device": str(v.device)}
        if t is torch.dtype:
            return {"$dtype": str(v).replace("torch.", "")}
        if t is torch.device:
            return {"$device": str(v)}
        if t is torch.Size:
            return {"$tuple": [int(x) for x in v]}
        if t is slice:
            return {"$slice": [walk(v.start, depth + 1), walk(v.stop, depth + 1), walk(v.step, depth + 1)]}
        np = _numpy()
        if np is not None:
            if isinstance(v, np.ndarray):
                if v.dtype.kind in "biuf" and str(v.dtype) in _DTYPES:
                    return {"$ndarray": tensor(torch.from_numpy(v.copy()))}
                return handle(v)
            if isinstance(v, np.generic) and v.dtype.kind in "biuf":
                return {"$np": str(v.dtype), "v": walk(v.item(), depth + 1)}
        if isinstance(v, collections.abc.Mapping):
            return {"$dict": [[walk(k, depth + 1), walk(x, depth + 1)] for k, x in _items(v)]}
        if isinstance(v, tuple):
            return {"$tuple": [walk(x, depth + 1) for x in _bounded(v)]}
        if isinstance(v, list):
            return {"$list": [walk(x, depth + 1) for x in _bounded(v)]}
        if isinstance(v, (set, frozenset)):
            return {"$set": [walk(x, depth + 1) for x in _bounded(v)], "frozen": isinstance(v, frozenset)}
        return handle(v)

    skeleton = walk(value, 0)
    header = json.dumps({"value": skeleton}, allow_nan=False).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError("the result is too large to send back "
                            f"(its structure takes more than {MAX_HEADER_BYTES >> 20} MiB)")
    from safetensors.torch import save

    blob = save(tensors) if tensors else b""
    return header, blob


def _repr(obj) -> str:
    try:
        return repr(obj)
    except BaseException:  # noqa: BLE001
        return f"<{_type_name(obj)}>"


def _items(mapping):
    out = []
    for i, item in enumerate(mapping.items()):
        if i >= MAX_NODES:
            raise ProtocolError("a mapping in the result is too long")
        out.append(item)
    return out


def _bounded(seq):
    out = []
    for i, item in enumerate(seq):
        if i >= MAX_NODES:
            raise ProtocolError("a sequence in the result is too long")
        out.append(item)
    return out


def _numpy():
    try:
        import numpy
    except ImportError:  # pragma: no cover
        return None
    return numpy


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                       "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                       "U16": "uint16", "U32": "uint32", "U64": "uint64"}


def read_tensors(blob) -> dict[str, Any]:
    """The tensors of a safetensors blob, read in place: when ``blob`` is a writable buffer
    (a received message), each tensor uses its memory and nothing is copied; otherwise the
    blob is copied once.  Every offset, size and type is checked against the format (the
    header's length, contiguous non-overlapping data, shape times item size) before use."""
    import struct

    import torch

    view = memoryview(blob).cast("B")
    if view.readonly:
        view = memoryview(bytearray(view))
    if len(view) < 8:
        raise ProtocolError("reply tensors are not valid safetensors (too short)")
    (n,) = struct.unpack("<Q", view[:8])
    if n > min(len(view) - 8, 8 << 20):
        raise ProtocolError("reply tensors are not valid safetensors (header length)")
    try:
        index = json.loads(bytes(view[8:8 + n]))
    except (ValueError, RecursionError):
        raise ProtocolError("reply tensors are not valid safetensors (header)") from None
    if not isinstance(index, dict):
        raise ProtocolError("reply tensors are not valid safetensors (header)")
    index.pop("__metadata__", None)
    data = view[8 + n:]
    entries = []
    for name, info in index.items():
        try:
            dtype = getattr(torch, _SAFETENSORS_DTYPES[info["dtype"]])
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ProtocolError("reply tensors are not valid safetensors (entry)") from None
        count = math.prod(shape) if shape else 1
        if any(d < 0 for d in shape) or not 0 <= begin <= end <= len(data) \
                or count * dtype.itemsize != end - begin:
            raise ProtocolError("reply tensors are not valid safetensors (sizes)")
        entries.append((begin, end, name, dtype, shape))
    entries.sort()
    if any(a[1] > b[0] for a, b in zip(entries, entries[1:])):
        raise ProtocolError("reply tensors are not valid safetensors (overlapping data)")
    out = {}
    import warnings

    for begin, end, name, dtype, shape in entries:
        chunk = data[begin:end]
        if begin % dtype.itemsize or (8 + n) % dtype.itemsize:  # unaligned: one copy of this tensor
            chunk = memoryview(bytearray(chunk))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flat = torch.frombuffer(chunk, dtype=dtype) if end > begin else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(shape)
    return out


def decode(header: bytes, blob: bytes, make_handle: Callable[[int, str, str], Any]) -> Any:
    """The value that ``encode`` wrote.  This is where untrusted bytes become objects:
    only JSON and safetensors are parsed, every size and depth is bounded, and a
    malformed message raises ProtocolError."""
    import torch

    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError(f"reply too large: its structure takes more than {MAX_HEADER_BYTES >> 20} MiB")
    if len(blob) > MAX_TENSOR_BYTES:
        raise ProtocolError(f"reply too large: more than {MAX_TENSOR_BYTES >> 20} MiB of tensors")
    header = bytes(header)
    # all values in a container but the first follow a ",": counted before parsing, so that
    # json.loads never builds more than a few hundred thousand objects
    if header.count(b"[") + header.count(b"{") + header.count(b",") > 2 * MAX_NODES:
        raise ProtocolError(f"reply too large: more than {MAX_NODES} values")
    try:
        skeleton = json.loads(header)["value"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ProtocolError(f"reply is not valid JSON ({type(exc).__name__})") from None
    del header
    tensors = read_tensors(blob) if len(blob) else {}
    count = [0]

    def need(cond, what):
        if not cond:
            raise ProtocolError(f"malformed reply: {what}")

    def device_ok(name: str):
        try:
            dev = torch.device(name)
        except (RuntimeError, TypeError, ValueError):
            return torch.device("cpu")
        if dev.type == "cuda" and torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count():
            return dev
        if dev.type == "mps" and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return dev
        return torch.device("cpu")

    def tensor(node):
        key = node.get("$tensor")
        need(isinstance(key, str) and key in tensors, "unknown tensor")
        t = tensors[key]
        need(str(t.dtype).replace("torch.", "") in _DTYPES, "tensor dtype")
        dev = device_ok(node.get("device", "cpu")) if isinstance(node.get("device", "cpu"), str) else torch.device("cpu")
        return t.to(dev) if dev.type != "cpu" else t

    def walk(node, depth):
        count[0] += 1
        need(count[0] <= MAX_NODES and depth <= MAX_DEPTH + 2, "too many or too deeply nested values")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        need(isinstance(node, dict) and len(node) >= 1, "unexpected JSON value")
        if "$tensor" in node:
            return tensor(node)
        if "$list" in node:
            need(isinstance(node["$list"], list), "list")
            return [walk(x, depth + 1) for x in node["$list"]]
        if "$tuple" in node:
            need(isinstance(node["$tuple"], list), "tuple")
            return tuple(walk(x, depth + 1) for x in node["$tuple"])
        if "$dict" in node:
            need(isinstance(node["$dict"], list), "dict")
            out = {}
            for pair in node["$dict"]:
                need(isinstance(pair, list) and len(pair) == 2, "dict item")
                key = walk(pair[0], depth + 1)
                try:
                    out[key] = walk(pair[1], depth + 1)
                except TypeError:
                    raise ProtocolError("malformed reply: unhashable dict key") from None
            return out
        if "$set" in node:
            need(isinstance(node["$set"], list), "set")
            try:
                items = [walk(x, depth + 1) for x in node["$set"]]
                return frozenset(items) if node.get("frozen") else set(items)
            except TypeError:
                raise ProtocolError("malformed reply: unhashable set item") from None
        if "$float" in node:
            need(node["$float"] in ("nan", "inf", "-inf"), "float")
            return float(node["$float"])
        if "$complex" in node:
            re_, im = (walk(x, depth + 1) for x in node["$complex"])
            need(isinstance(re_, float) and isinstance(im, float), "complex")
            return complex(re_, im)
        if "$bytes" in node:
            try:
                return base64.b64decode(node["$bytes"], validate=True)
            except (ValueError, TypeError):
                raise ProtocolError("malformed reply: bytes") from None
        if "$generator" in node:
            state = node["$generator"]
            need(isinstance(state, dict) and "$tensor" in state, "generator")
            gen = torch.Generator(device=device_ok(str(node.get("device", "cpu"))))
            try:
                gen.set_state(tensor(state).cpu())
            except (RuntimeError, TypeError):
                raise ProtocolError("malformed reply: generator state") from None
            return gen
        if "$dtype" in node:
            dt = getattr(torch, str(node["$dtype"]), None)
            need(isinstance(dt, torch.dtype), "dtype")
            return dt
        if "$device" in node:
            try:
                return torch.device(str(node["$device"]))
            except (RuntimeError, TypeError, ValueError):
                raise ProtocolError("malformed reply: device") from None
        if "$slice" in node:
            parts = [walk(x, depth + 1) for x in node["$slice"]]
            need(len(parts) == 3, "slice")
            return slice(*parts)
        if "$meta" in node:
            shape = node["$meta"]
            need(isinstance(shape, list) and all(isinstance(s, int) and 0 <= s < 1 << 62 for s in shape), "meta")
            dt = getattr(torch, str(node.get("dtype")), None)
            need(isinstance(dt, torch.dtype), "meta dtype")
            return torch.empty(shape, dtype=dt, device="meta")
        if "$ndarray" in node:
            inner = node["$ndarray"]
            need(isinstance(inner, dict) and "$tensor" in inner, "ndarray")
            return tensor(inner).cpu().numpy()
        if "$np" in node:
            np = _numpy()
            need(np is not None and node["$np"] in _DTYPES, "numpy scalar")
            value = walk(node.get("v"), depth + 1)
            need(isinstance(value, (bool, int, float)), "numpy scalar value")
            return np.dtype(node["$np"]).type(value)
        if "$handle" in node:
            hid = node["$handle"]
            need(isinstance(hid, int) and not isinstance(hid, bool), "handle id")
            return make_handle(hid, str(node.get("type", "?"))[:200], str(node.get("repr", ""))[:MAX_REPR])
        raise ProtocolError("malformed reply: unknown tag")

    return walk(skeleton, 0)


# ---------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------

class Ref:
    """A reference to an object of the notebook (see the module docstring)."""

    __slots__ = ("_Ref__student", "_Ref__path", "_Ref__info")

    def __init__(self, student, path: tuple, info: tuple = ("", "")):
        object.__setattr__(self, "_Ref__student", student)
        object.__setattr__(self, "_Ref__path", path)
        object.__setattr__(self, "_Ref__info", info)

    def __getattr__(self, name: str) -> "Ref":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Ref(self.__student, self.__path + (("attr", name),))

    def __getitem__(self, key) -> "Ref":
        return Ref(self.__student, self.__path + (("item", key),))

    def __call__(self, *args, **kwargs):
        return self.__student._op("call", self.__path, args=args, kwargs=kwargs)

    def __setattr__(self, name, value):
        self.__student._op("set", self.__path + (("attr", name),), value=value)

    def __setitem__(self, key, value):
        self.__student._op("set", self.__path + (("item", key),), value=value)

    def __iter__(self):
        it = self.__student._op("iter", self.__path)
        while True:
            done, item = self.__student._op("next", it._Ref__path)
            if done:
                return
            yield item

    def __len__(self):
        return self.__student._op("len", self.__path)

    def __bool__(self):
        raise TypeError(f"{self!r} is a reference to the notebook's object: "
                        "use student.fetch(...) to get its value")

    def __repr__(self):
        kind, text = self.__info
        where = _path_text(self.__path)
        return f"<student {where}" + (f": {kind}" if kind else "") + ">"

    __hash__ = object.__hash__


def _path_text(path) -> str:
    out = ""
    for step, arg in path:
        if step == "global":
            out = str(arg)
        elif step == "handle":
            out = f"#{arg}"
        elif step == "attr":
            out += f".{arg}"
        else:
            out += f"[{arg!r}]"
    return out


def _ref_path(ref: Ref) -> tuple:
    return object.__getattribute__(ref, "_Ref__path")


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
            return _Iter(iter(self.resolve(path)))
        if op == "next":
            it = self.resolve(path)
            try:
                return (False, next(it.it))
            except StopIteration:
                return (True, None)
        if op == "len":
            return len(self.resolve(path))
        if op == "send":
            return _Handed(value)
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


class _Iter:
    """An iterator handed out as a handle (never as data)."""

    def __init__(self, it):
        self.it = it


class _Handed:
    """Wraps an object sent with student.send, so that it comes back as a handle."""

    def __init__(self, obj):
        self.obj = obj


# ---------------------------------------------------------------------------------------
# In the notebook: LocalStudent
# ---------------------------------------------------------------------------------------

class _StudentBase:
    """What LocalStudent and the grader's RemoteStudent share: the reserved helpers."""

    def __getattr__(self, name: str) -> Ref:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Ref(self, (("global", name),))

    def __getitem__(self, name: str) -> Ref:
        return Ref(self, (("global", name),))

    def __setattr__(self, name, value):
        self._op("set", (("global", name),), value=value)

    def fetch(self, ref):
        """The value a reference stands for (data, or a reference for other objects)."""
        if not isinstance(ref, Ref):
            return ref
        return self._op("get", _ref_path(ref))

    def send(self, obj) -> Ref:
        """A copy of a local object, placed next to the notebook's code; returns a reference."""
        return self._op("send", None, value=obj)

    @contextlib.contextmanager
    def replaced(self, **substitutes):
        """Swap globals of the notebook for the duration of the block (put back afterwards)."""
        token = self._op("replace", None, value=substitutes)
        try:
            yield self
        finally:
            self._op("restore", None, value=token)

    def changed_inputs(self) -> list[int]:
        """The tensor arguments the last call changed in place, by position (in the order the
        arguments were given, lists, tuples and dicts walked in order).  The caller's tensors
        never change: this is how a test checks in-place behaviour."""
        return list(self.__dict__.get("_changed_inputs", []))

    def _op(self, op, path, args=(), kwargs=None, value=None):  # pragma: no cover - abstract
        raise NotImplementedError


class LocalStudent(_StudentBase):
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
            return self._get_core().resolve(_ref_path(value))
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
        args = _copy_tensors(self._resolve_args(tuple(args)))
        kwargs = _copy_tensors(self._resolve_args(dict(kwargs or {})))
        before = _tensor_args(args, kwargs) if op == "call" else []
        try:
            result = core.perform(op, path, args, kwargs, value)
        except Exception as exc:
            with contextlib.suppress(Exception):
                exc.from_student = True  # as at grading time: the notebook's code raised it
            raise
        if op == "call":
            object.__setattr__(self, "_changed_inputs", _changed(before))
        header, blob = encode(result, core.register)
        return decode(header, blob, lambda hid, kind, text: Ref(self, (("handle", hid),), (kind, text)))

    @property
    def source(self):
        """The code this notebook ran (its cells, in order), for checks on how it is written."""
        from .sourcecheck import SourceView

        ns = self._namespace()
        cells = [c for c in ns.get("In", []) if isinstance(c, str) and c.strip()]
        return SourceView(cells)


def local_student(namespace: dict | None = None) -> LocalStudent:
    return LocalStudent(namespace)


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

    def handle(self, token: str, payload: str) -> None:
        parent = self.kernel.get_parent("shell")
        generators: list = []
        try:
            req = self._unpickler(base64.b64decode(payload), generators).load()
            op, path = req["op"], req.get("path")
            args, kwargs, value = req.get("args", ()), req.get("kwargs", {}), req.get("value")
            before = _tensor_args(args, kwargs) if op == "call" else []
            result = self.core.perform(op, path, args, kwargs, value)
            reply = {"result": result,
                     "generators": {tok: g.get_state() for tok, g in generators},
                     "changed": _changed(before)}
            header, blob = encode(reply, self.core.register)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported as data
            header, blob = encode({"error": _error_info(exc)}, self.core.register)
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
            raise _builtin_exception(*reply["error"])
        return reply["value"]


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


def _tensor_args(args, kwargs, copies: bool = True) -> list:
    """Tensors among the arguments (``find_instances`` order), each with a copy to tell
    afterwards whether the call changed it in place (None when ``copies`` is false or the
    tensor is too large to copy back)."""
    import torch

    out = []
    for v in find_instances(args, kwargs, torch.Tensor):
        small = v.numel() * v.element_size() <= MAX_SYNC_BACK_BYTES and v.layout == torch.strided \
            and v.device.type != "meta"
        out.append((v, torch.Tensor.detach(v).clone() if small and copies else None))
    return out


def _changed(before: list) -> list[int]:
    """Positions (``_tensor_args`` order) of the tensors a call changed in place."""
    return [i for i, (t, copy_before) in enumerate(before)
            if copy_before is not None and not _same_tensor(t, copy_before)]


def _copy_tensors(value, depth: int = 0):
    """``value`` with every tensor in it (inside lists, tuples and dicts) replaced by a copy:
    the notebook's code receives copies, as it does at grading time."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.Tensor.detach(value).clone().requires_grad_(value.requires_grad)
    if depth > 8:
        return value
    if type(value) in (list, tuple):
        return type(value)(_copy_tensors(v, depth + 1) for v in value)
    if type(value) is dict:
        return {k: _copy_tensors(v, depth + 1) for k, v in value.items()}
    return value


def _same_tensor(t, before) -> bool:
    import torch

    now = torch.Tensor.detach(t)
    if now.shape != before.shape or now.dtype != before.dtype or now.device != before.device:
        return False
    if torch.equal(now, before):
        return True
    if now.is_floating_point() or now.is_complex():  # NaN != NaN: equal where both are NaN
        return bool(((now == before) | (now.isnan() & before.isnan())).all())
    return False


def _error_info(exc: BaseException) -> dict:
    if isinstance(exc, KeyboardInterrupt):
        return {"type": "KeyboardInterrupt", "message": "interrupted (time limit)", "interrupted": True}
    name = type(exc).__name__ if isinstance(type(exc).__name__, str) else "Exception"
    return {"type": name[:100], "message": _safe_str(exc, 2000),
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


# ---------------------------------------------------------------------------------------
# The grader's side of the request encoding (used by autograder.judge)
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
                return ("ref", _ref_path(obj))
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
    import sys

    target = sys.modules.get(mod)
    for part in qual.split("."):
        target = getattr(target, part, None)
    return target is fn
