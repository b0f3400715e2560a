"""The toy assignment (tests/toy.py: two questions, no torch) through the whole pipeline with
real kernels: the sandbox, the workers, nbgrader, the record and the exports, in seconds.  And
the fake backend (tests/fakebackend.py) against the real one on the same files: the record, the
exports and the summary the fast tier's tests read come out the same."""
from __future__ import annotations

import csv
import zipfile

import nbformat
import pytest

from autograder.pipeline.run import grade
from fakebackend import FakeBackend, use_fake_backend
from toy import POINTS, answered, exercise, toy_course

WRONG_NORM = "def norm(xs):\n    return sum(xs)  # not the length"


def _batch(root, tmp):
    """A Canvas download of the class: s1 right, s2 late with a wrong Q2, s3 the exercise as
    released, s4 a file that is no notebook; s5 is on the roster and hands in nothing."""
    files = {"ann_1001_9001_toy.ipynb": nbformat.writes(answered(root)),
             "bo_late_1002_9002_toy.ipynb": nbformat.writes(answered(root, norm=WRONG_NORM)),
             "cy_1003_9003_toy.ipynb": nbformat.writes(exercise(root)),
             "di_1004_9004_toy.ipynb": "{ not a notebook"}
    with zipfile.ZipFile(tmp / "toy.zip", "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    (tmp / "roster.csv").write_text("student_id,lms_id,name\ns1,1001,Ann\ns2,1002,Bo\ns3,1003,Cy\ns4,1004,Di\n"
                                    "s5,1005,Ed\n")
    return tmp / "toy.zip", tmp / "roster.csv"


def _rows(path):
    with open(path, newline="") as fh:
        return {r["student_id"]: r for r in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("toy")
    root = toy_course(tmp / "course")
    batch, roster = _batch(root, tmp)
    real = grade("toy", batch, grading_dir=tmp / "real", root=root, roster=roster, workers=2)
    with pytest.MonkeyPatch.context() as mp:
        # told only what s2 gets wrong; s3's untouched exercise the fake finds by itself
        fake = use_fake_backend(mp, FakeBackend(lose={"sum(xs)": ["test_norm_visible", "test_norm_hidden"]}))
        faked = grade("toy", batch, grading_dir=tmp / "fake", root=root, roster=roster, workers=2)
    assert fake.judged == [["s1", "s2", "s3"]]
    return {"root": root, "tmp": tmp, "real": real, "fake": faked}


def test_real_kernels_grade_the_toy_assignment(toy):
    report = toy["real"]
    scores = {r.student_id: r.score for r in report.results if r.status == "graded"}
    full, norm = sum(POINTS.values()), POINTS["test_norm_visible"] + POINTS["test_norm_hidden"]
    assert scores == {"s1": full, "s2": full - norm, "s3": 0}, report.table()
    assert report.by_student()["s4"].status != "graded", report.table()
    assert [r.student_id for r in report.absent] == ["s5"], report.table()
    pages = toy["tmp"] / "real" / "reports" / "toy" / "feedback"
    late = (pages / "s2.html").read_text()
    assert "<td>submitted</td><td class=\"lost\">late</td>" in late  # the late file's page says so
    assert "late</td>" not in (pages / "s1.html").read_text()
    assert "add(-4, 4)" not in late and "norm([1, 1])" not in late, "a hidden test's code reached a feedback page"


def test_the_fake_backend_leaves_what_the_real_one_leaves(toy):
    """Same files, the real backend and the fake one told what the real one finds: the same
    summary lines and the same grades.csv, canvas.csv and moodle.csv, but for dates and times."""
    real_dir, fake_dir = toy["tmp"] / "real" / "reports" / "toy", toy["tmp"] / "fake" / "reports" / "toy"
    for name in ("grades.csv", "canvas.csv", "moodle.csv"):
        real, fake = _rows(real_dir / name) if name == "grades.csv" else None, None
        if name != "grades.csv":
            real, fake = (real_dir / name).read_text(), (fake_dir / name).read_text()
            assert real == fake, name
        else:
            fake = _rows(fake_dir / name)
            assert real.keys() == fake.keys()
            for sid in real:
                differ = {k for k in real[sid] if real[sid][k] != fake[sid][k]}
                assert differ <= {"graded_at", "timestamp", "seconds"}, (sid, {k: (real[sid][k], fake[sid][k])
                                                                               for k in differ})
    lines = lambda report: [ln for ln in report.table().splitlines() if "seconds" not in ln]  # noqa: E731
    assert lines(toy["real"]) == lines(toy["fake"])
