"""Shared helpers for the test suite."""
from __future__ import annotations

import copy
import shutil
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# this session's folder of the releases that faked runs copy (tests/fakebackend.py, release_once)
RELEASES = "COURSE_TEST_RELEASES"

SOLUTION_RE = re.compile(r"### BEGIN SOLUTION(.*?)### END SOLUTION", re.S)
HIDDEN_RE = re.compile(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", re.S)


def source_notebooks() -> list[Path]:
    return sorted((ROOT / "solutions").glob("*/*.ipynb"))


def read_nb(path: Path):
    return nbformat.read(path, as_version=4)


def secret_lines(nb, min_len: int = 12) -> set[str]:
    """Lines of solution and hidden-test regions that appear nowhere else in the
    source notebook (so finding one in a student notebook or a web page is a leak)."""
    secret, public = set(), set()
    for cell in nb.cells:
        src = cell.source
        regions = SOLUTION_RE.findall(src) + HIDDEN_RE.findall(src)
        meta = cell.metadata.get("nbgrader", {})
        whole = meta.get("solution") and not SOLUTION_RE.search(src)
        if whole:
            regions.append(src)  # a whole-cell answer (e.g. a mark scheme) is secret too
        for region in regions:
            secret.update(ln.strip() for ln in region.splitlines() if len(ln.strip()) >= min_len)
        if not whole:
            rest = HIDDEN_RE.sub("", SOLUTION_RE.sub("", src))
            public.update(ln.strip() for ln in rest.splitlines())
    return secret - public


# the most telling wrong answer to attention's Q2: softmax over the queries instead of the keys
WRONG_SOFTMAX = '''
hs = q.size(-1)
scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
if mask is not None:
    scores = scores.masked_fill(~mask, float("-inf"))
weights = torch.softmax(scores, dim=-2)  # normalises over queries instead of keys
return weights @ v, weights
'''

def set_solution(nb, grade_id: str, new_body: str, region: int = 0):
    """Replace solution region number ``region`` of cell ``grade_id`` with ``new_body``."""
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            matches = list(SOLUTION_RE.finditer(cell.source))
            m = matches[region]
            indent = re.search(r"([ \t]*)### BEGIN SOLUTION", cell.source[: m.end()]).group(1)
            body = "\n".join(indent + ln if ln else ln for ln in new_body.strip("\n").splitlines())
            cell.source = cell.source[: m.start()] + "### BEGIN SOLUTION\n" + body + "\n" + indent + \
                "### END SOLUTION" + cell.source[m.end():]
            return nb
    raise KeyError(grade_id)


def fill_solutions(exercise, source):
    """The exercise notebook with every answer cell replaced by the reference answer: what a
    student who got everything right hands in (no hidden tests, no solution markers)."""
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    nb = copy.deepcopy(exercise)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def filled_exercise(name: str):
    return fill_solutions(read_nb(ROOT / "exercises" / name / f"{name}.ipynb"),
                          read_nb(ROOT / "solutions" / name / f"{name}.ipynb"))


def cell_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream") + \
        "".join(f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error")


def handin_cell(nb):
    cells = [c for c in nb.cells if c.cell_type == "code" and "handin_report(" in c.source]
    assert len(cells) == 1, "every exercise ends with one hand-in cell"
    return cells[0]


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def assert_self_check_passed(grading_dir: Path, student: str, assignment: str) -> None:
    """The hand-in cell of an autograded submission reported every visible check as passed,
    without a warning, and ended with "Ready to hand in".

    The filled exercise is autograded once per assignment in its own test module; reading its
    hand-in output there replaces a separate run of the notebook for the self-check test.
    """
    path = grading_dir / "autograded" / student / assignment / f"{assignment}.ipynb"
    cell = handin_cell(read_nb(path))
    out = cell_text(cell)
    assert re.search(r"All \d+ visible tests passed|The visible test passed", out), out
    assert "WARNING" not in out and "[FAIL]" not in out and "[WARN]" not in out, out
    assert _last_line(out).startswith("Ready to hand in"), out
    assert not any(o.output_type == "execute_result" for o in cell.outputs), "the hand-in cell echoes Out[]"
    # no progress bars: neither widgets nor text on stderr
    assert not any(o.output_type == "display_data" or o.get("name") == "stderr" for o in cell.outputs), cell.outputs


