"""One execution per book page in the test suite: nbval runs every page (book/ comes first in
testpaths); when all cells of a page pass, its outputs go into the book's execution cache, so
that a book build later in the same session finds the page there instead of running it a
second time.  A page that failed or was only partly run is not cached, and the build then
executes it itself as usual.  Used by this repository's tests and by the published student
course's (``python -m autograder publish`` copies this file)."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK_CACHE = ROOT / "_build" / ".jupyter_cache"  # execute_notebooks: cache in _config.yml


class _BookPagesIntoCache:
    def __init__(self):
        self.failed: set[str] = set()
        self.ran: dict[str, int] = {}
        self.cached: set[str] = set()  # pages whose nbval run went into the cache in this session

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
        nb = item.parent.nb
        n_code = sum(1 for c in nb.cells if c.cell_type == "code")
        if str(page) in self.failed or self.ran.get(str(page)) != n_code:
            return
        try:
            from jupyter_cache import get_cache
            from jupyter_cache.base import CacheBundleIn

            get_cache(str(BOOK_CACHE)).cache_notebook_bundle(
                CacheBundleIn(nb, str(page), data={"source": "nbval"}), check_validity=False, overwrite=True)
            self.cached.add(str(page))
        except Exception as err:  # only an optimisation: the build then executes the page itself
            print(f"\n(book cache: {page.name} not cached: {err})")


PLUGIN = "book-pages-into-cache"


def built_from_cache(page: Path) -> bool | None:
    """Whether the execution cache's record for ``page`` as it is now came from nbval (True), from an
    execution of its own by the book build (False), or there is none (None)."""
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(str(BOOK_CACHE))
    try:
        record = cache.match_cache_notebook(nbformat.read(page, as_version=4))
    except KeyError:
        return None
    return record.data.get("source") == "nbval"


def register(config) -> None:
    """Install the plugin (conftest.py calls this from pytest_configure)."""
    config.pluginmanager.register(_BookPagesIntoCache(), PLUGIN)
