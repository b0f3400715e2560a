"""LMS bulk downloads -> one folder of submissions, nothing dropped silently."""
from __future__ import annotations

import csv
import sys
import zipfile

from autograder.lms import collect
from conftest import ROOT, run

NB = (ROOT / "exercises" / "attention" / "attention.ipynb").read_bytes()


def _rows(path):
    return list(csv.DictReader(open(path, newline="")))


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
    from autograder.grade import grade

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
    moodle = _rows(tmp_path / "out" / "moodle.csv")
    assert moodle[0]["ID number"] == "s001" and moodle[0]["Email address"] == "lee@uni.example"
    for png in ("histogram.png", "pass_rates.png"):
        assert (tmp_path / "out" / png).read_bytes()[:4] == b"\x89PNG"
