"""The line a student reads when a test cell fails, built in one place.

Two readers show it: the self-check in the notebook (``coursekit.selfcheck``: ``[FAIL] ...``)
and the grader's judge (``autograder.judge.runner``), which writes it as the test cell's error
output of the graded notebook, and so onto the feedback page.  The self-check sometimes knows
more than the grader (which question a missing name belongs to, a library of the runtime that
broke) and says that instead; everything else it says in the grader's words, from here.

Nothing here imports anything outside the standard library: the grader imports it too.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass

HIDDEN_FAILURE = "a hidden check failed (see the first line of this cell for what it checks)"
MAX_TEXT = 2000         # characters of an error's own text the line quotes
MAX_HIDDEN_TEXT = 300   # ... when the error came from a hidden check


@dataclass(frozen=True)
class Failure:
    """Why a test cell failed: ``ename`` and ``message`` as a notebook shows an error
    (``ename: message``); ``unanswered`` when the student's code is still the released stub;
    ``quoted`` when the message is the error's own text rather than a sentence of ours."""

    ename: str
    message: str
    unanswered: bool = False
    quoted: bool = False

    @property
    def reason(self) -> str:
        """The line on its own, as the self-check prints it: the error's name stays in front
        of a quoted text (a sentence of ours names it already)."""
        if self.quoted:
            return f"{self.ename}: {self.message}" if self.message else self.ename
        return self.message


def failing_line(exc: BaseException, filename: str) -> int | None:
    """The line (1-based) of the test cell's own code, compiled as ``filename``, that the
    error last passed through; None when it never did."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    return frames[-1].lineno if frames else None


def explain_failure(exc: BaseException, source: str, filename: str, *, hidden_lines=frozenset(),
                    culprit: str | None = None) -> Failure:
    """The failure of the test cell ``source`` (compiled as ``filename``) that raised ``exc``.

    ``hidden_lines``: the cell's lines in a hidden-test region, never quoted.  ``culprit``: the
    student's function the error came from, when the caller can tell (the self-check reads it
    from the traceback; the grader, whose student code runs in another process, cannot): it is
    named in the line, and the error counts as the student's even without the mark that
    ``coursekit.remote`` puts on errors raised by the notebook's code."""
    line = failing_line(exc, filename)
    hidden = line is not None and line in hidden_lines
    name = getattr(exc, "student_type", None) or type(exc).__name__
    text = str(exc)
    if getattr(exc, "from_student", False) or culprit:
        who = culprit or "your code"
        if isinstance(exc, NotImplementedError):
            return Failure(name, f"not answered yet ({who} still raises NotImplementedError)", unanswered=True)
        if isinstance(exc, NameError) and "not defined in the notebook" in text:
            return Failure(name, f"{text[:MAX_TEXT]}: the cell that defines it did not run, or failed")
        return Failure(name, f"{who} raised {name}" + (f": {text[:MAX_TEXT]}" if text else ""))
    if isinstance(exc, AssertionError):
        if text:
            return Failure("AssertionError", text)
        if hidden or (line is None and hidden_lines):
            return Failure("AssertionError", HIDDEN_FAILURE)
        if line is None:
            return Failure("AssertionError", "an assertion failed")
        return Failure("AssertionError", "failed: " + source.splitlines()[line - 1].strip())
    if hidden:
        return Failure(name, f"{HIDDEN_FAILURE}: {name}" + (f": {text[:MAX_HIDDEN_TEXT]}" if text else ""))
    return Failure(name, text[:MAX_TEXT], quoted=True)
