"""Grading on a Dask cluster: ``grade ... --cluster ADDRESS`` (a scheduler address such as
``tcp://head:8786``, or the path of a scheduler file).

Each Dask task is a small batch of submissions (one submission for a small class; see
``batch_size``: one nbgrader start-up per batch instead of per submission).  On the worker that
runs it, ``grade_batch`` grades them exactly as a local worker does (the same bubblewrap sandbox
and limits, JudgedExecute, nbgrader's autograde and feedback, in the worker's own Python process)
in a private folder, and sends back the result: the batch's gradebook rows (its own SQLite
gradebook, or nothing when the workers write to a shared PostgreSQL gradebook), each autograded
notebook and feedback page.  The instructor's process merges them into the course's folders as
they arrive.  Dask retries a task whose worker died on another worker (the scheduler's
``distributed.scheduler.allowed-failures`` bounds how many workers one task may take down), and
a task that raised once more (``retries=1``); merging replaces a student's earlier rows, so a
submission graded twice is in the gradebook once.  A batch that fails for good is split: each
of its submissions is graded again as a task of its own, so one submission that brings its
worker down is reported as not graded, with the reason, and costs the others nothing.

Before the first task, every worker builds (or finds in its own cache) the offline models the
assignment loads.  Start workers with one thread each (the grader changes its process's
environment while a task runs) and the course's Dask settings (``dask-grading.yaml``: Dask's
profiler and monitors, made for many small tasks, cost a grading worker about a fifth of its CPU;
``check_workers`` says so when a worker runs without them):

    export DASK_CONFIG=autograder/backends/dask-grading.yaml
    dask scheduler --scheduler-file sched.json
    dask worker --scheduler-file sched.json --nthreads 1 --nworkers 2

On SLURM, ``dask_jobqueue.SLURMCluster(cores=2, processes=2, memory="16GB", job_script_prologue=[
"export DASK_CONFIG=<course checkout>/autograder/backends/dask-grading.yaml"])``
with ``cluster.scale(jobs=10)`` and ``--cluster`` set to ``cluster.scheduler_address``; on
Kubernetes, the ``dask-kubernetes`` operator's ``DaskCluster`` (see docs/GRADING.md).
"""
from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from coursekit.models import course_cache_dir

from autograder.course.errors import GradingError
from autograder.course.offline_models import warm_models
from autograder.course.settings import GradingSettings, environ as _environ
from autograder.isolation import sandbox
from autograder.isolation.sandbox import SandboxInfo, UNSANDBOXED
from autograder.isolation.scratch import process_folder
from autograder.judge.worker import Job, Outcome

# Imports inside functions: dask and distributed are imported inside the functions that talk to a cluster:
# the module (whose task functions a Dask worker unpickles) loads without them.

_LOCK = threading.Lock()  # one task at a time changes this process's environment
_PREPARED: set[tuple] = set()  # the model lists this worker process has built or found
_SANDBOX: dict = {}        # per worker process: does bubblewrap work, does the GPU work inside it
DASK_CONFIG_FILE = Path(__file__).with_name("dask-grading.yaml")


@dataclass
class TaskSpec:
    assignment: str
    students: list[str]
    notebooks: list[str]     # the repaired submissions, as notebook JSON, in the order of students
    nb_name: str
    release_db: bytes         # a SQLite gradebook holding the release
    settings: str             # the run's GradingSettings, serialised (to_json)
    late: list = field(default_factory=list)  # students whose file came late


@dataclass
class TaskResult:
    student: str
    graded: bool
    notes: list
    cause: str
    worker: str
    autograded: bytes | None = None
    feedback: bytes | None = None
    timings: dict = field(default_factory=dict)


@dataclass
class BatchResult:
    results: list[TaskResult]
    gradebook: bytes | None = None  # the batch's SQLite gradebook, with the graded students' rows


def grading_dask_config() -> dict:
    """The course's Dask settings for grading (``dask-grading.yaml``) as dotted keys, the form
    ``dask.config.set`` takes (a nested dict there would replace all of ``distributed``)."""
    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
        return out

    return flat(yaml.safe_load(DASK_CONFIG_FILE.read_text()))


