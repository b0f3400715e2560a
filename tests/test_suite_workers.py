"""How scripts/test.sh splits the suite over two pytest-xdist workers (tests/conftest.py)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

import conftest
from conftest import ROOT

# benchmarks/ is no package: the script loaded from its file (registered first, as an import would)
_spec = importlib.util.spec_from_file_location("suite_profile", ROOT / "benchmarks" / "suite_profile.py")
suite_profile = sys.modules["suite_profile"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite_profile)


def test_book_pages_and_the_tests_that_need_the_built_book_share_one_unit():
    assert conftest.work_unit("book/05_encoder_decoder.ipynb::Cell 7") == "book"
    assert conftest.work_unit("tests/test_book_browser.py::test_page_in_the_browser[01.ipynb]") == "book"
    assert conftest.work_unit("tests/test_finetune.py::test_x") == "tests/test_finetune.py"
    # every module that asks for the built book is in the book's unit
    uses = {p.name for p in (ROOT / "tests").glob("test_*.py") if re.search(r"\bbuilt_book\b", p.read_text())}
    assert uses and uses <= conftest.BOOK_GROUP_MODULES, uses - conftest.BOOK_GROUP_MODULES


def test_units_start_with_the_book_then_the_slowest_modules():
    ids = ["tests/test_zygote.py::a", "tests/test_finetune.py::b", "tests/test_scale.py::c",
           "book/01_attention_retrieval.ipynb::Cell 0", "tests/test_publish.py::d"]
    ranked = sorted(ids, key=conftest._start_rank)
    assert [conftest.work_unit(i) for i in ranked] == [
        "book", "book", "tests/test_scale.py", "tests/test_finetune.py", "tests/test_zygote.py"]
    assert ranked[:2] == ["book/01_attention_retrieval.ipynb::Cell 0", "tests/test_publish.py::d"]  # pages first


@pytest.mark.parametrize("worker, cpus, pinned", [("gw0", [0, 1], [0]), ("gw1", [0, 1], [1]),
                                                   ("gw1", [0, 1, 2, 3, 4], [1, 3]), ("gw1", [3], None)])
def test_each_worker_gets_its_own_cpus(monkeypatch, worker, cpus, pinned):
    calls = []
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, mask: calls.append(list(mask)))
    conftest._pin_worker()
    assert calls == ([pinned] if pinned else [])


def test_a_plain_run_is_not_pinned(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, mask: pytest.fail("pinned outside xdist"))
    conftest._pin_worker()


def test_every_test_module_has_a_tier():
    """A new module is put into a tier of conftest.TIERS, so --fast never grows by accident."""
    modules = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    listed = set().union(*conftest.TIERS.values())
    assert modules - listed == set(), "add these modules to a tier in tests/conftest.py: " + \
        ", ".join(sorted(modules - listed))
    assert listed - modules == set(), "tests/conftest.py lists modules that do not exist: " + \
        ", ".join(sorted(listed - modules))
    tiers_of = [t for t, mods in conftest.TIERS.items() for _ in mods]
    assert len(tiers_of) == len(listed), "a module is in two tiers"
    assert conftest.tier_of("book/01_attention_retrieval.ipynb::Cell 0") == "book"
    assert conftest.tier_of("tests/test_docs.py::test_x") == "fast"
    # the PostgreSQL case of a fast test (tests/pg.py's ``db``) is scale; its SQLite case stays fast
    assert conftest.tier_of("tests/test_record_crash.py::test_x[postgresql-stage]") == "scale"
    assert conftest.tier_of("tests/test_record_crash.py::test_x[sqlite-stage]") == "fast"
    assert conftest.tier_of("tests/test_record_errors.py::test_x[postgresql]") == "scale"
    assert conftest.tier_of("tests/test_identity.py::test_x[postgresqlish]") == "fast"


# ---------------------------------------------------------------- --cpu-log and benchmarks/suite_profile.py

STAT = ("cpu  900 0 300 5000 100 0 0 0 0 0\n"
        "cpu0 400 0 100 2000 50 0 10 0 0 0\n"
        "cpu1 500 0 200 3000 50 0 0 0 0 0\n"
        "intr 12345\n")


def test_busy_seconds_counts_the_given_cpus_less_idle_and_iowait():
    tick = os.sysconf("SC_CLK_TCK")
    assert conftest.busy_seconds({0}, STAT) == pytest.approx(510 / tick)
    assert conftest.busy_seconds({1}, STAT) == pytest.approx(700 / tick)
    assert conftest.busy_seconds({0, 1}, STAT) == pytest.approx(1210 / tick)  # not the "cpu" total line again
    assert conftest.busy_seconds({7}, STAT) == 0


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux only")
def test_cpu_log_has_a_line_per_test(tmp_path):
    log = tmp_path / "cpu.tsv"
    test = tmp_path / "test_two.py"
    test.write_text("import time\n\ndef test_busy():\n    t = time.process_time()\n"
                    "    while time.process_time() - t < 0.3:\n        pass\n\n"
                    "def test_sleeps():\n    time.sleep(0.3)\n")
    # tests/conftest.py is the conftest of a run from tests/: the option is its own
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           f"--cpu-log={log}", str(test)], cwd=ROOT / "tests", capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT / "tests")))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {r.nodeid.split("::")[-1]: r for r in suite_profile.read_log(log)}
    assert set(rows) == {"test_busy", "test_sleeps"}
    assert rows["test_busy"].wall >= 0.3 and rows["test_sleeps"].wall >= 0.3
    # the loop's own 0.3 s of CPU is on its CPU whatever else runs there (the sleep's idle time is
    # the test's only where nothing else may run on its CPU, as in a pinned worker: not asserted)
    assert rows["test_busy"].cpu >= 0.25, rows


def test_suite_profile_sums_cpu_and_idle_by_tier_and_module(tmp_path, capsys):
    log = tmp_path / "cpu.tsv"
    log.write_text("tests/test_docs.py::test_a\t10.00\t9.00\tgw0\t1\n"
                   "tests/test_fair_time.py::test_b[x]\t30.00\t5.00\tgw1\t1\n"
                   "book/07_gpt.ipynb::Cell 12\t40.00\t40.00\tgw0\t1\n"
                   "tests/test_docs.py::test_cut_off\t1.0")  # a run killed while writing
    rows = suite_profile.read_log(log)
    assert [r.nodeid for r in rows] == ["tests/test_docs.py::test_a", "tests/test_fair_time.py::test_b[x]",
                                        "book/07_gpt.ipynb::Cell 12"]
    text = suite_profile.summary(rows, top=2)
    assert text.splitlines()[0] == ("3 tests on 2 worker(s): wall 80 s summed, CPU 54 s, idle 26 s "
                                    "(32.5% of the wall time)")
    assert "CPU by tier: book 40 s, fast 9 s, sandbox 5 s" in text
    by_cpu = text.split("tests by CPU")[1].split("tests by idle")[0].splitlines()[1:]
    assert by_cpu[0].endswith("book/07_gpt.ipynb::Cell 12") and by_cpu[1].endswith("tests/test_docs.py::test_a")
    by_idle = text.split("tests by idle")[1].splitlines()[1:]
    assert by_idle[0].endswith("tests/test_fair_time.py::test_b[x]") and len(by_idle) == 2
    assert suite_profile.main([str(log)]) == 0 and "CPU by tier" in capsys.readouterr().out
    assert suite_profile.main([str(tmp_path / "missing.tsv")]) == 2
    assert "--cpu-log" in capsys.readouterr().err
