"""Crash-consistent changes of the class record (issue 34, item 2).

A grading run, ``undo`` and ``remove`` stage every file the record names before their
transaction commits (undo's copies in the history's archive, the new files beside them, a
journal of the renames); ``export`` writes every file under a temporary name and renames them
all at the end, the feedback pages nbgrader renders again among them; a save of the
hand-grading page is one transaction of the gradebook.  Here each command is killed (SIGKILL, in a process of its own) at each step --
before the commit, as it commits, after it, half way through the renames, while an export is
written -- and the next command on the assignment completes or rolls back what it left, with a
line saying which; and a full disk is injected at each write point (``COURSE_FAULT=<step>:enospc``,
``autograder.records.faults``): one line, and the record and the exports stay as they were.

Nothing here starts a kernel: the submissions are judged by ``fakebackend.FakeBackend``, whose
feedback page shows each submission's own code, so that a test sees whose files a student has.
The tests marked ``ON_BOTH`` run on SQLite and again with the record in a throwaway PostgreSQL
database (tests/pg.py; those cases are in the ``scale`` tier).
"""
from __future__ import annotations

import csv
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fakebackend
from autograder.cli import main as cli
from autograder.records import classrecord, gradebook
from conftest import ROOT
from pg import ON_BOTH, db, postgres_server, state_of_database  # noqa: F401 - fixtures

DRIVER = ("import sys, fakebackend; fakebackend.install(); from autograder.cli import main; "
          "sys.exit(main(sys.argv[1:]))")


def _state(grading: Path, exports: bool = True) -> dict:
    """Every byte of the record, its files and (``exports``) the exports; the runs' scratch
    folders aside, and a journal SQLite leaves beside the gradebook when killed in a transaction
    (SQLite's own: it rolls it back).  A record on PostgreSQL: every row of its database (and
    not the file gradebook.url, which names the database: each copy of the folder has its own)."""
    return {**{str(p.relative_to(grading)): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted(grading.rglob("*")) if p.is_file() and "runs" not in p.relative_to(grading).parts
               and not p.name.endswith("-journal") and p.name != "gradebook.url"
               and (exports or "reports" not in p.relative_to(grading).parts)},
            **state_of_database(grading)}


def _files(folder: Path) -> dict:
    """The files of a folder of exports (a killed writer's temporary files, hidden, aside)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".")}


def _lms_files(grading: Path) -> dict:
    return {name: (grading / "reports" / "attention" / name).read_bytes()
            for name in ("grades.csv", "canvas.csv", "moodle.csv")}


def _totals(grading: Path) -> dict:
    with open(grading / "reports" / "attention" / "grades.csv", newline="") as fh:
        return {r["student_id"]: r["total"] for r in csv.DictReader(fh)}


def _code(grading: Path, sid: str) -> str:
    """Whose submission the student's graded notebook and feedback page are ('-' when none)."""
    page = grading / "feedback" / sid / "attention" / "attention.html"
    nb = grading / "autograded" / sid / "attention" / "attention.ipynb"
    codes = {fakebackend.MARK.search(p.read_text())["code"] if p.exists() else "-" for p in (page, nb)}
    assert len(codes) == 1, f"{sid}'s graded notebook and feedback page are of different submissions: {codes}"
    return codes.pop()


def _runs(grading: Path) -> list:
    return classrecord.history(gradebook.db_url(grading), "attention")


@pytest.fixture(scope="module")
def graded(tmp_path_factory, db):
    """A class graded once (s1 30, s2 15; s3 on the roster hands nothing in), and a second batch
    (s1 15, s2 30) to grade over it; its record on SQLite, or (``ON_BOTH``) on PostgreSQL."""
    with pytest.MonkeyPatch.context() as mp:
        fakebackend.install(mp)
        return _grade_class(tmp_path_factory, db)


def _grade_class(tmp_path_factory, db) -> dict:
    tmp = tmp_path_factory.mktemp("crash")
    first, second = tmp / "first", tmp / "second"
    first.mkdir(), second.mkdir()
    for sid, score in (("s1", 1.0), ("s2", 0.5)):
        (first / f"{sid}_attention.ipynb").write_bytes(fakebackend.submission(f"{sid}-first", score))
        (second / f"{sid}_attention.ipynb").write_bytes(fakebackend.submission(f"{sid}-second", 1.5 - score))
    (tmp / "roster.csv").write_text("student_id,lms_id,name\ns1,1001,Ann\ns2,1002,Bo\ns3,1003,Cy\n")
    grading = tmp / "grading"
    assert cli(["grade", "attention", str(first), "--grading-dir", str(grading), "--roster", str(tmp / "roster.csv"),
                *db.args()]) == 0
    assert _totals(grading) == {"s1": "30", "s2": "15", "s3": "0"}
    return {"tmp": tmp, "grading": grading, "second": second, "state": _state(grading), "lms": _lms_files(grading)}


