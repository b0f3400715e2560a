"""Issue 35, items 14 and 16: the rosters instructors have (Canvas's gradebook export, Moodle's
participants and grades exports) read as they are; canvas.csv named as Canvas's own column; what
the LMS files give students without a gradable file; a second run of the same files; a notebook
handed in untouched."""
from __future__ import annotations

import csv
import zipfile

import nbformat
import pytest

from autograder.pipeline.collect import RosterError, collect, roster_rows
from autograder.records.classbook import NO_ANSWER
from conftest import ROOT

NB = (ROOT / "exercises" / "attention" / "attention.ipynb").read_bytes()
TITLE = "Multi-head attention and positional encoding"

# Canvas: Grades > Export > "Export Entire Gradebook" (a real export's shape: the Points Possible
# row, the student view's "Student, Test", a student without an SIS id, assignment and total columns)
CANVAS_EXPORT = (
    'Student,ID,SIS User ID,SIS Login ID,Section,Attention (88101),LoRA (88102),Current Score,Final Score\n'
    '    Points Possible,,,,,30.00,36.00,(read only),(read only)\n'
    '"Lovelace, Ada",1001,s001,alovelace,TRF-101 Lecture,,,0.00,0.00\n'
    '"Turing, Alan",1002,s002,aturing,TRF-101 Lecture,28.00,,93.33,93.33\n'
    '"Student, Test",1099,,1c1a2d3e4f,TRF-101 Lecture,,,,\n'
    '"Hopper, Grace",1003,,ghopper,TRF-101 Lecture,,,,\n'
    '"Noether, Emmy",1004,s004,enoether,TRF-101 Lab B,,,,\n'
)

# Moodle: Participants > "Download table data as" CSV, and Grades > Export > Plain text file
MOODLE_PARTICIPANTS = (
    'First name,Last name,ID number,Email address,Roles,Groups,Last access to course,Status\n'
    'Ada,Lovelace,s001,ada@uni.example,Student,Lab A,"Monday, 3 March 2025, 9:12 AM",Active\n'
    'Alan,Turing,s002,alan@uni.example,Student,Lab B,Never,Active\n'
    'Tess,Teacher,,tess@uni.example,Teacher,,"Tuesday, 4 March 2025, 1:00 PM",Active\n'
)
MOODLE_GRADES = (
    'First name,Last name,ID number,Institution,Department,Email address,'
    '"Assignment: Multi-head attention and positional encoding (Real)",Course total (Real),'
    'Last downloaded from this course\n'
    'Ada,Lovelace,s001,Uni,Computer Science,ada@uni.example,-,0.00,1741000000\n'
    'Alan,Turing,s002,Uni,Mathematics,alan@uni.example,27.00,27.00,1741000000\n'
)


def roster_table(path, assignment):
    from autograder.pipeline.collect import roster_table as read

    return read(path, assignment)


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_canvas_gradebook_export_is_a_roster(tmp_path):
    path = tmp_path / "2025-03-01T1200_Grades-TRF-101.csv"
    path.write_text(CANVAS_EXPORT, encoding="utf-8")
    table = roster_table(path, "attention")
    assert table.format == "canvas"
    rows = {r["student_id"]: r for _, r in table.rows}
    assert sorted(rows) == ["s001", "s002", "s004"]
    assert rows["s001"] == {"student_id": "s001", "lms_id": "1001", "name": "Lovelace, Ada", "login": "alovelace",
                            "section": "TRF-101 Lecture"}
    assert rows["s004"]["section"] == "TRF-101 Lab B"
    why = dict(table.skipped)
    assert why[2] == "Points Possible" and "Test Student" in why[5] and "no SIS User ID" in why[6]
    line = table.describe(path)
    assert "Canvas gradebook export" in line and "student_id from 'SIS User ID'" in line
    assert "lms_id from 'ID'" in line and "skipped 3 rows" in line and "\n" not in line
    # the assignment's own column: by the assignment's id or title, by lms_name, by canvas_id
    assert table.column_for(TITLE, None, None, "attention") == "Attention (88101)"
    assert table.column_for("Parameter counting", "LoRA", None, "parameters_and_lora") == "LoRA (88102)"
    assert table.column_for("Something else", None, 88102, "x") == "LoRA (88102)"
    assert table.column_for("Something else", None, None, "x") is None
    assert [r["student_id"] for _, r in roster_rows(path)] == ["s001", "s002", "s004"]


