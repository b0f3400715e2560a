"""LMS bulk downloads -> one folder of submissions, nothing dropped silently."""
from __future__ import annotations

import csv
import re
import sys
import zipfile

import pytest

from autograder.text import csvsafe
from autograder.pipeline.collect import collect, read_report, summary
from conftest import ROOT, run
from lms_corpus import CASES

NB = (ROOT / "exercises" / "attention" / "attention.ipynb").read_bytes()


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_canvas_zip_with_roster(tmp_path):
    z = tmp_path / "submissions.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("leeann_1001_5001_attention.ipynb", NB)
        zf.writestr("kimbo_LATE_1002_5002_attention-1.ipynb", NB)      # an older file: duplicate
        zf.writestr("kimbo_LATE_1002_5003_attention-2.ipynb", NB)      # the newest: graded
        zf.writestr("stranger_1999_5004_attention.ipynb", NB)          # not in the roster
        zf.writestr("leeann_1001_5005_report.pdf", b"%PDF")            # not a notebook
        zf.writestr("../evil.ipynb", NB)                                # path traversal: a row, nothing written
    roster = tmp_path / "roster.csv"
    roster.write_text("student_id,lms_id,name,email\ns001,1001,Lee Ann,lee@uni.example\n"
                      "s002,1002,Kim Bo,kim@uni.example\n")
    out = tmp_path / "out"
    entries = collect("attention", z, out, roster)
    assert sorted(p.name for p in out.glob("*.ipynb")) == ["s001_attention.ipynb", "s002_attention.ipynb"]
    status = {e.source: e.status for e in entries}
    assert status["leeann_1001_5001_attention.ipynb"] == "collected"
    # issue 25: the newest Canvas resubmission is graded (before: the first, 5002)
    assert status["kimbo_LATE_1002_5003_attention-2.ipynb"] == "collected, LATE"
    assert status["kimbo_LATE_1002_5002_attention-1.ipynb"].startswith("duplicate: an older file of student s002")
    assert status["stranger_1999_5004_attention.ipynb"].startswith("unmatched: canvas id 1999")
    assert status["leeann_1001_5005_report.pdf"].startswith("not a notebook")
    assert not (tmp_path / "evil.ipynb").exists()
    assert status["../evil.ipynb"].startswith("unsafe path")
    report = _rows(out / ".collect_report.csv")
    assert len(report) == len(entries) == 6  # issue 25: the unsafe entry has its row too (before: 5, none)
    ids = {r["student_id"]: r for r in _rows(out / ".lms_ids.csv")}
    assert ids["s002"]["late"] == "yes" and ids["s001"]["email"] == "lee@uni.example"


def test_moodle_folders_without_roster(tmp_path):
    src = tmp_path / "moodle"
    for folder, name in [("Ada Lovelace_301_assignsubmission_file_", "attention.ipynb"),
                         ("Alan Turing_302_assignsubmission_file_", "my work.ipynb")]:
        (src / folder).mkdir(parents=True)
        (src / folder / name).write_bytes(NB)
    out = tmp_path / "out"
    entries = collect("attention", src, out)
    assert sorted(p.name for p in out.glob("*.ipynb")) == ["moodle301_attention.ipynb", "moodle302_attention.ipynb"]
    assert all(e.lms == "moodle" and e.status == "collected" for e in entries)


def test_cli_collect(tmp_path):
    src = tmp_path / "plain"
    src.mkdir()
    (src / "s9_attention.ipynb").write_bytes(NB)
    (src / "notes.txt").write_text("hi")
    proc = run([sys.executable, "-m", "autograder", "collect", "attention", str(src), str(tmp_path / "o")])
    assert proc.returncode == 0, proc.stderr
    assert "s9_attention.ipynb: collected -> s9_attention.ipynb" in proc.stdout
    assert "notes.txt: not a notebook" in proc.stdout
    assert "2 files: 1 collected, 1 not collected" in proc.stdout


