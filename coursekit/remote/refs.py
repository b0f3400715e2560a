"""References to the notebook's objects, and what every ``student`` offers (``StudentBase``)."""
from __future__ import annotations

import contextlib

# names that `student` keeps for itself (a notebook global of one of these names is reached
# as student["name"]).
RESERVED = frozenset({"fetch", "send", "replaced", "source", "changed_inputs"})


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
        where = path_text(self.__path)
        return f"<student {where}" + (f": {kind}" if kind else "") + ">"

    __hash__ = object.__hash__


def path_text(path) -> str:
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


def ref_path(ref: Ref) -> tuple:
    return object.__getattribute__(ref, "_Ref__path")




class StudentBase:
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
        return self._op("get", ref_path(ref))

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


