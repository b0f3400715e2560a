"""The execute-and-judge stage: submissions shared out to worker processes.

Each worker owns a folder with a copy of the course gradebook and runs nbgrader's
autograde (with ``JudgedExecute``) and then feedback for its students in one process
(``python -m autograder.judge.worker``).  Submissions a worker could not grade are retried
alone, to name their cause; the workers' gradebooks are then merged into the course
gradebook.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder.isolation import sandbox
from autograder.authoring.release import tool_env
from autograder.isolation.scratch import ENV, remove_tree, run_folder
from autograder.course.settings import GradingSettings, environ, usable_cpus


@dataclass
class Worker:
    gdir: Path
    students: list[str]
    log: str = ""
    timed_out: bool = False
    url: str | None = None  # a shared gradebook (PostgreSQL); None: the worker's own SQLite copy


@dataclass
class Outcome:
    """What the stage learned about one submission."""

    graded: bool
    notes: list[str] = field(default_factory=list)
    cause: str = ""
    timings: dict = field(default_factory=dict)  # seconds: kernel_start, cells, tests, total


def nbgrader_args(gdir: Path, url: str | None = None) -> list[str]:
    """Folders of one worker; its gradebook is ``url`` (a shared database) or its own SQLite copy."""
    url = url or f"sqlite:///{gdir / 'gradebook.db'}"
    return [f"--CourseDirectory.db_url={url}",
            f"--CourseDirectory.submitted_directory={gdir / 'submitted'}",
            f"--CourseDirectory.autograded_directory={gdir / 'autograded'}",
            f"--CourseDirectory.feedback_directory={gdir / 'feedback'}"]


def worker_env(gdir: Path, threads: int, settings: GradingSettings) -> dict:
    env = tool_env()
    env["JUPYTER_PATH"] = str(gdir / "jupyter") + os.pathsep + env.get("JUPYTER_PATH", "")
    env["TMPDIR"] = str(gdir / "tmp")
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONHASHSEED"] = "0"
    env.update(settings.env)  # the assignment's grading environment, for the kernels and the judge
    # Kernels read the instructor's model cache (read-only in the sandbox), filled beforehand;
    # the sandbox's HOME is an empty folder, so say where it is.
    from coursekit.models import course_cache_dir

    env["COURSE_CACHE_DIR"] = str(course_cache_dir())
    from autograder.isolation.scratch import process_folder

    env[ENV] = str(process_folder())  # the run's folder for sockets: removed when the run ends
    return env


def prepare_worker(gdir: Path, main_url: str, use_bwrap: bool, settings: GradingSettings, threads: int,
                   gpu: bool) -> None:
    """A worker's folder: its kernelspec and, with a SQLite gradebook, its own copy of it."""
    from autograder.records.gradebook import sqlite_path

    remove_tree(gdir)
    (gdir / "tmp").mkdir(parents=True)
    main_db = sqlite_path(main_url)
    if main_db is not None:
        shutil.copy(main_db, gdir / "gradebook.db")
    sandbox.install_kernelspec(gdir / "jupyter", memory_mb=settings.memory_mb, use_bwrap=use_bwrap,
                               threads=threads, gpu=gpu, tmp_mb=settings.tmp_mb, work_mb=settings.work_mb,
                               file_mb=settings.file_mb)


def run_worker(w: Worker, assignment: str, root: Path, extra: list[str], env: dict, timeout: float) -> Worker:
    """One process autogrades all of this worker's students, then writes their feedback."""
    extra = [*extra, f"--JudgedExecute.scratch_dir={w.gdir / 'tmp'}",
             f"--JudgedExecute.status_dir={w.gdir / 'status'}"]
    cmd = [sys.executable, "-m", "autograder.judge.worker",  # autograde, --then generate_feedback
           assignment, "--force", *nbgrader_args(w.gdir, w.url), *extra, "--then",
           assignment, "--force", *nbgrader_args(w.gdir, w.url)]
    # each submission's own limit is enforced inside (JudgedExecute); this bounds the process:
    # start-up, nbgrader's own work and feedback, and a kernel's grace period after its limit
    timeout += 60 + 30 * len(w.students)
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
        w.log += proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        w.timed_out = True
        w.log += str(exc.stdout or "") + str(exc.stderr or "")
    return w


