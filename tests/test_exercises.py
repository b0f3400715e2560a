"""The exercises at the end of the book's chapters (issue 38): the self-check of a compute exercise
accepts the worked solution's answer and rejects a typical wrong one without holding the answer;
every exercise is numbered by its chapter, labelled with its kind, listed on book/assignments.md
and solved in instructor/exercises/, whose code runs here."""
from __future__ import annotations

import importlib.util
import json
import math
import re
import sys

import nbformat
import pytest

from autograder.authoring.instructor_book import instructor_toc, missing_solutions
from autograder.course.exercises import ExerciseError, chapters, exercises, page_exercises, solution_labels
from conftest import ROOT
from coursekit.exercises import ExerciseKeyError, accepts, answer_key, check_answer


def _answers_module():
    spec = importlib.util.spec_from_file_location("exercise_answers", ROOT / "instructor" / "exercises" / "answers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def solved():
    """Every compute exercise's worked answer and typical wrong answer, computed by the solution code."""
    module = _answers_module()
    return module, {name: (float(ex.answer()), float(ex.wrong())) for name, ex in module.EXERCISES.items()}


# ---------------------------------------------------------------------------------------------
# the self-check
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer,tolerance", [(3.14159, {"rel": 0.01}), (2.5e-4, {"rel": 0.005}),
                                              (-7.25, {"rel": 0.01}), (2.5, {"abs": 0.1}), (1234, {"exact": True}),
                                              (2.886751e9, {"rel": 0.01})])
def test_the_band_accepts_within_its_tolerance_and_rejects_three_tolerances_away(answer, tolerance):
    key = answer_key("13.2", answer, **tolerance)
    if "exact" in tolerance:
        assert accepts("13.2", answer, key) and accepts("13.2", float(answer), key)
        assert not any(accepts("13.2", answer + d, key) for d in (-2, -1, 0.5, 1, 2))
        return
    for t in (0, 0.3, 0.6, 0.99):
        near = answer * (1 + t * tolerance["rel"]) if "rel" in tolerance else answer + t * tolerance["abs"]
        assert accepts("13.2", near, key), (near, key)
        near = answer * (1 - t * tolerance["rel"]) if "rel" in tolerance else answer - t * tolerance["abs"]
        assert accepts("13.2", near, key), (near, key)
    for t in (3.01, 4, 10, 100):
        far = answer * (1 + t * tolerance["rel"]) if "rel" in tolerance else answer + t * tolerance["abs"]
        assert not accepts("13.2", far, key), (far, key)
        far = answer * (1 - t * tolerance["rel"]) if "rel" in tolerance else answer - t * tolerance["abs"]
        assert not accepts("13.2", far, key), (far, key)
    assert not accepts("13.2", -answer, key)  # the sign counts


def test_the_key_holds_no_answer_and_belongs_to_one_exercise():
    key = answer_key("13.2", 6543.21, rel=0.001)
    assert not re.search(r"6543|6\.54|654", key.split(":", 3)[3]), key  # salt and hash only
    assert accepts("13.2", 6543.21, key) and not accepts("13.3", 6543.21, key)
    assert answer_key("13.2", 6543.21, rel=0.001) != key  # a fresh salt each time


def test_the_self_check_names_the_exercise_and_says_right_or_not_yet(capsys):
    key = answer_key("14.3", 1.5, rel=0.01)
    assert check_answer("14.3", 1.5, key) is True
    assert capsys.readouterr().out.strip() == "Exercise 14.3: right"
    assert check_answer("14.3", 1.9, key, hint="subtract E first") is False
    assert capsys.readouterr().out.strip() == "Exercise 14.3: not yet; hint: subtract E first"


@pytest.mark.parametrize("value,says", [(None, "no answer yet"), ("1.5", "must be one number, got str"),
                                        ([1.5], "must be one number, got list"), (float("nan"), "not a finite number"),
                                        (math.inf, "not a finite number"), (True, "must be one number, got bool")])
def test_hostile_answers_get_one_line_and_no_exception(value, says, capsys):
    key = answer_key("14.3", 1.5, rel=0.01)
    assert check_answer("14.3", value, key) is False
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("Exercise 14.3: ") and says in out, out


def test_numpy_and_torch_numbers_are_accepted(capsys):
    import numpy as np
    import torch

    key = answer_key("13.2", 6969, rel=0.005)
    assert check_answer("13.2", np.int64(6969), key) and check_answer("13.2", torch.tensor(6969.0), key)
    assert not check_answer("13.2", torch.tensor([6969.0, 1.0]), key)


