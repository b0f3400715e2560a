"""Every grading setting, declared once.

Each ``Setting`` says what one setting is: its type and default, the help text a person reads,
whether ``course.yml``'s ``grading`` section may set it (course-wide or per assignment), the
flag of the command line that sets it for one run, and whether the kernel's launcher takes it
as a flag of its own.  From this one list:

* ``Grading`` (``autograder.course.model``): what ``course.yml`` says, validated by ``read_grading``
  (an unknown key names the nearest known one; a wrong type names the type expected);
* ``GradingSettings`` (``autograder.course.settings``): the frozen object a run makes once and
  hands whole to every worker, written into the worker's job file and read back from it;
* the flags of ``python -m autograder grade`` and ``export`` (``autograder.cli``), with their help;
* the flags of the kernel's launcher (``autograder.isolation.sandbox``: the kernel's limits).

The environment is not a way to set any of these: the variables the notebook side reads are
listed in ``coursekit.envvars``.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, make_dataclass, replace

COURSE = "course.yml"            # the setting may be written in course.yml's grading section
RUN = "run"                      # the setting is given for one run only (a flag), never in course.yml
FOUND = "found"                  # the run works it out (from the assignment's entry, the sandbox check)


class SettingError(ValueError):
    """A grading setting of the wrong kind or name (one line naming it)."""


@dataclass(frozen=True)
class Setting:
    name: str                    # the field of GradingSettings (and course.yml's key, the flag's dest)
    type: type                   # int, str, dict or tuple
    default: object
    help: str
    source: str = COURSE         # COURSE, RUN or FOUND
    flag: str | None = None      # the command-line flag; None with ``no_flag`` saying why
    commands: tuple = ("grade",)  # the commands that take the flag
    minimum: int | None = None   # the smallest value allowed (a whole number)
    choices: tuple = ()
    kernel: bool = False         # the kernel's launcher takes it as a flag (its limits)
    no_flag: str = ""            # why a setting a person gives has no flag
    shown_default: str = ""      # the default in words, for the help, where the value says little
    travels: bool = True         # a field of GradingSettings (False: an option of the command only)

    @property
    def is_set_by_a_person(self) -> bool:
        return self.source in (COURSE, RUN)


SETTINGS: tuple[Setting, ...] = (
    # the limits of a submission's kernel and notebook
    Setting("cell_timeout", int, 300, "seconds per cell (and per request a test makes to the kernel)",
            flag="--cell-timeout", minimum=1),
    Setting("notebook_timeout", int, 1800, "seconds per notebook: kernel starts, cells, tests and replays together",
            flag="--notebook-timeout", minimum=1),
    Setting("interrupt_grace", int, 10, "seconds a kernel interrupted at a time limit has to stop before it is killed",
            flag="--interrupt-grace", minimum=1),
    Setting("memory_mb", int, 8192, "memory limit per kernel in MiB: its address space, or its data segment when "
                                    "the kernels get the GPU", flag="--memory-mb", minimum=1, kernel=True),
    Setting("tmp_mb", int, 512, "MiB of a kernel's /tmp and /dev/shm (held in memory)", flag="--tmp-mb",
            minimum=1, kernel=True),
    Setting("work_mb", int, 512, "MiB of a kernel's working folder (held in memory)", flag="--work-mb",
            minimum=1, kernel=True),
    Setting("file_mb", int, 512, "the largest file a kernel may write, in MiB", flag="--file-mb", minimum=1,
            kernel=True),
    # what one test may take (autograder.judge.budget), whatever the student's code hands it
    Setting("test_timeout", int, 600, "seconds per test: every request it makes and its own arithmetic together",
            flag="--test-timeout", minimum=1),
    Setting("test_items", int, 10_000, "requests a test makes to the kernel (and calls back to it)",
            flag="--test-items", minimum=1),
    Setting("test_mb", int, 1024, "MiB a test takes from the kernel, all its replies together", flag="--test-mb",
            minimum=1),
    Setting("test_memory_mb", int, 2048, "MiB a test may add to the grading process's data segment (0: no limit)",
            flag="--test-memory-mb", minimum=0),
    Setting("env", dict, {}, "environment of the kernels and of the judge (e.g. COURSE_PROFILE: cpu), merged "
                             "over the course-wide one",
            no_flag="what the kernels run with is what students were told (course.yml), the same for every run"),
    # how a run grades
    Setting("workers", int, 0, "parallel grading processes", source=RUN,
            flag="--workers", minimum=1, shown_default="one per CPU core"),
    Setting("sandbox", str, "auto", "run student code in bubblewrap: auto (when it works, else warn), on, off",
            source=RUN, flag="--sandbox", choices=("auto", "on", "off")),
    Setting("max_restarts", int, 4, "fresh kernels a notebook may get after a crash or a cell that does not stop",
            source=RUN, flag="--max-restarts", minimum=0),
    Setting("cluster", str, None, "a Dask scheduler address (tcp://host:8786) or scheduler file: grade on its workers",
            source=RUN, flag="--cluster", shown_default="local worker processes"),
    # what the run works out
    Setting("judge_context", tuple, (), "grade ids of the released cells the judge runs before the tests "
                                        "(the assignment's judge_context in course.yml)", source=FOUND),
    Setting("models", tuple, (), "the offline models the assignment loads (its models in course.yml)", source=FOUND),
    Setting("bwrap", bool, True, "the kernels run in bubblewrap (the run's sandbox check)", source=FOUND),
    Setting("gpu", bool, False, "the kernels get the GPU (the run's sandbox check)", source=FOUND),
    Setting("provenance", str, "", "the line every feedback page ends with", source=FOUND),
    # options of the commands that are not grading settings: they do not travel to the workers
    Setting("db_url", str, None, "the gradebook's database, e.g. postgresql://grader@dbhost/course; recorded in the "
                                 "grading folder for later commands", source=RUN, flag="--db-url", travels=False,
            shown_default="grading/gradebook.db, SQLite"),
    Setting("missing", str, None, "what canvas.csv and moodle.csv give a student of the class without a gradable file "
                                  "(no submission, or none that could be graded): zero (0) or blank (an empty cell, "
                                  "which the LMS leaves ungraded)", source=RUN, flag="--missing",
            commands=("grade", "export"), choices=("zero", "blank"), travels=False,
            shown_default="what the last grade run was told, else zero"),
)

BY_NAME = {s.name: s for s in SETTINGS}
TRAVELLING = tuple(s for s in SETTINGS if s.travels)
IN_COURSE_FILE = tuple(s for s in SETTINGS if s.source == COURSE)
KERNEL = tuple(s for s in SETTINGS if s.kernel)


def flags_of(command: str) -> tuple[Setting, ...]:
    """The settings a command's flags set, in the schema's order."""
    return tuple(s for s in SETTINGS if s.flag and command in s.commands)


def _default(s: Setting):
    return field(default_factory=dict) if s.type is dict else field(default=s.default)


def dataclass_of(name: str, settings, module: str, bases: tuple = (), doc: str = ""):
    """A frozen dataclass whose fields are ``settings``, with their types and defaults."""
    kinds = {int: int, str: str, bool: bool, dict: dict, tuple: tuple}
    cls = make_dataclass(name, [(s.name, kinds[s.type] if s.default is not None else (s.type | None), _default(s))
                                for s in settings],
                         bases=bases, frozen=True, namespace={"__module__": module, "__doc__": doc})
    return cls


# course.yml's grading section ------------------------------------------------------------
_KINDS = {int: "a whole number", str: "a text", dict: "a mapping (KEY: value)", bool: "true or false",
          tuple: "a list"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def unknown_key(key, known, where: str) -> str:
    """One line for a key that is not one of ``known``, naming the nearest known key."""
    near = difflib.get_close_matches(str(key), list(known), n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"the keys are: {', '.join(sorted(known))}"
    return f"unknown key {key!r} in {where} ({hint})"


def check_value(s: Setting, value, where: str):
    """``value`` for setting ``s`` (written at ``where``), or SettingError naming the key and the
    type expected."""
    wrong = not isinstance(value, s.type) or (s.type is int and isinstance(value, bool))
    if wrong:
        raise SettingError(f"{where} must be {_KINDS[s.type]} ({s.type.__name__}), not "
                           f"{type(value).__name__} {value!r}"[:200])
    if s.minimum is not None and value < s.minimum:
        raise SettingError(f"{where} must be positive" if s.minimum == 1 else f"{where} must be {s.minimum} or more")
    if s.choices and value not in s.choices:
        raise SettingError(f"{where} must be one of {', '.join(s.choices)}, not {value!r}")
    if s.type is dict:
        for k, v in value.items():
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                raise SettingError(f"{where}: {k!r} is not the name of an environment variable")
            if isinstance(v, (dict, list)) or v is None:
                raise SettingError(f"{where}.{k} must be a text or a number, not {type(v).__name__}")
        value = {k: str(v) for k, v in value.items()}
    return value


def read_grading(data, where: str, base):
    """``base`` (a ``Grading``) with what a ``grading`` section of course.yml sets; every key checked
    against the schema.  ``env`` is merged over the base's; every other key replaces its value."""
    if data is None:
        return base
    if not isinstance(data, dict):
        raise SettingError(f"{where} must be a mapping of settings, not {type(data).__name__}")
    known = {s.name for s in IN_COURSE_FILE}
    for key in data:
        if key not in known:
            raise SettingError(unknown_key(key, known, where))
    values = {}
    for key, value in data.items():
        s = BY_NAME[key]
        if s.type is dict:
            value = {} if value is None else value
            values[key] = {**getattr(base, key), **check_value(s, value, f"{where}.{key}")}
        else:
            values[key] = check_value(s, value, f"{where}.{key}")
    return replace(base, **values)


def kernel_argv(settings) -> list[str]:
    """The kernel's limits as flags of its launcher (``autograder.isolation.sandbox``)."""
    return [f"{s.flag}={getattr(settings, s.name)}" for s in KERNEL]
