"""The line a student reads when a test cell fails (``coursekit.failures``): the self-check in
the notebook (``coursekit.selfcheck``) and the grader's judge (``autograder.judge.runner``) give
the same failure the same line.  Both run here in this process, on the same test cells, with
``student`` bound to a ``LocalStudent`` (no kernel)."""
from __future__ import annotations

import pytest

from autograder.judge.feedback import short_error
from autograder.judge.runner import judge_cell
from coursekit import selfcheck
from coursekit.failures import HIDDEN_FAILURE, explain_failure
from coursekit.remote import LocalStudent

NOTEBOOK = '''
def value():
    return 2

def broken():
    raise ValueError("rows must not be empty")

def stub():
    raise NotImplementedError()

def asserts():
    assert False, "my own assert"
'''

# (what the test cell does, what the line must say): each a failure both sides explain alike
CELLS = {
    "message": ('assert student.value() == 3, "value() must return 3"', "value() must return 3"),
    "bare assert": ("assert student.value() == 3", "failed: assert student.value() == 3"),
    "student's error": ("student.broken()", "your code raised ValueError: rows must not be empty"),
    "unanswered": ("student.stub()", "not answered yet"),
    "student's own assert": ("student.asserts()", "your code raised AssertionError: my own assert"),
    "test's own error": ("raise TypeError('too long ' * 500)", "TypeError: too long too long"),
    "NotImplementedError of the test": ('raise NotImplementedError("no kernel for this dtype")',
                                        "NotImplementedError: no kernel for this dtype"),
}


def _notebook() -> dict:
    ns: dict = {}
    exec(NOTEBOOK, ns)
    return ns


def _judge(source: str) -> tuple[str, str]:
    verdict = judge_cell(source, "t", {"student": LocalStudent(_notebook())})
    assert not verdict.passed
    return verdict.ename, verdict.message


def _self_check(source: str) -> tuple[str, str]:
    test = {"question": "Q1", "grade_id": "t", "points": 1, "description": "Q1 visible: x", "source": source}
    ns = {"student": LocalStudent(_notebook())}
    outcome = selfcheck._run_test(test, ns, selfcheck._Context({"answers": {}}, ns))
    assert not outcome.passed
    return outcome.status, outcome.reason


@pytest.mark.parametrize("case", sorted(CELLS))
def test_the_self_check_and_the_grader_say_the_same_line(case):
    source, says = CELLS[case]
    ename, message = _judge(source)
    status, reason = _self_check(source)
    graded = f"{ename}: {message}"  # the error line of the graded notebook and the feedback page
    assert reason in (message, graded), (reason, graded)
    assert says in reason and says in graded, (says, reason, graded)
    assert (status == "unanswered") == message.startswith("not answered yet"), (status, message)
    assert len(graded) < 2100, len(graded)  # the error's own text is cut short alike


def test_a_hidden_check_is_never_quoted():
    source = '"""Q1 hidden: x"""\n### BEGIN HIDDEN TESTS\n_secret = 41\nassert _secret == 42\n### END HIDDEN TESTS'
    ename, message = _judge(source)
    assert (ename, message) == ("AssertionError", HIDDEN_FAILURE)
    source = source.replace("assert _secret == 42", "int('41 is the secret' * 40)")
    ename, message = _judge(source)
    assert message.startswith(f"{HIDDEN_FAILURE}: ValueError") and len(message) < 420, message


def test_the_feedback_page_says_the_graders_hidden_sentence():
    output = {"output_type": "error", "ename": "AssertionError", "evalue": "", "traceback": ["secret line"]}
    short_error(output)
    assert output["traceback"] == [f"AssertionError: {HIDDEN_FAILURE}"]


def test_a_function_the_self_check_can_name_is_named():
    try:
        _notebook()["broken"]()
    except ValueError as exc:
        failure = explain_failure(exc, "", "<check t>", culprit="broken")
    assert failure.reason == "broken raised ValueError: rows must not be empty", failure
