"""Everything that names the course's repositories or lists its assignments, written from
``course.yml`` (``python -m autograder release`` runs ``stamp``; a test runs ``check``).

* the setup cell of every notebook (book pages and assignments), from one template: it installs
  ``coursekit`` from the *student* repository where it is missing;
* the book's launch and repository buttons (``_config.yml``) and ``coursekit/_course.py``;
* the assignment tables of ``README.md`` and ``book/assignments.md`` (Colab badges included),
  between ``<!-- assignments:start -->`` and ``<!-- assignments:end -->``;
* the README's grading-steps table (points graded automatically and by hand, from the nbgrader
  metadata of each source notebook), between ``<!-- grading-steps:start -->`` and
  ``<!-- grading-steps:end -->``;
* the Colab grading notebook's default course repository (the *instructor* one);
* the list of every chapter's exercises on ``book/assignments.md`` (``autograder.course.exercises``),
  between ``<!-- exercises:start -->`` and ``<!-- exercises:end -->``.

So moving the course to other repositories is one edit of ``course.yml`` and one release.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

from autograder.course.cells import graded_cells
from autograder.course.exercises import exercises_table
from autograder.course.model import Course, load

SETUP_MARK = "# Setup: works on Colab, in JupyterLab and offline. Installs only what is missing."
TABLE_START, TABLE_END = "<!-- assignments:start -->", "<!-- assignments:end -->"
EXERCISES_START, EXERCISES_END = "<!-- exercises:start -->", "<!-- exercises:end -->"
STEPS_START, STEPS_END = "<!-- grading-steps:start -->", "<!-- grading-steps:end -->"


def setup_source(course: Course, assignment: str | None = None) -> str:
    """The setup cell: the same lines in every notebook; assignments add the self-check."""
    repo = course.student_repo
    lines = [SETUP_MARK,
             "import importlib.util, subprocess, sys",
             'if importlib.util.find_spec("coursekit") is None:  # e.g. a fresh Colab runtime',
             '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",',
             f'                    "git+{repo.url}@{repo.branch}"], check=True)',
             "from coursekit import setup_notebook"]
    if assignment:
        lines += ["from coursekit.selfcheck import check, handin_report, student, warn_only",
                  f'DEVICE = setup_notebook(seed=0, assignment="{assignment}")']
    else:
        lines += ["DEVICE = setup_notebook(seed=0)"]
    return "\n".join(lines)


def colab_url(course: Course, path: str) -> str:
    repo = course.student_repo
    return f"https://colab.research.google.com/github/{repo.name}/blob/{repo.branch}/{path}"


BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


def readme_table(course: Course) -> str:
    rows = ["| assignment | open in Colab |", "|---|---|"]
    for a in course.assignments:
        url = colab_url(course, f"exercises/{a.id}/{a.notebook}")
        rows.append(f"| `{a.id}` — {a.title} | [![Open In Colab]({BADGE})]({url}) |")
    return "\n".join(rows)


def grading_points(course: Course, assignment: str) -> tuple[float, float]:
    """(points graded automatically, points graded by hand) of an assignment, from the nbgrader
    metadata of its source notebook: autograded test cells carry the first; manually graded
    answers (``grade`` and ``solution``) and task cells the second."""
    a = course.assignment(assignment)
    nb = nbformat.read(Path(course.root) / "solutions" / a.id / a.notebook, as_version=4)
    cells = graded_cells(nb)
    auto = sum(c.points for c in cells if c.kind == "auto")
    hand = sum(c.points for c in cells if c.kind == "manual")
    hand += sum(float(c.metadata["nbgrader"].get("points", 0)) for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("task") and not c.metadata["nbgrader"].get("grade"))
    return auto, hand


def _points(x: float) -> str:
    return f"{x:g}"


def grading_steps_table(course: Course) -> str:
    """Which of the instructor's steps each assignment needs: 1 only when nothing is graded by hand."""
    rows = ["| assignment | points graded automatically | points graded by hand | steps |", "|---|---|---|---|"]
    for a in course.assignments:
        auto, hand = grading_points(course, a.id)
        steps = "1–3 (`grade`, `handgrade`, `export`)" if hand else "1 only (`grade`)"
        rows.append(f"| `{a.id}` | {_points(auto)} | {_points(hand)} | {steps} |")
    return "\n".join(rows)


def _page_title(root: Path, page: str) -> str:
    path = root / "book" / f"{page}.ipynb"
    if not path.exists():
        return page
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, re.M)
            if m:
                return re.sub(r"^\d+(\.\d+)*\.?\s+", "", m.group(1)).strip()
    return page