@pytest.fixture
def grading(graded, tmp_path, monkeypatch, db):
    """A copy of the graded class's folder (and of its PostgreSQL database), for a test that changes it."""
    fakebackend.install(monkeypatch)
    monkeypatch.delenv("COURSE_FAULT", raising=False)
    return db.copy(graded["grading"], tmp_path / "grading")


def _killed(args: list[str], step: str) -> None:
    """``python -m autograder ARGS`` killed with SIGKILL at ``step``."""
    env = {**os.environ, "COURSE_FAULT": f"{step}:kill",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", DRIVER, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, f"not killed at {step!r}: {proc.returncode}\n{proc.stderr[-2000:]}"


def _next_start(grading: Path, capsys) -> list[str]:
    """The next command on the assignment (export, without nbgrader's feedback): its lines."""
    capsys.readouterr()
    assert cli(["export", "attention", "--grading-dir", str(grading), "--no-feedback"]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("step", ["stage", "write pending.json", "commit"])
@ON_BOTH
def test_a_run_killed_before_its_commit_is_rolled_back_at_the_next_start(graded, grading, capsys, step):
    _killed(["grade", "attention", str(graded["second"]), "--grading-dir", str(grading)], step)
    lines = _next_start(grading, capsys)
    assert any("stopped before its commit" in line and "the class record is as it was" in line for line in lines), lines
    # the record and its files, every byte; the exports rebuilt from it are what they were
    assert _state(grading, exports=False) == {k: v for k, v in graded["state"].items() if not k.startswith("reports")}
    assert _lms_files(grading) == graded["lms"]
    assert len(_runs(grading)) == 1


@pytest.mark.parametrize("step", ["apply", "apply-op"])
@ON_BOTH
def test_a_run_killed_after_its_commit_is_completed_and_undo_gives_the_old_files_back(graded, grading, capsys, step):
    _killed(["grade", "attention", str(graded["second"]), "--grading-dir", str(grading)], step)
    lines = _next_start(grading, capsys)
    runs = _runs(grading)
    assert len(runs) == 2 and any(f"run 2 of attention (grade, {runs[1].id[:8]})" in line
                                  and "they are now" in line for line in lines), lines
    assert _totals(grading) == {"s1": "15", "s2": "30", "s3": "0"}
    assert (_code(grading, "s1"), _code(grading, "s2")) == ("s1-second", "s2-second")
    assert not list(grading.glob("history/*/pending.json"))
    assert cli(["undo", "attention", "--grading-dir", str(grading)]) == 0
    assert _totals(grading) == {"s1": "30", "s2": "15", "s3": "0"}
    assert (_code(grading, "s1"), _code(grading, "s2")) == ("s1-first", "s2-first")


@pytest.mark.parametrize("step", ["write grades.csv", "write s2.html", "replace"])
@ON_BOTH
def test_a_run_killed_while_its_exports_are_written_leaves_the_old_ones_whole(graded, grading, capsys, step):
    reports = grading / "reports" / "attention"
    before = _files(reports)
    _killed(["grade", "attention", str(graded["second"]), "--grading-dir", str(grading)], step)
    assert _files(reports) == before  # no empty file, none new
    assert len(_runs(grading)) == 2  # the run is in the record, with its files
    assert (_code(grading, "s1"), _code(grading, "s2")) == ("s1-second", "s2-second")
    _next_start(grading, capsys)
    assert _totals(grading) == {"s1": "15", "s2": "30", "s3": "0"}
    assert not [p for p in reports.rglob(".*") if p.is_file()]  # the killed run's temporary files went


@ON_BOTH
def test_an_export_killed_half_way_leaves_the_old_files_whole(grading):
    reports = grading / "reports" / "attention"
    before = _files(reports)
    # --missing blank: canvas.csv and moodle.csv leave s3's cell empty, where they held 0
    _killed(["export", "attention", "--grading-dir", str(grading), "--no-feedback", "--missing", "blank"],
            "write moodle.csv")
    assert _files(reports) == before


@pytest.mark.parametrize("command,step", [(["undo", "attention"], "apply"), (["remove", "attention", "s1"], "apply-op")])
@ON_BOTH
def test_undo_and_remove_killed_after_their_commit_are_completed(graded, grading, capsys, command, step):
    assert cli(["grade", "attention", str(graded["second"]), "--grading-dir", str(grading)]) == 0
    _killed([*command, "--grading-dir", str(grading)], step)
    lines = _next_start(grading, capsys)
    assert any("was in the class record" in line and "they are now" in line for line in lines), lines
    if command[0] == "undo":
        assert _totals(grading)["s1"] == "30" and _code(grading, "s1") == "s1-first"
    else:
        assert _totals(grading)["s1"] == "0" and _code(grading, "s1") == "-"
        assert cli(["undo", "attention", "--grading-dir", str(grading)]) == 0
        assert _totals(grading)["s1"] == "15" and _code(grading, "s1") == "s1-second"


def _one_line(capsys) -> str:
    # on PostgreSQL a command first names the database the folder recorded (``gradebook: <url>, recorded in ...``)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("gradebook: ")]
    assert len(err) == 1 and err[0].startswith("error: No space left on device"), err
    return err[0]


@pytest.mark.parametrize("step", ["archive", "stage", "write pending.json", "commit"])
@ON_BOTH
def test_a_full_disk_before_the_commit_is_one_line_and_changes_nothing(graded, grading, capsys, monkeypatch, step):
    capsys.readouterr()
    monkeypatch.setenv("COURSE_FAULT", f"{step}:enospc")
    assert cli(["grade", "attention", str(graded["second"]), "--grading-dir", str(grading)]) == 2
    assert "nothing of this run reached the class record" in _one_line(capsys)
    assert _state(grading) == graded["state"]


@pytest.mark.parametrize("step", ["write grades.csv", "write histogram.png", "write s1.html", "replace"])
@ON_BOTH
def test_a_full_disk_after_the_commit_is_one_line_and_keeps_the_exports(graded, grading, capsys, monkeypatch, step):
    reports = grading / "reports" / "attention"
    before = _files(reports)
    capsys.readouterr()
    monkeypatch.setenv("COURSE_FAULT", f"{step}:enospc")
    assert cli(["grade", "attention", str(graded["second"]), "--grading-dir", str(grading)]) == 2
    assert "python -m autograder export attention" in _one_line(capsys)
    assert _files(reports) == before
    assert len(_runs(grading)) == 2 and (_code(grading, "s1"), _code(grading, "s2")) == ("s1-second", "s2-second")


@pytest.mark.parametrize("command", [["undo", "attention"], ["remove", "attention", "s1"], ["export", "attention"]])
@ON_BOTH
def test_a_full_disk_in_undo_remove_or_export_is_one_line_and_changes_nothing(grading, capsys, monkeypatch, command):
    capsys.readouterr()
    before = _state(grading)
    monkeypatch.setenv("COURSE_FAULT", "write pending.json:enospc" if command[0] != "export" else "write canvas.csv:enospc")
    assert cli([*command, "--grading-dir", str(grading), *(["--no-feedback"] if command[0] == "export" else [])]) == 2
    _one_line(capsys)
    assert _state(grading) == before


# ----------------------------------------------------------------------------- export's feedback pages
#
# ``export`` (with feedback) renders every graded student's feedback page again with nbgrader: into
# a staging folder, the pages then renamed into place with the other exports.  Killed or out of
# disk at any step, the pages of before stay, whole.

FEEDBACK_STEPS = ["stage feedback", "write attention.html", "write grades.csv", "replace"]


def _pages(grading: Path) -> dict:
    """nbgrader's feedback pages of the class, and anything else in its feedback folder."""
    return {str(p.relative_to(grading)): p.read_bytes() for p in (grading / "feedback").rglob("*") if p.is_file()}


def test_an_export_with_feedback_puts_the_new_pages_in_place(grading):
    before = _pages(grading)
    assert cli(["export", "attention", "--grading-dir", str(grading)]) == 0
    after = _pages(grading)
    assert sorted(after) == sorted(before) and all(after[k] != before[k] for k in before)  # rendered anew
    assert all(b"Bootstrap" in page for page in after.values()) and not list(grading.glob(".feedback*"))
    report = (grading / "reports" / "attention" / "feedback" / "s1.html").read_bytes()
    assert b"Bootstrap" in report  # the exports show the new pages, not the ones they replaced


@pytest.mark.parametrize("step", FEEDBACK_STEPS)
def test_an_export_with_feedback_killed_leaves_the_old_pages_whole(grading, capsys, step):
    before, reports = _state(grading, exports=False), _files(grading / "reports" / "attention")
    _killed(["export", "attention", "--grading-dir", str(grading)], step)
    # whole: the pages of before (a killed writer's temporary files and staging folder aside)
    assert {k: v for k, v in _state(grading, exports=False).items()
            if not any(".tmp" in part for part in Path(k).parts)} == before
    assert _files(grading / "reports" / "attention") == reports
    _next_start(grading, capsys)  # its leftovers (temporary files, the staging folder) go
    assert _state(grading, exports=False) == before


@pytest.mark.parametrize("step", FEEDBACK_STEPS)
def test_a_full_disk_in_an_export_with_feedback_keeps_the_old_pages(grading, capsys, monkeypatch, step):
    before = _state(grading)
    capsys.readouterr()
    monkeypatch.setenv("COURSE_FAULT", f"{step}:enospc")
    assert cli(["export", "attention", "--grading-dir", str(grading)]) == 2
    assert "the exports are as they were" in _one_line(capsys)
    assert _state(grading) == before


# ----------------------------------------------------------------------------- hand-grading saves
#
# A save of the hand-grading page writes the points and comments of every answer on it in one
# transaction of the gradebook (pages: none; ``export`` renders them again, staged, above).  Killed
# or out of disk after the first answer, after the second or at the commit, every grade of the page
# is as it was, and no file of the record or the exports changed; the full disk is one line.

AETHER = ROOT / "exercises" / "project_aether" / "project_aether.ipynb"
SAVE_DRIVER = ("import sys, json; from pathlib import Path; from autograder.records.handgrade import HandGrading; "
               "from conftest import ROOT; hg = HandGrading('project_aether', Path(sys.argv[1]), ROOT); "
               "print(hg.save('q3_answer', json.loads(sys.argv[2])))")
SAVE = {"s1": ["3", "clear"], "s2": ["1.5", "one side only"]}


@pytest.fixture(scope="module")
def aether_graded(tmp_path_factory, db):
    """project_aether graded for s1 and s2 (their written answers await a grader)."""
    import nbformat

    tmp = tmp_path_factory.mktemp("handgrade-crash")
    subs = tmp / "subs"
    subs.mkdir()
    for sid in ("s1", "s2"):
        nb = nbformat.read(AETHER, as_version=4)
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == "q3_answer":
                cell.source = f"The answer of {sid} about decoder-only models."
        nbformat.write(nb, subs / f"{sid}_project_aether.ipynb")
    with pytest.MonkeyPatch.context() as mp:
        fakebackend.install(mp)
        mp.delenv("COURSE_FAULT", raising=False)
        assert cli(["grade", "project_aether", str(subs), "--grading-dir", str(tmp / "grading"), *db.args()]) == 0
    return tmp / "grading"


@pytest.fixture
def aether(aether_graded, tmp_path, monkeypatch, db):
    monkeypatch.delenv("COURSE_FAULT", raising=False)
    return db.copy(aether_graded, tmp_path / "grading")


def _hand_grades(grading: Path) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook(gradebook.db_url(grading)) as gb:
        return {sid: (gb.find_grade("q3_answer", "project_aether", "project_aether", sid).manual_score,
                      gb.find_comment("q3_answer", "project_aether", "project_aether", sid).manual_comment)
                for sid in ("s1", "s2")}


def _save_state(grading: Path) -> dict:
    """Every file of the record and the exports but the gradebook (what a save may change)."""
    return {k: v for k, v in _state(grading).items() if not k.startswith(("gradebook.db", "<postgresql>"))}


@pytest.mark.parametrize("step", ["save s1", "save s2", "save commit"])
@ON_BOTH
def test_a_hand_grading_save_killed_keeps_every_grade_of_the_page(aether, step):
    import json

    before, grades = _save_state(aether), _hand_grades(aether)
    assert grades == {"s1": (None, None), "s2": (None, None)}
    env = {**os.environ, "COURSE_FAULT": f"{step}:kill",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", SAVE_DRIVER, str(aether), json.dumps(SAVE)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, f"not killed at {step!r}: {proc.returncode}\n{proc.stderr[-2000:]}"
    assert _hand_grades(aether) == grades  # none of the page's grades, not the first one alone
    assert _save_state(aether) == before
    from autograder.records.handgrade import HandGrading

    hg = HandGrading("project_aether", aether, ROOT)  # the next save (the killed one's lock is gone)
    assert hg.save("q3_answer", {sid: tuple(v) for sid, v in SAVE.items()}) == [] and hg.scored == ["s1", "s2"]
    assert _hand_grades(aether) == {"s1": (3.0, "clear"), "s2": (1.5, "one side only")}


@pytest.mark.parametrize("step", ["save s2", "save commit"])
@ON_BOTH
def test_a_full_disk_in_a_hand_grading_save_is_one_line_and_saves_nothing(aether, monkeypatch, step):
    from autograder.records.handgrade import HandGrading

    before, grades = _save_state(aether), _hand_grades(aether)
    hg = HandGrading("project_aether", aether, ROOT)
    monkeypatch.setenv("COURSE_FAULT", f"{step}:enospc")
    said = hg.save("q3_answer", {sid: tuple(v) for sid, v in SAVE.items()})
    assert len(said) == 1 and said[0].startswith("nothing saved (No space left on device)"), said
    assert "as it was" in said[0] and hg.scored == []
    assert _hand_grades(aether) == grades and _save_state(aether) == before
