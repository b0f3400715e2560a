"""The floor of grading and where one submission's time goes (used by ``autograde.py`` and
``grading_scale.py``).

``floor``: every submission's own code cells run in one warm IPython shell, and every test
cell (visible and hidden part, as released) runs in this process against it
(``LocalStudent``): no kernel, no sandbox, no nbgrader, no feedback.  What grading cannot go
below on one core.

``breakdown``: one ``grade`` of a few submissions, each pipeline stage timed, with the judge
run in this process (as a Dask worker runs it: ``Job.run_here``) under cProfile, after a
warm-up job, so that the profile shows a warm worker's cost per submission: kernel start,
the student's cells, the judge's requests, the tests' own work in the grader, nbgrader's own
steps (reading, restoring locked cells, scoring, writing, the database), the feedback page.
"""
from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def _released_tests(assignment: str) -> dict:
    """grade id -> the released test cell's source (visible and hidden part)."""
    from autograder.judge.runner import _gid, is_test_cell

    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    return {_gid(c): c.source for c in nb.cells if is_test_cell(c)}


def floor(paths: list[Path], assignment: str = "attention", warm: int = 1) -> tuple[float, list]:
    """(seconds per submission, [tests passed per submission]) for ``paths`` run at the floor:
    one warm process on one thread, each submission's code cells executed in a fresh module
    namespace of this process (an error ends its cell, as in a kernel), every test cell as
    released (visible and hidden part) judged beside it with ``student`` a ``LocalStudent``."""
    import io
    import sys
    import types
    import warnings

    import torch

    from autograder.course.model import load
    from autograder.course.settings import GradingSettings
    from autograder.judge.runner import _gid, _judge_cell, cached_judge_namespace, context_sources, is_test_cell
    from coursekit.remote.local import LocalStudent

    torch.set_num_threads(1)  # as a grading kernel (OMP_NUM_THREADS=1 with one worker per core)
    tests = _released_tests(assignment)
    settings = GradingSettings.for_assignment(load(ROOT).assignment(assignment))
    released = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    context = context_sources(released, settings.judge_context)

    def one(path: Path) -> int:
        nb = nbformat.read(path, as_version=4)
        module = types.ModuleType("__floor__")  # dataclasses and pickle look classes up by module
        sys.modules["__floor__"] = module
        user = module.__dict__
        user["In"] = []
        ns = cached_judge_namespace(context, "cpu")
        ns["student"] = LocalStudent(user)
        passed = 0
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            if is_test_cell(cell):
                gid = _gid(cell)
                passed += _judge_cell(tests.get(gid, cell.source), gid, ns).passed
                continue
            user["In"].append(cell.source)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    exec(compile(cell.source, f"<cell {len(user['In'])}>", "exec"), user)
                except Exception:  # noqa: BLE001 - the cell failed; the notebook goes on
                    pass
        return passed

    for path in paths[:warm]:  # imports, torch's first calls
        one(path)
    t = time.perf_counter()
    passed = [one(p) for p in paths]
    return (time.perf_counter() - t) / max(1, len(paths)), passed


# ------------------------------------------------------------------------------------- breakdown

# (label, file suffix, function name): cumulative time of these functions in the worker's profile
_PROFILED = [
    ("kernel start", "autograder/judge/kernel.py", ("start", "launch", "connect")),
    ("kernel stop", "autograder/judge/kernel.py", ("stop",)),
    ("student's cells (in the kernel)", "autograder/judge/kernel.py", ("execute",)),
    ("judge requests (round trips)", "autograder/judge/kernel.py", ("request",)),
    ("tests (all, in the grader)", "autograder/judge/runner.py", ("judge_cell",)),
    ("judged execute (all)", "autograder/judge/execute.py", ("preprocess",)),
    ("nbgrader autograde (all)", "nbgrader/apps/autogradeapp.py", ("start",)),
    ("nbgrader feedback (all)", "nbgrader/apps/generatefeedbackapp.py", ("start",)),
    ("nbgrader apps' initialize", "nbgrader/apps/baseapp.py", ("initialize",)),
]


def _cumulative(stats: pstats.Stats, suffix: str, names: tuple) -> float:
    """Cumulative seconds of the named functions of one file; a function that calls another
    of the same list (start -> launch) is counted once, by its outermost call."""
    total = 0.0
    keys = {k for k in stats.stats if k[0].replace(os.sep, "/").endswith(suffix) and k[2] in names}
    for key in keys:
        _cc, _nc, _tt, ct, callers = stats.stats[key]
        # time reached from another listed function of this file is already counted there
        inner = sum(v[3] for caller, v in callers.items() if caller in keys)
        total += ct - inner
    return total


class _StageClock:
    """Wraps the pipeline's stages (the functions of autograder.pipeline.stages that
    ``run_stages`` calls, in order) with timers."""

    NAMES = ("collect", "read", "screen", "prepare", "judge", "commit", "export")

    def __init__(self):
        self.seconds: dict = {}

    @contextlib.contextmanager
    def installed(self):
        from autograder.pipeline import stages

        original = {name: getattr(stages, name) for name in self.NAMES}

        def timed(name, stage):
            def wrapper(*args, **kwargs):
                t = time.perf_counter()
                try:
                    return stage(*args, **kwargs)
                finally:
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
            return wrapper

        for name, stage in original.items():
            setattr(stages, name, timed(name, stage))
        try:
            yield self
        finally:
            for name, stage in original.items():
                setattr(stages, name, stage)


