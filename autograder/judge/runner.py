"""Judge a submission's tests outside its kernel, cell by cell.

``run_and_judge`` runs a notebook in a ``KernelSession`` (``autograder.judge.kernel``): the
student's cells go to the kernel; each graded test cell runs here, in the grader's process,
with ``student`` bound to the kernel (``coursekit.remote.client.RemoteStudent``), and
``judge_cell`` turns its outcome into a ``Verdict``.  References, comparisons and points are
computed here; no hidden-test line is ever sent to the kernel.  Each test cell's outputs are
written by the grader: what the test printed, and for a failure one error line (the failing
line of a visible test; for a hidden check only its message or a generic sentence), the line the
self-check gives in the notebook too (``coursekit.failures``).
"""
from __future__ import annotations

import builtins
import contextlib
import io
import sys
import time
import types
import warnings
from dataclasses import dataclass

import nbformat
from coursekit.failures import explain_failure
from coursekit.remote.client import RemoteStudent
from coursekit.remote.codec import ProtocolError, RemoteTimeout
from coursekit.selfcheck import warn_only

from .budget import ENAME, MEMORY_ENAME, Limits, TestBudget, TestLimitExceeded, is_memory_error
from .kernel import MAX_NOTEBOOK_OUTPUT, MAX_TEXT_OUTPUT, CellRun, KernelDied, KernelSession, stored_size

# Imports inside functions: torch is imported when the judge's namespace is built: importing the runner (for
# its verdicts) does not load it.


# ---------------------------------------------------------------------------------------
# Judging one test cell
# ---------------------------------------------------------------------------------------

@dataclass
class Verdict:
    grade_id: str
    passed: bool
    printed: str = ""
    ename: str = ""
    message: str = ""
    kernel_died: bool = False

    def outputs(self) -> list:
        outs = []
        if self.printed.strip():
            outs.append(nbformat.v4.new_output("stream", name="stdout", text=self.printed[:MAX_TEXT_OUTPUT]))
        if not self.passed:
            outs.append(nbformat.v4.new_output("error", ename=self.ename or "AssertionError", evalue=self.message,
                                               traceback=[f"{self.ename or 'AssertionError'}: {self.message}"]))
        return outs


def _hidden_lines(source: str) -> set[int]:
    """Line numbers (1-based) of a cell's source that lie in a hidden-test region."""
    hidden, inside = set(), False
    for i, line in enumerate(source.splitlines(), 1):
        if "### BEGIN HIDDEN TESTS" in line:
            inside = True
        if inside:
            hidden.add(i)
        if "### END HIDDEN TESTS" in line:
            inside = False
    return hidden


def judge_cell(source: str, grade_id: str, namespace: dict, budget: TestBudget | None = None) -> Verdict:
    """Run a test cell's code in ``namespace`` (the grader's) and say how it went; with
    ``budget``, within its limits (``autograder.judge.budget``): a breach fails the test with
    its reason, even when the test's code caught the error."""
    if budget is None:
        return _judge_cell(source, grade_id, namespace)
    with budget.test():
        verdict = _judge_cell(source, grade_id, namespace)
    if not budget.breach and verdict.ename == "TimeoutError" and budget.time_left()[0] <= 1:
        budget.breach = budget.time_left()[1]  # the kernel was interrupted at the test's deadline
    if budget.breach and (verdict.passed or verdict.ename != ENAME):
        return Verdict(grade_id, False, verdict.printed, ENAME, f"stopped: {budget.breach}")
    return verdict


def _judge_cell(source: str, grade_id: str, namespace: dict) -> Verdict:
    filename = f"<test {grade_id}>"
    printed = io.StringIO()
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:
        return Verdict(grade_id, False, ename="SyntaxError", message=f"the test does not compile: {exc}")
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(code, namespace)
    except KernelDied as exc:
        return Verdict(grade_id, False, printed.getvalue(), "KernelDied", str(exc), kernel_died=True)
    except TestLimitExceeded as exc:
        return Verdict(grade_id, False, printed.getvalue(), ENAME, f"stopped: {exc}")
    except RemoteTimeout as exc:
        return Verdict(grade_id, False, printed.getvalue(), "TimeoutError", str(exc))
    except ProtocolError as exc:
        return Verdict(grade_id, False, printed.getvalue(), "ProtocolError",
                       f"the notebook's kernel did not send back a result ({exc})")
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a verdict
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) and not getattr(exc, "from_student", False):
            raise
        if is_memory_error(exc) and not getattr(exc, "from_student", False):
            return Verdict(grade_id, False, printed.getvalue(), MEMORY_ENAME,
                           "stopped: the test ran out of the grader's memory limit working on the notebook's values")
        return Verdict(grade_id, False, printed.getvalue(), *_failure(exc, source, filename))
    return Verdict(grade_id, True, printed.getvalue())


