"""instructor/grade_on_colab.ipynb on a rebuilt copy of today's Colab runtime (issue 33, item 4).

The two assignments Colab's package clashes broke, ``finetune`` (datasets with torchvision) and
``parameters_and_lora`` (peft with torchao), graded by the instructor's Colab notebook where it
would run on Colab: its grader environment is laid over the runtime's packages as the notebook
lays it on Colab (tests/colab_runtime.py, ``grader_python``), and its own install step adds only
what that runtime lacks (``INSTALL = "missing"``). A Canvas download holds each assignment's
reference answers and the untouched exercise; the first must earn every automatically graded
point, the second none, and no cell of the grading notebook may fail.

CPU only here; on a GPU (the device machine, when one is lent) the same notebook runs with
``COURSE_DEVICE`` unset: see the note of issue 33.
"""
from __future__ import annotations

import csv
import json
import os
import zipfile

import pytest

from colab_runtime import grader_python, runtime_python, snapshots
from colab_tier import run_cells
from conftest import ROOT, filled_exercise, read_nb

pytestmark = [pytest.mark.slow, pytest.mark.colab]

TODAY = snapshots()[0]
NOTEBOOK = ROOT / "instructor" / "grade_on_colab.ipynb"

@pytest.fixture(scope="module", params=["parameters_and_lora", "finetune"])
def graded(request, tmp_path_factory):
    assignment = request.param
    tmp = tmp_path_factory.mktemp(f"colab-{assignment}")
    lms_zip = tmp / "submissions.zip"
    with zipfile.ZipFile(lms_zip, "w") as zf:  # Canvas "Download Submissions" names
        zf.writestr(f"solved_2001_6001_{assignment}.ipynb", json.dumps(filled_exercise(assignment)))
        zf.writestr(f"untouched_2002_6002_{assignment}.ipynb",
                    (ROOT / "exercises" / assignment / f"{assignment}.ipynb").read_bytes())
    roster = tmp / "roster.csv"
    roster.write_text("student_id,lms_id,name\nc001,2001,Solved Student\nc002,2002,Untouched Student\n")
    work = tmp / "work"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(GRADE_ON_COLAB_ASSIGNMENT=assignment, GRADE_ON_COLAB_ZIP=str(lms_zip),
               GRADE_ON_COLAB_ROSTER=str(roster), GRADE_ON_COLAB_WORK_DIR=str(work),
               GRADE_ON_COLAB_INSTALL="missing", GRADE_ON_COLAB_WORKERS="1",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", COURSE_DEVICE=env.get("COURSE_DEVICE", "cpu"),
               # Colab's image keeps Jupyter's data files (nbconvert's templates) in /usr/local/share/jupyter,
               # a system path of every Python there; the rebuilt runtime keeps them in its own prefix
               JUPYTER_PATH=str(runtime_python(TODAY).parent.parent / "share" / "jupyter"))
    # run where an instructor opens it: in the course checkout, which the notebook finds from its folder
    cells = {c["id"]: c for c in run_cells(grader_python(TODAY), NOTEBOOK, env, scratch=tmp, timeout=3000)}
    out = work / "results" / assignment
    rows = {}
    if (out / "grades.csv").exists():
        with open(out / "grades.csv", newline="") as fh:
            rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    return assignment, cells, rows


def test_the_notebook_runs_on_colabs_packages(graded):
    """Every cell of the grading notebook runs; the grader reports Colab's own package versions."""
    assignment, cells, _ = graded
    broken = {cid: c["errors"] for cid, c in cells.items() if c["errors"]}
    assert not broken, f"{assignment}: {broken}\n" + "\n".join(cells[cid]["text"][-2500:] for cid in broken)
    versions = cells["grader"]["text"]
    for name in ("transformers", "torch"):
        want = TODAY.version(name)
        if want:
            assert f"{name} {want}" in versions, versions[-800:]


def test_solved_earns_every_automatic_point_and_untouched_none(graded):
    """The reference answers earn all automatically graded points; the untouched exercise none."""
    assignment, _, rows = graded
    solved, untouched = rows["c001"], rows["c002"]
    source = read_nb(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    auto_max = sum(float(c.metadata["nbgrader"].get("points", 0)) for c in source.cells
                   if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")
                   and not c.metadata["nbgrader"].get("task"))
    assert solved["status"] == "graded" and float(solved["auto"]) == auto_max > 0, (solved, auto_max)
    assert untouched["status"] == "graded" and float(untouched["auto"]) == 0, untouched
