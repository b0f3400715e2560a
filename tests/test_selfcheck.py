"""The student's loop: self-checks and the hand-in cell, in plain nbclient execution."""
from __future__ import annotations

import copy

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT, read_nb, source_notebooks

ASSIGNMENTS = [p.parent.name for p in source_notebooks()]


def fill_solutions(exercise, source):
    """The exercise notebook with every answer cell replaced by the reference answer."""
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    nb = copy.deepcopy(exercise)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def execute(nb, cwd, allow_errors=False):
    NotebookClient(nb, timeout=900, allow_errors=allow_errors,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def cell_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream") + \
        "".join(f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error")


def handin_cell(nb):
    cells = [c for c in nb.cells if c.cell_type == "code" and "handin_report(" in c.source]
    assert len(cells) == 1, "every exercise ends with one hand-in cell"
    return cells[0]


def exercise_paths(name):
    return ROOT / "exercises" / name / f"{name}.ipynb", ROOT / "solutions" / name / f"{name}.ipynb"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_filled_exercise_passes_its_self_check(name):
    ex, src = exercise_paths(name)
    nb = execute(fill_solutions(read_nb(ex), read_nb(src)), ex.parent)
    out = cell_text(handin_cell(nb))
    assert "all visible checks passed" in out, out
    assert "WARNING" not in out and "[FAIL]" not in out, out


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_untouched_exercise_reports_what_is_missing(name):
    ex, _ = exercise_paths(name)
    nb = execute(read_nb(ex), ex.parent, allow_errors=True)
    cell = handin_cell(nb)
    assert not any(o.output_type == "error" for o in cell.outputs), "the hand-in cell must not crash"
    out = cell_text(cell)
    assert "not answered yet" in out and "visible check(s) failed" in out, out
    assert "[PASS]" not in out, out


def test_check_one_question_and_partial_run_warning(tmp_path):
    ex, src = exercise_paths("attention")
    nb = fill_solutions(read_nb(ex), read_nb(src))
    # run only up to Q1's answer, then ask for Q1 and Q2, then the hand-in cell
    keep, cells = [], nb.cells
    for cell in cells:
        keep.append(cell)
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "get_multihead_qkv":
            break
    keep += [nbformat.v4.new_code_cell('check("q1")'), nbformat.v4.new_code_cell('check("q2")'),
             handin_cell(nb)]
    nb.cells = keep
    execute(nb, ex.parent, allow_errors=True)
    q1, q2, final = (cell_text(c) for c in nb.cells[-3:])
    assert "[PASS] Q1" in q1 and "1/1 visible checks passed" in q1, q1
    assert "hidden test(s) run at grading time" in q1
    assert "[FAIL] Q2" in q2 and "calculate_multihead_attention" in q2, q2
    assert "WARNING: only" in final and "Restart and run all" in final, final
    # the self-check never shows hidden-test code
    secret = read_nb(src)
    assert "einsum(" not in q1 + q2 + final