def status(gdir: Path, sid: str) -> dict:
    """The note JudgedExecute left for a student (written by the grader, never the kernel)."""
    path = gdir / "status" / f"{sid}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def completed(gdir: Path, sid: str, assignment: str, nb_name: str) -> bool:
    """True when the grader recorded that this submission was judged to the end, scored and
    written (``autograder.judge.worker.record_outcomes``); rows nbgrader makes up front do not count."""
    return bool(status(gdir, sid).get("complete")) and (gdir / "autograded" / sid / assignment / nb_name).exists()


def cause(w: Worker, sid: str, limit: float) -> str:
    """Why a submission could not be graded, from what its worker recorded: the grader's own
    note (the judge's error, or nbgrader's reason for refusing the notebook) before anything
    read from the log."""
    st = status(w.gdir, sid)
    if st.get("error"):
        return "grading failed: " + str(st["error"])[:300]
    if st.get("refused"):
        return "not graded: " + str(st["refused"])[:300]
    if w.timed_out:
        return f"the notebook ran longer than {limit:g} s and was stopped"
    lines = [ln.strip() for ln in w.log.splitlines() if ln.strip()]
    for ln in reversed(lines):  # the exception line of the last traceback
        if ln.split(":")[0].endswith(("Error", "Exception")) and " " not in ln.split(":")[0]:
            return "autograde failed: " + ln[:200]
    return "autograde failed: " + (lines[-1][:200] if lines else "unknown error")


# ----------------------------------------------------------------------------- gradebook merge

_MERGE = [
    ("student", "id IN ({sids})"),
    ("submitted_assignment", "student_id IN ({sids}) AND assignment_id = :aid"),
    ("submitted_notebook", "assignment_id IN (SELECT id FROM w.submitted_assignment "
                           "WHERE student_id IN ({sids}) AND assignment_id = :aid)"),
    ("grade", "notebook_id IN (SELECT sn.id FROM w.submitted_notebook sn JOIN w.submitted_assignment sa "
              "ON sn.assignment_id = sa.id WHERE sa.student_id IN ({sids}) AND sa.assignment_id = :aid)"),
    ("comment", "notebook_id IN (SELECT sn.id FROM w.submitted_notebook sn JOIN w.submitted_assignment sa "
                "ON sn.assignment_id = sa.id WHERE sa.student_id IN ({sids}) AND sa.assignment_id = :aid)"),
]


def merge_gradebook(main_db: Path, worker_db: Path, assignment: str, students: list[str]) -> None:
    """Copy ``students``' submissions of ``assignment`` from a worker's gradebook (a
    copy of the main one, so assignment and cell ids agree) into the main one,
    replacing earlier submissions of the same students."""
    if not students:
        return
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{main_db}") as gb:
        for sid in students:
            try:
                gb.remove_submission(assignment, sid)
            except MissingEntry:
                pass
    con = sqlite3.connect(main_db, timeout=60)
    try:
        con.execute("ATTACH DATABASE ? AS w", (str(worker_db),))
        aid = con.execute("SELECT id FROM assignment WHERE name = ?", (assignment,)).fetchone()[0]
        params = {f"s{i}": sid for i, sid in enumerate(students)}
        params["aid"] = aid
        names = ",".join(f":s{i}" for i in range(len(students)))
        with con:
            for table, where in _MERGE:
                verb = "INSERT OR IGNORE" if table == "student" else "INSERT"
                con.execute(f"{verb} INTO main.{table} SELECT * FROM w.{table} WHERE "
                            + where.format(sids=names), params)
        con.execute("DETACH DATABASE w")
    finally:
        con.close()


