"""The exercises at the end of the book's pages, as the pages write them.

A page ends with a ``## Exercises`` section of ``{exercise}`` directives (sphinx-exercise), each
with a label ``ex-<chapter>-<n>`` and a title that starts with its kind::

    ```{exercise} Compute: a byte-level BPE tokenizer of your own
    :label: ex-13-2
    ```

The chapter is the page's number in the book: its place among the numbered chapters of
``_toc.yml``, which is also the number Sphinx gives it. A *compute* exercise has a self-check cell,
``check_answer("13.2", value, key="...")`` (``coursekit.exercises``). The worked solutions are not in
the book: they live in ``instructor/exercises/`` and reach only the instructor build
(``python -m autograder instructor-book``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import yaml

KINDS = {"derive": "derive", "compute": "compute", "change the code": "change the code"}
_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{exercise\}[ \t]*(?P<title>[^\n]*)\n(?P<options>(?::[^\n]*\n)*)", re.M)
_LABEL = re.compile(r"^:label:\s*(?P<label>\S+)\s*$", re.M)
_CHECK = re.compile(r"check_answer\(\s*[\"'](?P<number>[^\"']+)[\"']\s*,\s*[^,]+,\s*key\s*=\s*[\"'](?P<key>[^\"']+)[\"']")
_SOLUTION = re.compile(r"^(`{3,}|:{3,})\{solution(-start)?\}[ \t]*(?P<label>\S+)", re.M)


class ExerciseError(ValueError):
    pass


@dataclass(frozen=True)
class Exercise:
    number: str      # "13.2"
    label: str       # "ex-13-2"
    kind: str        # derive | compute | change the code
    title: str       # the title without its kind
    page: str        # "book/14_tokenisation"
    key: str | None  # the self-check's key (compute exercises)


def chapters(root: Path) -> dict[str, int]:
    """Each numbered page of _toc.yml and its chapter number (pages of unnumbered parts: none)."""
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text(encoding="utf-8"))
    out: dict[str, int] = {}
    for part in toc.get("parts", []):
        if not part.get("numbered"):
            continue
        for chapter in part.get("chapters", []):
            out[chapter["file"]] = len(out) + 1
    return out


def _kind(title: str, where: str) -> tuple[str, str]:
    head, sep, rest = title.partition(":")
    kind = KINDS.get(head.strip().lower())
    if not sep or kind is None:
        raise ExerciseError(f"{where}: the exercise title {title!r} must start with its kind "
                            f"({', '.join(k.capitalize() for k in KINDS)}, then a colon)")
    return kind, rest.strip()


def page_exercises(root: Path, page: str, chapter: int) -> list[Exercise]:
    """The exercises of one page, in order, checked: labels ex-<chapter>-1, -2, ... and one
    self-check for each compute exercise."""
    path = Path(root) / f"{page}.ipynb"
    nb = nbformat.read(path, as_version=4)
    found: list[Exercise] = []
    keys: dict[str, str] = {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for m in _DIRECTIVE.finditer(cell.source):
                label_m = _LABEL.search(m.group("options"))
                n = len(found) + 1
                expected = f"ex-{chapter}-{n}"
                if not label_m or label_m.group("label") != expected:
                    got = label_m.group("label") if label_m else "none"
                    raise ExerciseError(f"{page}: exercise {n} of chapter {chapter} must have the label {expected} "
                                        f"(it has {got})")
                kind, title = _kind(m.group("title"), f"{page}, {expected}")
                found.append(Exercise(f"{chapter}.{n}", expected, kind, title, page, None))
        elif cell.cell_type == "code":
            for m in _CHECK.finditer(cell.source):
                if m.group("number") in keys:
                    raise ExerciseError(f"{page}: two self-checks for exercise {m.group('number')}")
                keys[m.group("number")] = m.group("key")
    by_number = {e.number: e for e in found}
    for number in keys:
        if number not in by_number or by_number[number].kind != "compute":
            raise ExerciseError(f"{page}: a self-check names exercise {number}, which is not a compute exercise "
                                "of this page")
    out = []
    for e in found:
        if e.kind == "compute" and e.number not in keys:
            raise ExerciseError(f"{page}: compute exercise {e.number} has no self-check cell (check_answer)")
        out.append(Exercise(e.number, e.label, e.kind, e.title, e.page, keys.get(e.number)))
    return out


def exercises(root: Path) -> list[Exercise]:
    """Every exercise of the book, in the order of its chapters."""
    out: list[Exercise] = []
    for page, number in chapters(root).items():
        if (Path(root) / f"{page}.ipynb").exists():
            out += page_exercises(root, page, number)
    return out


def solution_labels(root: Path) -> dict[str, str]:
    """Each exercise label that a page of instructor/exercises/ solves, and that page."""
    out: dict[str, str] = {}
    for path in sorted((Path(root) / "instructor" / "exercises").glob("*.md")):
        for m in _SOLUTION.finditer(path.read_text(encoding="utf-8")):
            out[m.group("label")] = path.relative_to(root).with_suffix("").as_posix()
    return out


def _page_title(root: Path, page: str) -> str:
    nb = nbformat.read(Path(root) / f"{page}.ipynb", as_version=4)
    for cell in nb.cells:
        m = re.search(r"^#\s+(.+)$", cell.source, re.M) if cell.cell_type == "markdown" else None
        if m:
            return m.group(1).strip()
    return page


def exercises_table(root: Path) -> str:
    """The table of book/assignments.md that lists every chapter's exercises, linked."""
    rows = ["| chapter | exercises |", "|---|---|"]
    by_page: dict[str, list[Exercise]] = {}
    for e in exercises(root):
        by_page.setdefault(e.page, []).append(e)
    for page, found in by_page.items():
        chapter = found[0].number.split(".")[0]
        links = ", ".join(f"{{ref}}`{e.number} <{e.label}>` ({e.kind})" for e in found)
        rows.append(f"| {chapter}. [{_page_title(root, page)}]({Path(page).name}.ipynb) | {links} |")
    return "\n".join(rows)
