"""Self-checks for the exercises at the end of each book page.

A *compute* exercise asks for a number. The page holds a cell such as::

    answer = None   # your number
    check_answer("13.2", answer, key="x1:rel:0.01:5f0c9e2a:8be1...", hint="count bytes, not characters")

and ``check_answer`` says *right* or *not yet* (with the hint), naming the exercise. The key
holds no answer that can be read: only a salted hash of the answer put on a grid, the way
nbgrader's generated tests hide theirs. The grid is the tolerance band: with ``rel`` the
answer's logarithm is cut in steps of ``log(1 + rel)``, with ``abs`` the answer itself in steps of
``abs``, and ``exact`` takes integers as they are. A value is accepted when its grid point, or one
of the two on either side, hashes to the key: so every value within the tolerance of the answer is
accepted, and every value more than three tolerances away is rejected (a guessed value one step
off may pass, which is the band's purpose).

The instructor makes a key with ``answer_key("13.2", value, rel=0.01)``; the value never enters
the page. Anything a student passes is taken as hostile: a non-number gets a one-line message,
never an exception from inside this module.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import re
import secrets

__all__ = ["answer_key", "check_answer", "ExerciseKeyError"]

_VERSION = "x1"
_REACH = 2   # grid points on either side of the student's own that may match
_KEY = re.compile(r"^x1:(rel|abs|exact):([0-9.eE+-]+):([0-9a-f]{8}):([0-9a-f]{24})$")
_EXERCISE = re.compile(r"^\d{1,2}\.\d{1,2}$")


class ExerciseKeyError(ValueError):
    """A key or an exercise number that is not well formed (the page's fault, not the student's)."""


def _grid(value: float, kind: str, step: float) -> str:
    """The grid point of ``value``: an integer, for ``rel`` with the sign in front ("+3", "-3", "0")."""
    if kind == "exact":
        return str(int(round(value)))
    if kind == "abs":
        return str(math.floor(value / step + 0.5))
    if value == 0:
        return "0"
    k = math.floor(math.log(abs(value)) / math.log1p(step) + 0.5)
    return f"{'+' if value > 0 else '-'}{k}"


def _neighbours(value: float, kind: str, step: float) -> list[str]:
    if kind == "exact":
        return [str(int(value))] if float(value).is_integer() else []
    point = _grid(value, kind, step)
    if point == "0":
        return [point]
    sign = point[0] if point[0] in "+-" else ""
    k = int(point[len(sign):]) if sign else int(point)
    return [f"{sign}{k + d}" for d in range(-_REACH, _REACH + 1)]


def _digest(exercise: str, salt: str, point: str) -> str:
    return hashlib.sha256(f"{salt}|{exercise}|{point}".encode()).hexdigest()[:24]


def _check_exercise(exercise: str) -> str:
    if not isinstance(exercise, str) or not _EXERCISE.match(exercise):
        raise ExerciseKeyError(f"exercise number {exercise!r}: expected chapter.number, e.g. '13.2'")
    return exercise


def answer_key(exercise: str, answer: float, *, rel: float | None = None, abs: float | None = None,
               exact: bool = False, salt: str | None = None) -> str:
    """The key of a compute exercise: pass the answer and one tolerance (``rel``, ``abs`` or ``exact``)."""
    _check_exercise(exercise)
    chosen = [name for name, given in (("rel", rel), ("abs", abs), ("exact", exact or None)) if given is not None]
    if len(chosen) != 1:
        raise ExerciseKeyError(f"exercise {exercise}: give exactly one of rel=, abs=, exact=True")
    kind = chosen[0]
    step = {"rel": rel, "abs": abs, "exact": 1.0}[kind]
    if not (isinstance(step, numbers.Real) and step > 0 and math.isfinite(step)):
        raise ExerciseKeyError(f"exercise {exercise}: the tolerance must be a positive number, got {step!r}")
    answer = float(answer)
    if not math.isfinite(answer) or (kind == "exact" and not answer.is_integer()):
        raise ExerciseKeyError(f"exercise {exercise}: the answer {answer!r} is not a finite number of that kind")
    salt = salt or secrets.token_hex(4)
    return f"{_VERSION}:{kind}:{step!r}:{salt}:{_digest(exercise, salt, _grid(answer, kind, step))}"


def _as_number(value) -> float | None:
    """A student's value as a float, or None. Accepts Python and numpy numbers and one-element tensors."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        return None
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, numbers.Real):
        try:
            value = item()       # a numpy scalar, a 0-d array or a one-element tensor
        except Exception:  # noqa: BLE001 - anything else a student may pass
            return None
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def accepts(exercise: str, value, key: str) -> bool:
    """Whether ``value`` is within the band of the answer ``key`` was made from."""
    _check_exercise(exercise)
    m = _KEY.match(key) if isinstance(key, str) else None
    if not m:
        raise ExerciseKeyError(f"exercise {exercise}: the self-check's key {key!r} is not well formed")
    kind, step, salt, digest = m.group(1), float(m.group(2)), m.group(3), m.group(4)
    number = _as_number(value)
    if number is None or not math.isfinite(number):
        return False
    return any(_digest(exercise, salt, point) == digest for point in _neighbours(number, kind, step))


def check_answer(exercise: str, value, key: str, hint: str = "") -> bool:
    """Say whether ``value`` answers compute exercise ``exercise``; returns True when it does."""
    _check_exercise(exercise)
    if value is None or value is Ellipsis:
        print(f"Exercise {exercise}: no answer yet (put your number in place of None and run the cell again)")
        return False
    number = _as_number(value)
    if number is None:
        print(f"Exercise {exercise}: the answer must be one number, got {type(value).__name__}")
        return False
    if not math.isfinite(number):
        print(f"Exercise {exercise}: not yet: {number} is not a finite number")
        return False
    if accepts(exercise, number, key):
        print(f"Exercise {exercise}: right")
        return True
    print(f"Exercise {exercise}: not yet" + (f"; hint: {hint}" if hint else ""))
    return False
