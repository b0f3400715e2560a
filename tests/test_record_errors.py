"""Issue 34, item 6: the commands on the class record say what happened.  ``remove`` of a
student with nothing to remove is refused (exit status 2, no run in the history); a damaged
gradebook file or a damaged row of the history is one line naming the file and the row, never
a traceback and never "nothing graded yet".  The tests marked ``ON_BOTH`` run on SQLite and again
with the record in a throwaway PostgreSQL database (tests/pg.py; the ``scale`` tier)."""
from __future__ import annotations

from pathlib import Path

import pytest

from autograder.cli import main as cli
from autograder.records import classrecord, gradebook
from pg import ON_BOTH, db, postgres_server  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, db) -> Path:
    """A grading folder whose gradebook knows attention and has two runs in its history
    (no student's notebook needed); on SQLite, or (``ON_BOTH``) in a PostgreSQL database."""
    from nbgrader.api import Gradebook

    from autograder.course.paths import GradingPaths

    grading = tmp_path_factory.mktemp("record") / "grading"
    grading.mkdir()
    if db.postgresql:
        GradingPaths(grading).record_url(db.args()[1])
    url = gradebook.db_url(grading)
    from autograder.course.paths import nbgrader_env
    from autograder.course.settings import environ

    with environ({"PATH": nbgrader_env()["PATH"]}), Gradebook(url) as gb:  # nbgrader's schema (alembic)
        gb.add_assignment("attention")
        gb.add_student("s1")
    classrecord.commit(url, classrecord.Commit("attention", data={"files": ["a.ipynb"], "source": "x.zip"},
                                               intake={"s1": {"student_id": "s1", "file": "a.pdf",
                                                              "reason": "not a notebook"}}))
    classrecord.commit(url, classrecord.Commit("attention", data={"files": ["b.ipynb"], "source": "y.zip"}))
    return grading


def _copy(recorded: Path, tmp_path: Path, db) -> Path:
    return db.copy(recorded, tmp_path / "grading")


def _sql(grading: Path, statement: str):
    """Run ``statement`` on the folder's record (SQLite or PostgreSQL); its first value, if any."""
    import sqlalchemy as sa

    engine = sa.create_engine(gradebook.db_url(grading))
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement))
            return result.scalar() if result.returns_rows else None
    finally:
        engine.dispose()


def _runs(grading: Path) -> int:
    return _sql(grading, "SELECT count(*) FROM course_run")


def _where(grading: Path) -> str:
    """How a one-line error names the folder's record: the SQLite file, or the database's URL."""
    url = gradebook.db_url(grading)
    return str(grading / "gradebook.db") if gradebook.is_sqlite(url) else gradebook.shown(url)


def _one_line(err: str) -> str:
    # on PostgreSQL a command first names the database the folder recorded (``gradebook: <url>, recorded in ...``)
    err = "".join(line + "\n" for line in err.splitlines() if not line.startswith("gradebook: "))
    assert "Traceback" not in err and "nothing graded yet" not in err, err
    assert err.count("\n") == 1, err
    return err


