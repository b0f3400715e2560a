"""Nothing an instructor does loses a grade: each run is a transaction with a history.

A small Canvas class is graded once (the record all the tests compare with).  Then the
mistakes instructors make: the wrong zip (stopped before anything is written), a regrade that
changes a grade (listed, and undone), a resubmission without --roster (adds no student), a
student removed by mistake (undone), a Ctrl-C once the record is written.  The grades come from
the tests' fake backend (tests/fakebackend.py: no kernel; the wrong softmax loses what real
grading takes from it, tests/test_autograde.py), so every run here takes a fraction of a second
after the release.  A run killed half way, with real kernels: tests/test_record_killed.py.
PostgreSQL: tests/test_scale.py.
"""
from __future__ import annotations

import csv
import os
import shutil
import signal
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main as cli
from autograder.pipeline.run import grade
from autograder.records import classrecord
from conftest import filled_exercise
from fakebackend import use_fake_backend
from record_class import canvas as _canvas, fake, rows as _rows, state as _state

EXPORTS = ("grades.csv", "canvas.csv", "moodle.csv", "histogram.png", "pass_rates.png")


@pytest.fixture(autouse=True)
def fake_backend(monkeypatch):
    """Every run of a test here judges with the fake backend."""
    return use_fake_backend(monkeypatch, fake())


@pytest.fixture
def graded_class(fake_graded_class):
    return fake_graded_class  # conftest.py: judged once per test run


def _copy(graded_class, name: str) -> Path:
    """A copy of the graded class's folder, for a test that changes it."""
    target = graded_class["tmp"] / name
    shutil.copytree(graded_class["grading"], target)
    return target


def test_the_summary_lists_the_rostered_student_who_handed_nothing_in(graded_class):
    report = graded_class["report"]
    assert {r.student_id: r.score for r in report.results} == {"s1": 30, "s2": 30, "s3": 24}
    assert [(r.student_id, r.status) for r in report.absent] == [("s4", "no submission")]
    table = report.table()
    assert "s4" in table and "no submission" in table and "1 student of the roster handed nothing in" in table
    assert (graded_class["reports"] / "feedback" / "s4.html").exists()
    assert _rows(graded_class["reports"] / "grades.csv")["s4"]["status"] == "no submission"


def test_the_wrong_zip_is_stopped_and_changes_nothing(graded_class, capsys):
    """project_aether's notebooks graded as attention: exit status 2, one line naming
    project_aether, and the gradebook and every export byte-identical."""
    grading = _copy(graded_class, "wrong_zip")
    before = _state(grading)
    aether = nbformat.writes(filled_exercise("project_aether")).encode()
    zip_ = _canvas(graded_class["tmp"] / "aether.zip", {
        "ann_1001_5101_project_aether.ipynb": aether, "bo_1002_5102_project_aether.ipynb": aether,
        "cy_1003_5103_project_aether.ipynb": aether})
    assert cli(["grade", "attention", str(zip_), "--grading-dir", str(grading)]) == 2
    err = capsys.readouterr().err
    assert "look like project_aether, not attention" in err and "nothing was graded or written" in err
    assert _state(grading) == before
    # renamed to look right, the notebooks' own cells still give them away
    renamed = _canvas(graded_class["tmp"] / "renamed.zip", {f"{n}_{u}_6{u}_attention.ipynb": aether
                                                            for n, u in (("ann", 1001), ("bo", 1002), ("cy", 1003))})
    assert cli(["grade", "attention", str(renamed), "--grading-dir", str(grading)]) == 2
    assert "graded cells" in capsys.readouterr().err
    assert _state(grading) == before


def test_a_regrade_is_listed_and_undo_gives_back_the_exports(graded_class, capsys, fake_backend):
    grading = _copy(graded_class, "regrade")
    reports = grading / "reports" / "attention"
    before = {name: (reports / name).read_bytes() for name in EXPORTS}
    page = (reports / "feedback" / "s2.html").read_bytes()
    resubmission = _canvas(graded_class["tmp"] / "resubmit.zip", {"bo_1002_5202_attention.ipynb": graded_class["wrong"]})
    report = grade("attention", resubmission, grading_dir=grading, workers=1)  # no --roster: the saved one
    assert fake_backend.judged == [["s2"]]
    assert "1 grade changed: s2 30 \u2192 24" in report.table()
    assert _rows(reports / "grades.csv")["s2"]["total"] == "24"
    assert cli(["history", "attention", "--grading-dir", str(grading)]) == 0
    listed = capsys.readouterr().out
    assert "  1  " in listed and "  2  " in listed and "s2 30 \u2192 24" in listed and "cell_timeout=" in listed
    assert cli(["undo", "attention", "--grading-dir", str(grading)]) == 0
    assert "s2 24 \u2192 30" in capsys.readouterr().out
    assert {name: (reports / name).read_bytes() for name in EXPORTS} == before
    assert (reports / "feedback" / "s2.html").read_bytes() == page
    # the undo is a run of the history too, and can itself be undone
    runs = classrecord.history(f"sqlite:///{grading / 'gradebook.db'}", "attention")
    assert [r.kind for r in runs] == ["grade", "grade", "undo"] and runs[1].data["undone_by"] == runs[2].id
    assert cli(["undo", "attention", str(runs[2].seq), "--grading-dir", str(grading)]) == 0
    assert _rows(reports / "grades.csv")["s2"]["total"] == "24"