@pytest.mark.parametrize("text", [MOODLE_PARTICIPANTS, MOODLE_GRADES])
def test_moodle_exports_are_rosters(tmp_path, text):
    path = tmp_path / "moodle.csv"
    path.write_text("\ufeff" + text, encoding="utf-8")  # Moodle writes a byte order mark
    table = roster_table(path, "attention")
    assert table.format == "moodle"
    rows = {r["student_id"]: r for _, r in table.rows}
    assert sorted(rows) == ["s001", "s002"]
    assert rows["s002"]["name"] == "Alan Turing" and rows["s002"]["email"] == "alan@uni.example"
    assert rows["s002"]["section"] == ("Lab B" if text is MOODLE_PARTICIPANTS else "Mathematics")
    line = table.describe(path)
    assert "Moodle" in line and "student_id from 'ID number'" in line
    if text is MOODLE_PARTICIPANTS:
        assert "line 4 (no ID number: Tess Teacher)" in line
    else:
        assert table.assignments == [TITLE]


def test_a_moodle_zip_matches_a_moodle_export_by_name(tmp_path):
    roster = tmp_path / "participants.csv"
    roster.write_text(MOODLE_PARTICIPANTS, encoding="utf-8")
    z = tmp_path / "moodle.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("Ada Lovelace_301_assignsubmission_file_/attention.ipynb", NB)
        zf.writestr("Alan Turing_302_assignsubmission_file_/attention.ipynb", NB)
        zf.writestr("Eve Unknown_303_assignsubmission_file_/attention.ipynb", NB)
    entries = collect("attention", z, tmp_path / "out", roster)
    got = {e.name: (e.student_id, e.status) for e in entries}
    assert got["Ada Lovelace"] == ("s001", "collected") and got["Alan Turing"] == ("s002", "collected")
    assert got["Eve Unknown"][1].startswith("unmatched")
    ids = {r["student_id"]: r for r in _rows(tmp_path / "out" / ".lms_ids.csv")}
    assert ids["s001"]["email"] == "ada@uni.example"


def test_the_plain_roster_is_unchanged_and_an_unknown_file_is_refused(tmp_path):
    plain = tmp_path / "roster.csv"
    plain.write_text("student_id,lms_id,name\ns001,1001,Ada\n")
    table = roster_table(plain, "attention")
    assert table.format == "roster" and [r for _, r in table.rows] == [{"student_id": "s001", "lms_id": "1001",
                                                                         "name": "Ada"}]
    other = tmp_path / "other.csv"
    other.write_text("Name,Mark\nAda,3\n")
    with pytest.raises(RosterError, match="Canvas's gradebook export"):
        roster_table(other, "attention")


def test_missing_students_zero_or_blank_and_the_saved_canvas_column(tmp_path):
    from autograder.records import classrecord
    from autograder.records.classbook import ClassRow
    from autograder.records.export import ExportResult, _canvas_csv, _moodle_csv, lms_score

    rows = [ClassRow("s001", "no submission", reason="no submission", max_score=30),
            ClassRow("s002", "graded", auto=28, max_score=30),
            ClassRow("s003", "not graded", reason="corrupt notebook", max_score=30)]
    for missing, want in (("zero", "0"), ("blank", "")):
        result = ExportResult(rows, [], {}, missing)
        assert [lms_score(result, r) for r in rows] == [want, "28", want]
        _canvas_csv(result, tmp_path / "canvas.csv", "Attention (88101)", None)
        canvas = _rows(tmp_path / "canvas.csv")
        assert "Attention (88101)" in canvas[0] and canvas[1]["Attention (88101)"] == want
        _moodle_csv(result, tmp_path / "moodle.csv", TITLE)
        assert _rows(tmp_path / "moodle.csv")[0][TITLE] == want
    from nbgrader.api import Gradebook

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(url) as gb:
        gb.update_or_create_assignment("attention")
    classrecord.ensure_tables(url)
    classrecord.commit(url, classrecord.Commit("attention", kind="grade", data={
        "files": [], "exports": {"canvas_column": "Attention (88101)", "missing": "blank"}}))
    classrecord.commit(url, classrecord.Commit("attention", kind="grade", data={"files": []}))
    assert classrecord.export_settings(url, "attention") == {"canvas_column": "Attention (88101)",
                                                             "missing": "blank"}


def test_an_untouched_notebook_says_no_answer_written():
    from autograder.pipeline.stages import untouched
    from autograder.records.classbook import ClassRow
    from autograder.records.export import student_feedback

    released = nbformat.reads(NB.decode(), as_version=4)
    assert untouched(nbformat.reads(NB.decode(), as_version=4), released)
    worked = nbformat.reads(NB.decode(), as_version=4)
    cell = next(c for c in worked.cells if c.metadata.get("nbgrader", {}).get("solution"))
    cell.source = cell.source.replace("raise NotImplementedError", "return None  # ") + "\n"
    assert not untouched(worked, released)
    row = ClassRow("s001", "graded", max_score=30, notes=NO_ANSWER)  # the remark the read stage writes
    assert student_feedback(row, []).startswith("No answer written")


