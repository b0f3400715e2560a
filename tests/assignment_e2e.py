"""What the end-to-end gradings of the torch assignments share: points read from the source
notebook, a mistake of tests/mistakes_catalogue.py planted in its answer cell, one grading of the
full, untouched and planted notebooks, and what each of them must score."""
from __future__ import annotations

import nbformat
import pytest

from autograder.pipeline.run import grade
from conftest import ROOT, filled_exercise, read_nb
from mistakes_catalogue import CAUGHT, HIDDEN_ONLY


def source(name: str):
    return ROOT / "solutions" / name / f"{name}.ipynb"


def cells_of(nb) -> dict:
    return {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}


def question_points(name: str, question: str, part: str = "") -> int:
    """Autograded points of a question (of its hidden tests with part="hidden"), from the test
    cells' docstrings ("Q2 visible: ...")."""
    return sum(c.metadata["nbgrader"]["points"] for c in read_nb(source(name)).cells
               if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")
               and c.source.lstrip('"').startswith(f"{question} {part}"))


def written_points(name: str) -> list:
    """Points of the answers graded by hand, in order."""
    return [c.metadata["nbgrader"]["points"] for c in read_nb(source(name)).cells
            if c.metadata.get("nbgrader", {}).get("grade") and c.metadata["nbgrader"].get("solution")]


def mistake_of(name: str, mistake: str):
    return next(m for m in CAUGHT + HIDDEN_ONLY if m.assignment == name and m.name == mistake)


def with_mistake(name: str, mistake: str):
    """The source notebook with one mistake of tests/mistakes_catalogue.py planted in its answer cell."""
    planted = mistake_of(name, mistake)
    nb = read_nb(source(name))
    cell = cells_of(nb)[planted.cell]
    for old, new in planted.edits:
        assert old in cell.source, f"{mistake}: the reference answer no longer contains {old!r}"
        cell.source = cell.source.replace(old, new)
    return nb


def grade_planted(tmp_path_factory, name: str, planted, extra: dict | None = None):
    """Grade, in one run, the filled exercise ("full"), the untouched one ("untouched"), one notebook
    per planted mistake and the ``extra`` notebooks: (results by student, the grading folder)."""
    subs = tmp_path_factory.mktemp(f"{name}_submissions")
    nbformat.write(filled_exercise(name), subs / "full.ipynb")
    (subs / "untouched.ipynb").write_bytes((ROOT / "exercises" / name / f"{name}.ipynb").read_bytes())
    for mistake in planted:
        nbformat.write(with_mistake(name, mistake), subs / f"{mistake}.ipynb")
    for student, nb in (extra or {}).items():
        nbformat.write(nb, subs / f"{student}.ipynb")
    out = tmp_path_factory.mktemp(f"{name}_out")
    report = grade(name, subs, out_dir=out, grading_dir=out / "grading")
    return {r.student_id: r for r in report.results}, out / "grading"


def assert_full_and_untouched(results: dict, auto: int, total: int) -> None:
    """The filled exercise scores every autograded point, the untouched one none."""
    for student, score in (("full", auto), ("untouched", 0)):
        result = results[student]
        assert result.status == "graded", result.message
        assert (result.score, result.max_score) == (score, total), student


def assert_loses_its_question(result, name: str, mistake: str, question: str, auto: int,
                              hidden_kinds=("hidden",)) -> None:
    """A planted mistake loses exactly its question's points: all of them where a visible test
    catches it, those of the hidden tests where it passes the visible ones."""
    assert result.status == "graded", result.message
    lost = auto - result.score
    if mistake_of(name, mistake).kind in hidden_kinds:
        assert lost == question_points(name, question, "hidden"), \
            f"{mistake} passes the visible test of {question} and fails its hidden test"
    else:
        assert lost == question_points(name, question), f"{mistake} loses all of {question}, nothing else"


def end_to_end_tests(name: str, planted: dict, points: dict, written: list, hidden_kinds=("hidden",)):
    """The tests every graded assignment has, for a module whose ``graded`` fixture is
    ``grade_planted``: its points as designed, the filled and untouched exercises, and every planted
    mistake losing exactly its question's points."""
    auto = sum(points.values())

    def test_points_as_designed():
        assert {q: question_points(name, q) for q in points} == points
        assert written_points(name) == written

    def test_solution_scores_every_autograded_point_and_the_untouched_exercise_none(graded):
        assert_full_and_untouched(graded[0], auto=auto, total=auto + sum(written))

    @pytest.mark.parametrize("mistake", planted)
    def test_a_planted_mistake_loses_the_points_of_its_question(graded, mistake):
        assert_loses_its_question(graded[0][mistake], name, mistake, planted[mistake], auto, hidden_kinds)

    return (test_points_as_designed, test_solution_scores_every_autograded_point_and_the_untouched_exercise_none,
            test_a_planted_mistake_loses_the_points_of_its_question)