def batch_size(n_submissions: int, n_workers: int) -> int:
    """Submissions per task: about four tasks per worker, so that the work still spreads
    evenly, at most eight per task, so that a lost worker costs little to redo."""
    return max(1, min(8, n_submissions // max(1, 4 * n_workers)))


def worker_sandbox(memory_mb: int, mode: str) -> tuple[bool, bool]:
    """(bubblewrap, GPU inside it) on this worker, probed once per process."""
    key = (memory_mb, mode)
    if key not in _SANDBOX:
        bwrap = mode != "off" and sandbox.bwrap_works()
        if mode == "on" and not bwrap:
            raise RuntimeError(f"the sandbox is required but bubblewrap does not work on {socket.gethostname()}")
        if bwrap:
            sandbox.probe(memory_mb, use_bwrap=True)  # raises when Python cannot run in it
        _SANDBOX[key] = (bwrap, bwrap and sandbox.gpu_works_in_sandbox(memory_mb))
    return _SANDBOX[key]


def _scratch_base() -> Path:
    """This worker process's folder for kernel scratch, kept across tasks: the kernel launched
    ahead for the next submission (``JudgedExecute.prestart``) lives there.  It is removed when
    the process exits, and by a later run when the process was killed (``autograder.isolation.scratch``)."""
    base = process_folder() / "kernels"
    base.mkdir(exist_ok=True)
    return base


def prepare_models(models: list, env: dict) -> str:
    """Build the assignment's offline models into this worker's cache (a no-op when they are
    there).  Returns the cache folder."""
    with _LOCK:
        warning = warm_models(models, env)
    if warning:
        raise RuntimeError(f"{socket.gethostname()}: {warning}")
    _PREPARED.add(tuple(models))
    return str(course_cache_dir())


def prepare_worker_process(models: list, env: dict, memory_mb: int, mode: str) -> dict:
    """Everything this worker needs before its first task: the models in its cache and its
    sandbox probed (``worker_sandbox``).  Returns what the sandbox is here, and whether
    Dask's profiler samples this worker (``dask-grading.yaml`` turns it off)."""
    import dask

    prepare_models(models, env)
    bwrap, gpu = worker_sandbox(memory_mb, mode)
    return {"host": socket.gethostname(), "bwrap": bwrap, "gpu": gpu,
            "profiler": bool(dask.config.get("distributed.worker.profile.enabled", False))}


def check_workers(settings: GradingSettings, models: list):
    """The sandbox check of a cluster run, done where student code will run: every worker
    prepares the models and probes its own sandbox (the instructor's machine, a login node
    maybe, needs neither bubblewrap nor the models).  Returns (SandboxInfo, warnings); a
    worker that cannot get ready stops the run with one line naming it, before any grading."""
    client = connect(settings.cluster, wait=True)
    try:
        try:
            seen = client.run(prepare_worker_process, list(models), dict(settings.env), settings.memory_mb,
                              settings.sandbox)
        except Exception as exc:  # noqa: BLE001 - one line that names the worker; nobody graded yet
            raise GradingError(f"a Dask worker could not get ready to grade (models {list(models)}, "
                               f"sandbox): {exc}"[:300]) from None
    finally:
        client.close()
    bare = sorted({w["host"] for w in seen.values() if not w["bwrap"]})
    warnings = []
    if bare:
        warnings.append(f"WARNING: student code runs WITHOUT a sandbox on the Dask workers of {', '.join(bare)} "
                        "(bubblewrap " + ("disabled" if settings.sandbox == "off" else "not available there") +
                        "): " + UNSANDBOXED)
    profiled = sorted({w["host"] for w in seen.values() if w.get("profiler")})
    if profiled:
        warnings.append(f"NOTE: Dask's profiler and monitors run at their defaults on the workers of "
                        f"{', '.join(profiled)}: they take about a fifth of the CPU grading needs. "
                        "Start the workers with DASK_CONFIG=autograder/backends/dask-grading.yaml (docs/GRADING.md).")
    gpu = all(w["gpu"] for w in seen.values())
    return SandboxInfo(bwrap=not bare, gpu=gpu), warnings


def grade_batch(spec: TaskSpec) -> BatchResult:
    """Grade a batch of submissions on this worker (see the module docstring): a ``Job``, run in
    this process, whose records and files travel back as data."""
    settings = GradingSettings.from_json(spec.settings)
    if tuple(settings.models) not in _PREPARED:  # a worker that joined (or restarted) after the run began
        prepare_models(list(settings.models), dict(settings.env))
    bwrap, gpu = worker_sandbox(settings.memory_mb, settings.sandbox)
    settings = replace(settings, bwrap=bwrap, gpu=gpu)  # as this worker's sandbox is
    host = socket.gethostname()
    tag = spec.students[0] if len(spec.students) == 1 else f"{spec.students[0]}-and-{len(spec.students) - 1}"
    with _LOCK, tempfile.TemporaryDirectory(prefix=f"grade-{tag}-") as tmp:
        (Path(tmp) / "release.db").write_bytes(spec.release_db)
        job = Job.prepare(Path(tmp) / "w", spec.assignment, spec.nb_name, dict(zip(spec.students, spec.notebooks)),
                          Path(tmp) / "release.db", settings, threads=1, scratch=_scratch_base(), late=spec.late)
        with _environ(job.env()):
            tempfile.tempdir = None  # TMPDIR changed
            try:
                job.run_here()
            finally:
                tempfile.tempdir = None
        results = []
        for student in spec.students:
            out = job.outcome(student)
            results.append(TaskResult(
                student, out.graded, list(out.notes), out.cause if out.graded or out.cause.startswith(("grading", "not"))
                else f"{out.cause} (on {host})", host,
                autograded=out.autograded.read_bytes() if out.autograded else None,
                feedback=out.feedback.read_bytes() if out.feedback else None, timings=out.timings))
        any_graded = any(r.graded for r in results)
        return BatchResult(results, (job.folder / "gradebook.db").read_bytes() if any_graded else None)


def connect(address: str, wait: bool = False):
    """A Dask client for a scheduler address or a scheduler file; a one-line GradingError
    when Dask is not installed, the scheduler cannot be reached or (``wait``) it has had no
    worker for 120 s."""
    try:
        from distributed import Client
    except ImportError:
        raise GradingError("--cluster needs Dask: pip install distributed (see requirements.txt)") from None
    import dask

    try:
        with dask.config.set(grading_dask_config()):  # this process's Dask client: the same quiet settings
            client = Client(scheduler_file=address, timeout="30s") if Path(address).is_file() else \
                Client(address, timeout="30s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise GradingError(f"cannot reach the Dask scheduler {address}: {type(exc).__name__}: {exc}"[:300]) from None
    if wait:
        try:
            client.wait_for_workers(1, timeout=120)
        except TimeoutError:
            client.close()
            raise GradingError(f"the Dask scheduler {address} has no workers (waited 120 s)") from None
    return client


class DaskBackend:
    """Grading on the workers of a Dask scheduler (``settings.cluster``)."""

    expected: int | None = None  # (the cluster's workers run already)

    def check(self, settings: GradingSettings):
        return check_workers(settings, list(settings.models))

    def judge(self, batch) -> dict:
        """One task per small batch of submissions; a batch that fails for good is graded again
        one submission per task.  What each task sends back is written into the run's folder."""
        from distributed import as_completed

        client = connect(batch.settings.cluster, wait=True)
        try:
            # the workers prepared their models and sandbox in check_workers; one that joined since
            # does so before its first task (grade_batch)
            release_db = Path(batch.gradebook).read_bytes()
            settings = replace(batch.settings, cluster=None).to_json()
            sids = sorted(batch.notebooks)
            size = batch_size(len(sids), len(client.scheduler_info().get("workers", {})))
            futures = {}

            def submit(students: list[str]):
                task = TaskSpec(batch.assignment, students, [batch.notebooks[sid].text() for sid in students],
                                batch.nb_name, release_db, settings, sorted(batch.late & set(students)))
                key = f"grade-{batch.assignment}-{students[0]}-n{len(students)}-{os.getpid()}-{id(batch)}"
                future = client.submit(grade_batch, task, key=key, pure=False, retries=1)
                futures[future] = students
                return future

            running = as_completed([submit(sids[start:start + size]) for start in range(0, len(sids), size)])
            outcomes = {}
            for n, future in enumerate(running):
                students = futures[future]
                try:
                    result: BatchResult = future.result()
                except Exception as exc:  # noqa: BLE001 - a task that failed for good (raised twice, or took
                    # down as many workers as the scheduler's allowed-failures lets it)
                    if len(students) > 1:
                        # one submission may have brought the whole batch down: each is graded again
                        # alone, so that it costs only itself
                        for sid in students:
                            running.add(submit([sid]))
                        continue
                    outcomes[students[0]] = Outcome(students[0], False, cause=(
                        f"grading failed on the cluster: {type(exc).__name__}: {exc}")[:300])
                    continue
                outcomes.update(_store(result, batch, f"task{n}"))
            return outcomes
        finally:
            client.close()


def _store(result: BatchResult, batch, name: str) -> dict:
    """One task's records, with its gradebook and files written into the run's folder."""
    folder = Path(batch.folder) / "tasks" / name
    folder.mkdir(parents=True, exist_ok=True)
    gradebook = None
    if result.gradebook:
        gradebook = folder / "gradebook.db"
        gradebook.write_bytes(result.gradebook)
    outcomes = {}
    for r in result.results:
        out = Outcome(r.student, r.graded, tuple(r.notes), r.cause, dict(r.timings))
        if r.graded and gradebook is not None and r.autograded is not None and r.feedback is not None:
            autograded = folder / r.student / batch.nb_name
            feedback = folder / r.student / batch.nb_name.replace(".ipynb", ".html")
            autograded.parent.mkdir(parents=True, exist_ok=True)
            autograded.write_bytes(r.autograded)
            feedback.write_bytes(r.feedback)
            out = replace(out, gradebook=gradebook, autograded=autograded, feedback=feedback)
        elif r.graded:  # graded there, but what proves it did not come back
            out = replace(out, graded=False, cause=f"grading failed on the cluster: {r.worker} sent back no gradebook")
        outcomes[r.student] = out
    return outcomes


if __name__ == "__main__":  # pragma: no cover
    print(__doc__, file=sys.stderr)