@pytest.mark.parametrize("row", [("s004", "no submission", "no submission", ""),
                                 ("s003", "not graded", "not a notebook (.pdf): <b>not collected</b>", "cy.pdf")],
                         ids=["no submission", "not graded"])
def test_the_page_and_the_lms_line_tell_a_student_without_a_grade_the_same(row):
    """What a student without a graded file reads is built once: their feedback page says what
    the LMS files' feedback line says (the file, the reason, what to do), escaped for HTML."""
    import html
    import re

    from autograder.records.classbook import ClassRow
    from autograder.records.export import _simple_page, not_graded_note, student_feedback

    sid, status, reason, file = row
    row = ClassRow(sid, status, reason=reason, max_score=30, file=file)
    what, todo = not_graded_note(row)
    assert student_feedback(row, []) == f"{what} {todo}"
    page = _simple_page("attention", row)
    assert "<b>" not in page
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert what in text and todo in text, (what, todo, text)
    assert (reason in what) == (status != "no submission") and file in what


def test_grade_with_a_canvas_export_then_the_same_zip_again(tmp_path, capsys):
    """One small run end to end (corrupt notebooks: no kernel starts), twice."""
    from autograder.pipeline.run import grade

    z = tmp_path / "submissions.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("turingalan_1002_5001_attention.ipynb", b'{"cells": [')
    roster = tmp_path / "Grades-TRF-101.csv"
    roster.write_text(CANVAS_EXPORT, encoding="utf-8")
    out = tmp_path / "out"
    report = grade("attention", z, out_dir=out, grading_dir=tmp_path / "g", roster=roster, missing="blank")
    table = report.table()
    assert "Canvas gradebook export" in table and "skipped 3 rows" in table
    assert "--missing blank" in table
    canvas = _rows(out / "canvas.csv")
    assert list(canvas[0])[-1] == "Attention (88101)"          # Canvas updates that assignment
    assert {r["SIS User ID"]: r["Attention (88101)"] for r in canvas[1:]} == {"s001": "", "s002": "", "s004": ""}
    again = grade("attention", z, out_dir=out, grading_dir=tmp_path / "g")
    assert "no grade changed: the same 1 file as run 1 were graded again" in again.table()
    assert list(_rows(out / "canvas.csv")[0])[-1] == "Attention (88101)"   # remembered without --roster
    from autograder.cli import main

    assert main(["history", "attention", "--grading-dir", str(tmp_path / "g")]) == 0
    assert "no grade changed: the same files as run 1 were graded again" in capsys.readouterr().out


def test_collect_and_grade_read_one_roster_alike(tmp_path):
    """A roster file has one reader: ``collect`` (its LMS index) and ``grade`` (its class) see the
    same students; a row without a student id is skipped by both, its line named, and a Canvas file
    of that row is unmatched in both; a missing file is the same line for both."""
    from autograder.course.errors import GradingError
    from autograder.pipeline.collect import load_roster, read_roster
    from autograder.pipeline.run import read_roster_file

    path = tmp_path / "roster.csv"
    path.write_text("student_id,lms_id,name\ns001,1001,Ada\n,1002,Bo\n")
    grade_class = read_roster_file(path, "attention")
    collect_index = read_roster(path, "attention")
    assert sorted(grade_class) == ["s001"]
    assert sorted(r["student_id"] for r in collect_index.values()) == sorted(grade_class)
    _, table = load_roster(path, "attention")
    assert "line 3 (no student_id: lms id 1002)" in table.describe(path)
    z = tmp_path / "canvas.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("bo_1002_5001_attention.ipynb", NB)
        zf.writestr("ada_1001_5002_attention.ipynb", NB)
    got = {e.lms_id: (e.student_id, e.status) for e in collect("attention", z, tmp_path / "out", path)}
    assert got["1001"] == ("s001", "collected")
    assert got["1002"][0] == "" and got["1002"][1].startswith("unmatched")
    gone = tmp_path / "no-such.csv"
    with pytest.raises(RosterError) as by_collect:
        read_roster(gone, "attention")
    with pytest.raises(GradingError) as by_grade:
        read_roster_file(gone, "attention")
    assert str(by_collect.value) == str(by_grade.value) == f"no such roster file: {gone}"
