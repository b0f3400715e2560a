"""Where a grading folder's gradebook lives.

By default it is the SQLite file ``<grading>/gradebook.db``.  ``grade --db-url URL`` (for
example ``postgresql://grader@dbhost/course``, as nbgrader deployments on JupyterHub use)
records another database in ``<grading>/gradebook.url``; every later command on that folder
(``grade``, ``handgrade``, ``export``) then reads and writes that one.
"""
from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

from autograder.course.paths import GradingPaths, nbgrader_env, read_alembic_head_in_process, sqlite_path
from autograder.course.settings import environ

# Imports inside functions: nbgrader.api and SQLAlchemy are imported where a database is opened: the command
# line imports this module for its URL helpers without them.


def db_url(grading: Path) -> str:
    """The database URL of the grading folder's gradebook (``GradingPaths.gradebook_url``)."""
    return GradingPaths(Path(grading)).gradebook_url


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:")


def has_assignment(url: str, assignment: str) -> bool:
    """True when the gradebook exists and knows ``assignment`` (it was released into it).  A
    SQLite gradebook that is damaged raises GradebookDamaged (one line naming the file): it is
    not a gradebook where nothing was graded yet."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return False
    check_sqlite(url)
    from nbgrader.api import Gradebook, MissingEntry

    try:
        with Gradebook(url) as gb:
            gb.find_assignment(assignment)
    except MissingEntry:
        return False
    except Exception as exc:  # noqa: BLE001 - an unreachable database: not released there
        if path is not None:
            raise damaged(url, exc) from None
        return False
    return True


def damaged(url: str, exc: BaseException | str) -> GradebookUnreachable:
    """The one line for a gradebook that cannot be read: its file, and why (a SQLite file another
    command holds locked, or a database server that failed, is not called damaged)."""
    why = exc if isinstance(exc, str) else str(getattr(exc, "orig", None) or exc).strip().splitlines()
    why = why if isinstance(why, str) else (why[0] if why else type(exc).__name__)
    path = sqlite_path(url)
    if path is None:
        return GradebookUnreachable(f"the gradebook database {shown(url)} failed: {why}"[:500])
    if "locked" in why or "busy" in why:
        return GradebookUnreachable(f"the gradebook {path} is in use by another command ({why}); "
                                    "try again when it has finished"[:500])
    return GradebookDamaged(f"the gradebook {path} is damaged ({why}); restore it from a backup, or start "
                            "a new grading folder (--grading-dir)"[:500])


def check_sqlite(url: str) -> None:
    """A SQLite gradebook file that exists must open as a database with readable tables
    (GradebookDamaged otherwise); other databases are checked by ``check_reachable``."""
    path = sqlite_path(url)
    if path is None or not path.exists():
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            bad = conn.execute("PRAGMA quick_check(1)").fetchone()
    except sqlite3.Error as exc:
        raise damaged(url, exc) from None
    if bad and bad[0] != "ok":
        raise damaged(url, str(bad[0]))


def staging_copy(url: str, path: Path, assignment: str) -> Path:
    """A SQLite gradebook at ``path`` holding what grading workers need of ``url``'s: the
    assignment as released (with the same ids), so that the rows they write can go into the
    class record as they are.  A SQLite gradebook is copied whole; another database's release
    rows are copied table by table."""
    import sqlalchemy as sa
    from nbgrader.api import Base, Gradebook

    path = Path(path)
    source = sqlite_path(url)
    if source is not None:
        shutil.copy(source, path)
        return path
    read_alembic_head_in_process()
    with environ({"PATH": nbgrader_env()["PATH"]}), Gradebook(f"sqlite:///{path}"):  # nbgrader's schema (alembic)
        pass
    tables = Base.metadata.tables
    src, dst = sa.create_engine(url), sa.create_engine(f"sqlite:///{path}")
    try:
        with src.connect() as a, dst.begin() as b:
            assign = tables["assignment"]
            rows = [dict(r._mapping) for r in a.execute(sa.select(assign).where(assign.c.name == assignment))]
            aids = [r["id"] for r in rows]
            nbs = [dict(r._mapping) for r in a.execute(sa.select(tables["notebook"]).where(
                tables["notebook"].c.assignment_id.in_(aids)))]
            nb_ids = [r["id"] for r in nbs]
            cells = [dict(r._mapping) for r in a.execute(sa.select(tables["base_cell"]).where(
                tables["base_cell"].c.notebook_id.in_(nb_ids)))]
            cell_ids = [r["id"] for r in cells]
            course = [dict(r._mapping) for r in a.execute(sa.select(tables["course"]))]
            b.execute(sa.delete(tables["course"]))
            for name, values in (("course", course), ("assignment", rows), ("notebook", nbs), ("base_cell", cells)):
                if values:
                    b.execute(sa.insert(tables[name]), values)
            for name in ("grade_cells", "solution_cells", "task_cells"):
                values = [dict(r._mapping) for r in a.execute(sa.select(tables[name]).where(
                    tables[name].c.id.in_(cell_ids)))]
                if values:
                    b.execute(sa.insert(tables[name]), values)
            src_cells = [dict(r._mapping) for r in a.execute(sa.select(tables["source_cell"]).where(
                tables["source_cell"].c.notebook_id.in_(nb_ids)))]
            if src_cells:
                b.execute(sa.insert(tables["source_cell"]), src_cells)
    finally:
        src.dispose()
        dst.dispose()
    return path


class GradebookUnreachable(RuntimeError):
    """The gradebook's database cannot be opened (one line, password hidden)."""


class GradebookDamaged(GradebookUnreachable):
    """The gradebook's file (or a row of it) cannot be read: one line naming the file."""


def reused_url_note(grading) -> str | None:
    """One line when the folder's gradebook is a database an earlier ``--db-url`` recorded (it is
    reused without being named again), else None."""
    paths = GradingPaths(Path(grading))
    recorded = paths.recorded_url_file
    if recorded is None:
        return None
    return (f"gradebook: {shown(paths.gradebook_url)}, recorded in {recorded} by an earlier --db-url "
            "(give --db-url to use another)")


def replaced_url_note(grading, url: str | None) -> str | None:
    """One line when ``--db-url`` names another database than the one an earlier ``--db-url``
    recorded for the folder (the new one is recorded in its place), else None."""
    recorded = GradingPaths(Path(grading)).recorded_url_file
    if not url or recorded is None or recorded.read_text().strip() == url.strip():
        return None
    return (f"gradebook: {shown(url)} from --db-url, in place of {shown(recorded.read_text().strip())} "
            f"recorded in {recorded}")


def shown(url: str) -> str:
    """``url`` with its password hidden, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy can parse: show it as it is
        return url


def check_reachable(url: str) -> None:
    """Open a connection to the gradebook's database once; raise GradebookUnreachable with one
    line that names it when that fails (a SQLite file is created on first use: fine when it is
    not there; one that is there and damaged raises GradebookDamaged)."""
    if is_sqlite(url):
        check_sqlite(url)
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


def scores(url: str | Path, assignment: str, students: list[str]) -> dict:
    """student -> (score, max_score, {grade_id: (score, max_score)}) from the gradebook at
    ``url`` (a database URL, or the path of a SQLite file)."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    url = url if isinstance(url, str) and "://" in url else f"sqlite:///{url}"
    with Gradebook(url) as gb:
        for sid in students:
            try:
                sub = gb.find_submission(assignment, sid)
            except MissingEntry:
                continue
            tests = {g.name: (float(g.score), float(g.max_score)) for nb in sub.notebooks for g in nb.grades}
            out[sid] = (float(sub.score), float(sub.max_score), tests)
    return out
