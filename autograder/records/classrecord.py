"""The class record, changed one transaction at a time, with its history.

Everything a grading run may change about a class lives in the gradebook's database (SQLite or
PostgreSQL), next to nbgrader's own tables:

* the students' submissions and grades (nbgrader's ``student``, ``submitted_assignment``,
  ``submitted_notebook``, ``grade`` and ``comment`` rows);
* ``course_roster``: the class, one row per student;
* ``course_intake``: what became of each file a run was given (graded, or why not);
* ``course_run``: the history, one row per run (grade, remove, undo, hand grading): when,
  which files, which settings, and every grade it changed (old -> new);
* ``course_snapshot``: what each run replaced, so that ``undo`` can put it back.

``commit`` writes a run in one database transaction: until it returns nothing of the run is
in the record, and a run stopped with Ctrl-C, killed, or failing half way leaves the record
as it was.  ``undo`` restores the record to before a run, also in one transaction, and is
itself a run of the history (so an undo can be undone).
"""
from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass, field

import sqlalchemy as sa

from .faults import fault
from .gradebook import shown, sqlite_path

# Imports inside functions: nbgrader.api is imported where the gradebook's tables are needed: the command
# line's history and undo import this module without nbgrader.

META = sa.MetaData()
ROSTER = sa.Table("course_roster", META, sa.Column("student_id", sa.String(255), primary_key=True),
                  sa.Column("data", sa.Text, nullable=False))
INTAKE = sa.Table("course_intake", META, sa.Column("assignment", sa.String(255), primary_key=True),
                  sa.Column("key", sa.String(1024), primary_key=True), sa.Column("data", sa.Text, nullable=False))
RUNS = sa.Table("course_run", META, sa.Column("id", sa.String(32), primary_key=True),
                sa.Column("assignment", sa.String(255), nullable=False, index=True),
                sa.Column("seq", sa.Integer, nullable=False), sa.Column("kind", sa.String(32), nullable=False),
                sa.Column("at", sa.String(32), nullable=False), sa.Column("data", sa.Text, nullable=False))
SNAPSHOTS = sa.Table("course_snapshot", META, sa.Column("run_id", sa.String(32), primary_key=True),
                     sa.Column("part", sa.String(16), primary_key=True),
                     sa.Column("key", sa.String(1024), primary_key=True), sa.Column("data", sa.Text))
SUBMISSION_TABLES = ("submitted_assignment", "submitted_notebook", "grade", "comment")


class RecordError(RuntimeError):
    """The class record cannot do what was asked (one line: an unknown run, nothing to undo)."""


@dataclass
class Change:
    """One student's standing before and after a run: a total, or a status in words."""

    student_id: str
    old: str
    new: str

    def __str__(self) -> str:
        return f"{self.student_id} {self.old} \u2192 {self.new}"


@dataclass
class RunEntry:
    """A run of the history, as ``history`` lists it."""

    id: str
    seq: int
    kind: str
    at: str
    data: dict = field(default_factory=dict)

    @property
    def changes(self) -> list[Change]:
        return [Change(*c) for c in self.data.get("changes", [])]


def _where(url: str) -> str:
    """The gradebook named for a person: its file, or its URL with the password hidden."""
    return str(sqlite_path(url) or shown(url))


