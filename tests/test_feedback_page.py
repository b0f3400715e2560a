"""The course's feedback page (autograder/judge/templates/course_feedback), rendered from a small
graded notebook without grading anything (issue 35, item 15): long test code is folded behind its
one-line description, long output lines wrap instead of running off the page's right edge, and the
points badges keep a contrast of at least 4.5:1 (WCAG 2.1 AA) where they stand."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from autograder.judge.feedback import FeedbackExporter


def _page(cells) -> str:
    import nbgrader.converters.generate_feedback as gf
    from traitlets.config import Config

    c = Config()
    c.FeedbackExporter.template_name = "course_feedback"
    c.FeedbackExporter.extra_template_basedirs = [str(Path(__file__).resolve().parents[1] / "autograder" / "judge"
                                                      / "templates")]
    # where nbgrader's feedback step finds the page's style sheet
    c.FeedbackExporter.extra_template_paths = [str(Path(gf.__file__).resolve().parents[1] / "server_extensions"
                                                   / "formgrader" / "static" / "node_modules" / "bootstrap" / "dist"
                                                   / "css")]
    nb = nbformat.v4.new_notebook(cells=cells)
    totals = {"total": 1, "max": 3, "auto": 1, "auto_max": 3, "manual": 0, "manual_max": 0, "pending": 0}
    html, _ = FeedbackExporter(config=c).from_notebook_node(
        nb, resources={"nbgrader": {"notebook": "attention", "late_penalty": 0}, "course": totals})
    return html


def _test_cell(source: str, grade_id: str, output: str = ""):
    cell = nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
        "grade": True, "solution": False, "grade_id": grade_id, "points": 1, "score": 0,
        "label": f"{grade_id}: what it checks", "pending": False}})
    if output:
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    return cell


@pytest.fixture(scope="module")
def page():
    long = '"""Q1 visible: shapes."""\n' + "\n".join(f"assert {i} == {i}, 'message {i}'" for i in range(40))
    return _page([_test_cell(long, "q1_long", "W" * 400 + "\n"), _test_cell("assert True", "q2_short")])


def test_long_test_code_is_folded_behind_its_description(page):
    assert page.count('<details class="test-code">') == 1  # the 41-line test only
    assert "the test&#39;s code (41 lines)" in page or "the test's code (41 lines)" in page
    assert "q1_long: what it checks" in page and "q2_short: what it checks" in page


def test_long_output_lines_wrap(page):
    assert "white-space: pre-wrap" in page and "overflow-wrap: anywhere" in page


def _luminance(hex_colour: str) -> float:
    channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_points_badges_are_readable(page):
    """Each points colour against the badge's own background, and the heading's links on its blue."""
    style = page[page.index("points as badges"):]
    background = re.search(r"\.pending, \.lost, \.full \{ background: (#[0-9a-f]{6})", style).group(1)
    for name in ("pending", "lost", "full"):
        colour = re.search(rf"\.{name} \{{ color: (#[0-9a-f]{{6}})", style).group(1)
        assert contrast(colour, background) >= 4.5, (name, colour, background)
    link = re.search(r"\.panel-primary > \.panel-heading a \{ color: (#[0-9a-f]{6})", style).group(1)
    assert contrast(link, "#337ab7") >= 4.5  # bootstrap's .panel-primary heading
    assert contrast("#a94442", "#337ab7") < 3  # what a red score on that blue gave before: unreadable


def test_a_lost_hidden_test_shows_the_visible_warnings_of_its_question():
    """The cause a student can act on stands next to the points a hidden test cost; nothing hidden."""
    from autograder.judge.feedback import FeedbackLabels

    def test(source, gid, score, output=""):
        cell = nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
            "grade": True, "solution": False, "grade_id": gid, "points": 2, "score": score}})
        if output:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
        return cell

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## Q1. Attention", metadata={"nbgrader": {"grade": False, "solution": False}}),
        test('"""Q1 visible: shapes."""\nassert True', "q1_visible", 2,
             "Q1 visible test passed\nWarning: the scores are not divided by sqrt(d_k) <b>x</b> (not graded here)\n"),
        test('"""Q1 hidden: exact values."""\n# hidden tests ran here', "q1_hidden", 0),
        nbformat.v4.new_markdown_cell("## Q2. Masks", metadata={"nbgrader": {"grade": False, "solution": False}}),
        test('"""Q2 hidden: causal."""\n# hidden', "q2_hidden", 0),
        test('"""Q1 hidden: full marks."""', "q1_hidden_ok", 2)])
    nb, resources = FeedbackLabels().preprocess(nb, {})
    metas = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")}
    assert metas["q1_hidden"]["causes"] == ["the scores are not divided by sqrt(d_k) <b>x</b> (not graded here)"]
    assert metas["q2_hidden"]["causes"] == []  # Q2's visible tests warned about nothing
    assert "causes" not in metas["q1_hidden_ok"] and "causes" not in metas["q1_visible"]
    html = _page(nb.cells)
    assert html.count("What the visible tests of this question warned about") == 1
    assert "not divided by sqrt(d_k) &lt;b&gt;x&lt;/b&gt;" in html  # the student's text, escaped
