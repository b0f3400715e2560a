"""The grading wing's shape is checked, not hoped for: its layers and the absence of import
cycles (import-linter, ``.importlinter``), and docs/GRADING.md's table of the pipeline's stages
against the stages ``grade`` runs."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from autograder.pipeline.run import STAGES
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


def test_the_documented_pipeline_is_the_one_that_runs():
    """docs/GRADING.md lists the stages in the order grade() runs them, and every file it
    names exists."""
    text = (ROOT / "docs" / "GRADING.md").read_text()
    section = text[text.index("## The pipeline"):]
    section = section[:section.index("\n## ", 5)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    documented = [row.split("|")[1].strip() for row in rows]
    assert documented == [stage.__name__ for stage in STAGES]
    named = re.findall(r"`(autograder/[\w/.-]+\.py)", section)
    assert named and all((ROOT / path).is_file() for path in named), [p for p in named if not (ROOT / p).is_file()]
