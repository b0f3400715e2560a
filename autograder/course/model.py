"""The course file, ``course.yml``: one place for the facts about the course.

``load()`` reads and checks it into typed objects::

    course = load()
    course.assignment("finetune").grading.env   # {'COURSE_PROFILE': 'cpu', ...}
    course.student_repo.name                     # 'owner/name' of the published student course

A mistake in the file (an unknown key, a wrong type, an assignment without a notebook)
is one clear ``CourseFileError`` naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from autograder import ROOT, SOURCE_DIR

from . import schema

COURSE_FILE = "course.yml"
MODEL_KINDS = ("distilbert", "roberta", "small_gpt", "offline_chat")


class CourseFileError(ValueError):
    """course.yml is missing a fact or has one of the wrong kind."""


@dataclass(frozen=True)
class Repository:
    name: str            # owner/name on GitHub
    branch: str = "main"

    @property
    def url(self) -> str:
        return f"https://github.com/{self.name}"


# How one assignment is graded: what course.yml's grading section may say, with the course's
# defaults for what it leaves out.  Its fields are declared once, in autograder.course.schema.
Grading = schema.dataclass_of("Grading", schema.IN_COURSE_FILE, __name__,
                              doc="How one assignment is graded (course.yml's grading section; "
                                  "fields and defaults: autograder.course.schema).")


@dataclass(frozen=True)
class Assignment:
    id: str
    title: str
    chapters: tuple[str, ...] = ()
    judge_context: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    grading: Grading = field(default_factory=Grading)
    due: str | None = None
    lms_name: str | None = None   # the assignment's column (Canvas) / grade item (Moodle) name
    canvas_id: int | None = None  # Canvas' id of the assignment: its import matches the column by it
    # hand-graded cell -> the cells whose outputs, as the student handed them in, its grader sees
    # beside the grader's own re-run (pairs, so that the dataclass stays hashable)
    handed_in_outputs: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def shown_outputs(self, grade_id: str) -> tuple[str, ...]:
        """The cells whose handed-in outputs the hand grader of ``grade_id`` sees."""
        return dict(self.handed_in_outputs).get(grade_id, ())

    @property
    def notebook(self) -> str:
        return f"{self.id}.ipynb"

    @property
    def lms_column(self) -> str:
        return self.lms_name or self.title


@dataclass(frozen=True)
class Course:
    title: str
    student_repo: Repository
    instructor_repo: Repository
    assignments: tuple[Assignment, ...]
    root: Path = ROOT
    grading: Grading = field(default_factory=Grading)   # the course-wide settings

    def assignment(self, name: str) -> Assignment:
        for a in self.assignments:
            if a.id == name:
                return a
        raise UnknownAssignment(name, [a.id for a in self.assignments])

    @property
    def ids(self) -> list[str]:
        return [a.id for a in self.assignments]


class UnknownAssignment(KeyError):
    def __init__(self, name: str, known: list[str]):
        super().__init__(name)
        self.name, self.known = name, known

    def __str__(self) -> str:
        return f"unknown assignment {self.name!r}; the assignments are: {', '.join(self.known)}"


def _expect(value, kind, where: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise CourseFileError(f"{COURSE_FILE}: {where} must be a {names}, not {type(value).__name__}")
    return value


def _keys(mapping: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(mapping) - allowed)
    if extra:
        raise CourseFileError(f"{COURSE_FILE}: {schema.unknown_key(extra[0], allowed, where)}")


def _repo(data, where: str) -> Repository:
    _expect(data, dict, where)
    _keys(data, {"name", "branch"}, where)
    name = _expect(data.get("name"), str, f"{where}.name")
    if name.count("/") != 1 or not all(name.split("/")):
        raise CourseFileError(f"{COURSE_FILE}: {where}.name must look like owner/name, not {name!r}")
    return Repository(name, _expect(data.get("branch", "main"), str, f"{where}.branch"))


def _grading(data, where: str, base: Grading) -> Grading:
    try:
        return schema.read_grading(data, where, base)
    except schema.SettingError as exc:
        raise CourseFileError(f"{COURSE_FILE}: {exc}") from None


def _str_list(data, where: str) -> tuple[str, ...]:
    _expect(data, list, where)
    return tuple(_expect(x, str, f"{where}[]") for x in data)


def parse(data, root: Path = ROOT) -> Course:
    _expect(data, dict, "the file")
    _keys(data, {"title", "repositories", "grading", "assignments"}, "the file")
    repos = _expect(data.get("repositories"), dict, "repositories")
    _keys(repos, {"student", "instructor"}, "repositories")
    base = _grading(data.get("grading"), "grading", Grading())
    assignments = []
    for aid, spec in _expect(data.get("assignments"), dict, "assignments").items():
        where = f"assignments.{aid}"
        _expect(spec, dict, where)
        _keys(spec, {"title", "chapters", "judge_context", "models", "grading", "due", "lms_name", "canvas_id",
                     "handed_in_outputs"}, where)
        shown = _expect(spec.get("handed_in_outputs", {}), dict, f"{where}.handed_in_outputs")
        models = _str_list(spec.get("models", []), f"{where}.models")
        for m in models:
            if m not in MODEL_KINDS:
                raise CourseFileError(f"{COURSE_FILE}: {where}.models: unknown model {m!r} "
                                      f"(known: {', '.join(MODEL_KINDS)})")
        due = spec.get("due")
        assignments.append(Assignment(
            id=str(aid), title=_expect(spec.get("title"), str, f"{where}.title"),
            chapters=_str_list(spec.get("chapters", []), f"{where}.chapters"),
            judge_context=_str_list(spec.get("judge_context", []), f"{where}.judge_context"),
            models=models, grading=_grading(spec.get("grading"), f"{where}.grading", base),
            due=None if due is None else str(due),
            lms_name=None if spec.get("lms_name") is None else _expect(spec["lms_name"], str, f"{where}.lms_name"),
            canvas_id=None if spec.get("canvas_id") is None else _expect(spec["canvas_id"], int, f"{where}.canvas_id"),
            handed_in_outputs=tuple((str(gid), _str_list(cells, f"{where}.handed_in_outputs.{gid}"))
                                    for gid, cells in shown.items())))
    return Course(title=_expect(data.get("title"), str, "title"),
                  student_repo=_repo(repos.get("student"), "repositories.student"),
                  instructor_repo=_repo(repos.get("instructor"), "repositories.instructor"),
                  assignments=tuple(assignments), root=root, grading=base)


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> Course:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CourseFileError(f"{COURSE_FILE} is not valid YAML: {exc}") from None
    return parse(data, Path(path).parent)


def load(root: Path = ROOT) -> Course:
    """The course file of the checkout at ``root`` (cached until the file changes)."""
    path = Path(root) / COURSE_FILE
    if not path.exists():
        raise CourseFileError(f"no {COURSE_FILE} in {root}")
    course = _load(str(path), path.stat().st_mtime)
    for a in course.assignments:
        if (Path(root) / SOURCE_DIR).is_dir() and not (Path(root) / SOURCE_DIR / a.id / a.notebook).exists():
            raise CourseFileError(f"{COURSE_FILE}: assignment {a.id!r} has no notebook {SOURCE_DIR}/{a.id}/{a.notebook}")
    return course
