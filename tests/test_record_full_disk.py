"""A real full disk under the class record (issue 34: "a full disk at each step, a small tmpfs as
the grading folder").

``tests/test_record_crash.py`` injects ENOSPC at each named write point; here nothing is injected:
the grading folder is a tmpfs (in a user and mount namespace of its own: ``unshare``) just too
small, at sizes spread from "the second run cannot write anything" to "it fits", so that the disk
fills wherever it happens to fill -- SQLite's journal, nbgrader's own files, a graded notebook, a
CSV.  Whatever the size, a ``grade`` run ends in one line and exit 0 or 2, and the record is either
as it was or holds the new run whole (each student's graded notebook and feedback page of one and
the same submission); after the disk is made larger, ``export`` gives every student the grade the
record holds.  Nothing here starts a kernel (``fakebackend.FakeBackend``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fakebackend
from autograder.cli import main as cli
from conftest import ROOT

# tmpfs sizes tried: what the graded class takes, plus these multiples of what the second run adds
FACTORS = (0, 0.5, 2, 8, 10, 12, 14, 16)  # (a run leaves ~0.12 MB; staged, it takes ~2 MB)

# Runs inside the namespace: mount the tmpfs, copy the graded class in, run one `grade` at the
# given size, note what it printed and left, make the tmpfs larger, `export`, note again.
CHILD = textwrap.dedent(r'''
    import csv, hashlib, json, os, re, shutil, subprocess, sys
    from pathlib import Path
    graded, second, mnt, size, out = sys.argv[1:6]
    mnt = Path(mnt)
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    grading = mnt / "grading"
    shutil.copytree(graded, grading)
    driver = ("import sys, fakebackend; fakebackend.install(); from autograder.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    mark = re.compile(r"# fake: code=(\S+)")

    def run(*args):
        p = subprocess.run([sys.executable, "-W", "ignore", "-c", driver, *args], capture_output=True, text=True,
                           timeout=600)
        return {"rc": p.returncode, "err": [l for l in p.stderr.splitlines() if l.strip()]}

    def look():
        rows = {}
        path = grading / "reports" / "attention" / "grades.csv"
        if path.exists():
            with open(path, newline="") as fh:
                rows = {r["student_id"]: r["total"] for r in csv.DictReader(fh)}
        codes = {}
        for sid in ("s1", "s2"):
            page = grading / "feedback" / sid / "attention" / "attention.html"
            nb = grading / "autograded" / sid / "attention" / "attention.ipynb"
            codes[sid] = sorted({(mark.search(p.read_text()) or [None, "?"])[1] if p.exists() else "-"
                                 for p in (page, nb)})
        state = {str(p.relative_to(grading)): hashlib.sha256(p.read_bytes()).hexdigest()
                 for p in sorted(grading.rglob("*")) if p.is_file()
                 and "runs" not in p.relative_to(grading).parts and not p.name.endswith("-journal")}
        return {"totals": rows, "codes": codes, "state": state}

    used = lambda: shutil.disk_usage(mnt).used
    result = {"before": look(), "used_before": used()}
    result["grade"] = run("grade", "attention", second, "--grading-dir", str(grading))
    result["after_grade"] = look()
    result["used_after"] = used()
    subprocess.run(["mount", "-o", "remount,size=512m", str(mnt)], check=True)
    result["export"] = run("export", "attention", "--grading-dir", str(grading))
    result["after_export"] = look()
    Path(out).write_text(json.dumps(result))
''')


def _can_mount_tmpfs(tmp: Path) -> str:
    """Why a tmpfs cannot be mounted here ('' when it can)."""
    if not shutil.which("unshare"):
        return "no unshare here"
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            f"mkdir -p {tmp}/probe && mount -t tmpfs -o size=1m tmpfs {tmp}/probe"],
                           capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"no user and mount namespaces here ({probe.stderr.strip()[:120]})"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A class graded once on an ordinary disk (s1 30, s2 15), and a second batch (s1 15, s2 30)."""
    tmp = tmp_path_factory.mktemp("fulldisk")
    why = _can_mount_tmpfs(tmp)
    if why:
        pytest.skip(why)
    first, second = tmp / "first", tmp / "second"
    first.mkdir(), second.mkdir()
    for sid, score in (("s1", 1.0), ("s2", 0.5)):
        (first / f"{sid}_attention.ipynb").write_bytes(fakebackend.submission(f"{sid}-first", score))
        (second / f"{sid}_attention.ipynb").write_bytes(fakebackend.submission(f"{sid}-second", 1.5 - score))
    (tmp / "roster.csv").write_text("student_id,lms_id,name\ns1,1001,Ann\ns2,1002,Bo\n")
    grading = tmp / "grading"
    with pytest.MonkeyPatch.context() as mp:
        fakebackend.install(mp)
        assert cli(["grade", "attention", str(first), "--grading-dir", str(grading),
                    "--roster", str(tmp / "roster.csv")]) == 0
    return {"tmp": tmp, "grading": grading, "second": second}


