"""The course's grading tools: nbgrader configuration and ``python -m autograder``.

The repository root is the nbgrader course directory:
``solutions/`` is nbgrader's source directory, ``exercises/`` its release
directory, and everything a grading run produces (submitted, autograded,
feedback, the gradebook, reports) lives under the git-ignored ``grading/``.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = "solutions"
RELEASE_DIR = "exercises"
GRADING_DIR = "grading"


def assignments(root: Path = ROOT) -> list[str]:
    """Assignment ids: the folders of solutions/ that hold a notebook."""
    src = root / SOURCE_DIR
    return sorted(p.name for p in src.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