def test_a_resubmission_without_the_roster_adds_no_student(graded_class):
    grading = _copy(graded_class, "no_roster")
    zip_ = _canvas(graded_class["tmp"] / "late.zip", {"cy_1003_5303_attention.ipynb": graded_class["full"],
                                                      "eve_1999_5304_attention.ipynb": graded_class["full"]})
    report = grade("attention", zip_, grading_dir=grading, workers=1)
    by_id = report.by_student()
    assert by_id["s3"].score == 30
    assert not any(r.student_id.startswith("canvas") for r in report.results), [r.student_id for r in report.results]
    canvas = list(csv.DictReader(open(grading / "reports" / "attention" / "canvas.csv", newline="")))
    assert sorted(r["SIS User ID"] for r in canvas[1:]) == ["s1", "s2", "s3", "s4"]  # one row per student
    # a file of a user who is not on the roster is reported, not graded
    assert any("1999" in r.file or "1999" in r.message for r in report.results if r.status != "graded")


def test_a_student_not_on_the_roster_is_reported_unless_added(graded_class):
    grading = _copy(graded_class, "add")
    folder = graded_class["tmp"] / "new_student"
    folder.mkdir()
    (folder / "s9_attention.ipynb").write_bytes(graded_class["full"])
    refused = grade("attention", folder, grading_dir=grading, workers=1).by_student()["s9"]
    assert refused.status == "error" and "not on the class roster" in refused.message
    added = grade("attention", folder, grading_dir=grading, workers=1, add_students=True).by_student()["s9"]
    assert added.score == 30
    assert "s9" in classrecord.read_roster(f"sqlite:///{grading / 'gradebook.db'}")


def test_remove_is_recorded_and_undone(graded_class, capsys):
    grading = _copy(graded_class, "remove")
    reports = grading / "reports" / "attention"
    assert cli(["remove", "attention", "s1", "--grading-dir", str(grading)]) == 0
    assert _rows(reports / "grades.csv")["s1"]["status"] == "no submission"
    assert cli(["undo", "attention", "--grading-dir", str(grading)]) == 0
    assert _rows(reports / "grades.csv")["s1"]["total"] == "30"
    assert cli(["remove", "attention", "s4", "--from-roster", "--grading-dir", str(grading)]) == 0
    assert "s4" not in _rows(reports / "grades.csv")
    capsys.readouterr()


def test_a_late_file_is_matched_and_its_feedback_page_says_so(graded_class, fake_backend):
    """Canvas names a late file ``<name>_late_<user>_<submission>_...`` (any case): the student is
    the roster's, the summary and grades.csv say late, and the backend that writes the student's
    feedback page is told so."""
    grading = _copy(graded_class, "late")
    zip_ = _canvas(graded_class["tmp"] / "late_file.zip", {"di_late_1004_5404_attention.ipynb": graded_class["full"]})
    result = grade("attention", zip_, grading_dir=grading, workers=1).by_student()["s4"]
    assert result.score == 30 and "submitted LATE" in result.message
    assert _rows(grading / "reports" / "attention" / "grades.csv")["s4"]["late"] == "yes"
    # the backend is told, for the feedback page (what the page says: tests/test_toy_pipeline.py)
    assert fake_backend.batches[-1].late == {"s4"}
    assert (grading / "reports" / "attention" / "feedback" / "s4.html").read_text() == \
        (grading / "feedback" / "s4" / "attention" / "attention.html").read_text()



