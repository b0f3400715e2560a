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
    assert "[PASS] visible (2 points)" in q1 and "The visible test passed." in q1, q1
    assert "  hidden (4 points, run when graded): q, k and v match" in q1, q1  # one line per hidden test
    assert "Q1 Q1" not in q1 and "Q1 hidden" not in q1, q1  # the question is named once
    assert "[FAIL]" in q2 and "calculate_multihead_attention" in q2 and "not answered yet" in q2, q2
    assert "WARNING: only" in final and "Restart and run all" in final, final
    lines = final.strip().splitlines()
    assert lines[-1].startswith("Not ready to hand in: ") and "Q2 is not answered" in lines[-1], final
    # check() and handin_report() print; they leave no Out[] line
    assert not any(o.output_type == "execute_result" for c in nb.cells[-3:] for o in c.outputs), \
        [o for c in nb.cells[-3:] for o in c.outputs if o.output_type == "execute_result"]
    # the self-check never shows hidden-test code
    shown = {ln.strip() for ln in (q1 + q2 + final).splitlines()}
    hidden = {ln.strip() for cell in read_nb(src).cells for region in HIDDEN_RE.findall(cell.source)
              for ln in region.splitlines() if len(ln.strip()) >= 12}
    assert hidden and not hidden & shown, sorted(hidden & shown)[:3]
    assert "einsum(" not in q1 + q2 + final


# ----------------------------------------------- messages, written answers, no nbgrader (in-process)

def test_follow_on_failure_names_the_unanswered_question():
    """Q1 unanswered: Q2's tests cannot run, and say so instead of "name 'train_ds' is not defined"."""
    from notebook_run import NotebookRun

    run = NotebookRun("finetune")
    out = run.check("q2", replace={"preprocess": run.answer_source("preprocess", stub=True)})
    assert "Q1 is not answered yet, so Q2 cannot be checked" in out, out
    assert "run the cell that defines it first" not in out, out


def test_hand_in_report_lists_empty_written_answers_and_ends_with_one_line(tmp_path, monkeypatch, capsys):
    """An untouched project_aether: the code questions and the written answers Q1, Q3 and Q8b
    are reported, and the last line says what is missing."""
    from coursekit.selfcheck import handin_report
    from notebook_run import NotebookRun

    run = NotebookRun("project_aether")
    stubs = {c.metadata["nbgrader"]["grade_id"]: c.source for c in run.stub_nb.cells
             if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"}
    ns = run.namespace(stubs)
    nbformat.write(run.stub_nb, tmp_path / "project_aether.ipynb")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    report = handin_report(assignment="project_aether", namespace=ns)
    out = capsys.readouterr().out
    assert not report and repr(report).startswith("<hand-in check: Not ready")
    assert 'still reading "YOUR ANSWER HERE"' in out and "Q1 (2 points), Q3 (4 points) and Q8b (2 points)" in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("Not ready to hand in: Q2 is not answered; Q4 is not answered;"), last
    assert last.endswith("written answers Q1, Q3 and Q8b (8 points) are empty."), last


def test_self_check_works_without_nbgrader(tmp_path):
    """On Colab nbgrader is not installed: the self-check must not need it."""
    import subprocess
    import sys

    code = f"""
import json, sys
sys.modules["nbgrader"] = None  # any import of nbgrader now fails
sys.path.insert(0, {str(ROOT)!r})
nb = json.load(open({str(ROOT / "exercises" / "project_aether" / "project_aether.ipynb")!r}))
answers = {{c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in
           json.load(open({str(ROOT / "solutions" / "project_aether" / "project_aether.ipynb")!r}))["cells"]
           if c["metadata"].get("nbgrader", {{}}).get("solution")}}
ns = globals()  # the cells run in __main__, as in a kernel, with their sources in In
In = [""]
for c in nb["cells"]:
    meta = c["metadata"].get("nbgrader", {{}})
    if c["cell_type"] == "code" and not meta.get("grade") and meta.get("grade_id") != "handin_check":
        In.append(answers.get(meta.get("grade_id"), "".join(c["source"])))
        exec(In[-1], ns)
report = ns["check"](namespace=ns)
assert report and sys.modules["nbgrader"] is None
assert not [m for m in sys.modules if m.startswith("nbgrader.")]
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**__import__("os").environ, "COURSE_MODEL_SOURCE": "offline"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "All 6 visible tests passed" in proc.stdout, proc.stdout


def test_a_check_that_needs_an_undefined_answer_says_so(monkeypatch):
    """Q1's cell has a syntax error, so get_multihead_qkv is not defined. Q2's visible test uses it in
    a warn_only block: the warning says that Q2 could not be checked because of Q1, not that the
    student's code raised NameError, and promises no failing hidden test. Run by check() and by hand."""
    from notebook_run import NotebookRun

    run = NotebookRun("attention")
    # as a cell with a syntax error runs: it stops at once, and defines nothing
    broken = {"get_multihead_qkv": "raise SyntaxError(\"expected ':'\")\ndef get_multihead_qkv(x, w_q, w_k, w_v, n_head):\n    pass\n"}
    out = run.check("q2", replace=broken)
    assert "[WARN] Q2 could not be checked: it uses get_multihead_qkv, your answer to Q1, which is not defined" \
        in out, out
    assert "raised NameError" not in out and "hidden test of Q2 will fail" not in out, out
    ns = run.namespace(broken)
    test = next(c.source for c in run.nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                == "test_calculate_multihead_attention_causal")
    ns["In"].append(test)  # what IPython's In holds while it runs the cell
    import contextlib
    import io
    import types

    import IPython

    from coursekit.selfcheck import use_assignment

    use_assignment("attention")
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(user_ns=ns))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(test, ns)
    assert "Warning: Q2 could not be checked: it uses get_multihead_qkv, your answer to Q1" in printed.getvalue(), \
        printed.getvalue()
    assert "hidden test grades this" not in printed.getvalue()


def test_hidden_test_cells_echo_nothing():
    """In the student's notebook a hidden-test cell is only its docstring: after the setup cell
    (use_assignment) IPython shows no Out[] for it, and other cells still show their value.
    In a fresh process, since an IPython shell, once created, is what get_ipython() returns."""
    import subprocess
    import sys

    code = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
hidden = '\\"\\"\\"Q2 hidden: outputs match a reference (abs. error <= 1e-5).\\"\\"\\"'
before = shell.run_cell(hidden).result
from coursekit.selfcheck import use_assignment
use_assignment("attention")
use_assignment("attention")  # the setup cell run twice adds one transformer, not two
print(repr(before is not None), repr(shell.run_cell(hidden).result), repr(shell.run_cell("1 + 1").result),
      len(shell.ast_transformers))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-4:] == ["True", "None", "2", "1"], proc.stdout
