"""The instructor build of the book (issue 38): every exercise's worked solution appears, under the
exercise's number, and the student pages of that build hold none. Built with the pages as they are
(not executed: the exercises and solutions need no outputs), so it needs the book's tools, not its
cache."""
from __future__ import annotations

import re

import pytest

from autograder.authoring.instructor_book import build
from autograder.course.exercises import exercises, solution_labels
from conftest import ROOT


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    return build(ROOT, out=tmp_path_factory.mktemp("instructor"), execute=False)


def _titles(path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [" ".join(re.sub(r"<[^>]+>", " ", m).split())
            for m in re.findall(r'<p class="admonition-title">(.*?)</p>', text, re.S)]


def test_the_instructor_book_shows_every_solution_under_its_exercise_number(html):
    shown = set()
    for page in set(solution_labels(ROOT).values()):
        shown |= {t for t in _titles(html / f"{page}.html") if t.startswith("Solution to Exercise")}
    for e in exercises(ROOT):
        assert any(t.startswith(f"Solution to Exercise {e.number} ") for t in shown), e.number


def test_the_chapters_number_their_exercises_as_the_self_checks_name_them(html):
    for e in exercises(ROOT):
        titles = _titles(html / f"{e.page}.html")
        assert any(t.startswith(f"Exercise {e.number} ") for t in titles), (e.number, titles)
        assert not any(t.startswith("Solution") for t in titles), e.page
