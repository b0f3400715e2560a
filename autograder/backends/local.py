"""Local worker processes: long-lived grading processes, given small batches of submissions
one after another.

The processes start in ``check`` (``python -m autograder.judge.worker --serve``), while the
grader still reads the submissions and proves the sandbox: their imports (nbgrader, torch: a
few seconds of CPU each) are paid once per run, ahead of the work, as a Dask cluster's workers
pay theirs before the run.  ``judge`` then shares the submissions out in small batches, each a
``Job`` (``autograder.judge.worker``: a folder with a copy of the release's gradebook, its
students' notebooks and the course's kernelspec), handed to whichever process is free, so that
the processes finish together.  Each batch runs nbgrader's autograde with ``JudgedExecute``
(a fresh sandboxed kernel per submission) and then its feedback, in that process.  Each
submission is held to its own notebook limit inside the process; a batch as a whole is bounded
only as a guard against the grader itself hanging: past it, the process is killed (with its
kernels) and a fresh one takes its place.  A submission a batch did not finish (its process was
killed or died, nbgrader refused the notebook) is graded again alone, to grade it if it can be
graded and to tell its cause if not.
"""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field

from coursekit.models import course_cache_dir

from autograder.course.paths import nbgrader_env
from autograder.course.settings import GradingSettings, environ, usable_cpus
from autograder.isolation import sandbox
from autograder.isolation.sandbox import SandboxInfo
from autograder.isolation.scratch import ENV, run_folder
from autograder.judge.worker import JOB_FILE, SERVE, Job, Outcome


@dataclass
class WorkerRun:
    """One batch in a worker process: its job, what it printed, whether it ran past its limit."""

    job: Job
    log: str = ""
    timed_out: bool = False
    outcomes: dict = field(default_factory=dict)


