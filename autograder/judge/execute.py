"""nbgrader's autograde step, with the tests judged outside the student's kernel.

``JudgedExecute`` takes the place of nbgrader's ``Execute`` in the autograde chain (see
``autograder/config.py``).  It runs the notebook cell by cell in a fresh sandboxed kernel
(``autograder.judge.KernelSession``), except the graded test cells: their code (visible
and hidden part, as nbgrader stored it at release) runs in this process with ``student``
bound to the kernel (``coursekit.remote.client.RemoteStudent``), and the grader writes the test
cell's outputs.  nbgrader's ``SaveAutoGrades`` then scores them as usual.

The kernel is killed when a cell runs past its limit and does not stop on an interrupt,
or dies; verdicts already given stay, a fresh kernel re-runs the cells that had run
without error, and the notebook continues (at most ``max_restarts`` times).
"""
from __future__ import annotations

import atexit
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Dict, Integer, List, Unicode

from autograder.course.model import Grading, load
from autograder.course.settings import GradingSettings
from autograder.isolation import sandbox
from autograder.isolation.policy import kernel_env
from autograder.isolation.scratch import process_folder, remove_tree

from .budget import Limits
from .feedback import strip_hidden_source
from .kernel import KernelSession
from .runner import context_sources, is_test_cell, run_and_judge
from .status import record_status
from .worker import Job

# The kernel launched for the next submission, (KernelSession, scratch folder).  Module
# level: nbgrader makes a new preprocessor object for every notebook it converts.
_SPARE: dict = {}
# This process's zygote (autograder.isolation.zygote): {"key": settings, "proc": Popen, "dir": Path}
_ZYGOTE: dict = {}


