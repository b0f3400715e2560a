"""instructor/grade_on_colab.ipynb on a rebuilt copy of today's Colab runtime (issue 33, item 4).

The two assignments Colab's package clashes broke, ``finetune`` (datasets with torchvision) and
``parameters_and_lora`` (peft with torchao), graded by the instructor's Colab notebook where it
would run on Colab: its grader environment is laid over the runtime's packages as the notebook
lays it on Colab (tests/colab_runtime.py, ``grader_python``), and its own install step adds only
what that runtime lacks (``INSTALL = "missing"``). A Canvas download holds each assignment's
reference answers and the untouched exercise; the first must earn every automatically graded
point, the second none, and no cell of the grading notebook may fail.

The tier asks whether grading works on Colab's packages, not how well a model learns: ``finetune``
is graded at its smoke profile (``SMOKE_GRADING``), from a copy of the checkout whose course.yml
says so, and its solved notebook may then miss the accuracy threshold's points only
(``test_fine_tuned_accuracy``); that the reference answers reach it at the ``cpu`` profile students
are graded at is checked by tests/test_finetune.py.

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
from conftest import ROOT, filled_exercise, fork_checkout, read_nb

pytestmark = [pytest.mark.slow, pytest.mark.colab]

TODAY = snapshots()[0]
NOTEBOOK = ROOT / "instructor" / "grade_on_colab.ipynb"

# assignment -> (its grading environment in course.yml, the same at the smoke profile; the tests
# whose points need the real profile's training, checked at that profile by tests/test_finetune.py)
SMOKE_GRADING = {"finetune": ("env: {COURSE_PROFILE: cpu, COURSE_MODEL_SOURCE: offline}",
                              "env: {COURSE_PROFILE: smoke, COURSE_MODEL_SOURCE: offline}",
                              {"test_fine_tuned_accuracy"})}


def course_for(assignment, tmp):
    """The checkout the notebook grades from: this one, or for SMOKE_GRADING a copy of it whose
    course.yml grades ``assignment`` at the smoke profile."""
    if assignment not in SMOKE_GRADING:
        return ROOT
    course = fork_checkout(tmp / "course")
    old, new, _ = SMOKE_GRADING[assignment]
    text = (course / "course.yml").read_text()
    assert text.count(old) == 1, f"course.yml no longer holds {old!r}: update SMOKE_GRADING"
    (course / "course.yml").write_text(text.replace(old, new))
    return course


@pytest.fixture(scope="module", params=["parameters_and_lora", "finetune"])
def graded(request, tmp_path_factory):
    assignment = request.param
    tmp = tmp_path_factory.mktemp(f"colab-{assignment}")
    notebook = course_for(assignment, tmp) / NOTEBOOK.relative_to(ROOT)
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
    cells = {c["id"]: c for c in run_cells(grader_python(TODAY), notebook, env, scratch=tmp, timeout=3000)}
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
    assignment, cells, rows = graded
    solved, untouched = rows["c001"], rows["c002"]
    source = read_nb(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    points = {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"].get("points", 0)) for c in source.cells
              if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")
              and not c.metadata["nbgrader"].get("task")}
    auto_max = sum(points.values())
    earned = {auto_max}
    if assignment in SMOKE_GRADING:  # graded at the smoke profile: the training-dependent points may be missed
        *_, needs_training = SMOKE_GRADING[assignment]
        assert needs_training <= set(points), f"SMOKE_GRADING names tests {assignment} does not have"
        assert "COURSE_PROFILE=smoke" in cells["sandbox"]["text"], cells["sandbox"]["text"][-800:]
        earned.add(auto_max - sum(points[t] for t in needs_training))
    assert solved["status"] == "graded" and float(solved["auto"]) in earned and auto_max > 0, (solved, earned)
    assert untouched["status"] == "graded" and float(untouched["auto"]) == 0, untouched