def _failure(exc: BaseException, source: str, filename: str) -> tuple[str, str]:
    """(ename, message) of a failed test cell: the line the self-check gives too (``coursekit.failures``)."""
    failure = explain_failure(exc, source, filename, hidden_lines=_hidden_lines(source))
    return failure.ename, failure.message


def judge_namespace(context_sources: list[str], device: str) -> dict:
    """The namespace test cells run in: the notebook's imports and given helpers (the cells
    the course file lists as judge context, taken from the released source, never from the
    submission), and ``DEVICE`` set to the kernel's device."""
    import torch

    module = types.ModuleType("__judge__")  # dataclasses and pickle look classes up by module
    sys.modules["__judge__"] = module
    ns: dict = module.__dict__
    ns["__builtins__"] = builtins
    exec("import importlib, importlib.util, math, os, subprocess, sys\nimport torch", ns)
    ns["DEVICE"] = torch.device(device)
    ns["check"] = ns["handin_report"] = lambda *a, **k: None
    ns["warn_only"] = warn_only  # checks in visible tests that warn (printed into the test's output)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for src in context_sources:
            exec(compile(src, "<judge context>", "exec"), ns)
    return ns


_CONTEXT_CACHE: dict = {}


def cached_judge_namespace(context_sources: list[str], device: str) -> dict:
    key = (tuple(context_sources), device)
    if key not in _CONTEXT_CACHE:
        _CONTEXT_CACHE.clear()
        _CONTEXT_CACHE[key] = judge_namespace(context_sources, device)
    return dict(_CONTEXT_CACHE[key])


# ---------------------------------------------------------------------------------------
# A whole notebook
# ---------------------------------------------------------------------------------------

def _gid(cell) -> str | None:
    meta = cell.metadata.get("nbgrader") or {}
    return meta.get("grade_id") if isinstance(meta, dict) else None


def is_test_cell(cell) -> bool:
    meta = cell.metadata.get("nbgrader") or {}
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def context_sources(nb, grade_ids) -> list[str]:
    """The code of the judge-context cells (by grade id, in the given order) of the released
    notebook ``nb`` (never the submission's own copies: nbgrader restores locked cells)."""
    by_id = {_gid(c): c.source for c in nb.cells if _gid(c)}
    missing = [g for g in grade_ids if g not in by_id]
    if missing:
        raise RuntimeError(f"judge context cells missing from the released notebook: {missing}")
    return [by_id[g] for g in grade_ids]


def _size(outputs) -> int:
    """The bytes ``outputs`` take in the notebook file (``kernel.stored_size``)."""
    return sum(stored_size(out) for out in outputs)


def _where(cell, index: int) -> str:
    return f"'{_gid(cell)}'" if _gid(cell) else f"cell {index + 1}"