def test_a_malformed_key_or_exercise_number_is_named_in_one_line():
    with pytest.raises(ExerciseKeyError, match=r"exercise 13\.2: the self-check's key 'nope' is not well formed"):
        accepts("13.2", 1.0, "nope")
    with pytest.raises(ExerciseKeyError, match=r"exercise number 'q1'"):
        check_answer("q1", 1.0, answer_key("13.2", 1.0, rel=0.1))
    with pytest.raises(ExerciseKeyError, match="exactly one of"):
        answer_key("13.2", 1.0, rel=0.1, abs=0.1)


# ---------------------------------------------------------------------------------------------
# the book's exercises
# ---------------------------------------------------------------------------------------------

def test_every_compute_exercise_accepts_its_solution_and_rejects_a_typical_mistake(solved):
    module, found = solved
    compute = [e for e in exercises(ROOT) if e.kind == "compute"]
    assert compute and {e.number for e in compute} == set(found), "every compute exercise has a worked answer"
    for e in compute:
        answer, wrong = found[e.number]
        assert accepts(e.number, answer, e.key), f"exercise {e.number}: its self-check rejects the solution"
        assert not accepts(e.number, wrong, e.key), f"exercise {e.number}: its self-check accepts {wrong}"


def test_the_answers_publish_checks_are_the_solutions_answers(solved):
    _, found = solved
    stored = json.loads((ROOT / "instructor" / "exercises" / "answers.json").read_text())
    assert set(stored) == set(found)
    for name, (answer, _) in found.items():
        assert math.isclose(stored[name], answer, rel_tol=1e-9), name


def test_the_bpe_solution_round_trips_any_text(solved):
    module, _ = solved
    merges = module.bpe_train("low lower lowest; naïve café 東京 " * 5, 20)
    for text in ("lowest naïve 東京", "", "\n\t emoji 🙂", "newer"):
        assert module.bpe_decode(module.bpe_encode(text, merges), merges) == text


def test_exercises_are_numbered_by_chapter_labelled_and_at_the_end_of_their_page():
    found = exercises(ROOT)
    by_page: dict[str, list] = {}
    for e in found:
        by_page.setdefault(e.page, []).append(e)
    assert set(by_page) == set(chapters(ROOT)), "every chapter ends with its exercises"
    for page, items in by_page.items():
        number = chapters(ROOT)[page]
        assert [e.number for e in items] == [f"{number}.{i}" for i in range(1, len(items) + 1)]
        assert 4 <= len(items) <= 8, page
        assert {e.kind for e in items} == {"derive", "compute", "change the code"}, page
        nb = nbformat.read(ROOT / f"{page}.ipynb", as_version=4)
        start = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                     and c.source.startswith("## Exercises"))
        assert not any(c.cell_type == "markdown" and re.search(r"^#{1,2} ", c.source, re.M)
                       for c in nb.cells[start + 1:]), f"{page}: the exercises end the page"
        for e in items:
            if e.kind == "change the code":
                text = next(c.source for c in nb.cells if f":label: {e.label}" in c.source)
                block = text.split(f":label: {e.label}", 1)[1].split("```", 1)[0]
                assert "Predict" in block and "correct observation" in block, e.number


def test_a_page_whose_labels_skip_a_number_is_refused(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "## Exercises\n\n```{exercise} Derive: a\n:label: ex-3-1\n\nx\n```\n\n```{exercise} Derive: b\n"
        ":label: ex-3-3\n\ny\n```")])
    (tmp_path / "book").mkdir()
    nbformat.write(nb, tmp_path / "book" / "p.ipynb")
    with pytest.raises(ExerciseError, match="exercise 2 of chapter[ ]3 must have the label ex-3-2"):
        page_exercises(tmp_path, "book/p", 3)
    nb.cells[0].source = nb.cells[0].source.replace("ex-3-3", "ex-3-2").replace("Derive: b", "Compute: b")
    nbformat.write(nb, tmp_path / "book" / "p.ipynb")
    with pytest.raises(ExerciseError, match="compute exercise 3.2 has no self-check cell"):
        page_exercises(tmp_path, "book/p", 3)


def test_every_exercise_is_listed_on_the_assignments_page_and_solved_for_instructors():
    page = (ROOT / "book" / "assignments.md").read_text()
    for e in exercises(ROOT):
        assert f"{{ref}}`{e.number} <{e.label}>`" in page, e.number
    assert missing_solutions(ROOT) == []
    solution_pages = {f["file"] for f in instructor_toc(ROOT)["parts"][-1]["chapters"]}
    assert solution_pages == set(solution_labels(ROOT).values())
    assert all((ROOT / f"{p}.md").exists() for p in solution_pages)