def scores(url: str | Path, assignment: str, students: list[str]) -> dict:
    """student -> (score, max_score, {grade_id: (score, max_score)}) from the gradebook at
    ``url`` (a database URL, or the path of a SQLite file)."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    url = url if isinstance(url, str) and "://" in url else f"sqlite:///{url}"
    with Gradebook(url) as gb:
        for sid in students:
            try:
                sub = gb.find_submission(assignment, sid)
            except MissingEntry:
                continue
            tests = {}
            for nb in sub.notebooks:
                for g in nb.grades:
                    tests[g.name] = (float(g.score), float(g.max_score))
            out[sid] = (float(sub.score), float(sub.max_score), tests)
    return out


def collect(gdir: Path, grading: Path, assignment: str, students: list[str], feedback_dir: Path,
            nb_name: str) -> None:
    """Move a worker's autograded notebooks and feedback into the course's folders."""
    for sid in students:
        for step in ("submitted", "autograded", "feedback"):
            src = gdir / step / sid / assignment
            if src.exists():
                dst = grading / step / sid / assignment
                shutil.rmtree(dst, ignore_errors=True)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(src), str(dst))
        html = grading / "feedback" / sid / assignment / nb_name.replace(".ipynb", ".html")
        if html.exists():
            shutil.copy(html, feedback_dir / f"{sid}.html")


def judged_args(settings: GradingSettings, use_bwrap: bool, gpu: bool) -> list[str]:
    """nbgrader options of JudgedExecute for this run."""
    return ["--JudgedExecute.kernel_name=" + sandbox.KERNEL_NAME, f"--JudgedExecute.ipc={use_bwrap}",
            f"--JudgedExecute.device={'cuda' if gpu else 'cpu'}",
            f"--JudgedExecute.timeout={settings.cell_timeout}",
            f"--JudgedExecute.notebook_timeout={settings.notebook_timeout}",
            f"--JudgedExecute.max_restarts={settings.max_restarts}"]


def execute_and_judge(assignment: str, notebooks: dict[str, nbformat.NotebookNode], nb_name: str,
                      grading: Path, feedback_dir: Path, root: Path, settings: GradingSettings,
                      use_bwrap: bool, gpu: bool, main_url: str | None = None) -> dict[str, Outcome]:
    """Grade ``notebooks`` (student id -> repaired notebook) into the course gradebook: on
    ``settings.cluster`` (Dask) when given, else in local worker processes."""
    from autograder.records.gradebook import db_url, sqlite_path

    main_url = main_url or db_url(grading)
    if settings.cluster:
        from .cluster import execute_on_cluster

        return execute_on_cluster(assignment, notebooks, nb_name, grading, feedback_dir, settings, main_url)
    main_db = sqlite_path(main_url)   # None: a shared database the workers write to directly
    shared = None if main_db is not None else main_url
    workers = settings.n_workers
    threads = max(1, usable_cpus() // workers)
    extra = judged_args(settings, use_bwrap, gpu)
    limit = float(settings.notebook_timeout)

    def make(name: str, share: list[str]) -> Worker:
        gdir = grading / "workers" / name
        prepare_worker(gdir, main_url, use_bwrap, settings, threads, gpu)
        for sid in share:
            target = gdir / "submitted" / sid / assignment
            target.mkdir(parents=True)
            nbformat.write(notebooks[sid], target / nb_name)
        return Worker(gdir, share, url=shared)

    def run_all(ws: list[Worker], budget) -> list[Worker]:
        with ThreadPoolExecutor(max_workers=max(1, len(ws))) as ex:
            futs = [ex.submit(run_worker, w, assignment, root, extra, worker_env(w.gdir, threads, settings),
                              budget(w)) for w in ws]
            return [f.result() for f in futs]

    def harvest(w: Worker) -> list[str]:
        got = scores(shared or w.gdir / "gradebook.db", assignment, w.students)
        ok = [s for s in w.students if s in got and completed(w.gdir, s, assignment, nb_name)]
        if main_db is not None:
            merge_gradebook(main_db, w.gdir / "gradebook.db", assignment, ok)
        collect(w.gdir, grading, assignment, ok, feedback_dir, nb_name)
        return ok

    def finished(w: Worker, sid: str) -> Outcome:
        st = status(w.gdir, sid)
        return Outcome(True, st.get("notes", []), timings=st.get("timings", {}))

    outcomes: dict[str, Outcome] = {}
    sids = sorted(notebooks)
    shares = [sids[i::workers] for i in range(workers) if sids[i::workers]]
    with run_folder() as folder, environ({ENV: str(folder)}):
        retry = []
        for w in run_all([make(f"w{k}", share) for k, share in enumerate(shares)],
                         lambda w: limit * len(w.students)):
            ok = harvest(w)
            for s in w.students:
                if s in ok:
                    outcomes[s] = finished(w, s)
                else:
                    retry.append(s)
        # anything a batch did not finish is graded again alone, with its own time: a
        # submission that brought its batch down costs only itself, and its cause is told
        singles = [make(f"retry{k}", [sid]) for k, sid in enumerate(retry)]
        for w in run_all(singles, lambda w: limit) if singles else []:
            sid = w.students[0]
            if harvest(w):
                outcomes[sid] = finished(w, sid)
            else:
                outcomes[sid] = Outcome(False, status(w.gdir, sid).get("notes", []), cause(w, sid, limit))
    if not os.environ.get("COURSE_KEEP_WORKERS"):  # keep them to debug a grading run
        remove_tree(grading / "workers")
    return outcomes
