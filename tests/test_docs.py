"""Docs that cannot go stale: every file or folder of this repository that README.md or a page
of docs/ names (in `backticks` or as a link) exists (issue 36, item 7)."""
from __future__ import annotations

import re
from pathlib import Path

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


# ----------------------------------------------------------------------------- the record's kinds table

KINDS_TABLE = "| kind | tests | SQLite | PostgreSQL | Dask |"
# what makes a test run on PostgreSQL (tests/pg.py's ON_BOTH, or a fixture of the server) and on Dask
PG_FIXTURES = {"db", "url", "postgres", "postgres_graded"}
DASK_FIXTURES = {"dask_cluster"}


def kinds_table(text: str) -> list[dict]:
    """The rows of docs/GRADING.md's table of the record's kinds: the tests each names and its marks."""
    lines = text.splitlines()
    start = lines.index(KINDS_TABLE)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        kind, tests, sqlite, pg, dask = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append({"kind": kind, "tests": re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", tests),
                     "sqlite": sqlite == "yes", "postgresql": pg == "yes", "dask": dask == "yes"})
    return rows


def functions_of(module: Path) -> dict:
    """The test functions a module defines: name -> (decorator names, parameter names, source)."""
    import ast

    source = module.read_text()
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            decorators = {ast.unparse(d) for d in node.decorator_list}
            out[node.name] = (decorators, {a.arg for a in node.args.args}, ast.get_source_segment(source, node))
    return out


def _fixture_args(module: Path, names: set) -> set:
    """The fixtures of ``module`` that take one of ``names`` (directly): they carry it to a test."""
    import ast

    out = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
            if {a.arg for a in node.args.args} & names:
                out.add(node.name)
    return out


def kinds_table_problems(text: str) -> list[str]:
    """What in the kinds table is not so: a test that does not exist, a PostgreSQL or Dask mark
    that none of its row's tests bears out (or a test that does, in a row marked no)."""
    rows = kinds_table(text)
    problems = [] if len(rows) >= 7 and all(row["tests"] and row["sqlite"] for row in rows) else [f"rows: {rows}"]
    for row in rows:
        on_pg = on_dask = False
        for path, name in row["tests"]:
            module = ROOT / path
            if not module.is_file():
                problems.append(f"{row['kind']}: {path} does not exist")
                continue
            found = functions_of(module)
            if name not in found:
                problems.append(f"{row['kind']}: {path} has no test {name}")
                continue
            decorators, params, source = found[name]
            # ON_BOTH parametrises the db that a fixture of the module takes (the test may not name db itself)
            pg_carriers = PG_FIXTURES | _fixture_args(module, {"db", "postgres"})
            on_pg |= "ON_BOTH" in decorators or bool(params & pg_carriers)
            on_dask |= bool(params & DASK_FIXTURES) or "LocalCluster" in source
        if on_pg != row["postgresql"]:
            problems.append(f"{row['kind']}: PostgreSQL is marked {row['postgresql']}, its tests say {on_pg}")
        if on_dask != row["dask"]:
            problems.append(f"{row['kind']}: Dask is marked {row['dask']}, its tests say {on_dask}")
    return problems


def test_every_test_the_kinds_table_names_exists_and_runs_where_it_says():
    assert kinds_table_problems((ROOT / "docs" / "GRADING.md").read_text()) == []


def test_the_kinds_table_check_catches_a_test_that_is_gone_and_a_wrong_mark():
    text = (ROOT / "docs" / "GRADING.md").read_text()
    gone = text.replace("test_a_second_tab_never_overwrites_newer_points`", "test_a_second_tab_that_is_not_there`", 1)
    assert any("has no test test_a_second_tab_that_is_not_there" in p for p in kinds_table_problems(gone))
    row = next(line for line in text.splitlines() if line.startswith("| 6 "))
    wrong = text.replace(row, row.replace("| yes | yes | no (no workers) |", "| yes | yes | yes |"))
    assert any(p.startswith("6 ") and "Dask is marked True" in p for p in kinds_table_problems(wrong))
