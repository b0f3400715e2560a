"""The instructor build of the book: ``python -m autograder instructor-book``.

The student book ends every chapter with its exercises and holds no solution. The worked
solutions live in this (instructor) repository, in ``instructor/exercises/*.md`` (sphinx-exercise's
``{solution}`` directive, one per exercise, with the code of ``instructor/exercises/answers.py``
included where an exercise asks for code or a number). This command builds the same book with one
part more, *Solutions (instructors only)*, into ``_build/instructor/html``: it writes a table of
contents and a configuration of its own under ``_build/instructor/`` (``_toc.yml`` and
``_config.yml`` are not changed) and reuses the student build's execution cache, so pages the book
build or the tests executed are not run again. ``publish`` never copies ``instructor/``, and proves
that no solution and no answer reaches the student course.
"""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from autograder.course.exercises import chapters, exercises, solution_labels

OUT = Path("_build") / "instructor"
PART = "Solutions (instructors only)"


class InstructorBookError(RuntimeError):
    pass


def missing_solutions(root: Path) -> list[str]:
    """One line for every exercise of the book without a worked solution, and every solution
    that names no exercise."""
    labels = {e.label: e for e in exercises(root)}
    solved = solution_labels(root)
    out = [f"exercise {e.number} ({e.page}): no {{solution}} {e.label} in instructor/exercises/"
           for label, e in labels.items() if label not in solved]
    out += [f"{page}: a solution for {label}, which no page of the book has" for label, page in solved.items()
            if label not in labels]
    return out


def instructor_toc(root: Path) -> dict:
    """_toc.yml with the solution pages as a last part, in the order of their chapters."""
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text(encoding="utf-8"))
    order = {page: n for page, n in chapters(root).items()}
    first: dict[str, int] = {}
    solved = solution_labels(root)
    for e in exercises(root):
        if e.label in solved:
            first.setdefault(solved[e.label], order[e.page])
    pages = sorted(set(solved.values()), key=lambda p: (first.get(p, 10**6), p))
    toc = copy.deepcopy(toc)
    toc.setdefault("parts", []).append({"caption": PART, "chapters": [{"file": p} for p in pages]})
    return toc


def instructor_config(root: Path, execute: bool = True) -> dict:
    """_config.yml, with the execution cache of the student build (so nothing runs twice);
    ``execute=False`` builds the pages as they are, without running them (a quick check of the
    exercises and solutions, whose glued numbers are then missing)."""
    config = yaml.safe_load((Path(root) / "_config.yml").read_text(encoding="utf-8"))
    config.setdefault("execute", {})["cache"] = str((Path(root) / "_build" / ".jupyter_cache").resolve())
    if not execute:
        config["execute"]["execute_notebooks"] = "off"
    config["title"] = f"{config.get('title', 'The course')} (instructor edition, with solutions)"
    return config


def build(root: Path, extra: list[str] | None = None, out: Path | None = None, execute: bool = True) -> Path:
    """Write the instructor table of contents and configuration, then build into ``out`` (default
    ``_build/instructor``); returns the HTML folder."""
    root = Path(root).resolve()
    problems = missing_solutions(root)
    if problems:
        raise InstructorBookError(f"{len(problems)} exercise(s) and solutions do not match:\n" + "\n".join(problems))
    out = Path(out) if out is not None else root / OUT
    out.mkdir(parents=True, exist_ok=True)
    (out / "_toc.yml").write_text(yaml.safe_dump(instructor_toc(root), sort_keys=False), encoding="utf-8")
    (out / "_config.yml").write_text(yaml.safe_dump(instructor_config(root, execute), sort_keys=False),
                                     encoding="utf-8")
    book = shutil.which("jupyter-book", path=str(Path(sys.executable).parent)) or shutil.which("jupyter-book")
    if book is None:
        raise InstructorBookError("jupyter-book is not installed (bash scripts/env.sh installs requirements.txt)")
    cmd = [book, "build", str(root), "--toc", str(out / "_toc.yml"), "--config", str(out / "_config.yml"),
           "--path-output", str(out), *(extra or [])]
    if subprocess.run(cmd, cwd=root, stdout=None if execute else subprocess.DEVNULL).returncode:
        raise InstructorBookError("the instructor build of the book failed (its output is above)")
    return out / "_build" / "html"