def test_grade_reads_an_lms_zip_and_exports_for_the_lms(tmp_path):
    from autograder.pipeline.run import grade

    z = tmp_path / "canvas.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("leeann_LATE_1001_5001_attention.ipynb", b'{"cells": [')  # corrupt: no kernel needed
    roster = tmp_path / "roster.csv"
    roster.write_text("student_id,lms_id,name,email\ns001,1001,Lee Ann,lee@uni.example\n")
    report = grade("attention", z, out_dir=tmp_path / "out", grading_dir=tmp_path / "g", roster=roster)
    (r,) = report.results
    assert r.student_id == "s001" and r.score == 0 and "corrupt notebook" in r.message
    assert "submitted LATE" in r.message
    canvas = _rows(tmp_path / "out" / "canvas.csv")
    column = "Multi-head attention and positional encoding"  # the assignment's title in course.yml
    assert canvas[0]["Student"].strip() == "Points Possible" and canvas[0][column] == "30"
    assert canvas[1]["ID"] == "1001" and canvas[1]["SIS User ID"] == "s001" and canvas[1][column] == "0"
    # the roster's name, not the slug of the Canvas file name ("leeann")
    assert canvas[1]["Student"] == "Lee Ann"
    moodle = _rows(tmp_path / "out" / "moodle.csv")
    assert moodle[0]["ID number"] == "s001" and moodle[0]["Email address"] == "lee@uni.example"
    assert moodle[0]["Full name"] == "Lee Ann"
    for png in ("histogram.png", "pass_rates.png"):
        assert (tmp_path / "out" / png).read_bytes()[:4] == b"\x89PNG"


# ----------------------------------------------------------------------------- hostile downloads (issue 25)

def _tree(root):
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_download(case, tmp_path):
    """Every entry gets a row with what became of it; nothing is written but the notebooks
    collected, into the output folder; the class goes on."""
    (tmp_path / "instructor-secret.txt").write_text("SECRET OF THE GRADER")
    (tmp_path / "in").mkdir()
    source = case.build(tmp_path / "in")
    roster = None
    if case.roster:
        roster = tmp_path / "roster.csv"
        roster.write_text(case.roster)
    before = _tree(tmp_path)
    out = tmp_path / "out"
    entries = collect("attention", source, out, roster, **case.limits)

    assert all(e.status for e in entries) and len(entries) == len(case.expect)
    for key, start in case.expect.items():
        found = [e for e in entries if (e.source.startswith(key[:-3]) if key.endswith("...") else e.source == key)]
        assert len(found) == 1 and found[0].status.startswith(start), (key, [e.status for e in found])
    report = csvsafe.read(out / ".collect_report.csv")
    assert [(r["source"], r["status"]) for r in report] == [(e.source, e.status) for e in entries]
    assert [e.source for e in read_report(out)] == [e.source for e in entries if not e.status.startswith("ignored:")]

    written = {p.name for p in out.iterdir()} - {".collect_report.csv", ".lms_ids.csv"}
    assert written == {e.target for e in entries if e.target}
    wanted = case.collected - {"*"}
    assert wanted <= written and ("*" in case.collected or wanted == written), written
    assert all(len(name.encode()) <= 255 for name in written)
    assert _tree(tmp_path) - before == {"out"} | {f"out/{n}" for n in written | {".collect_report.csv", ".lms_ids.csv"}}
    for path in out.iterdir():
        assert b"SECRET OF THE GRADER" not in path.read_bytes() and b"root:" not in path.read_bytes()
    if case.check:
        case.check(entries)
    assert summary(entries).count("\n") == len(entries)  # one line per entry, and the count


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def test_csv_cells_the_lms_and_students_choose_cannot_be_formulas(tmp_path):
    """Names from the roster and file names from the zip that start a formula reach every CSV
    file the grader writes as text (a leading '); the grade columns stay numbers."""
    from autograder.pipeline.run import grade

    corrupt = b'{"cells": ['  # no kernel needed: the point is the files written
    z = tmp_path / "canvas.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr('=HYPERLINK("evil.example";"x")_1001_5001_attention.ipynb', corrupt)
        zf.writestr("+cmd|' calc'!A0_1002_5002_attention.ipynb", corrupt)
        zf.writestr("-2+3_1003_5003_attention.ipynb", corrupt)
        zf.writestr("@SUM(1+1)_1004_5004_attention.ipynb", corrupt)
        zf.writestr("=1+1 report.pdf", b"%PDF")  # nobody's: a row of its own
        zf.writestr("\t=1+1.ipynb", corrupt)
    roster = tmp_path / "roster.csv"
    roster.write_text('student_id,lms_id,name,email,login,section\n'
                      's001,1001,"=HYPERLINK(""http://evil.example"",""click"")",@SUM(1+1),-2+3,"\r=1"\n'
                      's002,1002,+1-1,\t=1,ok,ok\ns003,1003,Cy,cy@uni.example,cy,A\n'
                      's004,1004,Di,di@uni.example,di,A\n')
    out, grading = tmp_path / "out", tmp_path / "g"
    grade("attention", z, out_dir=out, grading_dir=grading, roster=roster)
    files = [out / "grades.csv", out / "canvas.csv", out / "moodle.csv", out / "lms_ids.csv",
             grading / "collected" / "attention" / ".collect_report.csv",
             grading / "collected" / "attention" / ".lms_ids.csv", grading / "class" / "roster.csv"]
    seen = ""
    for path in files:
        with open(path, newline="", encoding="utf-8") as fh:
            for row in csv.reader(fh):
                for cell in row:
                    seen += cell + "\n"
                    assert not cell.startswith(FORMULA_START) or re.fullmatch(r"-?\d+(\.\d+)?", cell), (path, cell)
    for text in ("'=HYPERLINK(\"http://evil.example\"", "'@SUM(1+1)", "'-2+3", "'+1-1", "'\t=1", "'\r=1",
                 "'=1+1 report.pdf", "'+cmd\\|' calc'!A0"):
        assert text in seen, text  # the cells are there, as text
    column = "Multi-head attention and positional encoding"
    canvas = _rows(out / "canvas.csv")
    assert canvas[0][column] == "30" and {float(r[column]) for r in canvas[1:]} == {0.0}  # numbers
    assert {r["SIS User ID"]: r["Student"] for r in canvas[1:]}["s001"].startswith("'=HYPERLINK")


