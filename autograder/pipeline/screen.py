"""Is this file of this assignment?  An instructor who grades the wrong zip must lose nothing.

A file looks like another assignment of the course when its name ends with that assignment's
name (``s1_project_aether.ipynb``, a Canvas ``..._project_aether.ipynb``) and not with this
one's, or when its graded cells carry more of that assignment's grade ids than of this one's.
Such a file is refused with one line naming the assignment it looks like; when most of a batch
is, the run stops before anything is written (``GradingError``: exit status 2).
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from autograder import SOURCE_DIR
from autograder.course.errors import GradingError

from .chain import RunContext
from .intake import Submission

MIN_CELLS = 3  # grade ids of another assignment a notebook must carry to look like it


@lru_cache(maxsize=8)
def _grade_ids(root: str, assignments: tuple[str, ...]) -> dict[str, frozenset]:
    """assignment -> the grade ids of its source notebook."""
    out = {}
    for a in assignments:
        path = Path(root) / SOURCE_DIR / a / f"{a}.ipynb"
        try:
            cells = json.loads(path.read_text())["cells"]
        except (OSError, ValueError, KeyError):
            continue
        out[a] = frozenset(c["metadata"]["nbgrader"]["grade_id"] for c in cells
                           if isinstance(c.get("metadata", {}).get("nbgrader"), dict)
                           and c["metadata"]["nbgrader"].get("grade_id"))
    return out


def _named_after(name: str, assignment: str) -> bool:
    stem = re.sub(r"\s*\(\d+\)$", "", Path(name).stem).replace("-", "_").lower()
    stem = re.sub(r"_\d+$", "", stem)  # Canvas' -1, -2 of a resubmission
    return bool(re.search(rf"(^|[_\s]){re.escape(assignment.lower())}$", stem))


def looks_like(sub, assignment: str, ids: dict[str, frozenset]) -> tuple[str, str] | None:
    """(the other assignment, why) when ``sub`` belongs to another assignment, else None."""
    others = [a for a in ids if a != assignment]
    for name in (sub.source, sub.file):
        if name and not _named_after(name, assignment):
            for other in others:
                if _named_after(name, other):
                    return other, f"its name, {Path(name).name}"
    if sub.grade_ids:
        mine = len(sub.grade_ids & ids.get(assignment, frozenset()))
        best = max(others, key=lambda a: len(sub.grade_ids & ids[a]), default=None)
        if best is not None:
            theirs = len(sub.grade_ids & ids[best])
            if theirs >= MIN_CELLS and theirs > mine:
                return best, f"its graded cells ({theirs} of {best}'s, {mine} of {assignment}'s)"
    return None


def screen_assignment(ctx: RunContext, subs: tuple[Submission, ...]) -> tuple[Submission, ...]:
    """``subs`` with every submission of another assignment marked as not graded (copies: the
    submissions given are not changed), or the run stopped when most of the batch is one (before
    anything is written)."""
    ids = _grade_ids(str(ctx.paths.course), tuple(ctx.course.ids))
    found = []
    for sub in subs:
        if sub.error or (sub.nb is None and not sub.source):
            continue
        hit = looks_like(sub, ctx.assignment, ids)
        if hit is not None:
            found.append((sub, *hit))
    readable = [s for s in subs if not s.error]
    if found and len(found) * 2 > len(readable):
        others = sorted({other for _, other, _ in found})
        raise GradingError(
            f"stopped: {len(found)} of {len(readable)} files look like {' or '.join(others)}, not {ctx.assignment} "
            f"(e.g. {Path(found[0][0].source or found[0][0].file).name}: {found[0][2]}); nothing was graded or written. "
            "Is it the right zip? "
            f"To grade them: python -m autograder grade {others[0]} ...")
    refused = {id(sub): f"not graded: this file looks like {other}, not {ctx.assignment} ({why})"
               for sub, other, why in found}
    return tuple(replace(sub, error=refused[id(sub)], nb=None) if id(sub) in refused else sub for sub in subs)