def _in_process_judge(profile: cProfile.Profile, warm_up: list, record: dict):
    """A LocalBackend.judge that runs the batch's job in this process (as a Dask worker does),
    after a warm-up job on ``warm_up`` (student ids), the measured job under ``profile``."""
    from autograder.course.settings import environ
    from autograder.isolation.scratch import ENV, run_folder
    from autograder.judge.worker import Job

    def judge(self, batch):
        scratch = Path(tempfile.mkdtemp(prefix="kernels-", dir=batch.folder))
        outcomes = {}
        with run_folder() as folder, environ({ENV: str(folder)}):
            for name, sids, prof in (("warm", warm_up, None), ("measured", sorted(set(batch.notebooks) - set(warm_up)),
                                                                profile)):
                job = Job.prepare(batch.folder / name, batch.assignment, batch.nb_name,
                                  {s: batch.notebooks[s].text() for s in sids}, batch.gradebook,
                                  batch.settings, threads=1, scratch=scratch, late=batch.late & set(sids))
                with environ(job.env()):
                    tempfile.tempdir = None
                    t = time.perf_counter()
                    try:
                        if prof is not None:
                            prof.enable()
                        with contextlib.redirect_stderr(io.StringIO()):  # nbgrader's log lines
                            job.run_here()
                    finally:
                        if prof is not None:
                            prof.disable()
                        tempfile.tempdir = None
                    record[name] = (time.perf_counter() - t, len(sids))
                for s in sids:
                    outcomes[s] = job.outcome(s)
        getattr(self, "close", lambda: None)()  # grading processes started by check, not needed here
        return outcomes

    return judge


def breakdown(subs: Path, work: Path, n: int = 8, sandbox: str = "auto", grading_dir: Path | None = None) -> list:
    """Rows (stage, seconds per submission) for grading the first ``n`` files of ``subs`` (plus
    one warm-up file) once, judged in this process under cProfile."""
    import shutil

    from autograder.backends.local import LocalBackend
    from autograder.pipeline.run import grade

    files = sorted(subs.glob("*.ipynb"))[: n + 1]
    folder = work / "breakdown-subs"
    folder.mkdir(parents=True)
    for f in files:
        shutil.copy(f, folder / f.name)
    warm_up = [files[0].name.split("_")[0]]
    grading = grading_dir or work / "breakdown"
    (work / "breakdown-empty").mkdir()
    grade("attention", work / "breakdown-empty", out_dir=work / "breakdown-out0", grading_dir=grading, workers=1,
          use_sandbox=sandbox)  # the release into the gradebook, once for the class, not timed
    profile, record = cProfile.Profile(), {}
    original = LocalBackend.judge
    LocalBackend.judge = _in_process_judge(profile, warm_up, record)
    try:
        with _StageClock().installed() as clock:
            t = time.perf_counter()
            grade("attention", folder, out_dir=work / "breakdown-out", grading_dir=grading,
                  workers=1, use_sandbox=sandbox)
            wall = time.perf_counter() - t
    finally:
        LocalBackend.judge = original
    measured, count = record["measured"]
    warm_s, _ = record["warm"]
    total = len(files)
    stats = pstats.Stats(profile)
    cum = {label: _cumulative(stats, suffix, names) / count for label, suffix, names in _PROFILED}
    st = {k: v / total for k, v in clock.seconds.items()}
    tests_in_grader = cum["tests (all, in the grader)"] - cum["judge requests (round trips)"]
    judged = cum["judged execute (all)"]
    inside = (cum["kernel start"] + cum["kernel stop"] + cum["student's cells (in the kernel)"] +
              cum["tests (all, in the grader)"])
    rows = [
        ("intake (collect, read, screen)", st.get("collect", 0) + st.get("read", 0) + st.get("screen", 0)),
        ("prepare (sandbox check, release, models)", st.get("prepare", 0)),
        ("worker start + first submission (once per worker, spread)", warm_s / total),
        ("kernel start (zygote fork, connect)", cum["kernel start"]),
        ("student's cells (in the kernel)", cum["student's cells (in the kernel)"]),
        ("judge requests (round trips, student code inside)", cum["judge requests (round trips)"]),
        ("tests' own work in the grader", tests_in_grader),
        ("kernel stop", cum["kernel stop"]),
        ("judged execute, rest (copies, namespace, spare)", judged - inside),
        ("nbgrader autograde's own steps", cum["nbgrader autograde (all)"] - judged),
        ("nbgrader apps' initialize (config, db)", cum["nbgrader apps' initialize"]),
        ("feedback page (nbgrader feedback)", cum["nbgrader feedback (all)"]),
        ("judge stage, per measured submission (profiled)", measured / count),
        ("commit (class record, files)", st.get("commit", 0)),
        ("export (csv, plots, pages)", st.get("export", 0)),
        ("whole grade(), per submission", wall / total),
    ]
    return rows


def print_breakdown(rows: list, floor_s: float | None = None) -> None:
    print(f"{'stage (one submission, workers=1, profiled: cProfile adds overhead)':<66}{'s':>8}"
          + (f"{'x floor':>9}" if floor_s else ""))
    for label, s in rows:
        print(f"{label:<66}{s:8.3f}" + (f"{s / floor_s:9.2f}" if floor_s else ""))
