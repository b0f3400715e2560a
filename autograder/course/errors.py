"""The one kind of refusal every wing of the grader shares."""
from __future__ import annotations


class GradingError(RuntimeError):
    """The run cannot grade anyone (unknown assignment, broken sandbox, the wrong zip...):
    one line for the instructor, and nothing of the class record was changed."""
