"""The grading wing's shape is checked, not hoped for: its layers and the absence of import
cycles (import-linter, ``.importlinter``), docs/GRADING.md's table of the pipeline's stages
against the stages ``grade`` runs, and the chain of frozen results the stages hand on."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import shutil
import subprocess
import sys
import textwrap
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder.judge.worker import Outcome
from autograder.pipeline import chain, run, stages
from autograder.pipeline.collect import Entry
from autograder.pipeline.intake import Submission
from autograder.pipeline.results import Report, Result
from conftest import ROOT

LINT = Path(sys.executable).parent / "lint-imports"


def _lint(where: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=where, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(LINT.parent), "PYTHONPATH": str(where)})


def test_the_layers_hold_and_nothing_imports_in_a_cycle():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 kept, 0 broken" in proc.stdout


def test_an_upward_import_or_a_cycle_is_caught(tmp_path):
    """The same contracts on a copy of the packages in which a backend imports the pipeline (an
    upward import, and a cycle): both contracts break."""
    for package in ("autograder", "coursekit"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path)
    local = tmp_path / "autograder" / "backends" / "local.py"
    local.write_text(local.read_text() + "\n\ndef _upward():\n    from autograder.pipeline import stages  # noqa\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0
    assert "layered" in proc.stdout and "BROKEN" in proc.stdout and "autograder.backends.local" in proc.stdout


def stages_run() -> list:
    """The stage functions ``grade`` runs, in the order its code calls them (``run.run_stages``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(run.run_stages)))
    calls = sorted((node.lineno, node.col_offset, node.func.attr) for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and isinstance(node.func.value, ast.Name) and node.func.value.id == "stages")
    found = [getattr(stages, name) for _, _, name in calls]
    return [f for f in found if list(inspect.signature(f).parameters)[:1] == ["ctx"]]  # not the helpers


def test_grade_runs_its_stages_through_run_stages():
    assert "run_stages(" in inspect.getsource(run.grade)
    assert [f.__name__ for f in stages_run()] == ["collect", "read", "screen", "prepare", "judge", "commit",
                                                  "export"]


def test_the_benchmarks_stage_clock_times_every_stage_grade_runs(monkeypatch):
    """benchmarks/grading_profile.py's breakdown wraps exactly the stages run_stages calls, and puts them back."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from grading_profile import _StageClock

    before = stages_run()
    assert list(_StageClock.NAMES) == [f.__name__ for f in before]
    with _StageClock().installed():
        assert all(getattr(stages, f.__name__) is not f for f in before)
    assert stages_run() == before


def test_the_documented_pipeline_is_the_one_that_runs():
    """docs/GRADING.md lists the stages in the order grade() runs them, each with the type of its
    result (the stage's return annotation) first in its row, and every file it names exists."""
    text = (ROOT / "docs" / "GRADING.md").read_text()
    section = text[text.index("## The pipeline"):]
    section = section[:section.index("\n## ", 5)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    documented = [(row.split("|")[1].strip(), re.match(r"\s*`(\w+)`", row.split("|")[3])) for row in rows]
    ran = stages_run()
    assert [name for name, _ in documented] == [stage.__name__ for stage in ran]
    assert [m.group(1) if m else None for _, m in documented] == \
        [typing.get_type_hints(stage)["return"].__name__ for stage in ran]
    named = re.findall(r"`(autograder/[\w/.-]+\.py)", section)
    assert named and all((ROOT / path).is_file() for path in named), [p for p in named if not (ROOT / p).is_file()]


def test_each_stage_takes_the_result_of_the_one_before():
    ran = stages_run()
    hints = [typing.get_type_hints(stage) for stage in ran]
    for before, (stage, hint) in zip([Path] + [h["return"] for h in hints], zip(ran, hints)):
        ctx, given = list(inspect.signature(stage).parameters)
        assert hint[ctx] is chain.RunContext and hint[given] is before, stage.__name__


def _placeholder(kind):
    """An instance of the dataclass ``kind``, every field None (only its shape matters here)."""
    return kind(**{f.name: None for f in dataclasses.fields(kind)})


@pytest.mark.parametrize("kind", [chain.RunContext, Submission, chain.Release]
                         + [typing.get_type_hints(stage)["return"] for stage in stages_run()[:-1]],
                         ids=lambda kind: kind.__name__)
def test_a_stage_result_cannot_be_changed(kind):
    """What one stage hands the next is frozen: no later stage can set a field of it, nor add one."""
    value = _placeholder(kind)
    field = dataclasses.fields(kind)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, "changed")
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        value.found_later = "something for a later stage"
    assert not hasattr(value, "__dict__")


@pytest.mark.parametrize("kind", [Outcome, Entry, Report, Result], ids=lambda kind: kind.__name__)
def test_what_judge_collect_and_export_hand_on_cannot_be_changed(kind):
    """The judge's ``Outcome``, collect's ``Entry`` and the export's ``Report`` and ``Result`` are
    frozen too: each is built with its final values (a backend that learns more makes a copy)."""
    value = _placeholder(kind)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, dataclasses.fields(kind)[0].name, "changed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.found_later = "something for a later stage"


def test_screen_refuses_with_copies_and_leaves_what_it_was_given():
    """A student off the roster is refused in screen's result; read's result still says what it read."""
    ctx = SimpleNamespace(assignment="attention", paths=SimpleNamespace(course=ROOT),
                          course=SimpleNamespace(ids=["attention"]), roster={"ann": {}}, add_students=False)
    nb = {"cells": []}
    read = chain.Submissions((Submission("ann", "ann_attention.ipynb", nb=nb),
                              Submission("bob", "bob_attention.ipynb", nb=nb)), "fingerprint", None)
    screened = stages.screen(ctx, read)
    assert [(s.student_id, s.error, s.nb) for s in read.submissions] == [("ann", None, nb), ("bob", None, nb)]
    assert screened.submissions[0] is read.submissions[0]
    assert screened.submissions[1].nb is None and "not on the class roster" in screened.submissions[1].error
    assert screened.added == () and screened.fingerprint == "fingerprint"
