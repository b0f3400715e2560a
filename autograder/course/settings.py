"""One settings object for a grading run: limits, workers, sandbox, the kernels' environment."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, replace

from autograder.isolation import sandbox


@dataclass(frozen=True)
class GradingSettings:
    cell_timeout: int = 300          # seconds per cell, and per request a test makes
    notebook_timeout: int = 1800     # seconds per notebook
    memory_mb: int = sandbox.DEFAULT_MEMORY_MB
    tmp_mb: int = sandbox.DEFAULT_TMP_MB
    work_mb: int = sandbox.DEFAULT_WORK_MB
    file_mb: int = sandbox.DEFAULT_FILE_MB
    workers: int = 0                 # 0: one per CPU core
    sandbox: str = "auto"            # auto (bubblewrap when it works, else a warning), on, off
    max_restarts: int = 4            # fresh kernels after a crash or an unstoppable cell
    cluster: str | None = None       # a Dask scheduler address or scheduler file: grade there
    env: dict = field(default_factory=dict)  # for the kernels and the judge (e.g. COURSE_PROFILE)

    @classmethod
    def for_assignment(cls, assignment, **overrides) -> "GradingSettings":
        """The course file's settings for ``assignment``, with every override that is not None."""
        g = assignment.grading
        base = cls(cell_timeout=g.cell_timeout, notebook_timeout=g.notebook_timeout, memory_mb=g.memory_mb,
                   env=dict(g.env))
        return base.with_(**overrides)

    def with_(self, **overrides) -> "GradingSettings":
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def n_workers(self) -> int:
        return max(1, self.workers or usable_cpus())


def usable_cpus() -> int:
    """The CPUs this process may run on (a SLURM job, a container or ``taskset`` can allow
    fewer than the machine has)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def environ(changes: dict):
    """``os.environ`` with ``changes`` applied for the duration of the block, then restored."""
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
