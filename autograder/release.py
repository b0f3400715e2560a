"""Regenerate the student notebooks in exercises/ from the sources in solutions/."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from . import RELEASE_DIR, ROOT, assignments


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


def nbgrader(args: list[str], root: Path = ROOT, grading_dir: Path | None = None,
             timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    """Run one nbgrader command in the course directory, with optional overrides."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    if grading_dir is not None:
        g = Path(grading_dir)
        g.mkdir(parents=True, exist_ok=True)  # sqlite cannot create the folder
        cmd += [f"--CourseDirectory.db_url=sqlite:///{g / 'gradebook.db'}",
                f"--CourseDirectory.submitted_directory={g / 'submitted'}",
                f"--CourseDirectory.autograded_directory={g / 'autograded'}",
                f"--CourseDirectory.feedback_directory={g / 'feedback'}"]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout, **kw)


def release(names: list[str] | None = None, out_dir: Path | None = None,
            grading_dir: Path | None = None, root: Path = ROOT) -> list[Path]:
    """Generate student notebooks for ``names`` (default: all) into ``out_dir``
    (default: exercises/). Returns the notebooks written."""
    names = names or assignments(root)
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
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
                raise ReleaseError(f"nbgrader generate_assignment {name} failed:\n" + "\n".join(tail))
            target = out_dir / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(stage / name, target)
            for nb_path in sorted(target.glob("*.ipynb")):
                normalize_notebook(nb_path)
                written.append(nb_path)
    return written
