"""The student's loop: self-checks and the hand-in cell, in plain nbclient execution.

The hand-in report of every assignment's filled and untouched exercise is checked in the
assignment's own autograding tests (assert_self_check_passed / assert_self_check_reports_missing
in conftest), on the notebooks autograding has just executed, so no notebook runs twice."""
from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from conftest import HIDDEN_RE, ROOT, cell_text, fill_solutions, handin_cell, read_nb

def execute(nb, cwd, allow_errors=False):
    NotebookClient(nb, timeout=900, allow_errors=allow_errors,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def exercise_paths(name):
    return ROOT / "exercises" / name / f"{name}.ipynb", ROOT / "solutions" / name / f"{name}.ipynb"


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
    shown = {ln.strip() for ln in (q1 + q2 + final).splitlines()}
    hidden = {ln.strip() for cell in read_nb(src).cells for region in HIDDEN_RE.findall(cell.source)
              for ln in region.splitlines() if len(ln.strip()) >= 12}
    assert hidden and not hidden & shown, sorted(hidden & shown)[:3]
    assert "einsum(" not in q1 + q2 + final
