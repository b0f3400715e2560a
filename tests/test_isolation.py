"""One fresh kernel in one fresh sandbox per submission, also now that a worker launches the
next submission's kernel while the current one is graded (``JudgedExecute.prestart``) and
forks it from a zygote that imported torch once (``autograder.isolation.zygote``): what a submission
does to its kernel, its files and its environment never reaches the next one.

Two submissions go to one worker, in order.  The first plants state everywhere it can
(a file in ``/tmp``, ``/dev/shm`` and its working folder, an environment variable, an attribute on the
torch module, a patched ``torch.softmax``); the second is a correct answer with one extra
cell that breaks its own Q2 answer if it sees any of that.  The control plants and checks
in the same notebook, so the check is shown to bite.
"""
from __future__ import annotations

import csv

import nbformat
import nbformat.v4

from autograder.pipeline.run import grade
from conftest import filled_exercise

PLANT = '''\
import os, pathlib, torch
pathlib.Path("/tmp/planted").write_text("x")
pathlib.Path("planted.txt").write_text("x")
pathlib.Path("/dev/shm/planted").write_text("x")
os.environ["COURSE_PLANTED"] = "1"
torch._planted = True
torch.softmax = lambda *args, **kwargs: None
'''
CHECK = '''\
import os, torch
_leaks = [p for p in ("/tmp/planted", "planted.txt", "/dev/shm/planted") if os.path.exists(p)]
_leaks += ["environment"] if "COURSE_PLANTED" in os.environ else []
_leaks += ["torch module"] if hasattr(torch, "_planted") or torch.softmax(torch.zeros(2), 0) is None else []
if _leaks:
    def calculate_multihead_attention(*args, **kwargs):
        raise RuntimeError(f"another submission's state leaked in: {_leaks}")
'''


def _with_cells(*sources: str):
    """The reference answers, with ``sources`` as extra cells right after the Q2 answer."""
    nb = filled_exercise("attention")
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id") == "calculate_multihead_attention")
    for offset, src in enumerate(sources, start=1):
        nb.cells.insert(at + offset, nbformat.v4.new_code_cell(src))
    return nb


def test_the_next_submission_sees_nothing_of_the_previous_one(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(_with_cells(PLANT), subs / "s1_planter_attention.ipynb")
    nbformat.write(_with_cells(CHECK), subs / "s2_checker_attention.ipynb")
    nbformat.write(_with_cells(PLANT, CHECK), subs / "s3_control_attention.ipynb")
    report = grade("attention", subs, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading", workers=1)
    with open(tmp_path / "out" / "grades.csv", newline="") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert {r.status for r in report.results} == {"graded"}
    full = rows["s2_checker"]["max_score"]
    assert rows["s2_checker"]["total"] == full, rows["s2_checker"]  # nothing leaked in
    assert float(rows["s3_control"]["Q2"]) < float(rows["s2_checker"]["Q2"]), "the check never bites"
