"""Where a grading folder's gradebook lives.

By default it is the SQLite file ``<grading>/gradebook.db``.  ``grade --db-url URL`` (for
example ``postgresql://grader@dbhost/course``, as nbgrader deployments on JupyterHub use)
records another database in ``<grading>/gradebook.url``; every later command on that folder
(``grade``, ``handgrade``, ``export``) then reads and writes that one.
"""
from __future__ import annotations

from pathlib import Path

URL_FILE = "gradebook.url"


def db_url(grading: Path) -> str:
    """The database URL of the grading folder's gradebook."""
    recorded = Path(grading) / URL_FILE
    if recorded.exists():
        return recorded.read_text().strip()
    return f"sqlite:///{Path(grading) / 'gradebook.db'}"


def use_db_url(grading: Path, url: str | None) -> str:
    """Record ``url`` (when given) as the folder's gradebook; returns the URL in use."""
    if url:
        Path(grading).mkdir(parents=True, exist_ok=True)
        (Path(grading) / URL_FILE).write_text(url.strip() + "\n")
    return db_url(grading)


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:")


def sqlite_path(url: str) -> Path | None:
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None


def has_assignment(url: str, assignment: str) -> bool:
    """True when the gradebook exists and knows ``assignment`` (it was released into it)."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return False
    from nbgrader.api import Gradebook, MissingEntry

    try:
        with Gradebook(url) as gb:
            gb.find_assignment(assignment)
    except MissingEntry:
        return False
    except Exception:  # noqa: BLE001 - an unreachable database: not released there
        return False
    return True


def forget(url: str, assignment: str, students: list[str]) -> None:
    """Remove these students' submissions of ``assignment`` from the gradebook.

    Used for submissions that could not be graded this time: a grade left from an earlier run
    (or the partial rows of a failed run in a shared database) must not stand for the new file.
    """
    from nbgrader.api import Gradebook, MissingEntry

    if not students:
        return
    with Gradebook(url) as gb:
        for sid in students:
            try:
                gb.remove_submission(assignment, sid)
            except MissingEntry:
                pass


class GradebookUnreachable(RuntimeError):
    """The gradebook's database cannot be opened (one line, password hidden)."""


def shown(url: str) -> str:
    """``url`` with its password hidden, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy can parse: show it as it is
        return url


def check_reachable(url: str) -> None:
    """Open a connection to the gradebook's database once; raise GradebookUnreachable with one
    line that names it when that fails (a SQLite file is created on first use: always fine)."""
    if is_sqlite(url):
        return
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - driver missing, refused, bad password, no database
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        raise GradebookUnreachable(f"cannot open the gradebook database {shown(url)}: "
                                   f"{type(exc).__name__}: {first[0] if first else ''}"[:300]) from None