def assert_self_check_reports_missing(grading_dir: Path, student: str, assignment: str) -> None:
    """The hand-in cell of an autograded untouched exercise ran without crashing, listed the
    unanswered questions (no visible check passed) and ended with what is missing."""
    path = grading_dir / "autograded" / student / assignment / f"{assignment}.ipynb"
    cell = handin_cell(read_nb(path))
    assert not any(o.output_type == "error" for o in cell.outputs), "the hand-in cell must not crash"
    out = cell_text(cell)
    assert "not answered yet" in out and re.search(r"0 of \d+ visible tests passed", out), out
    assert "[PASS]" not in out, out
    assert _last_line(out).startswith("Not ready to hand in: "), out


def assert_hand_in_reports(grading_dir: Path, assignment: str) -> None:
    """Both hand-in checks on an autograded batch: `full` (the filled exercise) passed every
    visible check, `untouched` (the released exercise) listed what is missing."""
    assert_self_check_passed(grading_dir, "full", assignment)
    assert_self_check_reports_missing(grading_dir, "untouched", assignment)


def assert_gradebook_consistent(url: str, assignment: str, graded: set[str]) -> None:
    """The gradebook at ``url`` (SQLite or PostgreSQL) holds exactly the graded students, each
    submitted notebook has one grade row per graded cell, and no grade row is orphaned."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as con:
            q = lambda sql, **kw: con.execute(sa.text(sql), kw).all()  # noqa: E731
            in_db = {s for (s,) in q("select sa.student_id from submitted_assignment sa join assignment a "
                                      "on sa.assignment_id = a.id where a.name = :a", a=assignment)}
            assert in_db == graded
            n_cells = q("select count(*) from grade_cells gc join base_cell bc on gc.id = bc.id join notebook n "
                        "on bc.notebook_id = n.id join assignment a on n.assignment_id = a.id where a.name = :a",
                        a=assignment)[0][0]
            assert n_cells > 0
            per_nb = q("select sn.id, count(g.id) from submitted_notebook sn join submitted_assignment sa "
                       "on sn.assignment_id = sa.id join assignment a on sa.assignment_id = a.id "
                       "left join grade g on g.notebook_id = sn.id where a.name = :a group by sn.id", a=assignment)
            assert len(per_nb) == len(graded)
            assert all(count == n_cells for _, count in per_nb), per_nb
            assert q("select count(*) from grade where notebook_id not in (select id from submitted_notebook)")[0][0] == 0
            assert q("select count(*) from submitted_notebook where assignment_id not in "
                     "(select id from submitted_assignment)")[0][0] == 0
    finally:
        engine.dispose()


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a command a test stops with Ctrl-C: SIGINT at its default, as in a
    terminal.  A child inherits an ignored SIGINT (a suite started in the background of a
    script, ``nohup``), and Python then installs no KeyboardInterrupt: the Ctrl-C would be lost."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)


@pytest.fixture(scope="session")
def built_book():
    """Build the book as the README's build command does (cached execution)."""
    jb = Path(sys.executable).parent / "jupyter-book"
    proc = run([str(jb), "build", ".", "--warningiserror", "--keep-going"])
    assert proc.returncode == 0, "book build failed:\n" + (proc.stdout + proc.stderr)[-4000:]
    return ROOT / "_build" / "html"


@pytest.fixture(scope="session")
def fake_graded_class(tmp_path_factory):
    """The small Canvas class of tests/record_class.py, judged by the fake backend once per test
    run (per worker) and shared by the modules that start from it; a test that changes the
    record works on a copy of ``["grading"]``, in a folder of its own under ``["tmp"]``."""
    from record_class import graded_class

    return graded_class(tmp_path_factory.mktemp("record"))


