"""Grading on a Dask cluster: ``grade ... --cluster ADDRESS`` (a scheduler address such as
``tcp://head:8786``, or the path of a scheduler file).

Each submission is one Dask task.  On the worker that runs it, ``grade_submission`` grades it
exactly as a local worker does (the same bubblewrap sandbox and limits, JudgedExecute, nbgrader's
autograde and feedback, in the worker's own Python process) in a private folder, and sends back
the result: the submission's gradebook rows (its one-submission SQLite gradebook, or nothing when
the workers write to a shared PostgreSQL gradebook), the autograded notebook and the feedback
page.  The instructor's process merges them into the course's folders as they arrive.  Dask
retries a task whose worker died on another worker; merging replaces a student's earlier rows,
so a submission graded twice is in the gradebook once.

Before the first task, every worker builds (or finds in its own cache) the offline models the
assignment loads.  Start workers with one thread each (the grader changes its process's
environment while a task runs):

    dask scheduler --scheduler-file sched.json
    dask worker --scheduler-file sched.json --nthreads 1 --nworkers 2

On SLURM, ``dask_jobqueue.SLURMCluster(cores=2, processes=2, memory="16GB", job_extra_directives=[...])``
with ``cluster.scale(jobs=10)`` and ``--cluster`` set to ``cluster.scheduler_address``; on
Kubernetes, the ``dask-kubernetes`` operator's ``DaskCluster`` (see docs/GRADING.md).
"""
from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .settings import GradingSettings, environ as _environ

_LOCK = threading.Lock()  # one task at a time changes this process's environment
_SANDBOX: dict = {}        # per worker process: does bubblewrap work, does the GPU work inside it
_SCRATCH: dict = {}        # per worker process: the kernels' scratch folder (see _scratch_base)


@dataclass
class TaskSpec:
    assignment: str
    student: str
    notebook: str            # the repaired submission, as notebook JSON
    nb_name: str
    release_db: bytes | None  # the course gradebook with the release (SQLite mode)
    shared_url: str | None    # a shared gradebook the worker writes to (PostgreSQL mode)
    settings: dict
    models: list = field(default_factory=list)


@dataclass
class TaskResult:
    student: str
    graded: bool
    notes: list
    cause: str
    worker: str
    gradebook: bytes | None = None
    autograded: bytes | None = None
    feedback: bytes | None = None
    timings: dict = field(default_factory=dict)


def worker_sandbox(memory_mb: int, mode: str) -> tuple[bool, bool]:
    """(bubblewrap, GPU inside it) on this worker, probed once per process."""
    key = (memory_mb, mode)
    if key not in _SANDBOX:
        from . import sandbox

        bwrap = mode != "off" and sandbox.bwrap_works()
        if mode == "on" and not bwrap:
            raise RuntimeError(f"the sandbox is required but bubblewrap does not work on {socket.gethostname()}")
        if bwrap:
            sandbox.probe(memory_mb, use_bwrap=True)  # raises when Python cannot run in it
        _SANDBOX[key] = (bwrap, bwrap and sandbox.gpu_works_in_sandbox(memory_mb))
    return _SANDBOX[key]


def _scratch_base() -> Path:
    """This worker process's folder for kernel scratch, kept across tasks: the kernel launched
    ahead for the next submission (``JudgedExecute.prestart``) lives there."""
    if "base" not in _SCRATCH:
        import atexit

        _SCRATCH["base"] = Path(tempfile.mkdtemp(prefix="course-kernels-"))
        atexit.register(shutil.rmtree, _SCRATCH["base"], True)
    return _SCRATCH["base"]


def prepare_models(models: list, env: dict) -> str:
    """Build the assignment's offline models into this worker's cache (a no-op when they are
    there).  Returns the cache folder."""
    from .grade import warm_models
    from coursekit.models import course_cache_dir

    with _LOCK:
        warning = warm_models(models, env)
    if warning:
        raise RuntimeError(f"{socket.gethostname()}: {warning}")
    return str(course_cache_dir())