def _entry(url: str, r) -> RunEntry:
    """A row of the history as a RunEntry; a damaged row (its data not a JSON object of the
    fields history reads) is a RecordError that names the gradebook and the row."""
    try:
        data = json.loads(r.data)
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        changes = data.get("changes", [])
        if not isinstance(changes, list) or not all(isinstance(c, list) and len(c) == 3 for c in changes):
            raise ValueError("its list of changed grades is malformed")
        for key in ("files", "removed", "undid_seq"):
            if not isinstance(data.get(key, []), list):
                raise ValueError(f"its {key!r} is not a list")
        if not isinstance(data.get("undone_by", ""), str) or not isinstance(data.get("settings", {}), dict):
            raise ValueError("its 'undone_by' or 'settings' is malformed")
        return RunEntry(str(r.id), int(r.seq), str(r.kind), str(r.at), data)
    except (TypeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise RecordError(f"the history in {_where(url)} is damaged: row {r.seq!r} of table {RUNS.name} (run id "
                          f"{str(r.id)[:8]}, assignment {r.assignment}) cannot be read: {str(exc)[:200]}") from None


def _snapshot(url: str, run: RunEntry, part, key, data):
    try:
        return json.loads(data) if data is not None else None
    except (TypeError, ValueError) as exc:
        raise RecordError(f"the history in {_where(url)} is damaged: the saved {part} {str(key)[:80]!r} of run "
                          f"{run.seq} (table {SNAPSHOTS.name}, run id {run.id[:8]}) cannot be read: "
                          f"{str(exc)[:200]}") from None


def _engine(url: str):
    return sa.create_engine(url, future=True)


def _tables():
    from nbgrader.api import Base

    return Base.metadata.tables


def _plain(value):
    """A row value as JSON (dates and intervals tagged, to come back as what they were)."""
    if isinstance(value, dt.datetime):
        return {"$dt": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"$td": value.total_seconds()}
    return value


def _typed(value):
    if isinstance(value, dict) and "$dt" in value:
        return dt.datetime.fromisoformat(value["$dt"])
    if isinstance(value, dict) and "$td" in value:
        return dt.timedelta(seconds=value["$td"])
    return value


def _rows(conn, table, where) -> list[dict]:
    return [{k: _plain(v) for k, v in r._mapping.items()} for r in conn.execute(sa.select(table).where(where))]


def assignment_id(conn, assignment: str) -> str | None:
    t = _tables()["assignment"]
    row = conn.execute(sa.select(t.c.id).where(t.c.name == assignment)).first()
    return row[0] if row else None


def submission_rows(conn, aid: str, student: str) -> dict:
    """Every row of ``student``'s submission of assignment ``aid`` (empty lists when none)."""
    t = _tables()
    out = {"student": _rows(conn, t["student"], t["student"].c.id == student)}
    sa_ = _rows(conn, t["submitted_assignment"], sa.and_(t["submitted_assignment"].c.assignment_id == aid,
                                                          t["submitted_assignment"].c.student_id == student))
    out["submitted_assignment"] = sa_
    sn = _rows(conn, t["submitted_notebook"], t["submitted_notebook"].c.assignment_id.in_([r["id"] for r in sa_]))
    out["submitted_notebook"] = sn
    ids = [r["id"] for r in sn]
    out["grade"] = _rows(conn, t["grade"], t["grade"].c.notebook_id.in_(ids))
    out["comment"] = _rows(conn, t["comment"], t["comment"].c.notebook_id.in_(ids))
    return out


def _delete_submission(conn, rows: dict) -> None:
    t = _tables()
    nb_ids = [r["id"] for r in rows["submitted_notebook"]]
    conn.execute(sa.delete(t["comment"]).where(t["comment"].c.notebook_id.in_(nb_ids)))
    conn.execute(sa.delete(t["grade"]).where(t["grade"].c.notebook_id.in_(nb_ids)))
    conn.execute(sa.delete(t["submitted_notebook"]).where(t["submitted_notebook"].c.id.in_(nb_ids)))
    conn.execute(sa.delete(t["submitted_assignment"]).where(
        t["submitted_assignment"].c.id.in_([r["id"] for r in rows["submitted_assignment"]])))


def _insert_submission(conn, rows: dict) -> None:
    t = _tables()
    for student in rows.get("student", []):
        if conn.execute(sa.select(t["student"].c.id).where(t["student"].c.id == student["id"])).first() is None:
            conn.execute(sa.insert(t["student"]).values(**{k: _typed(v) for k, v in student.items()}))
    for name in SUBMISSION_TABLES:
        values = [{k: _typed(v) for k, v in r.items()} for r in rows.get(name, [])]
        if values:
            conn.execute(sa.insert(t[name]), values)


def standing(rows: dict) -> str:
    """A submission's total in words: '30', or 'no grade' when it has none."""
    if not rows.get("submitted_assignment"):
        return "no grade"
    total = 0.0
    for g in rows.get("grade", []):
        score = g["manual_score"] if g["manual_score"] is not None else g["auto_score"]
        total += float(score or 0.0) + float(g.get("extra_credit") or 0.0)
    return f"{total:g}"


@dataclass
class Commit:
    """What one run puts into the class record."""

    assignment: str
    kind: str = "grade"                       # grade, remove, undo, handgrade
    submissions: dict = field(default_factory=dict)  # student -> rows to put in (None: remove theirs)
    intake: dict = field(default_factory=dict)       # key -> facts about a file (None: forget it)
    roster: dict | None = None                # the whole class (student -> row), when it changes
    data: dict = field(default_factory=dict)  # files, settings, summary: what history shows
    # student -> {grade_id of a hand-graded cell: True when its answer changed since the record's
    # submission}: a hand grade stays with an unchanged answer, and leaves a changed one
    answers: dict = field(default_factory=dict)
    rehand: list = field(default_factory=list)  # filled by commit: [student, grade_id, old points]


def ensure_tables(url: str) -> None:
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            META.create_all(conn)
    finally:
        engine.dispose()


def commit(url: str, change: Commit, run_id: str | None = None) -> tuple[str, list[Change]]:
    """Put ``change`` into the class record in one transaction; return the run's id (``run_id``
    when given: the id its staged files were filed under, ``files.FileChanges``) and the grades
    it changed."""
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            META.create_all(conn)
            out = _commit(conn, change, run_id)
            fault("commit")  # a kill or a full disk as the transaction commits: nothing of it stays
            return out
    finally:
        engine.dispose()


def _commit(conn, change: Commit, run_id: str | None = None) -> tuple[str, list[Change]]:
    run_id = run_id or uuid.uuid4().hex
    aid = assignment_id(conn, change.assignment)
    snapshot, changes = [], []
    for student, new in sorted(change.submissions.items()):
        old = submission_rows(conn, aid, student) if aid else {}
        snapshot.append(("submission", student, old))
        if aid and old.get("submitted_assignment"):
            _delete_submission(conn, old)
        again = []
        if new and old.get("grade") and student in change.answers:
            again = _carry_hand_grades(conn, old, new, change.answers[student])
            change.rehand += [[student, gid, points] for gid, points in again]
        if new:
            _insert_submission(conn, new)
        before, after = standing(old), standing(new or {})
        if again:  # shown even when the total stays (an answer hand-graded 0)
            after += " (" + ", ".join(f"{gid} answered anew: awaiting a grader" for gid, _ in again) + ")"
        if before != after:
            changes.append(Change(student, before, after))
    for key, facts in sorted(change.intake.items()):
        row = conn.execute(sa.select(INTAKE.c.data).where(INTAKE.c.assignment == change.assignment,
                                                          INTAKE.c.key == key)).first()
        snapshot.append(("intake", key, None if row is None else json.loads(row[0])))
        conn.execute(sa.delete(INTAKE).where(INTAKE.c.assignment == change.assignment, INTAKE.c.key == key))
        if facts is not None:
            conn.execute(sa.insert(INTAKE).values(assignment=change.assignment, key=key, data=json.dumps(facts)))
    if change.roster is not None:
        old_roster = roster(conn)
        if old_roster != change.roster:
            snapshot.append(("roster", "*", old_roster))
            _put_roster(conn, change.roster)
    seq = (conn.execute(sa.select(sa.func.max(RUNS.c.seq)).where(RUNS.c.assignment == change.assignment)).scalar()
           or 0) + 1
    data = dict(change.data, changes=[[c.student_id, c.old, c.new] for c in changes],
                students=sorted(change.submissions))
    if change.rehand:
        data["rehand"] = change.rehand
    conn.execute(sa.insert(RUNS).values(id=run_id, assignment=change.assignment, seq=seq, kind=change.kind,
                                        at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                                        data=json.dumps(data, default=str)))
    for part, key, rows in snapshot:
        conn.execute(sa.insert(SNAPSHOTS).values(run_id=run_id, part=part, key=key, data=json.dumps(rows)))
    return run_id, changes


def _carry_hand_grades(conn, old: dict, new: dict, changed: dict) -> list[tuple[str, float]]:
    """A resubmission's rows (``new``, in place) given the hand grades of ``old`` where the
    hand-graded answer is unchanged, and none where it changed (awaiting a grader again, as
    nbgrader first left it).  Returns (grade_id, old points) of each hand grade left behind."""
    cells = _tables()["base_cell"]
    # a grade belongs to the answer's grade cell and its comment to its solution cell: two rows
    # of base_cell with one name (so the comment is found by the name, not by the grade's cell id)
    ids = {r["cell_id"] for part in (new.get("grade", []), new.get("comment", []), old.get("comment", []))
           for r in part}
    names = {r.id: r.name for r in conn.execute(sa.select(cells.c.id, cells.c.name).where(cells.c.id.in_(ids)))}
    old_grades = {g["cell_id"]: g for g in old.get("grade", [])}
    old_comments = {names.get(c["cell_id"]): c for c in old.get("comment", [])}
    new_comments = {names.get(c["cell_id"]): c for c in new.get("comment", [])}
    again = []
    for g in new.get("grade", []):
        name = names.get(g["cell_id"])
        before = old_grades.get(g["cell_id"])
        if name not in changed or before is None:
            continue
        comment, old_comment = new_comments.get(name), old_comments.get(name)
        if not changed[name]:  # the same answer: the same hand grade
            for key in ("manual_score", "extra_credit", "needs_manual_grade"):
                g[key] = before[key]
            if comment is not None:
                comment["manual_comment"] = old_comment["manual_comment"] if old_comment else None
            continue
        if before["manual_score"] is not None:
            again.append((name, float(before["manual_score"])))
        g["manual_score"] = g["extra_credit"] = None
        if g["auto_score"] is None:  # a written answer (a blank one scored 0 automatically)
            g["needs_manual_grade"] = True
        if comment is not None:
            comment["manual_comment"] = None
    return again


def roster(conn) -> dict:
    return {r.student_id: json.loads(r.data) for r in conn.execute(sa.select(ROSTER))}


def _put_roster(conn, rows: dict) -> None:
    conn.execute(sa.delete(ROSTER))
    if rows:
        conn.execute(sa.insert(ROSTER), [{"student_id": k, "data": json.dumps(v)} for k, v in sorted(rows.items())])


def read_roster(url: str) -> dict:
    """The saved class: student id -> its roster row (empty when no roster was ever given)."""
    return _read(url, roster, {})


def read_intake(url: str, assignment: str) -> dict:
    """key -> what became of that file, for every file of ``assignment`` runs were given."""
    def get(conn):
        return {r.key: json.loads(r.data) for r in conn.execute(sa.select(INTAKE).where(INTAKE.c.assignment == assignment))}
    return _read(url, get, {})


def with_submission(url: str, assignment: str, students) -> set[str]:
    """Those of ``students`` who have something of ``assignment`` in the record: a submission in
    the gradebook, or a file a run was given (graded or not)."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return set()
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            found = set()
            aid = assignment_id(conn, assignment)
            intake = sa.inspect(conn).has_table(INTAKE.name)
            for s in students:
                if aid and submission_rows(conn, aid, s)["submitted_assignment"]:
                    found.add(s)
                elif intake and conn.execute(sa.select(INTAKE.c.key).where(
                        INTAKE.c.assignment == assignment, INTAKE.c.key == s)).first() is not None:
                    found.add(s)
            return found
    finally:
        engine.dispose()


def history(url: str, assignment: str) -> list[RunEntry]:
    """Every run of ``assignment``, oldest first."""
    def get(conn):
        rows = conn.execute(sa.select(RUNS).where(RUNS.c.assignment == assignment).order_by(RUNS.c.seq))
        return [_entry(url, r) for r in rows]
    return _read(url, get, [])


def export_settings(url: str, assignment: str) -> dict:
    """What the grading runs of ``assignment`` said about its exports (``canvas_column``: the
    column of a Canvas gradebook export; ``missing``: "zero" or "blank"), the latest run not undone
    winning; empty when none said anything (or there is no record yet)."""
    out: dict = {}
    try:
        runs = history(url, assignment)
    except Exception:  # noqa: BLE001 - no record yet, or a damaged history: the defaults
        return out
    for r in runs:
        if r.kind == "grade" and not r.data.get("undone_by") and isinstance(r.data.get("exports"), dict):
            out.update({k: v for k, v in r.data["exports"].items() if isinstance(v, str) and v})
    return out


def _read(url: str, get, empty):
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return empty
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(RUNS.name):
                return empty
            return get(conn)
    finally:
        engine.dispose()


def undo(url: str, assignment: str, run: str | None = None, run_id: str | None = None,
         before_commit=None) -> tuple[RunEntry, list[RunEntry], list[Change]]:
    """Restore the record of ``assignment`` to what it was before ``run`` (an id, its number in
    the history, or None: the last run that was not undone), undoing every later run too.  One
    transaction; recorded as a run itself (id ``run_id`` when given).  ``before_commit(undone)``
    is called last inside the transaction (to stage the files it names: an error there leaves the
    record as it was).  Returns (the undo's entry, the runs undone, the grades changed)."""
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            META.create_all(conn)
            runs = [_entry(url, r) for r in
                    conn.execute(sa.select(RUNS).where(RUNS.c.assignment == assignment).order_by(RUNS.c.seq))]
            live = [r for r in runs if not r.data.get("undone_by")]
            if run is None:
                targets = [r for r in live if r.kind != "undo"]
                if not targets:
                    raise RecordError(f"nothing to undo: no run of {assignment} in the history")
                first = targets[-1]
            else:
                first = _named_run(runs, str(run), assignment)
                if first.data.get("undone_by"):
                    raise RecordError(f"run {first.seq} of {assignment} was already undone")
            undone = [r for r in live if r.seq >= first.seq]
            # what the record becomes: each run's snapshot, newest first
            restore = Commit(assignment, kind="undo", data={"undid": [r.id for r in undone],
                                                            "undid_seq": [r.seq for r in undone]})
            for r in reversed(undone):
                for part, key, data in conn.execute(sa.select(SNAPSHOTS.c.part, SNAPSHOTS.c.key, SNAPSHOTS.c.data)
                                                    .where(SNAPSHOTS.c.run_id == r.id)):
                    rows = _snapshot(url, r, part, key, data)
                    if part == "submission":
                        restore.submissions[key] = rows if rows and rows.get("submitted_assignment") else None
                    elif part == "intake":
                        restore.intake[key] = rows
                    elif part == "roster":
                        restore.roster = rows
            run_id, changes = _commit(conn, restore, run_id)
            for r in undone:
                r.data["undone_by"] = run_id
                conn.execute(sa.update(RUNS).where(RUNS.c.id == r.id).values(data=json.dumps(r.data, default=str)))
            if before_commit is not None:
                before_commit(undone)
            fault("commit")
            entry = RunEntry(run_id, max(r.seq for r in runs) + 1, "undo", "", restore.data)
            return entry, undone, changes
    finally:
        engine.dispose()


def _named_run(runs: list[RunEntry], name: str, assignment: str) -> RunEntry:
    """The run ``name`` names: a number is its place in the history (never an id prefix, which
    may be made of digits too); otherwise a prefix of its id, of at least 4 characters, that
    names one run only."""
    if name.isdigit():
        found = [r for r in runs if r.seq == int(name)]
    elif len(name) >= 4:
        found = [r for r in runs if r.id.startswith(name.lower())]
    else:
        raise RecordError(f"{name!r}: give a run's number, or at least 4 characters of its id "
                          f"(see: history {assignment})")
    if len(found) > 1:
        raise RecordError(f"{name!r} names {len(found)} runs of {assignment}; give more of the id "
                          f"(see: history {assignment})")
    if not found:
        raise RecordError(f"no run {name!r} of {assignment} in the history (see: history {assignment})")
    return found[0]


def staged_rows(staging_url: str, assignment: str, students: list[str]) -> dict:
    """student -> the rows a grading worker wrote for them into its own gradebook."""
    engine = _engine(staging_url)
    try:
        with engine.connect() as conn:
            aid = assignment_id(conn, assignment)
            return {s: submission_rows(conn, aid, s) for s in students} if aid else {}
    finally:
        engine.dispose()