def fork_checkout(dest: Path) -> Path:
    """A copy of this checkout in ``dest``: the files git tracks, and new ones it does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def pytest_configure(config):
    from book_cache import register

    register(config)
    _pin_worker()
    os.environ[RELEASES] = tempfile.mkdtemp(prefix="course-test-releases-")
    _release_once_per_session()


def _release_once_per_session() -> None:
    """Every grading run in this process releases an assignment into a fresh grading folder by
    copying a release the real code made once this session (tests/fakebackend.py's
    ``release_once``; `nbgrader generate_assignment` costs about 2 s of CPU a run, and the suite
    grades well over a hundred times). That the copy holds all the real release writes, byte for
    byte: tests/test_class_grading.py; a second run into a folder, a changed source, a command in a
    child process and tests/test_release.py use the real release itself."""
    import autograder.pipeline.stages as stages
    from fakebackend import release_once

    if not hasattr(stages.release, "real"):
        stages.release = release_once(stages.release)


def pytest_unconfigure(config):
    folder = os.environ.pop(RELEASES, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- two workers (pytest-xdist)
# scripts/test.sh runs the suite on two pytest-xdist workers.  A worker gets whole units: a test
# module (its module-scoped fixture grades a batch once, not once per worker), or the book
# group: the book's pages, run by nbval, fill the book's execution cache (book_cache.py), and
# the tests that build, open or publish the book come after them on the same worker, so the
# build finds every page already executed.
BOOK_GROUP_MODULES = {"test_book_build.py", "test_book_browser.py", "test_publish.py"}
# Units start in this order (the book group first): a long module left for the end would keep
# one worker busy while the other idles.  The slowest modules, from `--durations=0`; a stale
# list costs only time.
SLOW_FIRST = ["test_colab.py", "test_colab_grading.py", "test_colab_previous.py", "test_scale.py", "test_record_writer.py", "test_record_full_disk.py", "test_finetune.py", "test_release.py", "test_arithmetic_assignments.py",
              "test_modern_decoder.py", "test_post_training.py", "test_tamper.py", "test_autograde.py",
              "test_concepts_lab.py", "test_llm_backends.py", "test_record_killed.py"]


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: "book", or its module's path."""
    path = nodeid.split("::", 1)[0]
    return "book" if path.startswith("book/") or Path(path).name in BOOK_GROUP_MODULES else path


def _start_rank(nodeid: str) -> int:
    unit = work_unit(nodeid)
    if unit == "book":
        return 0
    name = Path(unit).name
    return 1 + SLOW_FIRST.index(name) if name in SLOW_FIRST else 1 + len(SLOW_FIRST)


@pytest.hookimpl(tryfirst=True)  # before the fixtures: the build would take minutes
def pytest_runtest_setup(item):
    if "built_book" in getattr(item, "fixturenames", ()) and work_unit(item.nodeid) != "book":
        pytest.fail(f"{item.nodeid} uses built_book: move it into one of {sorted(BOOK_GROUP_MODULES)}, so that "
                    "it runs after the book's pages (tests/conftest.py)", pytrace=False)


# ---------------------------------------------------------------- tiers (README: "Test tiers")
# What each test module needs. `bash scripts/test.sh --fast` runs the `fast` tier alone: no kernel,
# no sandbox, no book, no model to train, no Colab runtime (minutes at most; see README). A module
# that is in no list is not fast (tests/test_suite_workers.py asks for every module to be listed).
# the toy course's notebooks are graded by tests/test_toy_pipeline.py; nbval must not run them as pages
collect_ignore = ["fixtures"]

