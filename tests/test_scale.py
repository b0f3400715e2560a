"""Grading beyond one machine: a shared PostgreSQL gradebook and Dask workers give the same
grades as local workers with SQLite; a worker that dies mid-run loses no submission; a worker
with an empty cache builds the offline models before grading; the course's Dask settings are
settings Dask has, and reach the workers. (A submission that cannot be graded keeps no grade
from an earlier run: tests/test_class_grading.py, with the fake backend.)"""
from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder.pipeline.run import grade
from pg import dump, free_port, postgres, postgres_server  # noqa: F401 - fixtures
from conftest import (WRONG_SOFTMAX, ROOT, as_from_a_terminal, assert_gradebook_consistent, filled_exercise, read_nb, run,
                      set_solution)
from dask_cluster import dask_cluster  # noqa: F401 - the module's local Dask cluster (a fixture)

EXERCISE = ROOT / "exercises" / "attention" / "attention.ipynb"
# the columns that carry grades (notes hold timings and worker names, which may differ)
GRADE_COLUMNS = ["student_id", "status", "auto", "manual", "pending", "total", "max_score", "Q1", "Q2", "Q3", "Q4"]


def _grades(path: Path) -> dict[str, dict]:
    with open(path, newline="") as fh:
        return {r["student_id"]: {k: r[k] for k in GRADE_COLUMNS} for r in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def small_class(tmp_path_factory) -> Path:
    """Four students: right, one wrong function, untouched, a crash."""
    folder = tmp_path_factory.mktemp("class") / "subs"
    folder.mkdir()
    right = filled_exercise("attention")
    wrong = set_solution(filled_exercise("attention"), "calculate_multihead_attention", WRONG_SOFTMAX)
    crash = set_solution(filled_exercise("attention"), "get_multihead_qkv", "raise RuntimeError('boom')")
    for sid, nb in [("s1", right), ("s2", wrong), ("s3", read_nb(EXERCISE)), ("s4", crash)]:
        nbformat.write(nb, folder / f"{sid}_attention.ipynb")
    return folder


@pytest.fixture(scope="module")
def local_grades(small_class, tmp_path_factory) -> dict:
    """The reference: local worker processes, SQLite gradebook."""
    tmp = tmp_path_factory.mktemp("local")
    grade("attention", small_class, out_dir=tmp / "out", grading_dir=tmp / "grading", workers=2)
    got = _grades(tmp / "out" / "grades.csv")
    assert {sid: r["total"] for sid, r in got.items()} == {"s1": "30", "s2": "24", "s3": "0", "s4": "24"}
    return got


# ----------------------------------------------------------------------------- PostgreSQL

@pytest.fixture(scope="module")
def postgres_graded(postgres, small_class, tmp_path_factory) -> tuple[str, Path, Path]:
    """The small class graded into PostgreSQL once (two workers writing to it at once): the
    database URL, the grading folder and the reports folder.  Tests that stop a later run
    leave it as it was (that is what they check)."""
    tmp = tmp_path_factory.mktemp("pg_graded")
    grading, out = tmp / "grading", tmp / "out"
    proc = run([sys.executable, "-m", "autograder", "grade", "attention", str(small_class), "--workers", "2",
                "--db-url", postgres, "--grading-dir", str(grading), "--out", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return postgres, grading, out


def test_a_postgresql_gradebook_gives_the_same_grades_as_sqlite(postgres_graded, local_grades, tmp_path):
    """Grading into PostgreSQL (two workers writing to it at once) and exporting from it later."""
    postgres, grading, out = postgres_graded
    assert _grades(out / "grades.csv") == local_grades
    assert not (grading / "gradebook.db").exists()  # nothing went to SQLite on the side
    from nbgrader.api import Gradebook

    with Gradebook(postgres) as gb:
        assert sorted(s.student.id for s in gb.find_assignment("attention").submissions) == sorted(local_grades)
        assert gb.find_submission("attention", "s1").score == 30
    assert_gradebook_consistent(postgres, "attention", set(local_grades))
    # a later command on the folder reads the same database without being told again
    proc = run([sys.executable, "-m", "autograder", "export", "attention", "--grading-dir", str(grading),
                "--out", str(tmp_path / "again")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _grades(tmp_path / "again" / "grades.csv") == local_grades


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGINT"])
def test_a_run_killed_half_way_leaves_a_postgresql_record_as_it_was(postgres_graded, small_class, signal_name):
    """A run into PostgreSQL stopped while it judges (SIGKILL, or Ctrl-C): not a row changed."""
    postgres, grading, _ = postgres_graded
    before = dump(postgres)
    assert before and any(before.values())
    # a run killed by the other parametrisation leaves its folder until the next run starts
    earlier = set((grading / "runs").glob("*")) if (grading / "runs").is_dir() else set()
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", "attention", str(small_class),
                             "--workers", "1", "--grading-dir", str(grading)], cwd=ROOT, start_new_session=True,
                            preexec_fn=as_from_a_terminal, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None \
            and not [p for p in (grading / "runs").glob("*/workers/*/status/*.json") if p.parents[3] not in earlier]:
        time.sleep(0.1)
    assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
    assert time.monotonic() < deadline, "the second run judged no submission in 300 s"
    os.killpg(proc.pid, getattr(signal, signal_name))
    proc.wait(120)
    assert dump(postgres) == before


def test_an_unreachable_database_is_one_line(small_class, tmp_path):
    """A wrong --db-url stops the run with one line that names it."""
    port = free_port()  # nothing listens there
    url = f"postgresql://grader@127.0.0.1:{port}/gradebook"
    proc = run([sys.executable, "-m", "autograder", "grade", "attention", str(small_class),
                "--db-url", url, "--grading-dir", str(tmp_path / "g")])
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(port) in lines[0]


# ----------------------------------------------------------------------------- Dask



def test_dask_workers_grade_like_local_workers(dask_cluster, small_class, local_grades, tmp_path):
    """`grade --cluster ADDRESS` from the command line: the same grades, every feedback page."""
    cluster, client = dask_cluster
    proc = run([sys.executable, "-m", "autograder", "grade", "attention", str(small_class),
                "--cluster", cluster.scheduler_address, "--grading-dir", str(tmp_path / "grading"),
                "--out", str(tmp_path / "out")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _grades(tmp_path / "out" / "grades.csv") == local_grades
    for sid in local_grades:
        assert (tmp_path / "out" / "feedback" / f"{sid}.html").exists()
        assert (tmp_path / "grading" / "autograded" / sid / "attention" / "attention.ipynb").exists()
    assert_gradebook_consistent(f"sqlite:///{tmp_path / 'grading' / 'gradebook.db'}", "attention", set(local_grades))
    assert len(client.run(os.getpid)) == 2


def test_dask_workers_write_a_shared_postgresql_gradebook(dask_cluster, postgres, small_class, local_grades,
                                                          tmp_path):
    """With --cluster and --db-url, each worker writes its student's rows straight into PostgreSQL."""
    cluster, _ = dask_cluster
    report = grade("attention", small_class, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading",
                   cluster=cluster.scheduler_address, db_url=postgres)
    assert all(r.status == "graded" for r in report.results), report.table()
    assert _grades(tmp_path / "out" / "grades.csv") == local_grades
    assert not (tmp_path / "grading" / "gradebook.db").exists()
    assert_gradebook_consistent(postgres, "attention", set(local_grades))


def test_a_worker_that_dies_mid_run_loses_no_submission(dask_cluster, small_class, local_grades, tmp_path):
    """SIGKILL one worker process while it grades: its submission is graded again elsewhere."""
    cluster, client = dask_cluster
    pids = client.run(os.getpid)  # worker address -> process id
    killed: list[str] = []

    def kill_a_busy_worker():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            busy = [w for w, keys in client.processing().items()
                    if any(str(k).startswith("grade-") for k in keys)]
            if busy:
                time.sleep(0.5)  # inside the task: nbgrader and the kernel are starting or running
                os.kill(pids[busy[0]], signal.SIGKILL)
                killed.append(busy[0])
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_a_busy_worker)
    killer.start()
    report = grade("attention", small_class, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading",
                   cluster=cluster.scheduler_address)
    killer.join()
    assert killed, "no worker was busy grading: the test did not kill anything"
    assert all(r.status == "graded" for r in report.results), report.table()
    assert _grades(tmp_path / "out" / "grades.csv") == local_grades
    # graded twice (once on the dead worker, unfinished), recorded once
    assert_gradebook_consistent(f"sqlite:///{tmp_path / 'grading' / 'gradebook.db'}", "attention", set(local_grades))


def test_the_sandbox_is_checked_on_the_workers(dask_cluster, small_class, local_grades, tmp_path, monkeypatch):
    """With --cluster the sandbox is checked where kernels run: a login node without bubblewrap
    still grades with --sandbox on, in the workers' sandboxes, and says so."""
    from autograder.isolation import sandbox

    if not sandbox.bwrap_works():
        pytest.skip("bubblewrap does not work on this machine (the workers run here)")
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: False)  # this process only, not the workers
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(small_class / "s1_attention.ipynb", subs)
    cluster, _ = dask_cluster
    report = grade("attention", subs, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading",
                   cluster=cluster.scheduler_address, use_sandbox="on")
    assert not any("WITHOUT" in w for w in report.warnings), report.warnings
    assert _grades(tmp_path / "out" / "grades.csv") == {"s1": local_grades["s1"]}
    assert "sandbox bubblewrap" in (tmp_path / "out" / "feedback" / "s1.html").read_text()


def test_a_submission_that_takes_down_its_workers_costs_only_itself(small_class, local_grades, tmp_path,
                                                                    monkeypatch):
    """One task of two submissions, s3 and s4; s4 kills every worker that runs it: the batch
    is split, s3 is graded alone as usual, s4 alone is reported not graded with a reason."""
    distributed = pytest.importorskip("distributed")
    import dask

    from autograder.backends import cluster

    def kills_its_worker_on_s4(spec):  # runs in the worker process (pickled by value)
        import os

        from autograder.backends import cluster as real

        if "s4" in spec.students:
            os._exit(3)  # as a worker killed by the kernel's OOM killer would
        return real.grade_batch(spec)

    subs = tmp_path / "subs"
    subs.mkdir()
    for sid in ("s3", "s4"):
        shutil.copy(small_class / f"{sid}_attention.ipynb", subs)
    monkeypatch.setattr(cluster, "batch_size", lambda n, workers: 2)
    monkeypatch.setattr(cluster, "grade_batch", kills_its_worker_on_s4)
    # the scheduler gives up on a task after it took down two workers (Dask's default: four)
    with dask.config.set({**cluster.grading_dask_config(), "distributed.scheduler.allowed-failures": 1}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None, silence_logs=50) as lc:
        report = grade("attention", subs, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading",
                       cluster=lc.scheduler_address)
    by_id = {r.student_id: r for r in report.results}
    assert by_id["s4"].status != "graded" and "cluster" in by_id["s4"].message, report.table()
    got = _grades(tmp_path / "out" / "grades.csv")
    assert got["s3"] == local_grades["s3"]
    assert_gradebook_consistent(f"sqlite:///{tmp_path / 'grading' / 'gradebook.db'}", "attention", {"s3"})


def test_the_grading_dask_settings_are_settings_dask_has():
    """Every key of autograder/backends/dask-grading.yaml is one of Dask's own (a misspelt key would be
    ignored without a word), and the file turns the workers' profiler off."""
    pytest.importorskip("distributed")
    import dask

    from autograder.backends.cluster import grading_dask_config

    ours = grading_dask_config()
    assert ours, "no settings read from autograder/backends/dask-grading.yaml"
    missing = object()
    unknown = sorted(key for key in ours if dask.config.get(key, missing) is missing)
    assert not unknown, f"keys Dask does not have: {unknown}"
    assert ours["distributed.worker.profile.enabled"] is False


def test_workers_at_dasks_defaults_get_a_note_and_the_grading_settings_reach_them():
    """A worker started at Dask's defaults (profiler on) is named in a NOTE; workers started
    with dask-grading.yaml are not, and the settings are what the workers run with."""
    distributed = pytest.importorskip("distributed")
    import dask

    from autograder.backends.cluster import check_workers, grading_dask_config
    from autograder.course.settings import GradingSettings

    notes = {}
    for label, config in (("defaults", {}), ("course", grading_dask_config())):
        with dask.config.set(config), distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                                               dashboard_address=None, silence_logs=40) as lc:
            settings = GradingSettings(cluster=lc.scheduler_address, sandbox="auto")
            _, warnings = check_workers(settings, [])
            notes[label] = [w for w in warnings if "profiler" in w]
            with distributed.Client(lc) as client:
                profiler = client.run(lambda: dask.config.get("distributed.worker.profile.enabled"))
            assert list(profiler.values()) == [label == "defaults"]
    assert len(notes["defaults"]) == 1 and "dask-grading.yaml" in notes["defaults"][0], notes
    assert notes["course"] == [], notes


def test_a_grading_process_does_not_build_the_iri_grammar():
    """Importing the grading code (as a Dask worker does when its first task arrives) keeps
    jsonschema from building rfc3987_syntax's IRI grammar, 1.5 s of CPU in every worker."""
    import importlib.util

    if importlib.util.find_spec("rfc3987_syntax") is None:
        pytest.skip("rfc3987_syntax is not installed: nothing to keep out")
    code = ("import sys, autograder.backends.cluster, nbformat, jsonschema; "
            "print(sys.modules.get('rfc3987_syntax') is None)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.stdout.strip() == "True", proc.stdout + proc.stderr


def test_a_worker_with_an_empty_cache_builds_the_models_first(tmp_path):
    """Before any task, every worker builds the assignment's offline models into its own cache."""
    distributed = pytest.importorskip("distributed")
    from autograder.backends.cluster import prepare_models

    caches = {i: tmp_path / f"cache{i}" for i in range(2)}
    workers = {f"w{i}": {"cls": distributed.Nanny,
                         "options": {"nthreads": 1, "env": {"COURSE_CACHE_DIR": str(cache)}, "silence_logs": 40}}
               for i, cache in caches.items()}
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard_address": None}}
    with distributed.SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40) as cluster:
        with distributed.Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            used = client.run(prepare_models, ["distilbert"], {})
            assert sorted(used.values()) == sorted(str(c) for c in caches.values())
            built = {}
            for cache in caches.values():
                weights = list(cache.rglob("model.safetensors"))
                assert weights, f"nothing built in {cache}"
                built.update({w: (w.stat().st_ino, w.stat().st_mtime_ns) for w in weights})
            client.run(prepare_models, ["distilbert"], {})  # a second time: found in the cache
            assert {w: (w.stat().st_ino, w.stat().st_mtime_ns) for w in built} == built, "built again"