def book_table(course: Course) -> str:
    rows = ["| assignment | practises | open |", "|---|---|---|"]
    for a in course.assignments:
        chapters = ", ".join(f"[{_page_title(course.root, c)}]({c}.ipynb)" for c in a.chapters)
        url = colab_url(course, f"exercises/{a.id}/{a.notebook}")  # a text link: the book loads nothing remote
        rows.append(f"| {a.title} (`{a.id}`) | {chapters} | [Open in Colab]({url}) |")
    return "\n".join(rows)


def _between(text: str, content: str, where: str, start: str = TABLE_START, end: str = TABLE_END) -> str:
    if start not in text or end not in text:
        raise ValueError(f"{where}: the markers {start} and {end} are missing")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{content}\n{end}{tail}"


def course_module(course: Course) -> str:
    repo = course.student_repo
    return ('"""Written by `python -m autograder release` from course.yml: where students get the course."""\n'
            f"REPO = {repo.name!r}\nBRANCH = {repo.branch!r}\n")


def _stamp_setup(path: Path, source: str, write: bool) -> bool:
    """Replace the notebook's setup cell (the first code cell that starts with SETUP_MARK)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith(SETUP_MARK):
            if cell.source == source:
                return False
            if write:
                cell.source = source
                nbformat.write(nb, path)
            return True
    raise ValueError(f"{path}: no setup cell (a code cell starting with {SETUP_MARK!r})")


def _config_yml(text: str, course: Course) -> str:
    repo = course.student_repo
    text = re.sub(r"(?m)^(\s*url:\s*)https://github\.com/\S+", lambda m: m.group(1) + repo.url, text)
    return re.sub(r"(?m)^(repository:\n(?:\s+.*\n)*?\s+branch:\s*)\S+", lambda m: m.group(1) + repo.branch, text)


def _colab_grader(text: str, course: Course) -> str:
    """The grading notebook's default COURSE_REPO (the instructor repository)."""
    url = course.instructor_repo.url
    return re.sub(r'(COURSE_REPO = param\(\\"REPO\\", \\")https://github\.com/[^\\"]+', lambda m: m.group(1) + url,
                  text)


def targets(root: Path) -> dict[str, Path]:
    return {"readme": root / "README.md", "book_table": root / "book" / "assignments.md",
            "config": root / "_config.yml", "module": root / "coursekit" / "_course.py",
            "grader": root / "instructor" / "grade_on_colab.ipynb",
            "grader_readme": root / "instructor" / "README.md"}


def stamp(root: Path | None = None, course: Course | None = None, write: bool = True) -> list[Path]:
    """Write every generated piece; returns the files that changed (or would, with write=False)."""
    course = course or (load(root) if root else load())
    root = Path(course.root)
    changed: list[Path] = []

    def update(path: Path, new: str) -> None:
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old != new:
            changed.append(path)
            if write:
                path.write_text(new, encoding="utf-8")

    for a in course.assignments:
        path = root / "solutions" / a.id / a.notebook
        if _stamp_setup(path, setup_source(course, a.id), write):
            changed.append(path)
    for page in sorted((root / "book").glob("*.ipynb")):
        if _stamp_setup(page, setup_source(course), write):
            changed.append(page)
    t = targets(root)
    readme = _between(t["readme"].read_text(encoding="utf-8"), readme_table(course), "README.md")
    update(t["readme"], _between(readme, grading_steps_table(course), "README.md", STEPS_START, STEPS_END))
    book_page = _between(t["book_table"].read_text(encoding="utf-8"), book_table(course), "book/assignments.md")
    update(t["book_table"], _between(book_page, exercises_table(root), "book/assignments.md", EXERCISES_START,
                                     EXERCISES_END))
    update(t["config"], _config_yml(t["config"].read_text(encoding="utf-8"), course))
    update(t["module"], course_module(course))
    if t["grader"].exists():
        update(t["grader"], _colab_grader(t["grader"].read_text(encoding="utf-8"), course))
    if t["grader_readme"].exists():
        update(t["grader_readme"], re.sub(r"https://colab\.research\.google\.com/github/[^/]+/[^/]+/blob/[^/]+/",
                                          f"https://colab.research.google.com/github/{course.instructor_repo.name}/"
                                          f"blob/{course.instructor_repo.branch}/",
                                          t["grader_readme"].read_text(encoding="utf-8")))
    return changed


def check(root: Path | None = None) -> list[Path]:
    """The generated files that do not match course.yml (empty when all do)."""
    return stamp(root, write=False)


def main() -> None:  # pragma: no cover - used by hand
    for path in stamp():
        print(f"stamped {path}")


if __name__ == "__main__":  # pragma: no cover
    main()


__all__ = ["setup_source", "stamp", "check", "readme_table", "book_table", "colab_url", "course_module",
           "grading_points", "grading_steps_table"]
