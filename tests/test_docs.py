"""Docs that cannot go stale: every file or folder of this repository that README.md or a page
of docs/ names (in `backticks` or as a link) exists (issue 36, item 7)."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# top-level folders and files a path may start with; what the build, grading or a venv writes is not checked
TRACKED_TOPS = {"book", "tests", "docs", "autograder", "coursekit", "scripts", "benchmarks", "instructor", "data",
                "solutions", "exercises", ".ci", "course.yml", "_toc.yml", "_config.yml", "requirements.txt",
                "pyproject.toml", "nbgrader_config.py", ".importlinter", "README.md"}
_CANDIDATE = re.compile(r"`([^`\s]+)`|\]\(([^)\s#]+)(?:#[^)]*)?\)")


def named_paths(text: str) -> set[str]:
    out = set()
    for a, b in _CANDIDATE.findall(text):
        token = (a or b).rstrip(".,:;")
        if token.startswith(("http", "mailto:")) or any(ch in token for ch in "<>*{}$|()=\"'"):
            continue
        token = token.removeprefix("./").split("::", 1)[0]
        if token.split("/", 1)[0] in TRACKED_TOPS and ("/" in token or token in TRACKED_TOPS):
            out.add(token.rstrip("/"))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_doc_names_exists(doc):
    """A renamed or removed file leaves no dangling name in README.md or docs/."""
    text = doc.read_text(encoding="utf-8")
    base = ROOT if doc.name == "README.md" else doc.parent
    missing = sorted(p for p in named_paths(text) if not (ROOT / p).exists() and not (base / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_a_dangling_name_is_caught():
    assert named_paths("see `tests/no_such_test.py` and [x](docs/GRADING.md#stages)") == \
        {"tests/no_such_test.py", "docs/GRADING.md"}
