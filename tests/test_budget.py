"""What one test may take from the kernel (``autograder.judge.budget``), without a kernel: the
course file's limits reach the judge, and a test that passes one fails with its reason."""
from __future__ import annotations

import resource
import time

import pytest

from autograder.course.model import CourseFileError, parse
from autograder.course.settings import GradingSettings
from autograder.judge.budget import Limits, TestBudget
from autograder.judge.runner import judge_cell
from coursekit.remote.codec import RemoteTimeout
from conftest import ROOT

BASE = {"title": "t", "repositories": {"student": {"name": "a/b"}, "instructor": {"name": "a/c"}},
        "assignments": {"x": {"title": "X"}}}


class FakeSession:
    """Answers every request with ``size`` bytes after ``delay`` s; notes the time limit of each."""

    def __init__(self, size: int = 0, delay: float = 0.0):
        self.size, self.delay, self.timeouts = size, delay, []

    def request(self, payload, timeout, on_callback):
        self.timeouts.append(timeout)
        if self.delay > timeout:
            time.sleep(timeout)
            raise RemoteTimeout(f"the student's code did not finish within {timeout:g} s")
        time.sleep(self.delay)
        return b"{}", b"x" * self.size


def _judge(code: str, session, limits: Limits, notebook_deadline=None):
    budget = TestBudget(session, limits, notebook_deadline)
    ns = {"pull": lambda: budget.request("payload", 30.0, None)}
    return judge_cell(code, "t", ns, budget), budget


def test_the_course_files_limits_reach_the_judge():
    grading = {"test_timeout": 7, "test_items": 8, "test_mb": 9, "test_memory_mb": 0}
    course = parse({**BASE, "grading": grading}, ROOT)
    settings = GradingSettings.from_json(GradingSettings.for_assignment(course.assignment("x")).to_json())
    assert Limits.of(settings) == Limits(seconds=7, items=8, mb=9, memory_mb=0)
    assert Limits.of(GradingSettings()) == Limits()
    with pytest.raises(CourseFileError, match="test_mb must be positive"):
        parse({**BASE, "grading": {"test_mb": 0}}, ROOT)


def test_items_and_bytes_stop_a_test_even_when_it_catches_the_error():
    session = FakeSession(size=1 << 20)
    code = "for _ in range(100):\n    try:\n        pull()\n    except Exception:\n        pass\nassert True"
    verdict, _ = _judge(code, session, Limits(seconds=60, items=1000, mb=4, memory_mb=0))
    assert (verdict.passed, verdict.ename) == (False, "TestLimit")
    assert verdict.message == "stopped: the test took more than 4 MiB from the notebook's code"
    assert len(session.timeouts) == 4  # the fourth reply (1 MiB and its structure) passed 4 MiB: nothing after it
    session = FakeSession(size=10)
    verdict, _ = _judge(code, session, Limits(seconds=60, items=7, mb=4, memory_mb=0))
    assert verdict.message == "stopped: the test asked the notebook's code for more than 7 items"
    assert len(session.timeouts) == 7
    verdict, _ = _judge("for _ in range(7):\n    pull()", FakeSession(size=10),
                        Limits(seconds=60, items=7, mb=4, memory_mb=0))
    assert verdict.passed  # within its budget, as before


def test_each_request_gets_what_is_left_of_the_test_and_the_notebook():
    session = FakeSession(delay=0.3)
    verdict, _ = _judge("for _ in range(20):\n    pull()", session, Limits(seconds=1, items=1000, mb=4, memory_mb=0))
    assert verdict.message == "stopped: the test ran longer than 1 s", verdict
    assert all(t <= 1 for t in session.timeouts) and len(session.timeouts) <= 5, session.timeouts
    session = FakeSession(delay=0.3)
    verdict, _ = _judge("for _ in range(20):\n    pull()", session, Limits(seconds=60, items=1000, mb=4, memory_mb=0),
                        notebook_deadline=time.monotonic() + 1)
    assert verdict.message == "stopped: the notebook's time limit was reached during this test", verdict


def test_a_tests_own_work_stops_at_its_deadline():
    t0 = time.monotonic()
    verdict, _ = _judge("while True:\n    pass", FakeSession(), Limits(seconds=0.5, items=10, mb=4, memory_mb=0))
    assert verdict.message == "stopped: the test ran longer than 0.5 s", verdict
    assert time.monotonic() - t0 < 30  # stopped, not left to run (a loose bound: this machine is shared)


def test_a_tests_own_allocation_stops_at_the_memory_limit_which_is_then_put_back():
    before = resource.getrlimit(resource.RLIMIT_DATA)
    limit = 300  # MiB the test may add
    verdict, _ = _judge("_big = bytearray(600 << 20)\nassert _big", FakeSession(),
                        Limits(seconds=60, items=10, mb=4, memory_mb=limit))
    assert (verdict.ename, verdict.message) == (
        "MemoryLimit", "stopped: the test ran out of the grader's memory limit working on the notebook's values")
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    verdict, _ = _judge("_small = bytearray(10 << 20)\nassert _small is not None", FakeSession(),
                        Limits(seconds=60, items=10, mb=4, memory_mb=limit))
    assert verdict.passed


class KilledSession(FakeSession):
    """A kernel that ignores the interrupt at a request's deadline: the session kills it."""

    def request(self, payload, timeout, on_callback):
        from autograder.judge.kernel import KernelKilled
        self.timeouts.append(timeout)
        time.sleep(timeout)
        raise KernelKilled(f"the student's code ran longer than {timeout:g} s and did not stop when "
                           "interrupted; its kernel was killed")


def test_a_kernel_killed_at_the_tests_deadline_fails_the_test_even_when_a_warning_swallows_it():
    """The kill that follows an ignored interrupt at the test's deadline is the test's time limit,
    not a kernel the student ended: a visible test whose ``warn_only`` block turns a dead kernel into
    a warning still fails, with the time limit's reason (seen on a loaded CI machine)."""
    from coursekit.selfcheck import warn_only
    code = "with warn_only():\n    for _ in range(20):\n        pull()\nassert True"
    budget = TestBudget(KilledSession(), Limits(seconds=1, items=1000, mb=4, memory_mb=0))
    ns = {"pull": lambda: budget.request("payload", 30.0, None), "warn_only": warn_only}
    verdict = judge_cell(code, "t", ns, budget)
    assert (verdict.passed, verdict.message) == (False, "stopped: the test ran longer than 1 s"), verdict
    # killed at the cell's own (shorter) limit, the death is the student's: a warning, as before
    budget = TestBudget(KilledSession(), Limits(seconds=60, items=1000, mb=4, memory_mb=0))
    ns = {"pull": lambda: budget.request("payload", 0.2, None), "warn_only": warn_only}
    assert judge_cell(code, "t", ns, budget).passed
