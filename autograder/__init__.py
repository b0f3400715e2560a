"""The course's grading tools: nbgrader configuration and ``python -m autograder``.

The repository root is the nbgrader course directory:
``solutions/`` is nbgrader's source directory, ``exercises/`` its release
directory, and everything a grading run produces (submitted, autograded,
feedback, the gradebook, reports) lives under the git-ignored ``grading/``.
"""
import sys
from pathlib import Path

# nbformat imports jsonschema, which imports rfc3987_syntax when it is installed; that package
# builds its IRI grammar at import time, about 1.5 s of CPU in every process that grades
# (python-jsonschema/jsonschema#1521): the local workers, each Dask worker, the instructor's.
# Grading never validates IRIs: without the package jsonschema has no checker for "iri".
# Here, so that it holds before any module of the package imports nbformat.
sys.modules.setdefault("rfc3987_syntax", None)

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = "solutions"
RELEASE_DIR = "exercises"
GRADING_DIR = "grading"


def assignments(root: Path = ROOT) -> list[str]:
    """Assignment ids: the folders of solutions/ that hold a notebook."""
    src = root / SOURCE_DIR
    return sorted(p.name for p in src.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