def _without_hidden_tests(nb):
    """The submission as the student has it (for the kernel's working folder): test cells
    carry only their visible part."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if is_test_cell(cell):
            cell.source = strip_hidden_source(cell.source)
    return out


class JudgedExecute(NbGraderPreprocessor):
    """Execute the student's cells in the sandboxed kernel; judge test cells here."""

    enabled = Bool(True)
    timeout = Integer(Grading().cell_timeout, help="seconds per cell (and per request a test makes)")
    notebook_timeout = Integer(Grading().notebook_timeout, help="seconds for the whole notebook")
    interrupt_grace = Integer(Grading().interrupt_grace, help="seconds an interrupted kernel has to stop before it "
                                                              "is killed")
    kernel_name = Unicode("course-sandbox").tag(config=True)
    # no history file; and no 0.5 ms sleep after every execute_request (ipykernel's guard for clients that
    # stop reading at the reply: every loop of KernelSession reads on to the kernel's "idle", which follows
    # the cell's last output): a submission's ~100 requests
    extra_arguments = List(["--HistoryManager.hist_file=:memory:", "--IPythonKernel._execute_sleep=0"]).tag(config=True)
    ipc = Bool(True, help="talk to the kernel over IPC sockets (no network in the sandbox)")
    device = Unicode("cpu", help="the device the kernels compute on (cuda when they get the GPU)")
    context = List([], help="grade ids of the released cells whose code makes the judge's namespace "
                            "(imports, given helpers)")
    job = Unicode("", help="the grading worker's job.json (autograder.judge.worker.Job): when given, every "
                           "setting of the judge comes from the run's GradingSettings in it").tag(config=True)
    max_restarts = Integer(4)
    scratch_dir = Unicode("", help="host folder for per-submission scratch (connection files)")
    status_dir = Unicode("", help="where to write a JSON note per submission")
    kernel_env = Dict({}, help="extra environment variables for the kernels")
    preload = List(["torch"], help="modules every kernel imports when it starts, before any "
                                   "student code (the setup cell would import them first anyway)").tag(config=True)
    prestart = Bool(True, help="launch the next submission's kernel (a fresh process in a fresh "
                               "sandbox) while this one is graded").tag(config=True)
    zygote = Bool(True, help="fork each sandboxed kernel, in a sandbox of its own, from a process "
                             "that imported torch once (autograder.isolation.zygote)").tag(config=True)


    def _kernel_args(self) -> list[str]:
        # imported, not bound: the student's namespace stays as the notebook makes it
        lines = [f"--IPKernelApp.exec_lines=import importlib as _il; _il.import_module({name!r}); del _il"
                 for name in self.preload]
        return [*self.extra_arguments, *lines]

    def _session(self, scratch: Path, copy: Path | None) -> KernelSession:
        env = {**self.kernel_env, "COURSE_DEVICE": self.device}
        zygote = _ZYGOTE.get("dir")
        if zygote is not None:
            env["COURSE_SANDBOX_ZYGOTE"] = str(zygote / "z.sock")
        return KernelSession(self.kernel_name, scratch / "work", env=env, extra_arguments=self._kernel_args(),
                             ipc=self.ipc, copy=copy, conn_base=zygote, grace=self.interrupt_grace)

    def _ensure_zygote(self, base: Path) -> None:
        """Start this process's zygote for these settings (or keep the one running), when the
        kernels run in bubblewrap on the CPU; otherwise kernels start as separate sandboxes."""
        key = self._spare_key(base)
        proc = _ZYGOTE.get("proc")
        if proc is not None and proc.poll() is None and _ZYGOTE.get("key") == key:
            return
        _stop_zygote()
        if not self.zygote:
            return
        try:
            argv = list(KernelSpecManager().get_kernel_spec(self.kernel_name).argv)
        except Exception:  # noqa: BLE001 - no such spec: the kernel manager will say so
            return
        if (argv[1:3] != ["-m", "autograder.isolation.sandbox"] or "--no-bwrap" in argv or "--gpu" in argv
                or argv[-2:] != ["--", "{connection_file}"]):
            return
        folder = Path(tempfile.mkdtemp(prefix="cz", dir=process_folder()))
        sock = folder / "z.sock"
        cmd = [*argv[:-2], "--zygote", f"--workbase={base.resolve()}",
               *[f"--preload={m}" for m in self.preload], "--", str(sock)]
        env = dict(os.environ, **self.kernel_env, COURSE_DEVICE=self.device)
        env.pop("COURSE_SANDBOX_ZYGOTE", None)
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=str(base))
        except OSError:
            remove_tree(folder)
            return
        deadline = time.monotonic() + 20
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if not sock.exists():
            _ZYGOTE.update(proc=proc, dir=folder)
            _stop_zygote()
            print(f"grading: the kernel zygote did not start (sys.executable={sys.executable}); "
                  "kernels start one by one", file=sys.stderr)
            return
        _ZYGOTE.update(key=key, proc=proc, dir=folder)

    def _launch_spare(self, base: Path) -> None:
        """Launch a kernel for the next submission: it starts up while this one is graded.
        It is a fresh process in a fresh sandbox, given to exactly one submission (its
        working folder receives that submission's copy before any code of it runs), and
        killed after it, exactly like a kernel started on demand."""
        scratch = Path(tempfile.mkdtemp(prefix="next-", dir=base))
        session = self._session(scratch, None)
        try:
            session.launch()
        except Exception:  # noqa: BLE001 - the next submission then starts its own kernel
            session.stop()
            remove_tree(scratch)
            return
        _SPARE["next"] = (session, scratch, self._spare_key(base))

    def _spare_key(self, base: Path) -> str:
        """What a kernel launched ahead of time must agree on with the submission that takes
        it: kernel spec, arguments, environment and limits (a Dask worker grades tasks of
        other runs too)."""
        try:
            argv = KernelSpecManager().get_kernel_spec(self.kernel_name).argv
        except Exception:  # noqa: BLE001 - no such spec: never matches a launched kernel
            argv = None
        return json.dumps([self.kernel_name, argv, self._kernel_args(), self.kernel_env, self.device, self.ipc,
                           str(base), kernel_env()], sort_keys=True, default=str)

    def _take_spare(self, base: Path):
        """The kernel launched for this submission, if it is still starting or ready and
        was launched with this submission's settings; else None (and it is killed)."""
        spare = _SPARE.pop("next", None)
        if spare is None:
            return None
        session, scratch, key = spare
        if session.launched() and scratch.is_dir() and key == self._spare_key(base):
            return session, scratch
        session.stop()
        remove_tree(scratch)
        return None

    def _configure(self, assignment: str) -> None:
        """Take every setting from the run's settings in the job file (one serialised object);
        a plain ``nbgrader autograde``, with no job, takes the course's settings for the assignment."""
        if not self.job:
            s = GradingSettings.for_assignment(load().assignment(assignment), bwrap=sandbox.bwrap_works())
        else:
            job = Job.load(Path(self.job))
            s = job.settings
            self.ipc, self.device = s.bwrap, s.device
            self.scratch_dir, self.status_dir = str(job.scratch_dir), str(job.folder / "status")
        self.timeout, self.notebook_timeout, self.max_restarts = s.cell_timeout, s.notebook_timeout, s.max_restarts
        self.interrupt_grace = s.interrupt_grace
        self.kernel_env, self.context = dict(s.env), list(s.judge_context)
        self.limits = Limits.of(s)

    def preprocess(self, nb, resources):
        nbg = resources.get("nbgrader", {})
        assignment, student = nbg.get("assignment", "?"), nbg.get("student", "?")
        self._configure(assignment)
        base = Path(self.scratch_dir or process_folder() / "kernels")
        base.mkdir(parents=True, exist_ok=True)
        spare = self._take_spare(base)
        self._ensure_zygote(base)
        scratch = spare[1] if spare else Path(tempfile.mkdtemp(prefix=f"{student}-", dir=base))
        notes: list[str] = []
        timings: dict = {}
        record: dict = {"notes": notes, "timings": timings}
        try:
            copy = scratch / f"{nbg.get('notebook', assignment)}.ipynb"
            nbformat.write(_without_hidden_tests(nb), copy)
            if spare:
                session = spare[0]
                session.copy = copy  # sent into the kernel's working folder when it connects
            else:
                session = self._session(scratch, copy)  # started by run_and_judge
            if self.prestart:
                self._launch_spare(base)
            started = time.monotonic()
            try:
                notes += run_and_judge(nb, session, context_sources(nb, self.context), self.device,
                                       self.timeout, self.notebook_timeout, self.max_restarts, timings,
                                       getattr(self, "limits", None))
            finally:
                session.stop()
                timings["total"] = time.monotonic() - started
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"[:500]
            raise
        finally:
            remove_tree(scratch)  # never follows links the kernel made
            record_status(self.status_dir, student, fresh=True, **record)
        return nb, resources

def _stop_zygote() -> None:
    """Kill the zygote (its sandbox, with any kernel still forked from it) and remove its folder."""
    proc, folder = _ZYGOTE.pop("proc", None), _ZYGOTE.pop("dir", None)
    _ZYGOTE.clear()
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            pass
    if folder is not None:
        remove_tree(folder)


@atexit.register
def _discard() -> None:
    """At exit: kill a spare kernel no submission needed, and the zygote; remove their folders."""
    spare = _SPARE.pop("next", None)
    if spare is not None:
        spare[0].stop()
        remove_tree(spare[1])
    _stop_zygote()