def run_and_judge(nb, session: KernelSession, context: list[str], device: str, timeout: float,
                  notebook_timeout: float, max_restarts: int = 4, timings: dict | None = None,
                  limits: Limits | None = None) -> list[str]:
    """Run ``nb`` cell by cell in ``session`` (started here), judging its graded test cells
    in this process; every cell's outputs are replaced.  Returns notes for the instructor
    (time limits, kernel restarts).  ``timings`` (if given) receives the seconds spent
    starting the kernel, running the student's cells and judging the tests.

    One deadline holds for the whole submission: kernel starts, the student's cells, the
    requests its tests make and the replays after a restart all draw on the same
    ``notebook_timeout``.  A replay runs each cell exactly as it ran the first time (same
    request, outputs dropped), so the student's code cannot tell it is being replayed.

    Each test runs within ``limits`` (``autograder.judge.budget``; default: the course's):
    its items, bytes, time (never past the notebook's deadline) and the process's memory."""
    notes: list[str] = []
    clock = timings if timings is not None else {}
    for key in ("kernel_start", "cells", "tests"):
        clock.setdefault(key, 0.0)
    start = time.monotonic()
    deadline = start + notebook_timeout

    def left() -> float:
        return deadline - time.monotonic()

    over = f"the notebook ran longer than {notebook_timeout:g} s; the rest was not run"
    state = {"restarts": 0, "dead": False, "why": "the kernel had stopped earlier"}
    try:
        if session.launched():  # launched ahead of time (JudgedExecute's spare kernel)
            try:
                session.connect(timeout=max(1.0, left()))
            except KernelDied:
                session.start(timeout=max(1.0, left()))  # a spare that failed costs one more try
        else:
            session.start(timeout=max(1.0, left()))
    except KernelDied as exc:
        notes.append(str(exc))
        state["dead"] = True
        session.stop()
    clock["kernel_start"] += time.monotonic() - start
    student_cells = [c.source for c in nb.cells if c.cell_type == "code" and not is_test_cell(c)]
    budget = TestBudget(session, limits or Limits(), deadline)
    student = RemoteStudent(budget, timeout, student_cells)
    namespace = cached_judge_namespace(context, device)
    namespace["student"] = student
    ran_ok: list[str] = []     # cells that ran without error, to replay after a restart
    kept = 0                   # bytes of outputs kept so far

    def stop(note: str) -> None:
        notes.append(note)
        session.stop()
        state["dead"] = True
        if note == over:
            state["why"] = "the notebook's time limit was reached"

    def restart() -> None:
        """A fresh kernel that replays the cells that had run without error, within the
        notebook's own time limit."""
        if state["restarts"] >= max_restarts:
            return stop("the kernel stopped too often; the rest of the notebook was not run")
        state["restarts"] += 1
        try:
            if left() <= 0:
                return stop(over)
            session.start(timeout=left())
            for src in ran_ok:
                if left() <= 0:
                    return stop(over)
                run = session.execute(src, timeout=min(timeout, left()))
                if run.status == "timeout" and left() <= 0:
                    return stop(over)
                if run.status in ("died", "timeout"):
                    raise KernelDied(run.evalue)
        except KernelDied as exc:
            if left() <= 0:  # the kernel could not start or replay in the time that was left
                return stop(over)
            return stop(f"a fresh kernel could not replay the notebook ({exc}); the rest was not run")
        notes.append("a fresh kernel re-ran the cells before it, and the notebook went on")

    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if not state["dead"] and left() <= 0:
            stop(over)
        if is_test_cell(cell):
            cell.execution_count = None
            if state["dead"]:
                cell.outputs = Verdict(_gid(cell), False, ename="KernelDied",
                                       message=f"not judged: {state['why']}").outputs()
                continue
            object.__setattr__(student, "_timeout", max(0.5, min(timeout, left())))
            t0 = time.monotonic()
            verdict = judge_cell(cell.source, _gid(cell) or f"cell-{index}", namespace, budget)
            student._reset()
            clock["tests"] += time.monotonic() - t0
            cell.outputs = verdict.outputs()
            if verdict.kernel_died or not session.alive():
                notes.append(f"the kernel died while test {_where(cell, index)} ran")
                restart()
            continue
        if state["dead"]:
            why = f"not run: {state['why']}"
            cell.outputs = [nbformat.v4.new_output("error", ename="NotRun", evalue=why, traceback=[why])]
            cell.execution_count = None
            continue
        t0 = time.monotonic()
        limit = min(timeout, left())
        try:
            run = session.execute(cell.source, timeout=limit)
        except KernelDied as exc:
            run = CellRun(outputs=[], status="died", ename="DeadKernelError", evalue=str(exc))
        clock["cells"] += time.monotonic() - t0
        kept += _size(run.outputs)
        cell.outputs = run.outputs if kept <= MAX_NOTEBOOK_OUTPUT else [nbformat.v4.new_output(
            "stream", name="stdout", text="[output not kept: the notebook's outputs passed "
                                          f"{MAX_NOTEBOOK_OUTPUT // 1_000_000} MB]\n")]
        cell.execution_count = run.execution_count
        if run.status == "ok":
            ran_ok.append(cell.source)
        elif run.status == "timeout":
            notes.append(f"{_where(cell, index)} ran longer than {limit:.0f} s and was interrupted")
        elif run.status == "died":
            notes.append(f"{_where(cell, index)}: {run.evalue}")
            restart()
    return notes
