"""instructor/grade_on_colab.ipynb: the Colab grading notebook, run here without Colab.

The whole notebook runs once under nbclient on a small Canvas bulk download of the fast
`attention` assignment (a full solution, an untouched exercise, a corrupt file and a PDF,
with a roster), its parameters given through GRADE_ON_COLAB_* environment variables; the
tests then read what it left behind. The Colab-only branches (upload and download dialogs)
run once more in a kernel where a stand-in `google.colab` module records the calls.
"""
from __future__ import annotations

import csv
import json
import zipfile

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT, read_nb

NOTEBOOK = ROOT / "instructor" / "grade_on_colab.ipynb"
SOLUTION = ROOT / "solutions" / "attention" / "attention.ipynb"
EXERCISE = ROOT / "exercises" / "attention" / "attention.ipynb"
MAX_POINTS = 30  # the attention assignment


def _cell(nb, cell_id):
    (cell,) = [c for c in nb.cells if c.get("id") == cell_id]
    return cell


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("colab")
    lms_zip = tmp / "submissions.zip"
    with zipfile.ZipFile(lms_zip, "w") as zf:  # Canvas "Download Submissions" file names
        zf.writestr("leeann_1001_5001_attention.ipynb", SOLUTION.read_bytes())
        zf.writestr("kimbo_1002_5002_attention.ipynb", EXERCISE.read_bytes())
        zf.writestr("robin_1003_5003_attention.ipynb", b'{"cells": [{"cell_type": "code", "sou')
        zf.writestr("leeann_1001_5004_notes.pdf", b"%PDF-1.4 not a notebook")
    roster = tmp / "roster.csv"
    roster.write_text("student_id,lms_id,name,email\ns001,1001,Lee Ann,lee@uni.example\n"
                      "s002,1002,Kim Bo,kim@uni.example\ns003,1003,Robin Ng,robin@uni.example\n")
    work = tmp / "work"
    env = {"GRADE_ON_COLAB_ASSIGNMENT": "attention", "GRADE_ON_COLAB_ZIP": str(lms_zip),
           "GRADE_ON_COLAB_ROSTER": str(roster), "GRADE_ON_COLAB_WORK_DIR": str(work),
           "GRADE_ON_COLAB_INSTALL": "none"}  # offline: the course's .venv has everything
    nb = read_nb(NOTEBOOK)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    out = work / "results" / "attention"
    with open(out / "grades.csv", newline="") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    return nb, work, out, rows


def test_notebook_runs_without_error_and_uses_this_checkout(run):
    nb, work, _, _ = run
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not [o for o in cell.outputs if o.output_type == "error"], cell.id
    setup = _text(_cell(nb, "course"))
    assert f"course:      {ROOT}" in setup and "the checkout this notebook runs in" in setup
    assert "this machine, not Colab" in setup
    assert not (work.parent / "transformers-course").exists()  # nothing was cloned


def test_one_row_per_student_full_marks_and_zero(run):
    _, _, _, rows = run
    assert sorted(rows) == ["s001", "s002", "s003"]  # the PDF is not a submission
    full, untouched, corrupt = rows["s001"], rows["s002"], rows["s003"]
    assert full["status"] == "graded" and float(full["total"]) == float(full["max_score"]) == MAX_POINTS
    assert untouched["status"] == "graded" and float(untouched["total"]) == 0
    assert corrupt["status"] == "not graded" and float(corrupt["total"]) == 0
    assert "corrupt notebook" in corrupt["reason"]
    assert "not a notebook" in full["notes"]  # the PDF Lee Ann handed in beside her notebook


def test_feedback_and_lms_exports_are_written(run):
    _, _, out, _ = run
    for sid in ("s001", "s002", "s003"):
        page = (out / "feedback" / f"{sid}.html").read_text()
        assert "Graded by the course autograder" in page
    assert "<h1>attention: s003</h1>" in (out / "feedback" / "s003.html").read_text()
    with open(out / "canvas.csv", newline="") as fh:
        canvas = list(csv.DictReader(fh))
    column = "Multi-head attention and positional encoding"  # the assignment's title in course.yml
    assert {r["SIS User ID"]: r[column] for r in canvas[1:]} == {"s001": "30", "s002": "0", "s003": "0"}
    assert canvas[1]["ID"] == "1001"  # the Canvas user id, from the roster


def test_results_zip_holds_grades_feedback_and_instructor_files(run):
    nb, work, _, _ = run
    with zipfile.ZipFile(work / "attention_results.zip") as zf:
        names = set(zf.namelist())
    for name in ("grades.csv", "canvas.csv", "moodle.csv", "histogram.png", "pass_rates.png",
                 "feedback/s001.html", "feedback/s002.html", "feedback/s003.html",
                 "instructor_only/grading_log.txt", "instructor_only/collect_report.csv",
                 "instructor_only/autograded/s001_attention.ipynb",
                 "instructor_only/autograded/s002_attention.ipynb"):
        assert name in names, name
    assert not any("s003_attention.ipynb" in n for n in names)  # nothing was autograded for it
    assert f"results: {work / 'attention_results.zip'}" in _text(_cell(nb, "download"))


