"""One execution per book page in the test suite: nbval runs every page (book/ comes first in
testpaths); when all cells of a page pass, its outputs go into the book's execution cache, so
that a book build later in the same session finds the page there instead of running it a
second time.  A page that failed or was only partly run is not cached, and the build then
executes it itself as usual.  Used by this repository's tests and by the published student
course's (``python -m autograder publish`` copies this file)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK_CACHE = ROOT / "_build" / ".jupyter_cache"  # execute_notebooks: cache in _config.yml
DONE = ROOT / "_build" / ".nbval-done"  # <test run>/<page>: nbval has finished the page (passed or not)


def _done_marker(page: str) -> Path | None:
    """Where a page finished by nbval is marked, for the workers of one pytest-xdist run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return DONE / run / Path(page).name if run else None


def wait_for_pages(pages, timeout: float = 1800.0) -> list[str]:
    """Wait until another pytest-xdist worker has finished each page in ``pages`` (each cached,
    unless it failed), so that a book build does not execute it a second time beside it.
    Returns the pages still not finished after ``timeout`` s (the build then runs them itself)."""
    left = {str(p) for p in pages}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        left = {p for p in left if not ((m := _done_marker(p)) is None or m.exists())}
        if left:
            time.sleep(2)
    return sorted(left)


class _BookPagesIntoCache:
    def __init__(self):
        self.failed: set[str] = set()
        self.ran: dict[str, int] = {}

    @staticmethod
    def _page(item) -> Path | None:
        if type(item).__name__ != "IPyNbCell":  # nbval's item for one notebook cell
            return None
        path = Path(str(item.parent.fspath)).resolve()
        return path if path.parent == ROOT / "book" else None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        page = self._page(item)
        if page is not None and outcome.get_result().failed:
            self.failed.add(str(page))

    def pytest_runtest_teardown(self, item, nextitem):
        page = self._page(item)
        if page is None:
            return
        outputs = getattr(item, "test_outputs", None)
        if outputs is None:
            self.failed.add(str(page))
        else:
            item.cell.outputs = list(outputs)
            self.ran[str(page)] = self.ran.get(str(page), 0) + 1
        if nextitem is not None and nextitem.parent is item.parent:
            return  # more cells of this page to come
        try:
            self._cache(item, page)
        finally:  # whatever happened to it, the page is done: a build waiting for it goes on
            marker = _done_marker(str(page))
            if marker is not None:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()

    def _cache(self, item, page: Path) -> None:
        if str(page) in self.failed:
            return
        nb = item.parent.nb
        if self.ran.get(str(page)) != sum(1 for c in nb.cells if c.cell_type == "code"):
            return
        try:
            from jupyter_cache import get_cache
            from jupyter_cache.base import CacheBundleIn

            get_cache(str(BOOK_CACHE)).cache_notebook_bundle(
                CacheBundleIn(nb, str(page), data={"source": "nbval"}), check_validity=False, overwrite=True)
        except Exception as err:  # only an optimisation: the build then executes the page itself
            print(f"\n(book cache: {page.name} not cached: {err})")


def register(config) -> None:
    """Install the plugin (conftest.py calls this from pytest_configure)."""
    config.pluginmanager.register(_BookPagesIntoCache(), "book-pages-into-cache")
