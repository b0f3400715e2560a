"""End-to-end autograding of the attention assignment on a batch of submissions."""
from __future__ import annotations

import csv
import json
import sys
import uuid

import nbformat
import pytest

from autograder.pipeline.run import grade, student_id_from_name
from conftest import ROOT, assert_hand_in_reports, filled_exercise, read_nb, run, secret_lines, set_solution, WRONG_SOFTMAX
from tamper_corpus import EQ_CHEAT  # results that claim equality with everything

SOURCE = ROOT / "solutions" / "attention" / "attention.ipynb"
EXERCISE = ROOT / "exercises" / "attention" / "attention.ipynb"


# forward() that delegates to the Q1/Q2 functions, which Q3 forbids
DELEGATING_FORWARD = '''
B, T, C = query.shape
split = lambda t: t.view(B, -1, self.n_head, self.head_size).transpose(1, 2)
q, k, v = split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value))
y, weights = calculate_multihead_attention(q, k, v, mask)
return self.out_proj(y.transpose(1, 2).reshape(B, T, C)), weights
'''



def colab_saved(nb):
    """What a notebook looks like after a round trip through Colab: nbformat 4.0
    cells with ids in metadata, Colab's notebook metadata, outputs kept."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.nbformat_minor = 0
    nb.metadata = {"colab": {"provenance": [], "name": "attention.ipynb", "gpuType": "T4"},
                   "kernelspec": {"name": "python3", "display_name": "Python 3"},
                   "language_info": {"name": "python"}, "accelerator": "GPU"}
    for i, cell in enumerate(nb.cells):
        cell.pop("id", None)
        cell.metadata["id"] = uuid.UUID(int=i).hex[:12]
        if cell.cell_type == "code":
            cell.metadata["colab"] = {"base_uri": "https://localhost:8080/"}
            cell.metadata["outputId"] = uuid.UUID(int=1000 + i).hex
            cell.execution_count = i
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran on Colab\n")]
    return nb


def jupyterlab4_saved(nb):
    """What JupyterLab 4 writes after a student worked in the notebook: fresh UUID cell ids
    (cells pasted into a new notebook get new ones), Lab's own cell metadata, outputs and
    execution counts, the ipykernel kernelspec and language_info, non-ASCII text kept."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                   "language_info": {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                                     "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                                     "pygments_lexer": "ipython3", "version": "3.12.3"}}
    for i, cell in enumerate(nb.cells):
        cell["id"] = str(uuid.UUID(int=(i + 1) * 7919))
        cell.metadata.update({"tags": [], "trusted": True})
        if cell.cell_type == "markdown":
            cell.metadata["jp-MarkdownHeadingCollapsed"] = False
        else:
            cell.execution_count = i + 1
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran in JupyterLab — ok\n")]
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    nbformat.write(filled_exercise("attention"), subs / "full.ipynb")  # what a student hands in
    (subs / "untouched_attention.ipynb").write_bytes(EXERCISE.read_bytes())
    nbformat.write(set_solution(read_nb(SOURCE), "calculate_multihead_attention", WRONG_SOFTMAX),
                   subs / "wrong_q2.ipynb")
    nbformat.write(set_solution(read_nb(SOURCE), "multi_head_attention", DELEGATING_FORWARD),
                   subs / "delegates.ipynb")
    nbformat.write(set_solution(read_nb(SOURCE), "get_multihead_qkv", EQ_CHEAT), subs / "eqcheat.ipynb")
    colab = colab_saved(read_nb(SOURCE))
    (subs / "colab.ipynb").write_text(json.dumps(colab, indent=1))
    lab = jupyterlab4_saved(read_nb(SOURCE))
    (subs / "lab4.ipynb").write_text(json.dumps(lab, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    # Colab copy in which the student deleted the Q4 answer cell and wrote the class in a new
    # cell (no grading metadata), and deleted the Q1 visible test cell
    recreated = colab_saved(read_nb(SOURCE))
    q4 = next(c for c in recreated.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "positional_encoding")
    q4.metadata.pop("nbgrader")
    recreated.cells = [c for c in recreated.cells
                       if c.metadata.get("nbgrader", {}).get("grade_id") != "test_get_multihead_qkv_shapes"]
    (subs / "recreated.ipynb").write_text(json.dumps(recreated, indent=1))
    # an LMS round trip that dropped every cell's grading metadata
    stripped = read_nb(SOURCE)
    for cell in stripped.cells:
        cell.metadata.pop("nbgrader", None)
    nbformat.write(stripped, subs / "stripped.ipynb")
    (subs / "corrupt.ipynb").write_text('{"cells": [{"cell_type": "code", "sou')
    (subs / "report.pdf").write_bytes(b"%PDF-1.4 not a notebook")
    nbformat.write(set_solution(read_nb(SOURCE), "get_multihead_qkv", "import os\nos._exit(3)"),
                   subs / "crash.ipynb")
    out = tmp_path_factory.mktemp("out")
    report = grade("attention", subs, out_dir=out, grading_dir=out / "grading")
    return report, {r.student_id: r for r in report.results}, out


def test_solution_scores_full_marks(graded):
    _, res, _ = graded
    assert res["full"].status == "graded"
    assert res["full"].max_score == 30
    assert res["full"].score == 30


def test_hand_in_cell_reports_the_visible_checks(graded):
    _, _, out = graded
    assert_hand_in_reports(out / "grading", "attention")


def test_untouched_student_notebook_scores_zero_without_crashing(graded):
    _, res, _ = graded
    assert res["untouched"].status == "graded", res["untouched"].message
    assert res["untouched"].score == 0


def test_one_wrong_function_loses_exactly_its_points(graded):
    _, res, _ = graded
    assert res["wrong_q2"].status == "graded"
    assert res["wrong_q2"].score == 30 - 6  # Q2 is worth 6, nothing else changes


def test_module_calling_the_helper_functions_loses_q3(graded):
    _, res, _ = graded
    assert res["delegates"].score == 30 - 12


def test_object_overriding_eq_does_not_pass(graded):
    _, res, _ = graded
    assert res["eqcheat"].score == 30 - 6


def test_colab_saved_notebook_grades_like_the_original(graded):
    _, res, _ = graded
    assert res["colab"].status == "graded", res["colab"].message
    assert res["colab"].score == res["full"].score


def test_jupyterlab4_saved_notebook_grades_like_the_original(graded):
    _, res, _ = graded
    assert res["lab4"].status == "graded", res["lab4"].message
    assert res["lab4"].score == res["full"].score == 30
    assert res["lab4"].tests == res["full"].tests


def test_recreated_and_stripped_cells_are_repaired(graded):
    _, res, out = graded
    assert res["recreated"].score == 30, res["recreated"].message
    assert "'positional_encoding' had lost its grading metadata" in res["recreated"].message
    assert "'test_get_multihead_qkv_shapes' was missing and is restored" in res["recreated"].message
    assert res["stripped"].score == 30, res["stripped"].message
    assert "Grading notes" in (out / "feedback" / "recreated.html").read_text()


def test_bad_files_get_a_clear_line_and_zero(graded):
    report, res, _ = graded
    assert res["corrupt"].score == 0 and "corrupt notebook" in res["corrupt"].message
    assert res["report"].score == 0 and "not a notebook" in res["report"].message
    table = report.table()
    for sid in ("full", "untouched", "corrupt", "report", "crash"):
        assert sid in table
    assert "12 files: 10 graded, 2 not graded" in table


def test_a_function_that_kills_its_kernel_costs_only_its_own_tests(graded):
    """Q1's function ends the kernel whenever it is called: each death is noted, a fresh
    kernel re-runs the notebook so far, and Q2-Q4 are still judged."""
    _, res, _ = graded
    crash = res["crash"]
    assert crash.status == "graded" and crash.score == 30 - 6, crash.message
    assert "kernel died" in crash.message and "fresh kernel" in crash.message
    assert crash.tests["test_get_multihead_qkv_values"] == (0.0, 4.0)
    assert crash.tests["test_positional_encoding_values"] == (4.0, 4.0)


def test_grades_csv_and_feedback(graded):
    report, res, out = graded
    rows = list(csv.DictReader(open(report.csv_path)))
    assert {r["student_id"] for r in rows} == set(res)
    by_id = {r["student_id"]: r for r in rows}
    assert float(by_id["full"]["total"]) == 30 and by_id["full"]["status"] == "graded"
    assert float(by_id["corrupt"]["total"]) == 0 and by_id["corrupt"]["status"] == "not graded"
    assert by_id["full"]["Q3"] == "12" and by_id["wrong_q2"]["Q2"] == "0"
    for png in ("histogram.png", "pass_rates.png"):
        assert (out / png).stat().st_size > 1000
    assert res["full"].tests["test_get_multihead_qkv_values"] == (4.0, 4.0)
    assert res["wrong_q2"].tests["test_calculate_multihead_attention_values"] == (0.0, 4.0)
    for sid in ("full", "untouched", "wrong_q2", "colab"):
        page = (out / "feedback" / f"{sid}.html").read_text()
        assert "grading-provenance" in page and "torch" in page
        assert "hidden tests ran here" in page
        assert "BEGIN HIDDEN TESTS" not in page and "einsum</span><span" not in page


def test_no_feedback_file_shows_hidden_test_code(graded):
    """Every feedback page, of every student: no line of a hidden test (or of the solution,
    beyond what the student wrote themselves) appears in it."""
    import html
    import re

    _, res, out = graded
    hidden = set()
    for cell in read_nb(SOURCE).cells:
        for region in re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", cell.source, re.S):
            hidden |= {ln.strip() for ln in region.splitlines() if len(ln.strip()) >= 12}
    hidden &= secret_lines(read_nb(SOURCE))
    pages = list((out / "feedback").glob("*.html"))
    assert len(pages) == len(res)  # every named submission gets a page, errors too
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        lines = {ln.strip() for ln in text.splitlines()}
        assert not hidden & lines, f"{page.name} shows hidden tests: {sorted(hidden & lines)[:3]}"


def test_no_student_kernel_outlives_the_batch(graded):
    """Kernels are killed, not asked to stop, once their notebook has run (and the crashed one
    died by itself): no process of the batch's grading folder is left running."""
    from pathlib import Path

    _, _, out = graded
    grading = str(out / "grading")
    left = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        if proc.name.isdigit() and grading in cmdline:
            left.append(cmdline[:200])
    assert not left, left


def test_feedback_exporter_matches_nbconvert_text(tmp_path):
    """The feedback exporter without nbconvert's BeautifulSoup pass gives pages with the same
    text as with it, and alt text on every image."""
    import base64
    import re

    from bs4 import BeautifulSoup
    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config

    from autograder.judge.feedback import FeedbackExporter

    nb = filled_exercise("attention")
    png = base64.b64encode(bytes.fromhex("89504e470d0a1a0a")).decode()
    next(c for c in nb.cells if c.cell_type == "code").outputs = [nbformat.v4.new_output("display_data", data={"image/png": png}),
                           nbformat.v4.new_output("stream", name="stdout", text="x < y & z\n")]
    class WithSoup(FeedbackExporter):  # the same page, through nbconvert's own final pass
        from_notebook_node = HTMLExporter.from_notebook_node

    config = Config({"HTMLExporter": {"template_name": "classic"}})
    ours, _ = FeedbackExporter(config=config).from_notebook_node(nb)
    theirs, _ = WithSoup(config=config).from_notebook_node(nb)
    text = [" ".join(BeautifulSoup(page, "html.parser").get_text().split()) for page in (ours, theirs)]
    assert text[0] == text[1]
    assert "x < y & z" in text[0]
    images = re.findall(r"<img\b[^>]*>", ours)
    assert len(images) == 1 and all(" alt=" in img for img in images)


def test_student_id_from_file_name(tmp_path):
    assert student_id_from_name(tmp_path / "s123_attention.ipynb", "attention") == "s123"
    assert student_id_from_name(tmp_path / "Ann Lee.ipynb", "attention") == "Ann_Lee"
    assert student_id_from_name(tmp_path / "bob.ipynb", "attention") == "bob"


def test_cli_grade_prints_summary(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "x.ipynb").write_text("not json")
    (subs / "y.txt").write_text("hello")
    proc = run([sys.executable, "-m", "autograder", "grade", "attention", str(subs),
                "--out", str(tmp_path / "out"), "--grading-dir", str(tmp_path / "grading")])
    assert proc.returncode == 1, proc.stderr[-2000:]  # nothing could be graded: the run says so
    assert "no submission could be graded" in proc.stderr
    assert "corrupt notebook: x.ipynb" in proc.stdout
    assert "not a notebook: y.txt" in proc.stdout
    assert (tmp_path / "out" / "grades.csv").exists()


def test_release_is_recorded_once_per_grading_folder(tmp_path, monkeypatch):
    """A second batch graded into the same folder reuses the release in its gradebook; a changed
    source (here: a stale fingerprint) is released again."""
    import autograder.pipeline.run as G
    import autograder.pipeline.stages as stages

    empty = tmp_path / "subs"
    empty.mkdir()
    G.grade("attention", empty, out_dir=tmp_path / "o1", grading_dir=tmp_path / "g")
    assert (tmp_path / "g" / "release" / ".attention.sources").exists()

    def released_again(*args, **kwargs):
        raise AssertionError("released again")

    monkeypatch.setattr(stages, "release", released_again)
    G.grade("attention", empty, out_dir=tmp_path / "o2", grading_dir=tmp_path / "g")
    (tmp_path / "g" / "release" / ".attention.sources").write_text("stale")
    with pytest.raises(AssertionError, match="released again"):
        G.grade("attention", empty, out_dir=tmp_path / "o3", grading_dir=tmp_path / "g")


def test_the_feedback_memo_keeps_short_sources_only_and_a_bounded_number():
    """Feedback pages highlight the cells every student shares once per grading process; a
    student's long cell is converted each time, and the memo never grows past its bound."""
    from autograder.judge import feedback

    calls = []
    upper = feedback.memoised("test", lambda source: calls.append(source) or source.upper())
    assert upper("q = k @ v") == upper("q = k @ v") == "Q = K @ V" and calls == ["q = k @ v"]
    long = "x" * (feedback.MEMO_MAX_CHARS + 1)
    assert upper(long) == upper(long) and calls.count(long) == 2
    for i in range(feedback.MEMO_MAX_ENTRIES + 10):
        upper(f"cell {i}")
    assert 0 < len(feedback._memo) <= feedback.MEMO_MAX_ENTRIES
    assert not any(len(key[1]) > feedback.MEMO_MAX_CHARS for key in feedback._memo)