_RUNNING: set = set()  # the worker processes of this process, to stop them all on Ctrl-C


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def batch_size(n_submissions: int, n_workers: int) -> int:
    """Submissions per batch: about four batches per process, so that the processes finish
    together, at most eight per batch, so that a batch that has to be graded again costs little."""
    return max(1, min(8, n_submissions // max(1, 4 * n_workers)))


class Worker:
    """One grading process (``autograder.judge.worker.serve``), started now; it imports what
    grading needs and waits for its first job."""

    def __init__(self, threads: int, env: dict, command: list[str] | None = None):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(command or [sys.executable, "-m", "autograder.judge.worker", SERVE],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     start_new_session=True)
        self.threads = threads
        self._buffer = b""
        self._said: str | None = None
        _RUNNING.add(self.proc)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _line(self, deadline: float) -> bytes | None:
        """The next line the process answers, or None when it stopped or the deadline passed."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 5.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def run(self, job: Job, env: dict, timeout: float) -> tuple[bool, bool]:
        """(done, timed out): the job run to its end, or the process killed past ``timeout``
        or stopped on its own."""
        deadline = time.monotonic() + timeout
        try:
            self.proc.stdin.write((json.dumps({"job": str(job.folder / JOB_FILE), "env": env}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            return False, False
        while True:
            line = self._line(deadline)
            if line is None:
                # the deadline passed, or the process closed its end (it died, or was killed):
                # only the first is a time limit, whatever the process's state at this instant
                timed_out = time.monotonic() >= deadline
                self.stop(kill=True)
                return False, timed_out
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if reply.get("job") == str(job.folder / JOB_FILE):
                return True, False

    def died_saying(self) -> str:
        """The end of what the process wrote to its stderr (kept when it stops)."""
        if self._said is None:
            self.stderr.seek(0)
            return self.stderr.read()[-4000:].decode(errors="replace")
        return self._said

    def stop(self, kill: bool = False, wait: float = 30) -> None:
        """End the process: at the end of its requests (it stops its zygote and spare kernel
        on the way out), killed when it does not end within ``wait`` seconds, or at once."""
        if not kill:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=wait)
            except (OSError, subprocess.TimeoutExpired):
                kill = True
        if kill:
            _kill(self.proc)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        if self._said is None:
            self._said = self.died_saying()  # its last words outlive the file that held them
        self.stderr.close()
        _RUNNING.discard(self.proc)


def worker_env(settings: GradingSettings, threads: int) -> dict:
    """What a grading process starts with (a job brings the rest: ``Job.env``)."""
    env = nbgrader_env()
    env.pop("JPY_PARENT_PID", None)
    env.update(settings.env)
    env.update(OMP_NUM_THREADS=str(threads), PYTHONHASHSEED="0", COURSE_CACHE_DIR=str(course_cache_dir()),
               COURSE_GRADER_PID=str(os.getpid()))
    return env


def _stop_all(workers: list) -> None:
    for worker in workers:
        worker.stop(kill=True)


def run_job(job: Job, timeout: float, worker: Worker | None = None) -> WorkerRun:
    """The job's students graded and given their feedback, in ``worker`` (or a process of
    its own, started here and stopped after)."""
    run = WorkerRun(job)
    # each submission's own limit is enforced inside (JudgedExecute); this bounds the batch:
    # nbgrader's own work and feedback, and a kernel's grace period after its limit
    own = worker is None
    worker = worker or Worker(job.threads, worker_env(job.settings, job.threads))
    env = dict(job.env(), COURSE_GRADER_PID=str(os.getpid()))
    done, run.timed_out = worker.run(job, env, timeout + 60 + 30 * len(job.students))
    log = job.folder / "log.txt"
    run.log = log.read_text(errors="replace") if log.exists() else ""
    if not done and not run.timed_out:
        run.log += worker.died_saying()
    if own:
        worker.stop(kill=not done)
    run.outcomes = {sid: job.outcome(sid, run.log, run.timed_out) for sid in job.students}
    return run


class LocalBackend:
    """Grading in worker processes on this machine (``settings.workers``, default one per CPU)."""

    def __init__(self):
        self._workers: list[Worker] = []
        self._key = None
        self.expected: int | None = None  # submissions the run expects to judge (set by its read stage)
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def check(self, settings: GradingSettings) -> tuple[SandboxInfo, list[str]]:
        info, warnings = sandbox.check(settings.sandbox, settings.memory_mb)
        self.start(settings, min(settings.n_workers, max(1, self.expected or settings.n_workers)))
        return info, warnings

    def start(self, settings: GradingSettings, n: int) -> None:
        """``n`` grading processes for ``settings``, started now (they import what grading needs
        while the run goes on) unless they run already.  Each job brings its own environment
        and threads (``Job.env``); a process only has to agree on the assignment's environment."""
        key = json.dumps(dict(settings.env), sort_keys=True)
        if key != self._key:
            self.close()
            self._key = key
        threads = max(1, usable_cpus() // max(1, n))
        while len(self._workers) < n:
            self._workers.append(Worker(threads, worker_env(settings, threads)))

    def close(self) -> None:
        """Every grading process ended (each stops its zygote and spare kernel)."""
        workers, self._workers[:] = list(self._workers), []
        for worker in workers:  # all told first (end of requests), so that they wind down together
            try:
                worker.proc.stdin.close()
            except OSError:
                pass
        for worker in workers:
            worker.stop()
        self._key = None

    def judge(self, batch) -> dict[str, Outcome]:
        sids = sorted(batch.notebooks)
        n = min(batch.settings.n_workers, max(1, len(sids)))
        try:
            return self._judge(batch, sids, n)
        except BaseException:  # Ctrl-C: every worker stops now, not when it is done
            for proc in list(_RUNNING):
                _kill(proc)
            raise
        finally:
            self.close()

    def _judge(self, batch, sids: list[str], n: int) -> dict[str, Outcome]:
        # the processes started in check (or now, when judge comes without it); one per batch
        # at most: a class of one needs one process
        for worker in self._workers[n:]:
            worker.stop(kill=True)
        del self._workers[n:]
        self.start(batch.settings, n)
        threads = max(1, usable_cpus() // n)
        limit = float(batch.settings.notebook_timeout)
        outcomes: dict[str, Outcome] = {}
        lock = threading.Lock()
        names = iter(range(1 << 30))

        def prepare(prefix: str, share: list[str], k: int) -> Job:
            with lock:
                name = f"{prefix}{next(names)}"
            # the kernels' scratch folder belongs to the process: the spare kernel it launches
            # at the end of one batch serves the first submission of its next one
            return Job.prepare(batch.folder / "workers" / name, batch.assignment, batch.nb_name,
                               {sid: batch.notebooks[sid].text() for sid in share}, batch.gradebook,
                               batch.settings, threads, late=batch.late & set(share),
                               scratch=batch.folder / "workers" / f"kernels{k}")

        def serve(k: int, work: queue.Queue, prefix: str, each: float, left: list) -> None:
            (batch.folder / "workers" / f"kernels{k}").mkdir(parents=True, exist_ok=True)
            while True:
                try:
                    share = work.get_nowait()
                except queue.Empty:
                    return
                worker = self._workers[k]
                if not worker.alive():  # killed at its limit, or died: a fresh one for the rest
                    worker.stop(kill=True)
                    worker = self._workers[k] = Worker(threads, worker_env(batch.settings, threads))
                try:
                    run = run_job(prepare(prefix, share, k), each * len(share), worker)
                    got = run.outcomes
                except Exception as exc:  # the grader's own failure: the batch is tried again alone
                    worker.stop(kill=True)
                    got = {sid: Outcome(sid, False, cause=f"grading failed: {type(exc).__name__}: {exc}"[:300])
                           for sid in share}
                with lock:
                    for sid, outcome in got.items():
                        if outcome.graded or left is None:
                            outcomes[sid] = outcome
                        else:
                            left.append(sid)

        def run_all(shares: list, prefix: str, retry: list | None) -> None:
            work: queue.Queue = queue.Queue()
            for share in shares:
                work.put(share)
            threads_ = [threading.Thread(target=serve, args=(k, work, prefix, limit, retry), daemon=True,
                                         name=f"course-worker-{k}") for k in range(min(n, len(shares)))]
            for t in threads_:
                t.start()
            for t in threads_:
                while t.is_alive():
                    t.join(0.5)

        with run_folder() as folder, environ({ENV: str(folder)}):  # the run's socket folder
            size = batch_size(len(sids), n)
            retry: list[str] = []
            run_all([sids[i:i + size] for i in range(0, len(sids), size)], "w", retry)
            # anything a batch did not finish is graded again alone, with its own time: a
            # submission that brought its batch down costs only itself, and its cause is told
            if retry:
                run_all([[sid] for sid in sorted(retry)], "retry", None)
            self.close()  # inside the run's folder: the processes stop their kernels first
        return outcomes
