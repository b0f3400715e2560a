"""Issue 34, item 9: bidi controls from names, file names and outputs are shown visibly
(``<U+202E>``) in every CSV file, page and summary line the grader writes, in one place
(``autograder.text.visible``); and the output limits count what a notebook stores.  Names read
back from the class record: on SQLite and PostgreSQL (``ON_BOTH``, tests/pg.py)."""
from __future__ import annotations

import json

import nbformat
import pytest

from autograder.text import csvsafe, htmlsafe
from autograder.text.visible import BIDI_CONTROLS, visible
from pg import ON_BOTH, db, postgres_server  # noqa: F401 - fixtures

RLO = "\u202e"
CONTROLS = "".join(sorted(BIDI_CONTROLS))


def _clean(text: str) -> bool:
    return not any(ch in text for ch in BIDI_CONTROLS)


def test_every_bidi_control_is_written_visibly():
    assert visible(f"a{RLO}b") == "a<U+202E>b"
    shown = visible(CONTROLS)
    assert _clean(shown)
    for code in ("202A", "202B", "202C", "202D", "202E", "2066", "2067", "2068", "2069", "200E", "200F", "061C"):
        assert f"<U+{code}>" in shown
    assert visible(3) == 3 and visible("plain") == "plain"


def test_csv_cells_show_bidi_controls(tmp_path):
    path = tmp_path / "x.csv"
    csvsafe.write(path, ["name", "file"], [[f"Eve{RLO}evE", f"gnp.{RLO}ipynb"], [f"={RLO}1", "30"]])
    text = path.read_text(encoding="utf-8")
    assert _clean(text)
    assert "Eve<U+202E>evE" in text and "gnp.<U+202E>ipynb" in text and "'=<U+202E>1" in text


def _result(tmp_path):
    from autograder.course.cells import GradedCell  # noqa: F401 - the type of cells
    from autograder.records.classbook import ClassRow
    from autograder.records.export import ExportResult

    rows = [ClassRow("s1", "not graded", reason=f"corrupt notebook: {RLO}x.ipynb", max_score=10,
                     lms={"name": f"Mallory{RLO}yrollaM", "lms_id": "7", "email": f"m{RLO}@x"}, file=f"{RLO}x.ipynb"),
            ClassRow("s2", "no submission", reason="no submission", max_score=10, lms={"name": f"B{RLO}ob"})]
    return ExportResult(rows, [], {})


def test_grades_canvas_and_moodle_csv_show_bidi_controls(tmp_path):
    from autograder.records import export

    result = _result(tmp_path)
    export._grades_csv(result, tmp_path / "grades.csv")
    export._canvas_csv(result, tmp_path / "canvas.csv", "Attention", None)
    export._moodle_csv(result, tmp_path / "moodle.csv", "Attention")
    for name in ("grades.csv", "canvas.csv", "moodle.csv"):
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert _clean(text), name
        assert "<U+202E>" in text, name


def test_feedback_pages_show_bidi_controls(tmp_path):
    from autograder.records import export

    result = _result(tmp_path)
    grading = tmp_path / "grading"
    graded = grading / "feedback" / "s3" / "attention"
    graded.mkdir(parents=True)
    (graded / "attention.html").write_text(f"<html><body><pre>output {RLO}txt.exe</pre></body></html>",
                                           encoding="utf-8")
    from autograder.records.classbook import ClassRow

    result.rows.append(ClassRow("s3", "graded", max_score=10))
    export.feedback_pages(result, grading, tmp_path / "feedback", "attention")
    for name in ("s1.html", "s2.html", "s3.html"):
        text = (tmp_path / "feedback" / name).read_text(encoding="utf-8")
        assert _clean(text), name
    assert "&lt;U+202E&gt;" in (tmp_path / "feedback" / "s1.html").read_text(encoding="utf-8")
    assert "output &lt;U+202E&gt;txt.exe" in (tmp_path / "feedback" / "s3.html").read_text(encoding="utf-8")


def test_html_fragments_and_pages_show_bidi_controls():
    assert htmlsafe.escape(f"a{RLO}<b>") == "a&lt;U+202E&gt;&lt;b&gt;"
    assert _clean(htmlsafe.sanitize(f"<p title='{RLO}'>x{RLO}y</p>"))
    assert "x&lt;U+202E&gt;y" in htmlsafe.markdown_to_html(f"x{RLO}y")
    assert _clean(htmlsafe.page(f"<p>{CONTROLS}</p>"))