def grade_submission(spec: TaskSpec) -> TaskResult:
    """Grade one submission on this worker (see the module docstring)."""
    from .workers import judged_args, nbgrader_args, prepare_worker, scores, status, worker_env
    from .worker import main as run_nbgrader

    settings = GradingSettings(**spec.settings)
    host = socket.gethostname()
    with _LOCK, tempfile.TemporaryDirectory(prefix=f"grade-{spec.student}-") as tmp:
        gdir = Path(tmp) / "w"
        url = spec.shared_url
        if url is None:
            (Path(tmp) / "main.db").write_bytes(spec.release_db or b"")
            main_url = f"sqlite:///{Path(tmp) / 'main.db'}"
        else:
            main_url = url
        bwrap, gpu = worker_sandbox(settings.memory_mb, settings.sandbox)
        prepare_worker(gdir, main_url, bwrap, settings, 1, gpu)
        target = gdir / "submitted" / spec.student / spec.assignment
        target.mkdir(parents=True)
        (target / spec.nb_name).write_text(spec.notebook)
        extra = [*judged_args(settings, bwrap, gpu), f"--JudgedExecute.scratch_dir={_scratch_base()}",
                 f"--JudgedExecute.status_dir={gdir / 'status'}"]
        args = nbgrader_args(gdir, url)
        from coursekit.models import course_cache_dir

        env = {k: v for k, v in worker_env(gdir, 1, settings).items()
               if k in ("JUPYTER_PATH", "TMPDIR", "OMP_NUM_THREADS", "PYTHONHASHSEED", "COURSE_CACHE_DIR", "PATH")
               or k in settings.env}
        env["COURSE_CACHE_DIR"] = str(course_cache_dir())
        from . import ROOT

        previous = os.getcwd()
        with _environ(env):
            tempfile.tempdir = None  # TMPDIR changed
            os.chdir(ROOT)  # nbgrader reads the course's nbgrader_config.py from here
            try:
                run_nbgrader([spec.assignment, "--force", *args, *extra, "--then", spec.assignment, "--force", *args])
            finally:
                os.chdir(previous)
                tempfile.tempdir = None
        st = status(gdir, spec.student)
        nb_path = gdir / "autograded" / spec.student / spec.assignment / spec.nb_name
        got = scores(url or gdir / "gradebook.db", spec.assignment, [spec.student])
        graded = spec.student in got and nb_path.exists()
        html = gdir / "feedback" / spec.student / spec.assignment / spec.nb_name.replace(".ipynb", ".html")
        return TaskResult(
            spec.student, graded, st.get("notes", []),
            "" if graded else ("grading failed: " + str(st.get("error") or "autograde failed on " + host))[:300],
            host, gradebook=(gdir / "gradebook.db").read_bytes() if graded and url is None else None,
            autograded=nb_path.read_bytes() if nb_path.exists() else None,
            feedback=html.read_bytes() if html.exists() else None, timings=st.get("timings", {}))


def connect(address: str):
    """A Dask client for a scheduler address or a scheduler file; a one-line GradingError
    when Dask is not installed or the scheduler cannot be reached."""
    from .grade import GradingError

    try:
        from distributed import Client
    except ImportError:
        raise GradingError("--cluster needs Dask: pip install distributed (see requirements.txt)") from None
    try:
        if Path(address).is_file():
            return Client(scheduler_file=address, timeout="30s")
        return Client(address, timeout="30s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise GradingError(f"cannot reach the Dask scheduler {address}: {type(exc).__name__}: {exc}"[:300]) from None


def execute_on_cluster(assignment: str, notebooks: dict, nb_name: str, grading: Path, feedback_dir: Path,
                       settings: GradingSettings, main_url: str):
    """The execute-and-judge stage on Dask: one task per submission, merged as they arrive."""
    from distributed import as_completed

    from .course import load
    from .grade import GradingError
    from .gradebook import sqlite_path
    from .workers import Outcome, merge_gradebook

    client = connect(settings.cluster)
    try:
        spec = load().assignment(assignment)
        try:
            client.wait_for_workers(1, timeout=120)
        except TimeoutError:
            raise GradingError(f"the Dask scheduler {settings.cluster} has no workers (waited 120 s)") from None
        # every worker has the models before any student code runs (built or found in its cache)
        try:
            client.run(prepare_models, list(spec.models), dict(settings.env))
        except Exception as exc:  # noqa: BLE001 - one line that names the worker; nobody graded yet
            raise GradingError(f"a Dask worker could not prepare the models {list(spec.models)}: {exc}"[:300]) from None
        main_db = sqlite_path(main_url)
        release_db = main_db.read_bytes() if main_db is not None else None
        plain = {k: v for k, v in settings.__dict__.items() if k != "cluster"}
        futures = {client.submit(grade_submission, TaskSpec(assignment, sid, nbformat.writes(nb), nb_name, release_db,
                                                            None if main_db is not None else main_url, plain,
                                                            list(spec.models)),
                                 key=f"grade-{assignment}-{sid}-{os.getpid()}-{id(notebooks)}", pure=False,
                                 retries=1): sid
                   for sid, nb in sorted(notebooks.items())}
        outcomes = {}
        for future in as_completed(futures):
            sid = futures[future]
            try:
                result: TaskResult = future.result()
            except Exception as exc:  # noqa: BLE001 - a task that failed twice: this student's row says why
                outcomes[sid] = Outcome(False, [], f"grading failed on the cluster: {type(exc).__name__}: {exc}"[:300])
                continue
            if result.graded:
                _store(result, assignment, nb_name, grading, feedback_dir, main_db, merge_gradebook)
            outcomes[sid] = Outcome(result.graded, list(result.notes), result.cause,
                                    timings=result.timings)
        return outcomes
    finally:
        client.close()


def _store(result: TaskResult, assignment: str, nb_name: str, grading: Path, feedback_dir: Path,
           main_db: Path | None, merge) -> None:
    """Put one task's result into the course's gradebook and folders."""
    sid = result.student
    if main_db is not None and result.gradebook:
        with tempfile.NamedTemporaryFile(suffix=".db", delete=False) as fh:
            fh.write(result.gradebook)
        try:
            merge(main_db, Path(fh.name), assignment, [sid])
        finally:
            os.unlink(fh.name)
    for step, data in (("autograded", result.autograded), ("feedback", result.feedback)):
        if data is None:
            continue
        folder = grading / step / sid / assignment
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        name = nb_name if step == "autograded" else nb_name.replace(".ipynb", ".html")
        (folder / name).write_bytes(data)
    if result.feedback is not None:
        (feedback_dir / f"{sid}.html").write_bytes(result.feedback)


if __name__ == "__main__":  # pragma: no cover
    print(__doc__, file=sys.stderr)
