"""Collect submissions from an LMS bulk download into one folder that ``grade`` reads.

Canvas ("Download submissions") names each file
``<name>[_LATE]_<user id>_<submission id>_<original name>[-N].ipynb``; Moodle
("Download all submissions") puts each student's files in a folder
``<Full Name>_<participant id>_assignsubmission_file[_]``.  A plain folder of
``<student id>_<assignment>.ipynb`` files passes through unchanged.

A roster CSV (columns ``student_id`` and ``lms_id``; optional ``name``, ``email``,
``login``, ``section``) maps LMS ids to the course's student ids.  Nothing is
dropped silently: every input file gets a row in ``.collect_report.csv`` saying
what became of it (collected, late, unmatched, duplicate, not a notebook).
"""
from __future__ import annotations

import csv
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .intake import student_id_from_name

CANVAS_RE = re.compile(r"^(?P<name>[^_]+)_(?P<late>LATE_)?(?P<uid>\d+)_(?P<subid>\d+)_(?P<orig>.+)$")
MOODLE_RE = re.compile(r"^(?P<name>.+)_(?P<uid>\d+)_assignsubmission_(?:file|onlinetext)_?$")


@dataclass
class Entry:
    source: str
    lms: str = "folder"
    lms_id: str = ""
    name: str = ""
    late: bool = False
    student_id: str = ""
    status: str = ""
    target: str = ""


def read_roster(path: Path | None) -> dict[str, dict]:
    if path is None:
        return {}
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    if rows and not {"student_id", "lms_id"} <= set(rows[0]):
        raise SystemExit(f"roster {path}: needs the columns student_id and lms_id")
    return {r["lms_id"].strip(): r for r in rows if r.get("lms_id", "").strip()}


def _files(source: Path, tmp: Path) -> tuple[Path, list[Path]]:
    """The folder to read and every file in it (a zip is unpacked safely first)."""
    if source.is_file() and zipfile.is_zipfile(source):
        root = tmp / "unzipped"
        with zipfile.ZipFile(source) as zf:
            for info in zf.infolist():
                parts = PurePosixPath(info.filename).parts
                if info.is_dir() or ".." in parts or info.filename.startswith("/") or "__MACOSX" in parts:
                    continue
                dest = root.joinpath(*parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
        source = root
    if not source.is_dir():
        raise SystemExit(f"not a folder or a zip file: {source}")
    return source, sorted(p for p in source.rglob("*") if p.is_file() and not p.name.startswith("."))


def _identify(path: Path, base: Path) -> Entry:
    rel = path.relative_to(base)
    e = Entry(str(rel))
    if len(rel.parts) > 1 and (m := MOODLE_RE.match(rel.parts[0])):
        e.lms, e.lms_id, e.name = "moodle", m["uid"], m["name"]
    elif m := CANVAS_RE.match(path.name):
        e.lms, e.lms_id, e.name, e.late = "canvas", m["uid"], m["name"], bool(m["late"])
    return e


def collect(assignment: str, source: Path, out: Path, roster: Path | None = None) -> list[Entry]:
    """Copy each student's notebook to ``out/<student id>_<assignment>.ipynb``.  Every file
    gets an Entry saying what became of it; a file that is not a notebook is still matched
    to its student, so the student's row can say why it was not graded."""
    by_lms = read_roster(roster)
    entries: list[Entry] = []
    taken: dict[str, Entry] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base, files = _files(Path(source), Path(tmp))  # fails before anything is written
        out.mkdir(parents=True, exist_ok=True)
        for path in files:
            e = _identify(path, base)
            entries.append(e)
            notebook = path.suffix.lower() == ".ipynb"
            if e.lms_id:
                row = by_lms.get(e.lms_id)
                if row is None and by_lms:
                    e.status = f"unmatched: {e.lms} id {e.lms_id} ({e.name}) is not in the roster"
                    continue
                e.student_id = (row or {}).get("student_id", "").strip() or f"{e.lms}{e.lms_id}"
            elif notebook:
                try:
                    e.student_id = student_id_from_name(path, assignment)
                except ValueError as exc:
                    e.status = f"unmatched: {exc}"
                    continue
            if not notebook:
                e.status = f"not a notebook ({path.suffix or 'no extension'}): not collected"
                continue
            if e.student_id in taken:
                first = taken[e.student_id]
                # keep the newest Canvas resubmission (-N suffix sorts later); else the first file
                e.status = f"duplicate: student {e.student_id} already has {first.source}"
                continue
            taken[e.student_id] = e
            e.target = f"{e.student_id}_{assignment}.ipynb"
            shutil.copy(path, out / e.target)
            e.status = "collected, LATE" if e.late else "collected"

    with open(out / ".collect_report.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["source", "lms", "lms_id", "name", "student_id", "late", "status", "collected_as"])
        for e in entries:
            w.writerow([e.source, e.lms, e.lms_id, e.name, e.student_id, "yes" if e.late else "",
                        e.status, e.target])
    # LMS identities for the grade exports (canvas.csv, moodle.csv)
    rows = {r.get("student_id", "").strip(): r for r in by_lms.values()}
    with open(out / ".lms_ids.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["student_id", "lms_id", "name", "email", "login", "section", "late"])
        seen = set()
        for e in entries:
            if e.student_id and e.student_id not in seen and (e.target or not any(
                    x.target for x in entries if x.student_id == e.student_id)):
                seen.add(e.student_id)
                r = rows.get(e.student_id, {})
                w.writerow([e.student_id, e.lms_id or r.get("lms_id", ""), r.get("name", e.name),
                            r.get("email", ""), r.get("login", ""), r.get("section", ""),
                            "yes" if e.late else ""])
    return entries


def read_report(folder: Path) -> list[Entry]:
    """The entries ``collect`` wrote into ``folder`` (none when it was not made by collect)."""
    path = Path(folder) / ".collect_report.csv"
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return [Entry(r["source"], r["lms"], r["lms_id"], r["name"], r["late"] == "yes", r["student_id"],
                      r["status"], r["collected_as"]) for r in csv.DictReader(fh)]


def summary(entries: list[Entry]) -> str:
    lines = [f"{e.source}: {e.status}" + (f" -> {e.target}" if e.target else "") for e in entries]
    ok = sum(1 for e in entries if e.target)
    lines.append(f"{len(entries)} files: {ok} collected, {len(entries) - ok} not collected "
                 f"({sum(1 for e in entries if e.late and e.target)} late)")
    return "\n".join(lines)
