"""Local worker processes: the submissions shared out, one grading process per share.

Each worker is a ``Job`` (``autograder.judge.worker``): a folder with a copy of the release's
gradebook, its students' notebooks and the course's kernelspec, graded by one process
(``python -m autograder.judge.worker FOLDER/job.json``: nbgrader's autograde with
``JudgedExecute``, then its feedback).  Each submission is held to its own notebook limit inside
that process; the process as a whole is bounded only as a guard against the grader itself
hanging.  A submission a worker did not finish (the worker was killed, nbgrader refused the
notebook) is graded again alone, to grade it if it can be graded and to tell its cause if not.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import nbformat

from autograder.course.settings import GradingSettings, environ, usable_cpus
from autograder.isolation import sandbox
from autograder.isolation.sandbox import SandboxInfo
from autograder.isolation.scratch import ENV, run_folder
from autograder.judge.worker import JOB_FILE, Job, Outcome


@dataclass
class WorkerRun:
    """One worker process: its job, what it printed, whether it ran past its limit."""

    job: Job
    log: str = ""
    timed_out: bool = False
    outcomes: dict = field(default_factory=dict)


_RUNNING: set = set()  # the worker processes of this process, to stop them all on Ctrl-C


def run_job(job: Job, timeout: float) -> WorkerRun:
    """One process grades all of the job's students, then writes their feedback."""
    run = WorkerRun(job)
    # each submission's own limit is enforced inside (JudgedExecute); this bounds the process:
    # start-up, nbgrader's own work and feedback, and a kernel's grace period after its limit
    timeout += 60 + 30 * len(job.students)
    env = dict(job.env(), COURSE_GRADER_PID=str(os.getpid()))
    proc = subprocess.Popen([sys.executable, "-m", "autograder.judge.worker", str(job.folder / JOB_FILE)],
                            cwd=job.course, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    _RUNNING.add(proc)
    try:
        run.log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.timed_out = True
        _kill(proc)
        run.log = proc.communicate()[0] or ""
    finally:
        _RUNNING.discard(proc)
    run.outcomes = {sid: job.outcome(sid, run.log, run.timed_out) for sid in job.students}
    return run


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


class LocalBackend:
    """Grading in worker processes on this machine (``settings.workers``, default one per CPU)."""

    def check(self, settings: GradingSettings) -> tuple[SandboxInfo, list[str]]:
        return sandbox.check(settings.sandbox, settings.memory_mb)

    def judge(self, batch) -> dict[str, Outcome]:
        sids = sorted(batch.notebooks)
        workers = min(batch.settings.n_workers, max(1, len(sids)))
        threads = max(1, usable_cpus() // workers)
        limit = float(batch.settings.notebook_timeout)

        def prepare(name: str, share: list[str]) -> Job:
            return Job.prepare(batch.folder / "workers" / name, batch.assignment, batch.nb_name,
                               {sid: nbformat.writes(batch.notebooks[sid]) for sid in share}, batch.gradebook,
                               batch.settings, threads, late=batch.late & set(share))

        def run_all(jobs: list[Job], budget) -> list[WorkerRun]:
            ex = ThreadPoolExecutor(max_workers=max(1, len(jobs)))
            try:
                return list(ex.map(lambda job: run_job(job, budget(job)), jobs))
            except BaseException:  # Ctrl-C: every worker stops now, not when it is done
                for proc in list(_RUNNING):
                    _kill(proc)
                raise
            finally:
                ex.shutdown(wait=True)

        outcomes: dict[str, Outcome] = {}
        shares = [sids[i::workers] for i in range(workers) if sids[i::workers]]
        with run_folder() as folder, environ({ENV: str(folder)}):  # the run's socket folder
            retry = []
            for run in run_all([prepare(f"w{k}", share) for k, share in enumerate(shares)],
                               lambda job: limit * len(job.students)):
                for sid, outcome in run.outcomes.items():
                    if outcome.graded:
                        outcomes[sid] = outcome
                    else:
                        retry.append(sid)
            # anything a batch did not finish is graded again alone, with its own time: a
            # submission that brought its batch down costs only itself, and its cause is told
            singles = [prepare(f"retry{k}", [sid]) for k, sid in enumerate(retry)]
            for run in run_all(singles, lambda job: limit) if singles else []:
                outcomes.update(run.outcomes)
        return outcomes

