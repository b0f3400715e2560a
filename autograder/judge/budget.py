"""What one test may take, counted on the grader's side.

A test cell runs in the grader's process and asks the student's kernel for values, one request
at a time (``KernelSession.request``).  Each request has the cell's time limit, and each reply is
bounded in size; but a test that iterates over what the student returns (a generator, a model's
parameters) makes as many requests as the student's code hands it items, and its own arithmetic
on student values (``torch.bincount`` of a huge id) can take any amount of the grader's memory.
``TestBudget`` bounds a test as a whole:

* **items**: the requests the test makes and the calls the student's code makes back to it;
* **bytes**: what those replies and calls carry (a reply is counted once it has come, so a test
  stops at most one reply, ``coursekit.remote.codec.MAX_REPLY_BYTES``, past its budget);
* **time**: one wall clock for the test, its requests and its own arithmetic together, never past
  the notebook's own deadline (each request gets what is left of both, not a fresh cell limit);
* **memory**: while a test runs, the grading process's data segment (``RLIMIT_DATA``: the heap
  and private writable mappings, torch's tensors included) may grow by at most ``memory_mb`` over
  what it was when the test started (the judge's context takes 0.3 GiB for one assignment, 1.6 GiB
  for another: ``benchmarks/judge_memory.py``); an allocation past it fails in the test, and a
  request is not made unless a reply of the largest size still fits.

A breach is sticky: once a test has passed a limit, every later request of it fails at once (so a
test that catches exceptions cannot go on pulling), and the runner records the test as failed,
with the limit's reason (``breach``).  The limits come from ``GradingSettings``.
"""
from __future__ import annotations

import contextlib
import re
import resource
import signal
import threading
import time
from dataclasses import dataclass

from coursekit.remote.client import callback_error
from coursekit.remote.codec import RemoteTimeout

from autograder.course.model import Grading
from autograder.judge.kernel import KernelKilled

_DEFAULTS = Grading()
# a request is made only while this much room is left under the memory limit: the largest
# message ZeroMQ may receive (``kernel.MAX_MESSAGE_BYTES``), read before anything checks it,
# and the Python objects its structure becomes
HEADROOM = (128 << 20) + (1 << 20) + (32 << 20)
MEMORY_ENAME = "MemoryLimit"
ENAME = "TestLimit"


class TestLimitExceeded(RuntimeError):
    """A test passed one of its limits (the message says which)."""

    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class Limits:
    """One test's limits (``GradingSettings`` carries them; ``memory_mb``: what a test may add to
    the process's data segment, 0 turns the memory limit off)."""

    __test__ = False

    seconds: float = _DEFAULTS.test_timeout
    items: int = _DEFAULTS.test_items
    mb: int = _DEFAULTS.test_mb
    memory_mb: int = _DEFAULTS.test_memory_mb

    @classmethod
    def of(cls, settings) -> "Limits":
        return cls(settings.test_timeout, settings.test_items, settings.test_mb, settings.test_memory_mb)


def data_segment() -> int:
    """This process's data segment in bytes (``VmData``: what ``RLIMIT_DATA`` counts)."""
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"^VmData:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return 0
    return int(found.group(1)) * 1024 if found else 0


