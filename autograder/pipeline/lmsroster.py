"""The roster files an instructor already has, read as the course's roster.

Three formats, told apart by their header:

* the course's own roster CSV: ``student_id``, ``lms_id`` (optional ``name``, ``email``,
  ``login``, ``section``), read as it is (``collect.roster_table`` skips a row without a
  student id, naming its line);
* Canvas's gradebook export (*Grades -> Export*): ``Student, ID, SIS User ID, SIS Login ID,
  Section`` and one column per assignment (``Attention (88101)``).  ``student_id`` is the SIS
  User ID, ``lms_id`` Canvas's ID (the number in the file names of "Download Submissions"),
  ``name`` the Student column, ``login`` the SIS Login ID, ``section`` the Section.  The
  "Points Possible" row (and Canvas's other rows without a student, such as "Manual Posting"),
  the "Test Student" of Canvas's student view, and students without a SIS User ID are skipped;
* Moodle's participants or grades export: ``First name, Last name, ID number, ...,
  Email address`` (the grades export adds ``Assignment: <name> (Real)`` columns).
  ``student_id`` is the ID number, ``name`` "First Last", ``email`` the Email address,
  ``section`` the Groups (or Department) column.  Moodle's export has no id that its
  "Download all submissions" folders carry, so those folders are matched by the student's full
  name (``collect``); rows without an ID number are skipped.

``read_table`` returns the rows in the roster's own fields and one line that says which columns
were used and which rows were skipped and why (``RosterTable.describe``).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_ASSIGNMENT_RE = re.compile(r"^(?P<name>.*\S)\s*\((?P<id>\d{1,20})\)$")
MOODLE_ASSIGNMENT_RE = re.compile(r"^Assignment:\s*(?P<name>.*?)\s*\((?:Real|Percentage|Letter)\)$")
TEST_STUDENTS = {"test student", "student, test"}   # Canvas's student view user, as either name order


@dataclass
class RosterTable:
    """A roster file read into the roster's fields: (line, row) pairs, where the values came from."""

    format: str                                        # "roster", "canvas", "moodle"
    rows: list = field(default_factory=list)          # (line number, {student_id, lms_id, name, ...})
    used: dict = field(default_factory=dict)          # roster field -> the file's column
    skipped: list = field(default_factory=list)       # (line number, why)
    assignments: list = field(default_factory=list)   # the file's assignment columns, as they are written

    def describe(self, path) -> str:
        """One line: the format, the columns used, the rows skipped and why."""
        if self.format == "roster":
            text = f"roster {path}: the course's roster CSV, {len(self.rows)} students"
        else:
            kind = {"canvas": "Canvas gradebook export", "moodle": "Moodle participants/grades export"}[self.format]
            cols = ", ".join(f"{k} from {v!r}" for k, v in self.used.items())
            text = f"roster {path}: {kind}, {len(self.rows)} students; {cols}"
        if self.skipped:
            text += f"; skipped {len(self.skipped)} row{'s' if len(self.skipped) != 1 else ''}: " + ", ".join(
                f"line {line} ({why})" for line, why in self.skipped)
        return text

    def column_for(self, title: str, lms_name: str | None = None, canvas_id: int | None = None,
                   assignment: str | None = None) -> str | None:
        """The Canvas export's column of an assignment, exactly as written there (its import then
        updates that assignment): the column of ``canvas_id``, else the one column named
        ``lms_name``, the title or the assignment's id (case and spaces aside); None when there is
        none, or more than one."""
        if self.format != "canvas":
            return None
        found = [(m["name"], int(m["id"]), col) for col in self.assignments if (m := CANVAS_ASSIGNMENT_RE.match(col))]
        if canvas_id is not None:
            by_id = [col for _, cid, col in found if cid == canvas_id]
            if by_id:
                return by_id[0]
        wanted = {_key(x) for x in (lms_name, title, assignment) if x}
        named = [col for name, _, col in found if _key(name) in wanted]
        return named[0] if len(named) == 1 else None


def _key(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).casefold().split())


def name_key(name: str) -> str:
    """A full name as collect compares it with a Moodle folder's (NFC, case and spaces aside)."""
    return "name:" + _key(name)


def detect(header: list[str]) -> str:
    """"roster", "canvas", "moodle" or "" from a header row."""
    cols = {h.strip() for h in header if h}
    if {"student_id", "lms_id"} <= cols:
        return "roster"
    if {"Student", "ID", "SIS User ID"} <= cols:
        return "canvas"
    if "ID number" in cols and ({"First name", "Last name"} <= cols or "Email address" in cols):
        return "moodle"
    return ""


def read_table(rows: list[dict], header: list[str]) -> RosterTable:
    """``rows`` (csv.DictReader's, the header's line being 1) as a RosterTable, or one with
    format "" when the header is of no known format."""
    fmt = detect(header)
    table = RosterTable(fmt)
    if fmt == "roster" or not fmt:
        table.rows = [(line, row) for line, row in enumerate(rows, start=2)]
        return table
    strip = {(h or "").strip(): h for h in header if h}
    get = lambda row, col: (row.get(strip.get(col, col)) or "").strip()  # noqa: E731
    if fmt == "canvas":
        table.used = {"student_id": "SIS User ID", "lms_id": "ID", "name": "Student"}
        table.used.update({k: c for k, c in (("login", "SIS Login ID"), ("section", "Section")) if c in strip})
        table.assignments = [h.strip() for h in header if h and h.strip() not in CANVAS_IDENTITY]
        for line, row in enumerate(rows, start=2):
            student, sid, lms_id = get(row, "Student"), get(row, "SIS User ID"), get(row, "ID")
            if student.casefold() == "points possible":
                table.skipped.append((line, "Points Possible"))
            elif student.casefold() in TEST_STUDENTS:
                table.skipped.append((line, "Test Student, Canvas's student view"))
            elif not lms_id and not sid:
                table.skipped.append((line, f"no student: {student!r}" if student else "empty"))
            elif not sid:
                table.skipped.append((line, f"no SIS User ID: {student or 'ID ' + lms_id}"))
            else:
                table.rows.append((line, {"student_id": sid, "lms_id": lms_id, "name": student,
                                          "login": get(row, "SIS Login ID"), "section": get(row, "Section")}))
        return table
    # moodle
    table.used = {"student_id": "ID number"}
    if {"First name", "Last name"} <= set(strip):
        table.used["name"] = "First name + Last name"
    if "Email address" in strip:
        table.used["email"] = "Email address"
    section = next((c for c in ("Groups", "Group", "Department") if c in strip), None)
    if section:
        table.used["section"] = section
    table.assignments = [m["name"] for h in header if h and (m := MOODLE_ASSIGNMENT_RE.match(h.strip()))]
    for line, row in enumerate(rows, start=2):
        sid = get(row, "ID number")
        name = " ".join(x for x in (get(row, "First name"), get(row, "Last name")) if x)
        if not sid:
            table.skipped.append((line, f"no ID number: {name or get(row, 'Email address') or 'empty'}"))
            continue
        table.rows.append((line, {"student_id": sid, "lms_id": "", "name": name,
                                  "email": get(row, "Email address"), "section": get(row, section) if section else ""}))
    return table
