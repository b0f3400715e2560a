"""Regenerate the student notebooks in exercises/ from the sources in solutions/."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from . import RELEASE_DIR, ROOT, assignments

CHECKS_DIR = ROOT / "coursekit" / "checks"
_DOC_RE = re.compile(r'^\s*"""(.*?)"""', re.S)
_Q_RE = re.compile(r"^\s*(Q\d+)\b")


class ReleaseError(RuntimeError):
    pass


def normalize_notebook(path: Path) -> None:
    """Strip what must never be committed: outputs and execution counts.

    nbformat writes keys sorted with a fixed indent, so the same input gives the
    same bytes."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)


def checks_spec(nb, assignment: str, notebook: str) -> dict:
    """What the students' self-check needs, taken from the *released* notebook:
    visible test code, and for hidden tests only their one-line description."""
    tests, code_cells, counting = [], 0, False
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and "handin_report(" in cell.source:
            counting = False
        # test cells are not counted: at grading time they run in the grader, not the kernel
        if counting and cell.cell_type == "code" and not (meta.get("grade") and not meta.get("solution")):
            code_cells += 1
        if meta.get("grade_id") == "setup":
            counting = True
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        doc = _DOC_RE.match(cell.source)
        q = _Q_RE.match(doc.group(1)) if doc else None
        if not q:
            raise ReleaseError(f"{assignment}: test cell {meta.get('grade_id')} must start with a "
                               'one-line docstring that names its question, e.g. """Q1 visible: ..."""')
        body = cell.source[doc.end():].strip()
        tests.append({"grade_id": meta["grade_id"], "question": q.group(1).upper(),
                      "description": doc.group(1).strip(), "points": meta.get("points", 0),
                      "hidden": not body, "source": cell.source if body else ""})
    return {"assignment": assignment, "notebook": notebook, "tests": tests,
            "code_cells_between_setup_and_handin": code_cells}


def nbgrader(args: list[str], root: Path = ROOT, grading_dir: Path | None = None,
             timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    """Run one nbgrader command in the course directory, with optional overrides."""
    from .gradebook import db_url

    cmd = [sys.executable, "-m", "nbgrader", *args]
    if grading_dir is not None:
        g = Path(grading_dir)
        g.mkdir(parents=True, exist_ok=True)  # sqlite cannot create the folder
        cmd += [f"--CourseDirectory.db_url={db_url(g)}",
                f"--CourseDirectory.submitted_directory={g / 'submitted'}",
                f"--CourseDirectory.autograded_directory={g / 'autograded'}",
                f"--CourseDirectory.feedback_directory={g / 'feedback'}"]
    kw.setdefault("env", tool_env())
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout, **kw)


def tool_env(env: dict | None = None) -> dict:
    """The environment with this Python's bin folder first on PATH: nbgrader runs
    ``alembic`` from there even when the virtual environment is not activated."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def release(names: list[str] | None = None, out_dir: Path | None = None,
            grading_dir: Path | None = None, root: Path = ROOT,
            checks_dir: Path | None = None) -> list[Path]:
    """Generate student notebooks for ``names`` (default: all) into ``out_dir``
    (default: exercises/) and their self-check specs into ``checks_dir``
    (default: coursekit/checks/, or out_dir/.checks when out_dir is given).
    Returns the files written."""
    names = names or assignments(root)
    if out_dir is None:  # the real release: first every setup cell, link and table from course.yml
        from .stamp import stamp

        stamp(root)
    if checks_dir is None:
        checks_dir = Path(out_dir) / ".checks" if out_dir else root / "coursekit" / "checks"
    out_dir = Path(out_dir) if out_dir else root / RELEASE_DIR
    written = []
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        # nbgrader records the assignment in a gradebook; keep that one private
        # unless the caller grades with it.
        gdir = Path(grading_dir) if grading_dir else Path(tmp) / "grading"
        for name in names:
            stage = Path(tmp) / "stage"
            shutil.rmtree(stage, ignore_errors=True)
            proc = nbgrader(["generate_assignment", name, "--force",
                             f"--CourseDirectory.release_directory={stage}"],
                            root=root, grading_dir=gdir)
            if proc.returncode != 0 and "there are submissions associated with it" in proc.stderr:
                raise ReleaseError(
                    f"the source of '{name}' gained or lost cells after submissions were graded with it; "
                    f"grade into a fresh folder (--grading-dir) or move the gradebook of {gdir} away")
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
                raise ReleaseError(f"nbgrader generate_assignment {name} failed:\n" + "\n".join(tail))
            target = out_dir / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(stage / name, target)
            nb_paths = sorted(target.glob("*.ipynb"))
            for nb_path in nb_paths:
                normalize_notebook(nb_path)
                written.append(nb_path)
            spec = checks_spec(nbformat.read(nb_paths[0], as_version=4), name, nb_paths[0].name)
            Path(checks_dir).mkdir(parents=True, exist_ok=True)
            spec_path = Path(checks_dir) / f"{name}.json"
            spec_path.write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
            written.append(spec_path)
    return written
