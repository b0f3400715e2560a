"""A whole class, from the LMS zip back to the LMS gradebook: every student gets a row with a
reason, exports come from the whole gradebook, hand grading goes into the gradebook and out
into every export, a broken setup stops before anyone is graded, and the command line says
what is wrong in one line.  The submissions are judged by the tests' fake backend
(tests/fakebackend.py: no kernel); a broken sandbox that stops a run: tests/test_sandbox.py."""
from __future__ import annotations

import csv
import dataclasses
import http.cookiejar
import sys
import threading
import urllib.parse
import urllib.request
import zipfile

import nbformat
import pytest

from autograder.pipeline.run import grade
from autograder.records import gradebook
from conftest import ROOT, assert_gradebook_consistent, filled_exercise, run
from fakebackend import FakeBackend, use_fake_backend

EXERCISE = ROOT / "exercises" / "attention" / "attention.ipynb"
AETHER_EXERCISE = ROOT / "exercises" / "project_aether" / "project_aether.ipynb"


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(autouse=True)
def fake_backend(monkeypatch):
    """Every run of a test here judges with the fake backend."""
    return use_fake_backend(monkeypatch, FakeBackend())


@pytest.fixture(scope="module")
def canvas_class(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        fake = use_fake_backend(mp, FakeBackend())
        graded = _canvas_class(tmp_path_factory)
    assert fake.judged == [["s001", "s002"], ["s002"]], "the class was judged by the fake backend"
    return graded


def _canvas_class(tmp_path_factory):
    """A Canvas zip: s001 right, s002 untouched, s003 a PDF, s005 a file not on the roster;
    s004 handed in nothing.  Then s002 hands in again (late batch into the same folder)."""
    tmp = tmp_path_factory.mktemp("canvas_class")
    full = nbformat.writes(filled_exercise("attention")).encode()
    z = tmp / "canvas.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("ann_1001_5001_attention.ipynb", full)
        zf.writestr("bo_1002_5002_attention.ipynb", EXERCISE.read_bytes())
        zf.writestr("cy_1003_5003_attention.pdf", b"%PDF-1.4")
        zf.writestr("zed_1999_5009_attention.ipynb", full)
    roster = tmp / "roster.csv"
    roster.write_text("student_id,lms_id,name,email\ns001,1001,Ann A,ann@uni.example\ns002,1002,Bo B,bo@uni.example\n"
                      "s003,1003,Cy C,cy@uni.example\ns004,1004,Di D,di@uni.example\n")
    grading, out = tmp / "grading", tmp / "out"
    first = grade("attention", z, out_dir=out, grading_dir=grading, roster=roster, workers=2)
    before = {r["student_id"]: r for r in _rows(out / "grades.csv")}
    late = tmp / "late"
    late.mkdir()
    (late / "s002_attention.ipynb").write_bytes(full)
    second = grade("attention", late, out_dir=out, grading_dir=grading, workers=1)
    return first, second, before, out, grading


def test_every_roster_student_and_every_file_gets_a_row_with_its_reason(canvas_class):
    first, _, before, out, _ = canvas_class
    summary = first.table()
    assert "not a notebook" in summary and "is not in the roster" in summary  # collect's findings, printed
    assert before["s001"]["status"] == "graded" and before["s001"]["total"] == "30"
    assert before["s003"]["status"] == "not graded" and "not a notebook" in before["s003"]["reason"]
    assert before["s004"]["status"] == "no submission" and before["s004"]["total"] == "0"
    unmatched = [r for sid, r in before.items() if sid.startswith("?")]
    assert len(unmatched) == 1 and "not in the roster" in unmatched[0]["reason"]
    assert {"Q1", "Q2", "Q3", "Q4", "auto", "manual", "pending", "total"} <= set(before["s001"])


def test_a_late_batch_changes_only_its_own_rows(canvas_class):
    _, second, before, out, _ = canvas_class
    after = {r["student_id"]: r for r in _rows(out / "grades.csv")}
    assert [r.student_id for r in second.results] == ["s002"]
    assert before["s002"]["total"] == "0" and after["s002"]["total"] == "30"
    for sid in set(before) - {"s002"}:
        assert after[sid] == before[sid], sid


def test_lms_files_use_the_columns_the_lms_imports(canvas_class):
    *_, out, _ = canvas_class
    canvas = _rows(out / "canvas.csv")
    column = "Multi-head attention and positional encoding"  # the assignment's title in course.yml
    assert canvas[0]["Student"].strip() == "Points Possible" and canvas[0][column] == "30"
    by_id = {r["SIS User ID"]: r for r in canvas[1:]}
    assert set(by_id) == {"s001", "s002", "s003", "s004"}  # the file nobody could match is not there
    assert by_id["s001"]["ID"] == "1001" and by_id["s003"][column] == "0" and by_id["s004"][column] == "0"
    moodle = {r["ID number"]: r for r in _rows(out / "moodle.csv")}
    assert moodle["s004"]["Email address"] == "di@uni.example"
    feedback = moodle["s003"][f"Feedback: {column}"]
    assert "could not be graded" in feedback and "repaired" not in feedback and "cell '" not in feedback
    assert "No submission" in moodle["s004"][f"Feedback: {column}"]


def test_hand_grading_reaches_every_export(tmp_path, fake_backend):
    """Written answers wait as pending; points and a comment entered on the hand-grading page
    go into the gradebook; export then shows them in grades.csv, canvas.csv and the feedback."""
    from autograder.records.handgrade import HandGrading, make_server

    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(filled_exercise("project_aether"), subs / "s1_project_aether.ipynb")
    (subs / "s2_project_aether.ipynb").write_bytes(AETHER_EXERCISE.read_bytes())
    grading, out = tmp_path / "grading", tmp_path / "out"
    report = grade("project_aether", subs, out_dir=out, grading_dir=grading, workers=2)
    assert fake_backend.judged == [["s1", "s2"]]
    s1 = report.by_student()["s1"]
    assert s1.score == 22 and s1.pending == 8 and "auto 22/22, 8 points await hand grading" in s1.message
    row = {r["student_id"]: r for r in _rows(out / "grades.csv")}["s1"]
    assert (row["auto"], row["manual"], row["pending"], row["total"]) == ("22", "0", "8", "22")
    # the page nbgrader renders from the record (the fake backend's own pages are placeholders)
    proc = run([sys.executable, "-m", "autograder", "export", "project_aether", "--grading-dir", str(grading),
                "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "awaiting a grader" in (out / "feedback" / "s1.html").read_text()
    column = "Project Aether: the arithmetic of a large decoder"
    assert {r["SIS User ID"]: r[column] for r in _rows(out / "canvas.csv")[1:]}["s1"] == ""  # not a 0

    server = make_server(HandGrading("project_aether", grading, ROOT), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    # a browser: the printed address (with this run's secret) sets a cookie; forms say where they come from
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    browser.addheaders = [("Origin", base)]
    try:
        assert browser.open(server.url).url == f"{base}/"  # the secret left the address bar
        page = browser.open(f"{base}/cell/q3_answer").read().decode()
        assert "Mark scheme" in page and "s1" in page and "no answer: scored 0" in page  # s2 left it blank
        for gid, points in (("q1_answer", "2"), ("q3_answer", "3.5"), ("q8_answer", "2")):
            data = {"token": server.token, "points__s1": points, "comment__s1": f"comment on {gid}"}
            saved = browser.open(urllib.request.Request(f"{base}/cell/{gid}", data=urllib.parse.urlencode(data).encode()))
            assert "saved points for 1 answer" in urllib.parse.unquote(saved.url)
        refused = urllib.parse.urlencode({"token": "forged", "points__s1": "0"}).encode()
        with pytest.raises(urllib.error.HTTPError):
            browser.open(urllib.request.Request(f"{base}/cell/q1_answer", data=refused))
        bad = urllib.parse.urlencode({"token": server.token, "points__s1": "9"}).encode()
        answer = browser.open(urllib.request.Request(f"{base}/cell/q1_answer", data=bad))
        assert "outside" in urllib.parse.unquote(answer.url)
        assert "saved points for 0 answers" in urllib.parse.unquote(answer.url)  # issue 25: not "saved 1"
    finally:
        server.shutdown()
        server.server_close()

    proc = run([sys.executable, "-m", "autograder", "export", "project_aether", "--grading-dir", str(grading),
                "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    row = {r["student_id"]: r for r in _rows(out / "grades.csv")}["s1"]
    assert (row["manual"], row["pending"], row["total"]) == ("7.5", "0", "29.5")
    assert {r["SIS User ID"]: r[column] for r in _rows(out / "canvas.csv")[1:]}["s1"] == "29.5"
    page = (out / "feedback" / "s1.html").read_text()
    assert "comment on q3_answer" in page and "awaiting a grader" not in page and "3.5 / 4.0" in page


@pytest.mark.parametrize("command", [["release", "attenton"], ["collect", "attenton", "x.zip", "o"],
                                     ["grade", "attenton", "x"], ["export", "attenton"],
                                     ["handgrade", "attenton"]])
def test_an_unknown_assignment_is_one_line_that_lists_the_names(command, tmp_path):
    proc = run([sys.executable, "-m", "autograder", *command], )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown assignment 'attenton'" in proc.stderr
    assert "attention" in proc.stderr.split("are:")[1] and "Traceback" not in proc.stderr


def test_empty_input_warns_and_fails(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    z = tmp_path / "empty.zip"
    zipfile.ZipFile(z, "w").close()
    for source in (empty, z):
        proc = run([sys.executable, "-m", "autograder", "grade", "attention", str(source),
                    "--grading-dir", str(tmp_path / "g")])
        assert proc.returncode == 1 and "nothing to grade" in proc.stderr, proc.stderr
    out = tmp_path / "collected"
    proc = run([sys.executable, "-m", "autograder", "collect", "attention", str(tmp_path / "missing.zip"), str(out)])
    assert proc.returncode == 2 and not out.exists(), "collect must not create its folder before failing"


def test_help_shows_defaults_and_examples():
    for command in ("grade", "collect", "release", "export", "handgrade"):
        proc = run([sys.executable, "-m", "autograder", command, "--help"])
        assert proc.returncode == 0 and "example" in proc.stdout, command
    grade_help = run([sys.executable, "-m", "autograder", "grade", "--help"]).stdout
    assert "(default: auto)" in grade_help and "8192" in grade_help and "300" in grade_help


@pytest.mark.parametrize("flag", ["--workers=-3", "--cell-timeout=0", "--notebook-timeout=-1", "--memory-mb=many"])
def test_a_limit_that_would_grade_nobody_is_refused_before_anything_runs(flag, tmp_path):
    """A cell limit of 0 s gave every student 0 (undoable, but no instructor means it): such a
    flag is a usage error, exit status 2, one line naming the flag, and no grading folder."""
    proc = run([sys.executable, "-m", "autograder", "grade", "attention", str(tmp_path), flag,
                "--grading-dir", str(tmp_path / "grading")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"argument {flag.split('=')[0]}: must be a number above 0" in proc.stderr.splitlines()[-1]
    assert not (tmp_path / "grading").exists()


class _LosesOne(FakeBackend):
    """A backend that hands back no record for one student (a grader's bug)."""

    def judge(self, batch):
        outcomes = super().judge(batch)
        outcomes.pop("b", None)
        return outcomes


def test_a_submission_a_backend_returns_nothing_for_is_not_graded_and_says_why(tmp_path, monkeypatch):
    """A student's row is never blank: a notebook the backend lost is an error with its reason,
    in the report and in the class record's intake, and the others are graded."""
    use_fake_backend(monkeypatch, _LosesOne())
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("a", "b"):
        nbformat.write(filled_exercise("attention"), subs / f"{name}_attention.ipynb")
    report = grade("attention", subs, grading_dir=tmp_path / "grading")
    by_id = report.by_student()
    assert (by_id["a"].status, by_id["a"].score) == ("graded", 30.0), report.table()
    assert by_id["b"].status == "error" and "returned no result" in by_id["b"].message, report.table()
    rows = {r["student_id"]: r for r in csv.DictReader(open(report.csv_path))}
    assert "returned no result" in rows["b"]["reason"], rows["b"]


class _WorkerDies(FakeBackend):
    """A backend that grades each notebook, then reports it lost (its worker died twice, say)."""

    def judge(self, batch):
        return {sid: dataclasses.replace(outcome, graded=False, cause="grading failed: the worker died")
                for sid, outcome in super().judge(batch).items()}


def test_a_submission_that_cannot_be_graded_keeps_no_earlier_grade(tmp_path, monkeypatch):
    """s1 is graded, then hands in again and that grading fails: the row says why, and the
    earlier 30/30 does not stand for the new file."""
    one = tmp_path / "one"
    one.mkdir()
    nbformat.write(filled_exercise("attention"), one / "s1_attention.ipynb")
    grade("attention", one, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading", workers=1)
    assert {r["student_id"]: r["total"] for r in _rows(tmp_path / "out" / "grades.csv")} == {"s1": "30"}

    use_fake_backend(monkeypatch, _WorkerDies())
    report = grade("attention", one, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading", workers=1)
    row = {r["student_id"]: r for r in _rows(tmp_path / "out" / "grades.csv")}["s1"]
    assert row["status"] != "graded" and row["total"] in ("", "0"), row
    assert "the worker died" in report.by_student()["s1"].message
    assert_gradebook_consistent(gradebook.db_url(tmp_path / "grading"), "attention", set())


def test_the_summary_row_and_the_class_record_note_the_same(tmp_path):
    """A student's notes are built once: the run's summary row shows what the class record keeps
    (grades.csv's notes), also for a file that could not be graded (an older Canvas file beside a
    newest one that is not a notebook at all)."""
    z = tmp_path / "canvas.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("ann_1001_5001_attention.ipynb", EXERCISE.read_bytes())
        zf.writestr("ann_1001_5002_attention.ipynb", b"this is not a notebook")
    roster = tmp_path / "roster.csv"
    roster.write_text("student_id,lms_id,name\ns001,1001,Ann A\n")
    report = grade("attention", z, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading", roster=roster)
    row = {r["student_id"]: r for r in _rows(report.csv_path)}["s001"]
    assert row["status"] == "not graded" and "duplicate" in row["notes"], row
    message = report.by_student()["s001"].message
    assert row["reason"] in message and row["notes"] in message, (message, row)


def test_a_faked_runs_copied_release_holds_all_a_release_writes(tmp_path, monkeypatch):
    """The fake backend's runs copy a release made once (fakebackend.release_once): what the real
    release writes into a fresh grading folder is all copied, byte for byte, and nothing else."""
    import autograder.pipeline.stages as stages
    from conftest import RELEASES
    from fakebackend import release_once

    monkeypatch.setenv(RELEASES, str(tmp_path / "kept"))
    (tmp_path / "kept").mkdir()
    once = release_once(getattr(stages.release, "real", stages.release))

    def files(folder):
        return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    for name in ("first", "second"):
        g = tmp_path / name
        once(["project_aether"], out_dir=g / "release", grading_dir=g, root=ROOT, checks_dir=g / "release" / ".checks")
    (template,) = [p for p in (tmp_path / "kept").iterdir() if not p.name.startswith(".")]
    made = files(template)  # what the real release wrote into a fresh folder
    assert "gradebook.db" in made and "release/project_aether/project_aether.ipynb" in made
    assert files(tmp_path / "first") == made and files(tmp_path / "second") == made


def test_the_stages_after_the_judge_hold_no_notebook(tmp_path, fake_backend, monkeypatch):
    """Once judged, the class's notebooks are let go: commit and export are given the submissions
    without them (the grader does not hold a notebook per student to the end of the run)."""
    from autograder.pipeline import stages

    given = []
    commit = stages.commit
    monkeypatch.setattr(stages, "commit", lambda ctx, judged: given.append(judged) or commit(ctx, judged))
    subs = tmp_path / "subs"
    subs.mkdir()
    for sid in ("s1", "s2"):
        nbformat.write(filled_exercise("attention"), subs / f"{sid}_attention.ipynb")
    report = grade("attention", subs, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading", workers=1)
    (judged,) = given
    assert [s.student_id for s in judged.submissions] == ["s1", "s2"]
    assert [s.nb for s in judged.submissions] == [None, None]
    assert sorted(fake_backend.batches[0].notebooks) == ["s1", "s2"]  # the judge had them
    assert {r.student_id: r.status for r in report.results} == {"s1": "graded", "s2": "graded"}, report.table()


def test_the_notebooks_wait_for_the_judge_compressed(tmp_path, fake_backend):
    """Each notebook read waits for its turn compressed (the grader does not grow by a parsed
    notebook per student: benchmarks/grading_scale.py), and the judge gets it back whole."""
    from autograder.text.packed import PackedNotebook

    subs = tmp_path / "subs"
    subs.mkdir()
    full = filled_exercise("attention")
    for sid in ("s1", "s2"):
        nbformat.write(full, subs / f"{sid}_attention.ipynb")
    grade("attention", subs, out_dir=tmp_path / "out", grading_dir=tmp_path / "grading", workers=1)
    (batch,) = fake_backend.batches
    assert sorted(batch.notebooks) == ["s1", "s2"]
    for packed in batch.notebooks.values():
        assert isinstance(packed, PackedNotebook), type(packed)
        assert packed.size * 3 < len(packed.text().encode()), packed  # compressed, not the text
        assert [c.source for c in packed.load().cells] == [c.source for c in full.cells]
        assert nbformat.reads(packed.text(), as_version=4) == packed.load()
