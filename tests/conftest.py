"""Shared helpers for the test suite."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
        if meta.get("solution") and not SOLUTION_RE.search(src):
            regions.append(src)  # a whole-cell answer (e.g. a mark scheme) is secret too
        for region in regions:
            secret.update(ln.strip() for ln in region.splitlines() if len(ln.strip()) >= min_len)
        rest = HIDDEN_RE.sub("", SOLUTION_RE.sub("", src))
        public.update(ln.strip() for ln in rest.splitlines())
    return secret - public


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


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)


@pytest.fixture(scope="session")
def built_book():
    """Build the book as the README's build command does (cached execution)."""
    jb = Path(sys.executable).parent / "jupyter-book"
    proc = run([str(jb), "build", ".", "--warningiserror", "--keep-going"])
    assert proc.returncode == 0, "book build failed:\n" + (proc.stdout + proc.stderr)[-4000:]
    return ROOT / "_build" / "html"
