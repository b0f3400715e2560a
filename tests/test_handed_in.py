"""Outputs as handed in, for the hand grader (issue 35, item 20): kept at intake from the
submitted file (which the student controls byte for byte) as bounded plain text, and shown on
the hand-grading page, marked "as handed in", escaped, beside the grader's re-run. No kernel:
the intake, the page and course.yml's list are checked directly (the whole way, through a
graded lab, in tests/test_concepts_lab.py)."""
from __future__ import annotations

import json

import nbformat
import pytest

from conftest import ROOT, read_nb

RLO = "\u202e"


def _cell(gid, outputs, kind="code"):
    return {"cell_type": kind, "source": "print(1)", "outputs": outputs,
            "metadata": {"nbgrader": {"grade_id": gid, "grade": False, "solution": False, "locked": True}}}


HOSTILE = {"cells": [
    _cell("runs", [
        {"output_type": "stream", "name": "stdout", "text": ["greedy 0.41\n", "\x1b[1;31mred\x1b[0m ", "<b>x</b>\n"]},
        {"output_type": "stream", "name": "stdout", "text": 12345},   # not text: skipped
        "not a dict", None, [1, 2],
        {"output_type": "error", "ename": "ValueError", "evalue": "bad " + RLO + "gnp", "traceback": ["\x1b[0m..."]},
        {"output_type": "display_data", "data": {"image/png": "AAAA", "text/plain": "<Figure size 1x1>"}},
        {"output_type": "execute_result", "data": {"text/plain": ["0.5"]}, "execution_count": 3},
        {"output_type": "widget", "data": {"text/plain": "hidden"}},
        {"output_type": "stream", "text": "nul\x00bell\x07 end"}]),
    _cell("huge", [{"output_type": "stream", "name": "stdout", "text": "start\n" + "y" * 2_000_000 + "\nfinal line"}]),
    _cell("runs", [{"output_type": "stream", "text": "a second cell with the same id"}]),
    _cell("notes", [{"output_type": "stream", "text": "a markdown cell has no outputs"}], kind="markdown"),
    _cell("other", [{"output_type": "stream", "text": "not asked for"}]),
    {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "bad id <x>"}}, "outputs": [{"text": "x"}]},
    {"cell_type": "code", "metadata": {"nbgrader": None}, "outputs": "junk"},
    {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "noout"}}},
]}


def test_intake_keeps_bounded_plain_text_of_the_cells_asked_for(tmp_path):
    from autograder.pipeline.intake import read_submission
    from autograder.text.outputs import CELL_LIMIT

    path = tmp_path / "s1_lab.ipynb"
    path.write_text(json.dumps(HOSTILE))
    kept: dict = {}
    nb, _ = read_submission(path, kept, {"runs", "huge", "notes", "noout", "missing"})
    assert set(kept) == {"runs", "huge", "noout"}  # code cells only; ids not in the file are simply absent
    runs = kept["runs"]
    assert runs == ("greedy 0.41\nred <b>x</b>\nValueError: bad " + RLO + "gnp\n[a figure, not shown here]\n0.5\n"
                    "nulbell end")  # colour codes and control characters gone; escaping is the page's job
    assert len(kept["huge"]) <= CELL_LIMIT + 100 and kept["huge"].startswith("start\n")
    assert kept["huge"].endswith("final line") and "characters left out" in kept["huge"]
    assert kept["noout"] == ""
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # grading still sees none
    assert read_submission(path) == (nb, _)  # without the arguments, as before


def test_output_text_of_anything():
    from autograder.text.outputs import output_text

    for junk in (None, "text", 5, {"output_type": "stream"}, [None, 3, "x", {"output_type": 7}]):
        assert output_text(junk) == ""


def _page(answers, shown=("first_answer", "basic_experiments"), gid="q6_answer", kind="markdown"):
    from autograder.records.handgrade import HandGradedCell, cell_page

    class HG:
        assignment = "llm_lab"

    cell = HandGradedCell(gid, "Q6", "Q6 written answer", 6, "Your observations", "scheme",
                          answers, cell_type=kind, shown=shown)
    return cell_page(HG(), cell, "tok").decode()


def test_the_page_shows_both_runs_marked_and_escaped():
    from autograder.records.handgrade import Answer

    mine = "[Paris] 'The capital of France is Paris.'\n<script>document.title='x'</script> " + RLO + "gnp.exe"
    page = _page([Answer("s1", "SmolLM2 answers well.", "", True, None, "", "v1", "g1", "",
                         [("first_answer", mine, "prompt: Oil prices\ngreedy: oil rose"),
                          ("basic_experiments", "", "greedy 0.1")]),
                  Answer("s2", "old", "", True, None, "", "v2", "g2", "", [("first_answer", None, "greedy: x")])])
    assert page.count("as handed in") == 3 and page.count("grader's re-run") == 3
    assert "The capital of France is Paris." in page and "prompt: Oil prices" in page
    assert "<script>" not in page and "&lt;script&gt;document.title" in page
    assert RLO not in page and "&lt;U+202E&gt;gnp.exe" in page
    assert "the cell had not been run in the file handed in" in page  # handed in without output
    assert "graded before handed-in outputs were kept" in page        # nothing kept (an older grading)
    handed = page.index("as handed in")
    assert handed < page.index("prompt: Oil prices") and page.index("Paris.") < page.index("prompt: Oil prices")


def test_a_code_answer_shows_its_output_once_per_run():
    from autograder.records.handgrade import Answer

    answer = Answer("s1", "compare({...})", "rerun table\n", True, None, "", "v", "g", "",
                    [("own_experiment", "my table\n", "rerun table\n")])
    page = _page([answer], shown=("own_experiment",), gid="own_experiment", kind="code")
    assert page.count("rerun table") == 1 and page.count("my table") == 1


def test_course_names_only_cells_that_exist():
    """Every hand-graded cell named under handed_in_outputs is one, and every cell it names is a
    code cell of the notebook (a typo would show nothing, silently)."""
    from autograder.course.cells import graded_cells
    from autograder.course.model import load

    course = load(ROOT)
    named = [a for a in course.assignments if a.handed_in_outputs]
    assert any(a.id == "llm_lab" for a in named)
    for a in named:
        nb = read_nb(ROOT / "solutions" / a.id / a.notebook)
        manual = {c.grade_id for c in graded_cells(nb) if c.kind == "manual"}
        code = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells if c.cell_type == "code"}
        for gid, cells in a.handed_in_outputs:
            assert gid in manual, f"{a.id}: {gid} is not a hand-graded cell"
            assert cells and set(cells) <= code, f"{a.id}: {gid} names cells that are not code cells: " \
                f"{sorted(set(cells) - code)}"


def test_course_file_refuses_a_bad_list():
    from autograder.course.model import CourseFileError, parse

    base = {"title": "t", "repositories": {"student": {"name": "a/b"}, "instructor": {"name": "a/c"}}}
    with pytest.raises(CourseFileError, match="handed_in_outputs"):
        parse(dict(base, assignments={"x": {"title": "x", "handed_in_outputs": ["q1"]}}))
    with pytest.raises(CourseFileError, match=r"handed_in_outputs\.q1"):
        parse(dict(base, assignments={"x": {"title": "x", "handed_in_outputs": {"q1": "cell"}}}))
    ok = parse(dict(base, assignments={"x": {"title": "x", "handed_in_outputs": {"q1": ["c1", "c2"]}}}))
    assert ok.assignment("x").shown_outputs("q1") == ("c1", "c2") and ok.assignment("x").shown_outputs("q2") == ()
