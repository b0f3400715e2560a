"""Every common mistake of tests/mistakes_catalogue.py, planted in the reference answer, is
flagged by the self-check before hand-in, with a message that names it; the reference answers
pass every check; mistakes only a hidden test can catch are said to be so, and are.

The notebooks run in this process (tests/notebook_run.py): each assignment's filled exercise
once, then only the planted cell and the cells that use it, and check() on the namespace."""
from __future__ import annotations

import re

import pytest

from conftest import HIDDEN_RE, ROOT, read_nb
from mistakes_catalogue import CAUGHT, HIDDEN_ONLY
from notebook_run import NotebookRun

_RUNS: dict[str, NotebookRun] = {}


def notebook(name: str) -> NotebookRun:
    if name not in _RUNS:
        _RUNS[name] = NotebookRun(name)
    return _RUNS[name]


def planted(run: NotebookRun, cell: str, edits) -> str:
    src = run.answer_source(cell)
    for old, new in edits:
        assert old in src, f"{run.name}/{cell}: the reference answer no longer contains {old!r}"
        src = src.replace(old, new)
    return src


def replacements(run: NotebookRun, mistake) -> dict[str, str]:
    return {mistake.cell: planted(run, mistake.cell, mistake.edits)}


def blocks(text: str) -> dict[str, list[str]]:
    """check()'s output split by question: {"Q2": [its lines]}."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^(Q\d+)\b", line)
        if m:
            current = out.setdefault(m.group(1), [])
        elif current is not None and line.startswith("  "):
            current.append(line.strip())
    return out


def flagged(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith("[FAIL]") or ln.startswith("[WARN]")]


ASSIGNMENTS = sorted({m.assignment for m in CAUGHT + HIDDEN_ONLY})


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_reference_answers_pass_every_check(name):
    out = notebook(name).check()
    assert "[FAIL]" not in out and "[WARN]" not in out, out
    assert re.search(r"(All \d+ visible tests passed|The visible test passed)", out), out


@pytest.mark.parametrize("mistake", CAUGHT, ids=lambda m: m.id)
def test_planted_mistake_is_flagged(mistake):
    run = notebook(mistake.assignment)
    out = run.check(mistake.question, replace=replacements(run, mistake))
    lines = blocks(out).get(mistake.question, [])
    hits = [ln for ln in flagged(lines) if mistake.expect in ln]
    assert hits, f"{mistake.id}: no message with {mistake.expect!r}:\n{out}"
    mark = "[FAIL]" if mistake.kind == "fail" else "[WARN]"
    assert hits[0].startswith(mark), f"{mistake.id}: expected {mark}, got {hits[0]}"
    # the message that names the mistake is the first one the question shows
    assert flagged(lines)[0] == hits[0], f"{mistake.id}: another message comes first:\n{out}"


def hidden_tests(name: str, question: str) -> list[tuple[str, str]]:
    nb = read_nb(ROOT / "solutions" / name / f"{name}.ipynb")
    out = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution") \
                and re.match(rf'\s*"""{question} hidden', cell.source):
            out.append((meta["grade_id"], HIDDEN_RE.search(cell.source).group(1)))
    return out


def run_hidden_tests(ns: dict, name: str, question: str) -> dict[str, tuple[str, int] | None]:
    """Each hidden test of the question run in ``ns``: None when it passes, else the exception's
    type and the line of the hidden test where it failed."""
    import contextlib
    import io
    import traceback

    out = {}
    for grade_id, code in hidden_tests(name, question):
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                exec(compile(code, f"<hidden {grade_id}>", "exec"), ns)
            out[grade_id] = None
        except Exception as exc:  # noqa: BLE001 - a failing hidden test is what we look for
            lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == f"<hidden {grade_id}>"]
            out[grade_id] = (type(exc).__name__, lines[-1] if lines else 0)
    return out


@pytest.mark.parametrize("mistake", HIDDEN_ONLY, ids=lambda m: m.id)
def test_hidden_only_mistake_passes_the_visible_checks_and_fails_a_hidden_test(mistake):
    run = notebook(mistake.assignment)
    repl = replacements(run, mistake)
    out = run.check(mistake.question, replace=repl)
    lines = blocks(out).get(mistake.question, [])
    assert not flagged(lines), f"{mistake.id} is flagged visibly; move it to CAUGHT:\n{out}"
    # a hidden test fails on an assert (or an error of the answer) before the point where it
    # stops on the reference answer (some hidden tests need cells this run skips, e.g. the
    # course GPT of concepts: on the reference they get further, or pass)
    reference = run_hidden_tests(run.namespace(), mistake.assignment, mistake.question)
    planted_ = run_hidden_tests(run.namespace(repl), mistake.assignment, mistake.question)
    caught = [gid for gid, res in planted_.items()
              if res is not None and res[0] != "NameError" and (reference[gid] is None or reference[gid][1] > res[1])]
    assert caught, f"{mistake.id}: no hidden test of {mistake.question} fails on it: {planted_} (reference: {reference})"


def test_every_mistake_is_described_in_the_docs():
    doc = (ROOT / "docs" / "MISTAKES.md").read_text()
    missing = [m.id for m in CAUGHT + HIDDEN_ONLY if f"`{m.name}`" not in doc]
    assert not missing, f"docs/MISTAKES.md does not describe: {missing}"