def _at(graded, size: int, name: str) -> dict:
    """One `grade` of the second batch on a tmpfs of ``size`` bytes, then `export` with room."""
    child, out = graded["tmp"] / "child.py", graded["tmp"] / f"{name}.json"
    child.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    env.pop("COURSE_FAULT", None)
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable, str(child),
                           str(graded["grading"]), str(graded["second"]), str(graded["tmp"] / f"mnt-{name}"),
                           str(size), str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


FIRST = {"s1": "30", "s2": "15"}
SECOND = {"s1": "15", "s2": "30"}


def test_a_grading_folder_that_fills_anywhere_loses_and_mixes_nothing(graded):
    roomy = _at(graded, 512 << 20, "roomy")
    assert roomy["grade"]["rc"] == 0 and roomy["after_grade"]["totals"] == SECOND, roomy["grade"]
    low, high = roomy["used_before"], roomy["used_after"]
    assert high > low, (low, high)
    # from "not a byte more" to many times what the run leaves (its staged copies and nbgrader's
    # scratch take more while it runs): the disk fills at a different step each time
    sizes = sorted({low + int((high - low) * f) for f in FACTORS})
    seen = set()
    for k, size in enumerate(sizes):
        size = max(4096, size - size % 4096)
        got = _at(graded, size, f"s{k}")
        grade, before, after, final = got["grade"], got["before"], got["after_grade"], got["after_export"]
        where = f"tmpfs of {size:,d} bytes: {grade}"
        assert before["totals"] == FIRST, where
        assert not any("Traceback" in line for line in grade["err"]), where
        if grade["rc"] == 0:
            seen.add("graded")
            assert after["totals"] == SECOND and after["codes"] == {"s1": ["s1-second"], "s2": ["s2-second"]}, where
        else:
            assert grade["rc"] == 2 and len(grade["err"]) == 1, where
            assert grade["err"][0].startswith("error: No space left on device"), where
            if after["state"] == before["state"]:
                seen.add("nothing reached the record")
                assert "nothing of this run reached the class record" in grade["err"][0], where
            else:  # committed: the new grades are the record's, and the line says to export
                seen.add("committed, exports left as they were")
                assert "python -m autograder export attention" in grade["err"][0], where
                assert after["codes"] == {"s1": ["s1-second"], "s2": ["s2-second"]}, where
        assert got["export"]["rc"] == 0, f"{where}; export: {got['export']}"
        want = SECOND if after["codes"]["s1"] == ["s1-second"] else FIRST
        assert final["totals"] == want, f"{where}; after export: {final['totals']}"
        for sid in ("s1", "s2"):
            assert len(final["codes"][sid]) == 1, f"{where}: {sid}'s notebook and page differ: {final['codes']}"
    # the sizes reached at least the two ends: a run refused whole and one that fits (between them,
    # where the disk fills after the commit, is a narrow window the sizes may or may not hit)
    assert {"graded", "nothing reached the record"} <= seen, seen
