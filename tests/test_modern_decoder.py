"""End-to-end autograding of the modern_decoder assignment (rotary positions, grouped-query attention,
generation with a key-value cache, cache bytes): the filled exercise scores every autograded point, the
untouched exercise 0, and planted mistakes lose exactly the points of their question, whether a visible
or only a hidden test catches them. The written answer (Q5) is graded by hand."""
from __future__ import annotations

import nbformat
import pytest

from autograder.pipeline.run import grade
from conftest import ROOT, assert_hand_in_reports, filled_exercise, read_nb
from mistakes_catalogue import CAUGHT, HIDDEN_ONLY

NAME = "modern_decoder"
SOURCE = ROOT / "solutions" / NAME / f"{NAME}.ipynb"
EXERCISE = ROOT / "exercises" / NAME / f"{NAME}.ipynb"
# one planted mistake of every autograded question; the last two pass every visible check
PLANTED = {"rotate_half_pairing": "Q1", "heads_grouped_by_modulo": "Q2", "no_cache": "Q3",
           "base_ignored": "Q1", "batch_ignored": "Q4"}


def question_points(question: str) -> int:
    """Autograded points of a question, from the test cells' docstrings ("Q2 visible: ...")."""
    return sum(c.metadata["nbgrader"]["points"] for c in read_nb(SOURCE).cells
               if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")
               and c.source.lstrip('"').startswith(f"{question} "))


def with_mistake(name: str):
    """The source notebook with one mistake of tests/mistakes_catalogue.py planted in its answer cell."""
    mistake = next(m for m in CAUGHT + HIDDEN_ONLY if m.assignment == NAME and m.name == name)
    nb = read_nb(SOURCE)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == mistake.cell)
    for old, new in mistake.edits:
        assert old in cell.source, f"{name}: the reference answer no longer contains {old!r}"
        cell.source = cell.source.replace(old, new)
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp(f"{NAME}_submissions")
    nbformat.write(filled_exercise(NAME), subs / "full.ipynb")
    (subs / "untouched.ipynb").write_bytes(EXERCISE.read_bytes())
    for name in PLANTED:
        nbformat.write(with_mistake(name), subs / f"{name}.ipynb")
    out = tmp_path_factory.mktemp(f"{NAME}_out")
    report = grade(NAME, subs, out_dir=out, grading_dir=out / "grading")
    results = {r.student_id: r for r in report.results}
    return results, out / "grading"


def test_points_as_designed():
    auto = {q: question_points(q) for q in ("Q1", "Q2", "Q3", "Q4")}
    assert auto == {"Q1": 6, "Q2": 8, "Q3": 6, "Q4": 4}
    written = [c.metadata["nbgrader"]["points"] for c in read_nb(SOURCE).cells
               if c.metadata.get("nbgrader", {}).get("grade") and c.metadata["nbgrader"].get("solution")]
    assert written == [6]


def test_solution_scores_every_autograded_point(graded):
    full = graded[0]["full"]
    assert full.status == "graded", full.message
    assert full.max_score == 30 and full.score == 24  # 24 autograded + 6 graded by hand


def test_untouched_exercise_scores_zero(graded):
    untouched = graded[0]["untouched"]
    assert untouched.status == "graded", untouched.message
    assert untouched.score == 0 and untouched.max_score == 30


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_mistake_loses_the_points_of_its_question(graded, name):
    result = graded[0][name]
    assert result.status == "graded", result.message
    lost = 24 - result.score
    question = PLANTED[name]
    if any(m.name == name and m.assignment == NAME for m in HIDDEN_ONLY):
        hidden = sum(c.metadata["nbgrader"]["points"] for c in read_nb(SOURCE).cells
                     if c.metadata.get("nbgrader", {}).get("grade") and c.source.lstrip('"').startswith(f"{question} hidden"))
        assert lost == hidden, f"{name} passes the visible test of {question} and fails its hidden test"
    else:
        assert lost == question_points(question), f"{name} loses all of {question}, nothing else"


def test_hand_in_cell_reports_the_visible_checks(graded):
    assert_hand_in_reports(graded[1], NAME)
