"""How scripts/test.sh splits the suite over two pytest-xdist workers (tests/conftest.py)."""
from __future__ import annotations

import os
import re

import pytest

import conftest
from conftest import ROOT


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