def test_summary_plots_and_problems_are_shown(run):
    nb, _, _, _ = run
    graded = _text(_cell(nb, "grade"))
    assert "3 files: 2 graded, 1 not graded" in graded  # the grader's table, streamed
    results = _cell(nb, "results")
    pngs = [o for o in results.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 2  # histogram and pass rates
    assert any("text/html" in o.get("data", {}) and "s001" in o["data"]["text/html"] for o in results.outputs)
    text = _text(results)
    assert "3 students: 2 graded, 1 not graded (scored 0)" in text
    problems = text.split("Problems:")[1]
    assert "leeann_1001_5004_notes.pdf: not a notebook" in problems
    assert "s003 (robin_1003_5003_attention.ipynb): not graded: corrupt notebook" in problems


def _fake_colab_run(cell_ids, preamble, tmp_path):
    """Run `preamble`, then the notebook's cells `cell_ids`, in a kernel with a stand-in google.colab."""
    fake = f'''
import json, sys, types
from pathlib import Path
CALLS = []
def _upload(target_dir=""):
    CALLS.append(("upload", target_dir))
    got = {{}}
    for p in sorted(Path({str(tmp_path / "picked")!r}).iterdir()):
        (Path(target_dir) / p.name).write_bytes(p.read_bytes())
        got[p.name] = p.read_bytes()
    return got
_colab = types.ModuleType("google.colab")
_colab.files = types.SimpleNamespace(upload=_upload, download=lambda path: CALLS.append(("download", path)))
sys.modules["google"] = types.ModuleType("google")
sys.modules["google.colab"] = sys.modules["google"].colab = _colab
'''
    source = read_nb(NOTEBOOK)
    detect = [ln for ln in _cell(source, "course").source.splitlines() if ln.startswith("IN_COLAB =")]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(fake), nbformat.v4.new_code_cell("\n".join(detect) + "\n" + preamble)]
    nb.cells += [nbformat.v4.new_code_cell(_cell(source, cid).source) for cid in cell_ids]
    nb.cells.append(nbformat.v4.new_code_cell("print(json.dumps({'in_colab': IN_COLAB, 'calls': CALLS}))"))
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb, json.loads(_text(nb.cells[-1]))


def test_colab_upload_and_download_branches(tmp_path):
    picked = tmp_path / "picked"  # what the instructor picks in the browser's dialog
    picked.mkdir()
    with zipfile.ZipFile(picked / "canvas download.zip", "w") as zf:
        zf.writestr("leeann_1001_5001_attention.ipynb", EXERCISE.read_bytes())
    (picked / "roster.csv").write_text("student_id,lms_id\ns001,1001\n")
    results_zip = tmp_path / "attention_results.zip"
    results_zip.write_bytes(b"PK")
    preamble = (f"GRADING = Path({str(tmp_path / 'grading')!r})\nSUBMISSIONS = ''\nROSTER_CSV = ''\n"
                f"RESULTS_ZIP = Path({str(results_zip)!r})")
    nb, seen = _fake_colab_run(["upload", "download"], preamble, tmp_path)
    uploads = tmp_path / "grading" / "uploads"
    assert seen["in_colab"] is True
    assert seen["calls"] == [["upload", str(uploads)], ["download", str(results_zip)]]
    text = _text(nb.cells[2])  # the upload cell
    assert f"submissions: {uploads / 'canvas download.zip'} (1 files, 1 of them notebooks)" in text
    assert f"roster:      {uploads / 'roster.csv'}" in text


def test_committed_without_outputs_and_colab_calls_guarded():
    nb = read_nb(NOTEBOOK)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{cell.id}: outputs committed"
            for line in cell.source.splitlines():
                if "google.colab" in line and "import" in line:
                    assert line.startswith((" ", "\t")), f"{cell.id}: unguarded Colab import: {line.strip()}"
    assert "parameters" in _cell(nb, "parameters").metadata.get("tags", [])


def test_grading_settings_come_from_the_course_file():
    """The notebook reads each assignment's limits and environment from course.yml, as the
    command line does; it sets no grading environment of its own."""
    nb = read_nb(NOTEBOOK)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "from autograder.course.model import load" in code
    assert "COURSE_PROFILE" not in code and "COURSE_MODEL_SOURCE" not in code
    assert 'param("CELL_TIMEOUT", "0")' in code and 'param("NOTEBOOK_TIMEOUT", "0")' in code


def test_the_setup_report_names_the_assignments_grading_environment(run):
    nb, *_ = run
    report = _text(_cell(nb, "sandbox"))
    assert "attention:  grading environment from course.yml: none" in report
