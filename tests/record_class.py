"""The small Canvas class the record's tests start from (tests/test_class_record.py,
tests/test_record_killed.py): judged by the fake backend once per test run
(conftest.fake_graded_class), then copied by each test that changes it."""
from __future__ import annotations

import csv
import hashlib
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.pipeline.run import grade
from conftest import WRONG_SOFTMAX, filled_exercise, set_solution
from fakebackend import FakeBackend, use_fake_backend

# what real grading takes from the wrong softmax (tests/test_autograde.py): both tests of that question
WRONG_LOSES = {"dim=-2": ["test_calculate_multihead_attention_causal", "test_calculate_multihead_attention_values"]}


def fake() -> FakeBackend:
    return FakeBackend(lose=WRONG_LOSES)


def canvas(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def state(grading: Path) -> dict:
    """Every byte of the record and of the exports (the run folders, scratch by design, aside)."""
    out = {}
    for path in sorted(p for p in grading.rglob("*") if p.is_file() and "runs" not in p.relative_to(grading).parts):
        out[str(path.relative_to(grading))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def rows(path: Path) -> dict:
    with open(path, newline="") as fh:
        return {r["student_id"]: r for r in csv.DictReader(fh)}


def graded_class(tmp: Path) -> dict:
    """s1 and s2 right, s3 with the wrong softmax; s4 is on the roster and hands in nothing;
    judged by the fake backend."""
    full = nbformat.writes(filled_exercise("attention")).encode()
    wrong = nbformat.writes(set_solution(filled_exercise("attention"), "calculate_multihead_attention",
                                         WRONG_SOFTMAX)).encode()
    zip_ = canvas(tmp / "canvas.zip", {"ann_1001_5001_attention.ipynb": full, "bo_1002_5002_attention.ipynb": full,
                                       "cy_1003_5003_attention.ipynb": wrong})
    roster = tmp / "roster.csv"
    roster.write_text("student_id,lms_id,name\ns1,1001,Ann\ns2,1002,Bo\ns3,1003,Cy\ns4,1004,Di\n")
    grading = tmp / "grading"
    with pytest.MonkeyPatch.context() as mp:
        judge = use_fake_backend(mp, fake())
        report = grade("attention", zip_, grading_dir=grading, roster=roster, workers=2)
    assert judge.judged == [["s1", "s2", "s3"]], "the class was judged by the fake backend"
    return {"tmp": tmp, "grading": grading, "report": report, "full": full, "wrong": wrong,
            "state": state(grading), "reports": grading / "reports" / "attention"}