def is_memory_error(exc: BaseException) -> bool:
    """True for a failed allocation: Python's MemoryError, torch's CPU allocator's error."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "Cannot allocate memory" in text)


class TestBudget:
    """The kernel session as a test sees it: ``request`` counts and bounds (see the module).
    Everything else is the session's."""

    __test__ = False

    def __init__(self, session, limits: Limits, notebook_deadline: float | None = None):
        self._session, self.limits = session, limits
        self.notebook_deadline = notebook_deadline
        self.active = False
        self.breach = ""
        self.items = self.bytes = 0
        self.deadline = float("inf")
        self.memory_limit = 0  # bytes of data segment, while a test runs (0: none)
        self.in_request = False

    def __getattr__(self, name):
        return getattr(self._session, name)

    # one test ---------------------------------------------------------------------------
    def _fail(self, why: str):
        if not self.breach:
            self.breach = why
        raise TestLimitExceeded(self.breach)

    def time_left(self) -> tuple[float, str]:
        """Seconds left to this test, and what a timeout then is called."""
        now = time.monotonic()
        left, why = self.deadline - now, f"the test ran longer than {self.limits.seconds:g} s"
        if self.notebook_deadline is not None and self.notebook_deadline - now < left:
            left, why = self.notebook_deadline - now, "the notebook's time limit was reached during this test"
        return left, why

    def _check(self) -> None:
        if self.breach:
            raise TestLimitExceeded(self.breach)
        left, why = self.time_left()
        if left <= 0:
            self._fail(why)
        if self.items >= self.limits.items:
            self._fail(f"the test asked the notebook's code for more than {self.limits.items:,d} items")
        if self.bytes > self.limits.mb << 20:
            self._fail(f"the test took more than {self.limits.mb:,d} MiB from the notebook's code")
        if self.memory_limit and data_segment() + HEADROOM > self.memory_limit:
            self._fail(f"the test used more than the {self.limits.memory_mb:,d} MiB of the grader's memory "
                       "a test may take")

    def request(self, payload: str, timeout: float, on_callback):
        if not self.active:  # between tests (forgetting a test's objects): the cell's own limit
            return self._session.request(payload, timeout, on_callback)
        self._check()
        left, why = self.time_left()
        bounded = left < timeout
        self.items += 1

        def counted(header: bytes, blob: bytes) -> str:
            self.items += 1
            self.bytes += len(header) + len(blob)
            try:
                self._check()
            except TestLimitExceeded as exc:
                return callback_error(f"the grader stopped this test: {exc}")
            return on_callback(header, blob)

        self.in_request = True
        try:
            header, blob = self._session.request(payload, max(0.1, min(timeout, left)), counted)
        except (RemoteTimeout, KernelKilled):
            if bounded:  # the test's own clock set this request's limit (the session is dead if killed)
                self._fail(why)
            raise
        finally:
            self.in_request = False
        self.bytes += len(header) + len(blob)
        if self.bytes > self.limits.mb << 20:
            self._fail(f"the test took more than {self.limits.mb:,d} MiB from the notebook's code")
        return header, blob

    @contextlib.contextmanager
    def test(self):
        """The limits of one test, for the duration of the block: counters from zero, the
        clock started, the memory limit set (and put back afterwards), and an alarm that stops
        the test's own arithmetic at its deadline (in the main thread; requests are bounded by
        their own time limits and are never cut short by it)."""
        self.items = self.bytes = 0
        self.breach = ""
        self.deadline = time.monotonic() + self.limits.seconds
        self.active = True
        try:
            with self._memory_limit(), self._alarm():
                yield self
        finally:
            self.active = False

    @contextlib.contextmanager
    def _memory_limit(self):
        limit = data_segment() + (self.limits.memory_mb << 20) if self.limits.memory_mb else 0
        try:
            soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        except (ValueError, OSError):
            soft = hard = None
        settable = (limit and soft is not None and (hard == resource.RLIM_INFINITY or hard >= limit)
                    and (soft == resource.RLIM_INFINITY or soft > limit))
        if settable:
            try:
                resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
                self.memory_limit = limit
            except (ValueError, OSError):
                settable = False
        try:
            yield
        finally:
            self.memory_limit = 0
            if settable:
                with contextlib.suppress(ValueError, OSError):
                    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))

    @contextlib.contextmanager
    def _alarm(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def ring(signum, frame):
            left, why = self.time_left()
            if self.in_request or not self.active or left > 0:
                return  # a request's own time limit covers it; the next ring comes 0.5 s later
            self._fail(why)

        previous = signal.signal(signal.SIGALRM, ring)
        left, _ = self.time_left()
        signal.setitimer(signal.ITIMER_REAL, max(0.05, left), 0.5)  # then every 0.5 s until the test ends
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
