"""The one kind of refusal every wing of the grader shares."""
from __future__ import annotations


class GradingError(RuntimeError):
    """The run cannot grade anyone (unknown assignment, broken sandbox, the wrong zip...):
    one line for the instructor, and nothing of the class record was changed."""


class StoppedAfterCommit(KeyboardInterrupt):
    """Ctrl-C once the run's grades were in the class record: the run is in the history (undo
    takes it back), and the exports may lag behind it until ``export`` rebuilds them."""

    def __init__(self, assignment: str, run_id: str):
        super().__init__(assignment, run_id)
        self.assignment, self.run_id = assignment, run_id
