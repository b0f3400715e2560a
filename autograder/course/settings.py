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
from dataclasses import asdict, fields, replace

from . import schema


class _Methods:
    """What a GradingSettings can do; its fields are those of ``schema.TRAVELLING``."""

    @classmethod
    def for_assignment(cls, assignment, **overrides) -> "GradingSettings":
        """The course file's settings for ``assignment``, with every override that is not None."""
        g = assignment.grading
        base = cls(**{s.name: dict(getattr(g, s.name)) if s.type is dict else getattr(g, s.name)
                      for s in schema.IN_COURSE_FILE},
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
        """The settings as the job file holds them (every field, by name)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "GradingSettings":
        """The settings ``to_json`` wrote; a field that is not one of the schema's, or a value of
        the wrong kind (a job file of another version of the grader), is one line naming it."""
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        values = {}
        for key, value in data.items():
            if key not in known:
                raise schema.SettingError(schema.unknown_key(key, known, "the grading settings of the job"))
            s = schema.BY_NAME[key]
            if s.type is tuple and isinstance(value, list):
                value = tuple(value)
            if value is not None or s.default is not None:
                schema.check_value(replace(s, minimum=None, choices=()), value, f"the job's setting {key}")
            values[key] = value
        return cls(**values)


GradingSettings = schema.dataclass_of(
    "GradingSettings", schema.TRAVELLING, __name__, bases=(_Methods,),
    doc="The run's settings, frozen: made once from course.yml and the command line "
        "(``for_assignment``), handed whole to every worker (``to_json`` / ``from_json``).")


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
