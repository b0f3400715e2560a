"""nbgrader's autograde step, with the tests judged outside the student's kernel.

``JudgedExecute`` takes the place of nbgrader's ``Execute`` in the autograde chain (see
``autograder/config.py``).  It runs the notebook cell by cell in a fresh sandboxed kernel
(``autograder.judge.KernelSession``), except the graded test cells: their code (visible
and hidden part, as nbgrader stored it at release) runs in this process with ``student``
bound to the kernel (``autograder.judge.RemoteStudent``), and the grader writes the test
cell's outputs.  nbgrader's ``SaveAutoGrades`` then scores them as usual.

The kernel is killed when a cell runs past its limit and does not stop on an interrupt,
or dies; verdicts already given stay, a fresh kernel re-runs the cells that had run
without error, and the notebook continues (at most ``max_restarts`` times).
"""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
from traitlets import Bool, Dict, Integer, List, Unicode

from nbgrader.preprocessors import NbGraderPreprocessor

from .judge import KernelSession, context_sources, is_test_cell, run_and_judge

def _without_hidden_tests(nb):
    """The submission as the student has it (for the kernel's working folder): test cells
    carry only their visible part."""
    from .preprocessors import strip_hidden_source

    out = copy.deepcopy(nb)
    for cell in out.cells:
        if is_test_cell(cell):
            cell.source = strip_hidden_source(cell.source)
    return out


class JudgedExecute(NbGraderPreprocessor):
    """Execute the student's cells in the sandboxed kernel; judge test cells here."""

    enabled = Bool(True)
    timeout = Integer(300, help="seconds per cell (and per request a test makes)").tag(config=True)
    notebook_timeout = Integer(1800, help="seconds for the whole notebook").tag(config=True)
    kernel_name = Unicode("course-sandbox").tag(config=True)
    extra_arguments = List(["--HistoryManager.hist_file=:memory:"]).tag(config=True)
    ipc = Bool(True, help="talk to the kernel over IPC sockets (no network in the sandbox)").tag(config=True)
    device = Unicode("cpu", help="the device the kernels compute on (cuda when they get the GPU)").tag(config=True)
    judge_context = Dict({}, help="assignment -> grade ids of the cells that make the judge's "
                                  "namespace (imports, given helpers)").tag(config=True)
    max_restarts = Integer(4).tag(config=True)
    scratch_dir = Unicode("", help="host folder for per-submission scratch (connection files)").tag(config=True)
    status_dir = Unicode("", help="where to write a JSON note per submission").tag(config=True)
    kernel_env = Dict({}, help="extra environment variables for the kernels").tag(config=True)

    def preprocess(self, nb, resources):
        nbg = resources.get("nbgrader", {})
        assignment, student = nbg.get("assignment", "?"), nbg.get("student", "?")
        base = Path(self.scratch_dir or tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{student}-", dir=base))
        notes: list[str] = []
        timings: dict = {}
        record: dict = {"notes": notes, "timings": timings}
        try:
            copy = scratch / f"{nbg.get('notebook', assignment)}.ipynb"
            nbformat.write(_without_hidden_tests(nb), copy)
            session = KernelSession(self.kernel_name, scratch / "work",
                                    env={**self.kernel_env, "COURSE_DEVICE": self.device},
                                    extra_arguments=self.extra_arguments, ipc=self.ipc, copy=copy)
            started = time.monotonic()
            try:
                notes += run_and_judge(nb, session, self._context_sources(nb, assignment), self.device,
                                       self.timeout, self.notebook_timeout, self.max_restarts, timings)
            finally:
                session.stop()
                timings["total"] = time.monotonic() - started
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"[:500]
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # never follows links the kernel made
            if self.status_dir:
                Path(self.status_dir).mkdir(parents=True, exist_ok=True)
                (Path(self.status_dir) / f"{student}.json").write_text(json.dumps(record))
        return nb, resources

    def _context_sources(self, nb, assignment: str) -> list[str]:
        return context_sources(nb, self.judge_context.get(assignment, []))