def test_csv_writer_quotes_text_not_numbers(tmp_path):
    path = tmp_path / "x.csv"
    cells = ["30", "29.5", "0", "-2", "-0.5", 3, -1.5, "=1+1", "+1", "-2+3", "-inf", "@x", "\tx", "\rx", "|x", "a=1"]
    csvsafe.write(path, [f"c{i}" for i in range(len(cells))], [cells])
    with open(path, newline="") as fh:
        written = list(csv.reader(fh))[1]
    assert written == ["30", "29.5", "0", "-2", "-0.5", "3", "-1.5", "'=1+1", "'+1", "'-2+3", "'-inf", "'@x",
                       "'\tx", "'\rx", "'\\|x", "a=1"]
    assert [list(r.values()) for r in csvsafe.read(path)] == [[str(c) for c in cells]]  # read back as written


def test_a_moodle_zip_with_a_150_character_cjk_name_grades_everyone(tmp_path):
    """The folder name is 456 bytes (legal in Moodle, too long for one Linux file name): its
    student is graded like the others, and hostile entries beside them are rows with reasons."""
    import nbformat

    from autograder.pipeline.run import grade
    from conftest import filled_exercise
    from lms_corpus import MOODLE_CJK, _info

    full = nbformat.writes(filled_exercise("attention")).encode()
    z = tmp_path / "moodle.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr(f"{MOODLE_CJK}/attention.ipynb", full)
        zf.writestr("Bo Brown_7302_assignsubmission_file_/attention.ipynb", NB)
        zf.writestr("Cy Chen_7303_assignsubmission_file_/../../../escaped.ipynb", full)
        zf.writestr(_info("Di Diaz_7304_assignsubmission_file_/attention.ipynb", 0o120777), "/etc/passwd")
    out = tmp_path / "out"
    report = grade("attention", z, out_dir=out, grading_dir=tmp_path / "g", workers=1)
    by = report.by_student()
    assert by["moodle7301"].status == "graded" and by["moodle7301"].score == 30
    assert by["moodle7302"].status == "graded" and by["moodle7302"].score < 30
    rows = {r["student_id"]: r for r in _rows(out / "grades.csv")}
    assert rows["moodle7301"]["total"] == "30"
    assert rows["moodle7303"]["status"] == "not graded" and "unsafe path" in rows["moodle7303"]["reason"]
    assert rows["moodle7304"]["status"] == "not graded" and "symbolic link" in rows["moodle7304"]["reason"]
    names = {r["ID number"]: r["Full name"] for r in _rows(out / "moodle.csv")}
    assert names["moodle7301"] == MOODLE_CJK.split("_")[0]
    assert not (tmp_path / "escaped.ipynb").exists() and not (tmp_path / "g" / "escaped.ipynb").exists()
