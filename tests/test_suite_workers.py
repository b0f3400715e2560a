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


def test_units_start_with_the_book_then_the_page_apart_then_the_slowest_modules():
    ids = ["tests/test_zygote.py::a", "tests/test_finetune.py::b", "tests/test_scale.py::c",
           "book/06_bert.ipynb::Cell 0", "book/01_attention_retrieval.ipynb::Cell 0", "tests/test_publish.py::d"]
    ranked = sorted(ids, key=conftest._start_rank)
    assert [conftest.work_unit(i) for i in ranked] == [
        "book", "book", "book-apart", "tests/test_scale.py", "tests/test_finetune.py", "tests/test_zygote.py"]
    assert ranked[:2] == ["book/01_attention_retrieval.ipynb::Cell 0", "tests/test_publish.py::d"]  # pages first
    assert all((ROOT / "book" / page).is_file() for page in conftest.BOOK_PAGES_APART)


def test_a_page_nbval_finished_is_marked_and_the_build_waits_for_it(tmp_path, monkeypatch):
    """The page run apart is marked done when its last cell is torn down, passed or not; until
    then wait_for_pages waits (and gives up after its timeout, naming the page)."""
    import threading
    import types

    import book_cache

    monkeypatch.setattr(book_cache, "DONE", tmp_path / "done")
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "run1")
    page = str(ROOT / "book" / "06_bert.ipynb")
    assert book_cache.wait_for_pages([page], timeout=0.2) == [page]

    class IPyNbCell:  # what nbval's item looks like to the plugin
        def __init__(self, parent):
            self.parent, self.cell, self.test_outputs = parent, types.SimpleNamespace(outputs=[]), []

    parent = types.SimpleNamespace(fspath=page, nb=None)
    first, last = IPyNbCell(parent), IPyNbCell(parent)
    plugin = book_cache._BookPagesIntoCache()
    plugin.failed.add(page)  # a failed page: not cached, but done all the same
    plugin.pytest_runtest_teardown(first, last)
    assert book_cache.wait_for_pages([page], timeout=0.2) == [page], "marked before its last cell"
    later = threading.Timer(0.5, plugin.pytest_runtest_teardown, (last, None))
    later.start()
    try:
        assert book_cache.wait_for_pages([page], timeout=60) == []
    finally:
        later.join()
    assert (tmp_path / "done" / "run1" / "06_bert.ipynb").exists()


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
