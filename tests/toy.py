"""The toy course (tests/fixtures/toy_course): one assignment, ``toy``, of two questions and no
torch, 5 points.  A test grades it with real kernels through the whole pipeline in seconds,
where grading a course assignment takes a minute; the course's own assignments are graded for
real once each elsewhere (tests/test_autograde.py and the assignments tier)."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import nbformat

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "toy_course"
# the points of each test cell, as the assignment's source gives them
POINTS = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"]
          for c in nbformat.read(FIXTURE / "solutions" / "toy" / "toy.ipynb", as_version=4).cells
          if c.metadata.get("nbgrader", {}).get("grade")}


def toy_course(dest: Path) -> Path:
    """A copy of the toy course at ``dest`` with its exercise released (``exercises/toy``), as
    ``python -m autograder release`` does for the course."""
    from autograder.authoring.release import release

    shutil.copytree(FIXTURE, dest)
    release(["toy"], out_dir=dest / "exercises", root=dest)
    return dest


def exercise(root: Path):
    return nbformat.read(root / "exercises" / "toy" / "toy.ipynb", as_version=4)


def answered(root: Path, **answers: str):
    """The released exercise with the reference answers, or ``answers`` (grade_id -> the cell's
    whole source) where given: what a student hands in."""
    source = nbformat.read(root / "solutions" / "toy" / "toy.ipynb", as_version=4)
    reference = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    reference = {gid: src.replace("    ### BEGIN SOLUTION\n", "").replace("\n    ### END SOLUTION", "")
                 for gid, src in reference.items()}
    reference.update(answers)
    nb = copy.deepcopy(exercise(root))
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in reference:
            cell.source = reference[gid]
    return nb