def test_a_run_number_never_reads_as_an_id_prefix(tmp_path, monkeypatch):
    """A number names a run's place in the history, even where another run's id begins with it."""
    ids = iter(["3aaa" + "1" * 28, "2bbb" + "2" * 28, "3aaa" + "3" * 28, "d" * 32, "e" * 32])
    url = f"sqlite:///{tmp_path / 'record.db'}"
    from nbgrader.api import Gradebook
    with Gradebook(url) as gb:  # nbgrader's tables, which the record lives beside
        gb.update_or_create_assignment("attention")
    monkeypatch.setattr(classrecord.uuid, "uuid4", lambda: type("U", (), {"hex": next(ids)})())
    for n in (1, 2, 3):
        classrecord.commit(url, classrecord.Commit("attention", intake={f"f{n}": {"n": n}}))
    with pytest.raises(classrecord.RecordError, match="names 2 runs"):
        classrecord.undo(url, "attention", "3aaa")
    with pytest.raises(classrecord.RecordError, match="at least 4 characters"):
        classrecord.undo(url, "attention", "2bb")
    _, undone, _ = classrecord.undo(url, "attention", "2")  # run 2's id begins with "2"; run 1's and 3's with "3"
    assert [r.seq for r in undone] == [2, 3]
    assert classrecord.read_intake(url, "attention") == {"f1": {"n": 1}}
    with pytest.raises(classrecord.RecordError, match="already undone"):
        classrecord.undo(url, "attention", "3")
    with pytest.raises(classrecord.RecordError, match="no run '7'"):
        classrecord.undo(url, "attention", "7")
    classrecord.undo(url, "attention", "4")  # the undo, undone: f2 and f3 come back
    assert classrecord.read_intake(url, "attention") == {f"f{n}": {"n": n} for n in (1, 2, 3)}


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl-C handler in this process (a worker started in the background may have
    SIGINT ignored), put back as it was afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("when", ["commit", "export"])
def test_a_ctrl_c_once_the_record_is_written_says_so(graded_class, capsys, monkeypatch, python_ctrl_c, when):
    """Ctrl-C while the record is written waits for it (record and files together); during or after
    that the run stops saying it is in the history, and ``export`` brings the exports level."""
    from autograder.records import export as export_module

    grading = _copy(graded_class, f"late_ctrl_c_{when}")
    reports = grading / "reports" / "attention"
    page = (reports / "feedback" / "s2.html").read_bytes()
    real_commit = classrecord.commit

    def commit_with_ctrl_c(*args, **kw):
        os.kill(os.getpid(), signal.SIGINT)  # held: the transaction still runs whole
        return real_commit(*args, **kw)

    def export_with_ctrl_c(*args, **kw):
        raise KeyboardInterrupt

    if when == "commit":
        monkeypatch.setattr(classrecord, "commit", commit_with_ctrl_c)
    else:
        monkeypatch.setattr(export_module, "export", export_with_ctrl_c)
    resubmission = _canvas(graded_class["tmp"] / f"late_{when}.zip",
                           {"bo_1002_5302_attention.ipynb": graded_class["wrong"]})
    assert cli(["grade", "attention", str(resubmission), "--grading-dir", str(grading), "--workers", "1"]) == 130
    err = capsys.readouterr().err
    assert "stopped after this run's grades reached the class record" in err and "nothing of this run" not in err
    assert "python -m autograder export attention" in err
    runs = classrecord.history(f"sqlite:///{grading / 'gradebook.db'}", "attention")
    assert [r.kind for r in runs] == ["grade", "grade"] and runs[1].id[:8] in err
    assert runs[1].data["changes"] == [["s2", "30", "24"]]
    # the graded notebook and the feedback page moved with the transaction, and the old ones kept
    assert (grading / "feedback" / "s2" / "attention" / "attention.html").is_file()
    assert list((grading / "history").rglob("s2")), "the page the run replaced is in the history's archive"
    assert _rows(reports / "grades.csv")["s2"]["total"] == "30"  # the exports lag behind ...
    monkeypatch.undo()
    assert cli(["export", "attention", "--grading-dir", str(grading)]) == 0  # ... until export rebuilds them
    assert _rows(reports / "grades.csv")["s2"]["total"] == "24"
    assert (reports / "feedback" / "s2.html").read_bytes() != page


def test_the_exports_plots_do_not_depend_on_what_else_styled_matplotlib(graded_class):
    """The grader draws its plots in matplotlib's own style: a process whose rcParams something
    else changed (the book's set_style, a test) writes the same bytes, so that undo's restored
    exports and a later export agree."""
    import matplotlib as mpl

    grading = _copy(graded_class, "styled")
    reports = grading / "reports" / "attention"
    assert cli(["export", "attention", "--grading-dir", str(grading)]) == 0
    plain = {name: (reports / name).read_bytes() for name in ("histogram.png", "pass_rates.png")}
    with mpl.rc_context({"font.size": 17, "axes.grid": True, "figure.autolayout": True, "axes.spines.top": False}):
        assert cli(["export", "attention", "--grading-dir", str(grading)]) == 0
    assert {name: (reports / name).read_bytes() for name in plain} == plain
