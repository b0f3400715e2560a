"""The wire format, kernel to grader: a JSON skeleton and one safetensors blob, every size
bounded before anything is parsed.  Nothing but data is ever decoded (never pickle)."""
from __future__ import annotations

import base64
import builtins
import collections.abc
import json
import math
import struct
import warnings
from typing import Any, Callable

# Imports inside functions: torch, numpy and safetensors are imported where a tensor is encoded or decoded:
# assignments without torch import the codec without them.

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

REPLY_MSG = "course_judge_reply"
REQUEST_KEY = "course_judge_request"  # the metadata key of a request's payload (base64 pickle)
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


class RemoteTimeout(RuntimeError):
    """The student's code did not answer a request within the time limit."""

    student_caused = True  # coursekit.selfcheck.warn_only turns it into a warning


def student_exception(type_name: str, message: str) -> BaseException:
    """The exception to raise on the caller's side for one raised by student code: the
    built-in class of that name (so ``except ValueError`` works), else StudentError."""
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        try:
            exc = cls(message)
        except Exception:  # noqa: BLE001 - an exotic constructor: fall back to the generic class
            return StudentError(type_name, message)
        exc.student_type = type_name  # type: ignore[attr-defined]
        return exc
    return StudentError(type_name, message)


def safe_str(obj: Any, limit: int = 2000) -> str:
    try:
        text = str(obj)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return "<unprintable>"
    return text if len(text) <= limit else text[:limit] + "..."


def type_name(obj: Any) -> str:
    t = type(obj)
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", "?")
    return name if mod in ("builtins", "__main__", "") else f"{mod}.{name}"


class Handed:
    """Wraps an object sent with student.send, so that it comes back as a handle."""

    def __init__(self, obj):
        self.obj = obj


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
        return {"$handle": register(obj), "type": type_name(obj),
                "repr": safe_str(_repr(obj), MAX_REPR)}

    def walk(v, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise ProtocolError(f"the result has more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise ProtocolError(f"the result is nested more than {MAX_DEPTH} levels deep")
        t = type(v)
        if t is Handed:
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
        return f"<{type_name(obj)}>"


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


