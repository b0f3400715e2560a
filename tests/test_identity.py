"""Issue 34, item 5: identity that cannot merge or split students.  A roster that names a
student id or an LMS id twice is refused (one line, the ids and their lines, exit status 2,
nothing written); names are taken in Unicode NFC; two file names that name different students
never become one id; of a student's Moodle attempts the newest by the zip's own dates is graded."""
from __future__ import annotations

import unicodedata
import zipfile
from pathlib import Path

import pytest

from autograder.cli import main as cli
from autograder.pipeline import collect as collect_module, intake
from autograder.pipeline.collect import collect, read_roster
from autograder.pipeline.intake import student_id_from_name
from conftest import ROOT
from pg import ON_BOTH, db, dump, postgres_server  # noqa: F401 - fixtures

NB = (ROOT / "exercises" / "attention" / "attention.ipynb").read_bytes()
JOSE_NFC = unicodedata.normalize("NFC", "Jos\u00e9")
JOSE_NFD = unicodedata.normalize("NFD", "Jos\u00e9")


def _roster(tmp_path, text: str) -> Path:
    path = tmp_path / "roster.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_roster_with_a_repeated_student_id_or_lms_id_is_refused_naming_the_lines(tmp_path):
    from autograder.course.errors import GradingError
    from autograder.pipeline.run import read_roster_file

    path = _roster(tmp_path, "student_id,lms_id,name\ns1,101,Ann\ns2,102,Bo\ns1,103,Cy\ns4,102,Di\n")
    with pytest.raises(GradingError) as err:
        read_roster_file(path, "attention")
    line = str(err.value)
    assert "\n" not in line
    assert "student id 's1' on lines 2 and 4" in line and "lms id '102' on lines 3 and 5" in line
    with pytest.raises(collect_module.RosterError, match="student id 's1' on lines 2 and 4"):
        read_roster(path, "attention")


@ON_BOTH
def test_the_command_line_refuses_a_repeated_roster_with_status_2_and_writes_nothing(tmp_path, capsys, db):
    path = _roster(tmp_path, "student_id,lms_id\ns1,101\ns1,102\n")
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "s1_attention.ipynb").write_bytes(NB)
    assert cli(["collect", "attention", str(subs), str(tmp_path / "out"), "--roster", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "student id 's1' on lines 2 and 3" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    grading = tmp_path / "grading"
    where = db.args()  # on PostgreSQL: --db-url and a fresh database
    assert cli(["grade", "attention", str(subs), "--roster", str(path), "--grading-dir", str(grading), *where]) == 2
    err = capsys.readouterr().err
    assert "student id 's1' on lines 2 and 3" in err and "Traceback" not in err
    assert not (grading / "gradebook.db").exists() and not (grading / "runs").exists()
    if where:  # not a row in the database either
        assert not any(dump(where[1]).values()), {t: rows for t, rows in dump(where[1]).items() if rows}


def test_roster_cells_are_taken_in_nfc(tmp_path):
    path = _roster(tmp_path, f"student_id,lms_id,name\ns1, 101 ,{JOSE_NFD}\n")
    [(line, row)] = collect_module.roster_rows(path, "attention")
    assert line == 2 and row["name"] == JOSE_NFC and row["lms_id"] == "101"


def test_one_name_in_nfc_and_nfd_is_one_student():
    assert student_id_from_name(Path(f"{JOSE_NFC}_attention.ipynb"), "attention") == \
        student_id_from_name(Path(f"{JOSE_NFD}_attention.ipynb"), "attention")
    assert intake.colliding_names([f"{JOSE_NFC}_attention.ipynb", f"Copy of {JOSE_NFD}_attention (1).ipynb",
                            "s1_attention.ipynb", "s1.attention.ipynb"], "attention") == {}


def test_names_that_differ_only_by_an_accent_never_share_an_id():
    other = "Jos\u00e8"
    found = intake.colliding_names([f"{JOSE_NFC}_attention.ipynb", f"{other}_attention.ipynb", "s2_attention.ipynb"],
                            "attention")
    assert list(found) == ["Jos"]
    assert sorted(found["Jos"]) == sorted([f"{JOSE_NFC}_attention.ipynb", f"{other}_attention.ipynb"])


def test_collect_refuses_both_files_of_an_accent_collision(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / f"{JOSE_NFC}_attention.ipynb").write_bytes(NB)
    (subs / "Jos\u00e8_attention.ipynb").write_bytes(NB)
    (subs / "s2_attention.ipynb").write_bytes(NB)
    entries = collect("attention", subs, tmp_path / "out")
    status = {e.source: e.status for e in entries}
    for name in (f"{JOSE_NFC}_attention.ipynb", "Jos\u00e8_attention.ipynb"):
        assert status[name].startswith("refused:"), status
        assert JOSE_NFC in status[name] and "Jos\u00e8" in status[name] and "'Jos'" in status[name]
    assert status["s2_attention.ipynb"] == "collected"
    assert sorted(p.name for p in (tmp_path / "out").glob("*.ipynb")) == ["s2_attention.ipynb"]


def test_collect_takes_nfc_and_nfd_of_one_name_as_one_student(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / f"{JOSE_NFD}_attention.ipynb").write_bytes(NB)
    (subs / f"Copy of {JOSE_NFC}_attention (1).ipynb").write_bytes(NB)
    entries = collect("attention", subs, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.ipynb")) == ["Jos_attention.ipynb"]
    assert sorted(e.status.split(":")[0] for e in entries) == ["collected", "duplicate"]


def _moodle_zip(path: Path, attempts: list[tuple[str, tuple, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, when, data in attempts:
            zf.writestr(zipfile.ZipInfo(name, date_time=when), data)
    return path


def test_the_newest_moodle_attempt_by_the_zips_dates_is_graded(tmp_path):
    folder = "Ada Lovelace_301_assignsubmission_file_"
    newest = NB.replace(b'"cells"', b'"cells" ', 1)
    zpath = _moodle_zip(tmp_path / "moodle.zip", [
        (f"{folder}/aa_final_attention.ipynb", (2024, 3, 1, 9, 0, 0), NB),        # first by name, but older
        (f"{folder}/zz_draft_attention.ipynb", (2024, 3, 2, 18, 30, 10), newest),  # the newest
        (f"{folder}/mm_attention.ipynb", (2024, 2, 1, 8, 0, 0), NB)])
    entries = collect("attention", zpath, tmp_path / "out", by_lms={"301": {"student_id": "s301", "lms_id": "301"}})
    status = {e.source: e.status for e in entries}
    assert status[f"{folder}/zz_draft_attention.ipynb"] == "collected"
    for older in ("aa_final_attention.ipynb", "mm_attention.ipynb"):
        assert status[f"{folder}/{older}"].startswith("duplicate: an older attempt of student s301"), status
        assert f"{folder}/zz_draft_attention.ipynb" in status[f"{folder}/{older}"]
    assert (tmp_path / "out" / "s301_attention.ipynb").read_bytes() == newest
