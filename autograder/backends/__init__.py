"""Where submissions are judged: local worker processes, or the workers of a Dask cluster.

Both backends take the same ``Batch`` and give back the same records, one ``Outcome`` per
submission (``autograder.judge.worker``): graded or not, the judge's notes, the cause, and
where the submission's gradebook rows, graded notebook and feedback page are.  They write
nothing into the class record (that is the pipeline's commit), and they never import the
pipeline.

    backend = backend_for(settings)
    info, warnings = backend.check(settings)          # the sandbox, where the kernels will run
    outcomes = backend.judge(batch)                   # student id -> Outcome
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from autograder.course.settings import GradingSettings
from autograder.isolation.sandbox import SandboxInfo
from autograder.judge.worker import Outcome

# Imports inside functions: a backend's module is imported when a run picks it (backend_for): the Dask one
# would load dask and distributed, which a local run never needs.

__all__ = ["Backend", "Batch", "Outcome", "backend_for"]


@dataclass
class Batch:
    """The submissions of one run that are to be judged."""

    assignment: str
    nb_name: str
    notebooks: dict            # student id -> the repaired notebook (a PackedNotebook: .text() is its JSON)
    gradebook: Path            # a SQLite gradebook holding the release (the workers start from a copy)
    settings: GradingSettings  # the run's, with where kernels run already checked
    folder: Path               # the run's private folder: the workers' folders go here
    late: frozenset = frozenset()  # students whose file came late (their feedback page says so)


class Backend(Protocol):
    # how many submissions the run expects to judge, once its files are listed (a hint: the
    # local backend starts no more grading processes than that); None when not known
    expected: int | None
    def check(self, settings: GradingSettings) -> tuple[SandboxInfo, list[str]]:
        """The sandbox where the kernels will run, proved to work; warnings for the instructor."""

    def judge(self, batch: Batch) -> dict[str, Outcome]:
        """Every submission of ``batch`` judged: one record each."""


def backend_for(settings: GradingSettings) -> Backend:
    """The Dask backend when the run names a cluster, else local worker processes."""
    if settings.cluster:
        from .cluster import DaskBackend

        return DaskBackend()
    from .local import LocalBackend

    return LocalBackend()
