"""Every path of a grading folder, in one place (in the spirit of nbgrader's
``CourseDirectory.format_path``).

A grading folder (``grading/`` of the checkout unless ``--grading-dir`` says otherwise) holds:

* the gradebook: ``gradebook.db`` (SQLite), or the database named in ``gradebook.url``;
* nbgrader's step folders ``submitted/``, ``autograded/``, ``feedback/`` (``<step>/<student>/<assignment>/``);
* ``release/``: the assignment as released for grading;
* ``reports/<assignment>/``: grades.csv, canvas.csv, moodle.csv, plots and ``feedback/<student>.html``;
* ``collected/<assignment>/``: the notebooks taken from the last LMS download, and its report;
* ``class/roster.csv``: a copy of the class roster kept in the gradebook;
* ``history/<run>/``: what each run replaced (graded notebooks and feedback pages), for ``undo``, and
  while a change of the record is under way its staged files and journal (``records.files``);
* ``runs/<run>/``: a run's private folder while it works; nothing in it is part of the record.
"""
from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from autograder import GRADING_DIR, ROOT

# Imports inside functions: nbgrader is imported only where a gradebook is made (the command line
# imports this module for its paths without it).

URL_FILE = "gradebook.url"
STEPS = ("submitted", "autograded", "feedback")


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` by a rename: a reader sees the old file or the new one, whole (and a
    write that fails, a full disk, leaves the old one and no half-written file beside it)."""
    tmp = path.with_name(f".{path.name}.new-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sqlite_path(url: str) -> Path | None:
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None


@dataclass(frozen=True)
class GradingPaths:
    root: Path                 # the grading folder
    course: Path = ROOT        # the course checkout (nbgrader's course directory)

    @classmethod
    def at(cls, grading_dir: str | Path | None = None, course: Path = ROOT) -> "GradingPaths":
        return cls(Path(grading_dir or Path(course) / GRADING_DIR).resolve(), Path(course))

    # the gradebook --------------------------------------------------------------------
    @property
    def gradebook_url(self) -> str:
        """The database of this folder's gradebook: the URL ``grade --db-url`` recorded, else SQLite."""
        recorded = self.root / URL_FILE
        if recorded.exists():
            return recorded.read_text().strip()
        return f"sqlite:///{self.root / 'gradebook.db'}"

    @property
    def recorded_url_file(self) -> Path | None:
        """The file holding the database an earlier ``grade --db-url`` recorded, if there is one."""
        recorded = self.root / URL_FILE
        return recorded if recorded.exists() else None

    def record_url(self, url: str | None) -> str:
        """Record ``url`` (when given) as this folder's gradebook; returns the URL in use."""
        recorded = self.root / URL_FILE
        if url and not (recorded.exists() and recorded.read_text().strip() == url.strip()):
            # written beside it and renamed into place: another command of the folder reading it
            # meanwhile (a run waiting for the writer lock records its --db-url too) finds the old
            # URL or the new one, whole, never an empty file
            self.root.mkdir(parents=True, exist_ok=True)
            write_atomic(recorded, url.strip() + "\n")
        return self.gradebook_url

    # folders --------------------------------------------------------------------------
    def step(self, step: str, student: str = "", assignment: str = "") -> Path:
        """nbgrader's folder of ``step`` (submitted, autograded, feedback) for a student's assignment."""
        return self.root / step / student / assignment if student else self.root / step

    @property
    def release(self) -> Path:
        return self.root / "release"

    def reports(self, assignment: str) -> Path:
        return self.root / "reports" / assignment

    def collected(self, assignment: str) -> Path:
        return self.root / "collected" / assignment

    @property
    def roster_copy(self) -> Path:
        return self.root / "class" / "roster.csv"

    def archive(self, run_id: str) -> Path:
        return self.root / "history" / run_id

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def nbgrader_flags(self, gradebook_url: str | None = None, steps: Path | None = None) -> list[str]:
        """nbgrader's command-line settings for this folder's gradebook and step folders (or for a
        worker's own: ``steps`` is then its folder, and ``gradebook_url`` its gradebook)."""
        steps = Path(steps) if steps is not None else self.root
        return [f"--CourseDirectory.db_url={gradebook_url or self.gradebook_url}",
                *[f"--CourseDirectory.{step}_directory={steps / step}" for step in STEPS]]


_REVISION = re.compile(r"""^(down_revision|revision)\s*=\s*['"]?([0-9a-f]+|None)['"]?\s*$""", re.M)


@functools.lru_cache(maxsize=None)
def alembic_head() -> str:
    """The schema revision nbgrader stamps a new gradebook with: the one revision of its migration
    scripts that no other revises.  nbgrader asks a subprocess (``alembic heads``: 3-4 s of a slow
    CPU, at every new gradebook, in every grading folder); the scripts say it in two lines each."""
    from nbgrader.dbutil import ALEMBIC_DIR

    revised, revisions = set(), set()
    for script in Path(ALEMBIC_DIR, "versions").glob("*.py"):
        found = dict(_REVISION.findall(script.read_text()))
        revisions.add(found["revision"])
        revised.add(found.get("down_revision"))
    heads = revisions - revised
    if len(heads) != 1:  # a branched history: let alembic decide, as nbgrader does
        raise LookupError(f"nbgrader's migrations have {len(heads)} heads: {sorted(heads)}")
    return heads.pop()


def read_alembic_head_in_process() -> None:
    """Make nbgrader take a new gradebook's schema revision from ``alembic_head`` (called where
    nbgrader's configuration is made: the course's nbgrader_config.py, the grader's processes),
    falling back to nbgrader's own way if the scripts cannot be read."""
    import nbgrader.api

    original = getattr(nbgrader.api.get_alembic_version, "__wrapped_original__", nbgrader.api.get_alembic_version)

    def get_alembic_version() -> str:
        try:
            return alembic_head()
        except (LookupError, KeyError, OSError):
            return original()

    get_alembic_version.__wrapped_original__ = original
    nbgrader.api.get_alembic_version = get_alembic_version


def nbgrader_env(env: dict | None = None) -> dict:
    """The environment with this Python's bin folder first on PATH: nbgrader runs ``alembic``
    from there even when the virtual environment is not activated."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env
