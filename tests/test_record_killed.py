"""A grading run killed half way (SIGKILL, or Ctrl-C) leaves the class record and every export
byte-identical, on SQLite.  The class it starts from is judged by the fake backend
(tests/record_class.py); the run that is killed grades with real kernels, in a process of its
own, and is stopped once a submission has been judged.  The rest of the record's mistakes:
tests/test_class_record.py (fast tier)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, as_from_a_terminal
from record_class import state


@pytest.fixture
def graded_class(fake_graded_class):
    return fake_graded_class  # conftest.py: judged once per test run


@pytest.mark.parametrize("how", ["SIGKILL", "Ctrl-C"])
def test_a_run_killed_half_way_leaves_the_record_as_it_was(graded_class, how):
    """``grade`` in a process of its own, stopped while it judges the resubmissions."""
    grading = graded_class["tmp"] / f"killed_{how}"
    shutil.copytree(graded_class["grading"], grading)
    before = state(grading)
    folder = graded_class["tmp"] / f"batch_{how}"
    folder.mkdir()
    for sid in ("s1", "s2", "s3"):
        (folder / f"{sid}_attention.ipynb").write_bytes(graded_class["wrong"])
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", "attention", str(folder),
                             "--grading-dir", str(grading), "--workers", "1"], cwd=ROOT, start_new_session=True,
                            preexec_fn=as_from_a_terminal, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        statuses = list((grading / "runs").glob("*/workers/*/status/*.json"))
        if statuses:  # a submission has been judged: the run is half way
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
    if how == "SIGKILL":
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    proc.wait(120)
    if how == "Ctrl-C":
        assert proc.returncode == 130, proc.stdout.read().decode()[-2000:]
    assert state(grading) == before