def test_hand_grading_pages_show_bidi_controls():
    from autograder.records.handgrade import _page

    assert _clean(_page(f"t{RLO}", f"<pre>{RLO}answer</pre>").decode())


def test_the_grade_summary_shows_bidi_controls():
    from autograder.pipeline.results import Report, Result

    report = Report("attention", results=[Result("s1", f"{RLO}x.ipynb", status="error",
                                                 message=f"not a notebook: gnp.{RLO}ipynb")])
    table = report.table()
    assert _clean(table) and "gnp.<U+202E>ipynb" in table


def test_everything_the_command_line_prints_shows_bidi_controls(capsys):
    from autograder.text.visible import visible_output

    with visible_output():
        print(f"s1 {RLO}x")
        import sys

        print(f"warn {RLO}", file=sys.stderr)
    out = capsys.readouterr()
    assert out.out == "s1 <U+202E>x\n" and out.err == "warn <U+202E>\n"


# ----------------------------------------------------------------------------- output limits

def _display(i: int) -> dict:
    return {"header": {"msg_type": "display_data"}, "msg_type": "display_data",
            "content": {"data": {"text/plain": str(i % 10)}, "metadata": {}}}


def _stored(outputs) -> int:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = outputs
    nb.cells.append(cell)
    return len(nbformat.writes(nb).encode()) - len(nbformat.writes(nbformat.v4.new_notebook()).encode())


def test_many_tiny_outputs_are_counted_as_stored(monkeypatch):
    """100,000 outputs of one character were 0.49 MB of values but 8.4 MB in the file.  A cell
    keeps no more than MAX_CELL_OUTPUT bytes as stored (a lower limit here, for time)."""
    from autograder.judge import kernel

    monkeypatch.setattr(kernel, "MAX_CELL_OUTPUT", 100_000)
    outs = kernel._Outputs()
    for i in range(5_000):  # 5,000 characters of values, about 420 kB stored
        outs.add(_display(i))
    assert outs.dropped
    assert _stored(outs.outputs) <= 100_000 * 1.02


def test_the_notebook_limit_counts_the_stored_size():
    from autograder.judge.runner import _size

    outputs = [nbformat.v4.output_from_msg(_display(i)) for i in range(1000)]
    outputs += [nbformat.v4.new_output("stream", name="stdout", text="a\n" * 500),
                nbformat.v4.new_output("error", ename="E", evalue="v", traceback=["t1", "t2"])]
    stored = _stored(outputs)
    assert abs(_size(outputs) - stored) <= stored * 0.02


def test_many_tiny_prints_are_counted_as_stored(monkeypatch):
    from autograder.judge import kernel

    monkeypatch.setattr(kernel, "MAX_CELL_OUTPUT", 50_000)
    outs = kernel._Outputs()
    for i in range(5_000):  # separate streams: stdout and stderr by turns
        outs.add({"header": {"msg_type": "stream"}, "msg_type": "stream",
                  "content": {"name": "stdout" if i % 2 else "stderr", "text": "x\n"}})
    assert outs.dropped
    assert _stored(outs.outputs) <= 50_000 * 1.02


@ON_BOTH
def test_names_read_back_from_the_class_record_are_shown_visibly(tmp_path, monkeypatch, capsys, db):
    """A roster's names with bidi controls, graded (the fake backend) into the record on SQLite or
    PostgreSQL and exported again from it: every LMS file and the printed summary show them visibly."""
    from autograder.cli import main as cli
    from conftest import filled_exercise
    from fakebackend import FakeBackend, use_fake_backend

    use_fake_backend(monkeypatch, FakeBackend())
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(filled_exercise("attention"), subs / "s1_attention.ipynb")
    roster = tmp_path / "roster.csv"
    roster.write_text(f"student_id,lms_id,name\ns1,1001,Mallory{RLO}yrollaM\ns2,1002,B{RLO}ob\n", encoding="utf-8")
    grading = tmp_path / "grading"
    assert cli(["grade", "attention", str(subs), "--roster", str(roster), "--grading-dir", str(grading),
                *db.args()]) == 0
    out = tmp_path / "again"
    assert cli(["export", "attention", "--grading-dir", str(grading), "--out", str(out), "--no-feedback"]) == 0
    printed = capsys.readouterr()
    assert _clean(printed.out + printed.err)
    for name in ("grades.csv", "canvas.csv", "moodle.csv"):
        text = (out / name).read_text(encoding="utf-8")
        assert _clean(text), name
    assert "Mallory<U+202E>yrollaM" in (out / "canvas.csv").read_text(encoding="utf-8")
