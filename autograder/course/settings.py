"""One settings object for a grading run: limits, workers, sandbox, the kernels' environment.

``GradingSettings`` is made once per run, from course.yml and the command line, and travels
whole: a grading worker (a local process or a Dask task) receives it as one serialised object
(``to_json`` / ``from_json``) and takes every limit and switch from it, never from its own
reading of course.yml, the command line or the environment.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field, fields, replace

from .model import Grading

_DEFAULTS = Grading()


@dataclass(frozen=True)
class GradingSettings:
    cell_timeout: int = _DEFAULTS.cell_timeout          # seconds per cell, and per request a test makes
    notebook_timeout: int = _DEFAULTS.notebook_timeout  # seconds per notebook
    memory_mb: int = _DEFAULTS.memory_mb
    tmp_mb: int = _DEFAULTS.tmp_mb
    work_mb: int = _DEFAULTS.work_mb
    file_mb: int = _DEFAULTS.file_mb
    test_timeout: int = _DEFAULTS.test_timeout        # seconds per test (autograder.judge.budget)
    test_items: int = _DEFAULTS.test_items            # requests per test
    test_mb: int = _DEFAULTS.test_mb                  # MiB of replies per test
    test_memory_mb: int = _DEFAULTS.test_memory_mb    # MiB a test may add to the grading process's memory
    workers: int = 0                 # 0: one per CPU core
    sandbox: str = "auto"            # auto (bubblewrap when it works, else a warning), on, off
    max_restarts: int = 4            # fresh kernels after a crash or an unstoppable cell
    cluster: str | None = None       # a Dask scheduler address or scheduler file: grade there
    env: dict = field(default_factory=dict)  # for the kernels and the judge (e.g. COURSE_PROFILE)
    judge_context: tuple = ()        # grade ids of the released cells the judge runs before the tests
    models: tuple = ()               # the offline models the assignment loads
    # where the kernels run, once the run has checked it (see autograder.isolation.sandbox.check)
    bwrap: bool = True
    gpu: bool = False
    provenance: str = ""             # the line every feedback page ends with

    @classmethod
    def for_assignment(cls, assignment, **overrides) -> "GradingSettings":
        """The course file's settings for ``assignment``, with every override that is not None."""
        g = assignment.grading
        base = cls(cell_timeout=g.cell_timeout, notebook_timeout=g.notebook_timeout, memory_mb=g.memory_mb,
                   tmp_mb=g.tmp_mb, work_mb=g.work_mb, file_mb=g.file_mb, test_timeout=g.test_timeout,
                   test_items=g.test_items, test_mb=g.test_mb, test_memory_mb=g.test_memory_mb, env=dict(g.env),
                   judge_context=tuple(assignment.judge_context), models=tuple(assignment.models))
        return base.with_(**overrides)

    def with_(self, **overrides) -> "GradingSettings":
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def n_workers(self) -> int:
        return max(1, self.workers or usable_cpus())

    @property
    def device(self) -> str:
        return "cuda" if self.gpu else "cpu"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "GradingSettings":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        data = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in known}
        return cls(**data)


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