TIERS = {
    "fast": {"test_course.py", "test_layers.py", "test_colab_runtimes.py", "test_docs.py", "test_identity.py",
             "test_visible_text.py", "test_record_errors.py", "test_class_grading.py", "test_book_claims.py", "test_llm_client.py",
             "test_publish_proof.py", "test_worked_examples.py", "test_suite_workers.py", "test_runtime_clashes.py",
             "test_data.py", "test_lms_roster.py", "test_feedback_page.py", "test_book_figures.py",
             "test_exercises.py", "test_budget.py", "test_settings.py", "test_llm_scoring.py", "test_handed_in.py", "test_class_record.py",
             "test_record_crash.py", "test_worker_gradebook.py", "test_failures.py", "test_policy.py"},
    "sandbox": {"test_sandbox.py", "test_isolation.py", "test_zygote.py", "test_judge.py", "test_fair_time.py",
                "test_tamper.py", "test_selfcheck.py", "test_handgrade.py", "test_local_backend.py",
                "test_lms.py", "test_toy_pipeline.py"},
    "assignments": {"test_autograde.py", "test_arithmetic_assignments.py", "test_finetune.py", "test_modern_decoder.py",
                    "test_concepts_lab.py", "test_record_killed.py", "test_release.py",
                    "test_instructor_notebook.py", "test_llm_backends.py", "test_mistakes.py", "test_offline_model.py",
                    "test_offline_assistant.py",
                    "test_gpt.py", "test_gpu.py", "test_handgrade_versions.py", "test_post_training.py"},
    "book": {"test_book_build.py", "test_book_browser.py", "test_book_pages.py", "test_publish.py",
             "test_instructor_book.py", "test_handgrade_browser.py"},
    "scale": {"test_scale.py", "test_record_writer.py", "test_record_full_disk.py", "test_record_cluster.py"},
    "colab": {"test_colab.py", "test_colab_previous.py", "test_colab_grading.py", "test_compat.py"},
}


# a test parametrised over the class record's database (tests/pg.py: ``db``) is in the module's
# tier on SQLite and in `scale` on PostgreSQL, whose server it starts
POSTGRESQL_CASE = re.compile(r"\[(?:.*-)?postgresql(?:-.*)?\]$")


def tier_of(nodeid: str) -> str:
    """The tier of a test: that of its module; the book's pages (nbval) are "book"; a test's
    PostgreSQL case (``[postgresql]`` among its parameters) is "scale"."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("book/"):
        return "book"
    if POSTGRESQL_CASE.search(nodeid):
        return "scale"
    return next((tier for tier, modules in TIERS.items() if Path(path).name in modules), "unlisted")


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item.nodeid)))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike; a plain run keeps file order
        items.sort(key=lambda item: _start_rank(item.nodeid))  # stable: a unit keeps its order


def _pin_worker() -> None:
    """Give each xdist worker its own share of the CPUs.  Without this, two workers that both
    train (torch, and the graders' kernels, use every CPU they may run on) wait on each
    other's threads: a training cell ran up to 7 times slower.  Pinned, a worker is a smaller
    machine, and everything in it (torch, usable_cpus(), the graders' thread counts) sees so."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and count and hasattr(os, "sched_setaffinity")):
        return
    cpus, n = sorted(os.sched_getaffinity(0)), int(count)
    if len(cpus) >= n:
        os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) % n::n])


# ---------------------------------------------------------------- where the suite's time goes
# `--cpu-log FILE`: each test (setup, call and teardown) appends a line to FILE: its node id, wall
# seconds, the CPU seconds spent meanwhile on the CPUs this process may run on, the xdist worker
# and how many CPUs that is.  A worker is pinned to its own CPU (_pin_worker), and everything a
# test starts (kernels, grading processes, servers) inherits that, so the CPU figure is the test's
# own, and wall minus CPU is the time its CPU idled.  benchmarks/suite_profile.py sums it up.

def pytest_addoption(parser):
    parser.addoption("--cpu-log", metavar="FILE", default=None,
                     help="append each test's wall and CPU seconds to FILE (benchmarks/suite_profile.py)")


def busy_seconds(cpus, stat: str | None = None) -> float:
    """CPU seconds the CPUs ``cpus`` have been busy since boot (/proc/stat: all but idle and iowait)."""
    busy = 0
    for line in (stat if stat is not None else Path("/proc/stat").read_text()).splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(f) for f in fields]
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = item.config.getoption("cpu_log", None)
    if not log or not Path("/proc/stat").exists():
        yield
        return
    cpus = os.sched_getaffinity(0)
    start, busy = time.monotonic(), busy_seconds(cpus)
    yield
    wall, cpu = time.monotonic() - start, busy_seconds(cpus) - busy
    with open(log, "a") as fh:  # one short line per write: the workers' lines do not mix
        fh.write(f"{item.nodeid}\t{wall:.2f}\t{cpu:.2f}\t{os.environ.get('PYTEST_XDIST_WORKER', '-')}\t{len(cpus)}\n")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        """LoadScopeScheduling with work_unit() as the scope, taken in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return ByWorkUnit(config, log)