@ON_BOTH
def test_remove_of_a_student_without_a_submission_is_refused_and_recorded_nowhere(recorded, tmp_path, capsys, db):
    grading = _copy(recorded, tmp_path, db)
    assert cli(["remove", "attention", "s7", "--grading-dir", str(grading)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "s7 has no submission of attention" in err
    assert _runs(grading) == 2
    # a student with a file in the record (here a PDF that was not graded) can be removed
    assert classrecord.with_submission(gradebook.db_url(grading), "attention", ["s1", "s7"]) == {"s1"}


@pytest.mark.parametrize("command", [["history"], ["undo"], ["remove", "s1"], ["export"]])
def test_a_damaged_gradebook_file_is_one_line_naming_it(tmp_path, capsys, command):
    grading = tmp_path / "grading"
    grading.mkdir()
    (grading / "gradebook.db").write_bytes(b"this is not a database" * 100)
    args = [command[0], "attention", *command[1:], "--grading-dir", str(grading)]
    assert cli(args) == 2
    err = _one_line(capsys.readouterr().err)
    assert str(grading / "gradebook.db") in err and "damaged" in err


@ON_BOTH
def test_a_damaged_history_row_is_one_line_naming_the_file_and_the_row(recorded, tmp_path, capsys, db):
    grading = _copy(recorded, tmp_path, db)
    _sql(grading, "UPDATE course_run SET data = '{broken' WHERE seq = 2")
    for command in (["history", "attention"], ["undo", "attention"], ["undo", "attention", "1"]):
        assert cli([*command, "--grading-dir", str(grading)]) == 2, command
        err = _one_line(capsys.readouterr().err)
        assert _where(grading) in err and "row 2 of table course_run" in err, err
    assert _runs(grading) == 2


def test_a_history_row_of_the_wrong_shape_is_named_too(recorded, tmp_path, capsys, db):
    grading = _copy(recorded, tmp_path, db)
    _sql(grading, """UPDATE course_run SET data = '{"changes": [1, 2]}' WHERE seq = 1""")
    assert cli(["history", "attention", "--grading-dir", str(grading)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "row 1 of table course_run" in err


def test_a_recorded_database_is_announced_when_it_is_reused(tmp_path):
    """A gradebook URL kept by an earlier --db-url is named (password hidden) when a command reuses it."""
    from autograder.course.paths import GradingPaths
    from autograder.records.gradebook import reused_url_note

    grading = tmp_path / "grading"
    assert reused_url_note(grading) is None  # SQLite beside the folder: nothing to announce
    GradingPaths(grading).record_url("postgresql://grader:s3cret@db.example:5432/course")
    note = reused_url_note(grading)
    assert note and "db.example:5432/course" in note and "gradebook.url" in note and "--db-url" in note
    assert "s3cret" not in note


def _recorded_elsewhere(recorded: Path, tmp_path: Path) -> tuple[Path, str]:
    """A fresh grading folder whose gradebook.url names a gradebook kept elsewhere (as an earlier
    grade --db-url leaves it)."""
    import shutil

    from autograder.course.paths import GradingPaths

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(recorded / "gradebook.db", elsewhere / "book.db")
    url = f"sqlite:///{elsewhere / 'book.db'}"
    grading = tmp_path / "grading"
    GradingPaths(grading).record_url(url)
    return grading, url


def test_export_says_once_which_recorded_database_it_reuses(recorded, tmp_path, capsys):
    grading, url = _recorded_elsewhere(recorded, tmp_path)
    assert cli(["export", "finetune", "--grading-dir", str(grading)]) == 2  # that gradebook knows attention only
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "nothing graded yet" in err[1], err
    assert err[0] == f"gradebook: {url}, recorded in {grading / 'gradebook.url'} by an earlier --db-url " \
                     "(give --db-url to use another)"


def test_grade_says_which_recorded_database_it_reuses_or_replaces(recorded, tmp_path, monkeypatch, capsys):
    """grade without --db-url on a folder with a recorded database names it in its summary; with
    another --db-url it says which one it takes the place of."""
    import nbformat

    from conftest import filled_exercise
    from fakebackend import FakeBackend, use_fake_backend

    use_fake_backend(monkeypatch, FakeBackend())
    grading, url = _recorded_elsewhere(recorded, tmp_path)
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(filled_exercise("attention"), subs / "s1_attention.ipynb")
    assert cli(["grade", "attention", str(subs), "--grading-dir", str(grading), "--workers", "1"]) == 0
    out = capsys.readouterr()
    note = f"gradebook: {url}, recorded in {grading / 'gradebook.url'} by an earlier --db-url"
    assert (out.out + out.err).count(note) == 1, out
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert cli(["grade", "attention", str(subs), "--grading-dir", str(grading), "--workers", "1",
                "--db-url", other]) == 0
    out = capsys.readouterr()
    assert f"gradebook: {other} from --db-url, in place of {url} recorded in {grading / 'gradebook.url'}" in out.err
    assert note not in out.out + out.err
    assert (grading / "gradebook.url").read_text().strip() == other


READ_URLS = """
import sys
from pathlib import Path
from autograder.course.paths import GradingPaths
paths, seen = GradingPaths(Path(sys.argv[1])), set()
print("reading", flush=True)
while not Path(sys.argv[2]).exists():
    seen.add(paths.gradebook_url)
print(sorted(seen))
"""


def test_a_command_reading_the_recorded_database_never_finds_it_half_written(tmp_path):
    """grade --db-url records its URL while another run of the folder reads it (CI saw a run read an
    empty gradebook.url and give nbgrader an empty database URL): a reader sees the URL, whole."""
    import os
    import subprocess
    import sys

    from autograder.course.paths import GradingPaths
    from conftest import ROOT

    grading, done = tmp_path / "grading", tmp_path / "done"
    url = "postgresql://grader@/course?host=/tmp/pg&port=5432"
    GradingPaths(grading).record_url(url)
    reader = subprocess.Popen([sys.executable, "-c", READ_URLS, str(grading), str(done)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert reader.stdout.readline().strip() == "reading"
        for _ in range(3000):  # the same URL again, as every run of a class given --db-url records it
            GradingPaths(grading).record_url(url)
            GradingPaths(grading).record_url(url.replace("5432", "5433"))  # and another one
    finally:
        done.touch()
        seen = reader.communicate(timeout=60)[0].strip()
    assert seen in (str(sorted({url, url.replace("5432", "5433")})), str([url])), seen
