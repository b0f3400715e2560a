"""Collect submissions from an LMS bulk download into one folder that ``grade`` reads.

Canvas ("Download submissions") names each file
``<name>[_LATE]_<user id>_<submission id>_<original name>[-N].ipynb``; Moodle
("Download all submissions") puts each student's files in a folder
``<Full Name>_<participant id>_assignsubmission_file[_]``.  A plain folder of
``<student id>_<assignment>.ipynb`` files passes through unchanged.

A roster CSV (columns ``student_id`` and ``lms_id``; optional ``name``, ``email``,
``login``, ``section``) maps LMS ids to the course's student ids.  Nothing is
dropped silently: every entry of the zip (or file of the folder) gets a row in
``.collect_report.csv`` saying what became of it (collected, late, unmatched, duplicate,
not a notebook, unsafe path, link, too big, name too long, could not be extracted ...), and
a problem with one entry is that entry's row: the class goes on.  (A folder that holds
files is represented by their rows; an empty one has a row of its own.)

The zip is never extracted by name.  Entries are judged from the zip's directory first
(name, kind, declared size); only the one notebook kept for each student is read, counting
the bytes it really inflates to, and written to a path built here,
``<student id>_<assignment>.ipynb``.  Limits: ``MAX_FILE_BYTES`` per notebook (the size
intake reads, 64 MiB) and ``MAX_TOTAL_BYTES`` for all notebooks of one zip (2 GiB); both
are arguments of ``collect`` (``--max-file-mb``, ``--max-total-mb`` on the command line).
Names of any length are fine (a Moodle folder of 150 CJK characters is 456 bytes, more than
Linux allows for one file name): a student is known by the LMS id in the name, and a name
never becomes a file name.  Of a student's Canvas files the newest is kept (the highest
submission id, then the highest ``-N`` suffix); of a student's Moodle attempts, the newest by
the zip's own dates (each entry's date and time), whatever the files are called; the report
names each file dropped.

Identity: the roster may name each student id and each LMS id once (a repeated one is refused
with its line numbers: two rows would merge two students, or split one); every name is taken in
Unicode NFC, so a name typed on a Mac (NFD) and elsewhere is one name; and two files whose names
name different students but would make one id (``José_attention.ipynb`` and
``Josè_attention.ipynb`` both make ``Jos``) are both refused, each naming the other.
"""
from __future__ import annotations

import csv
import hashlib
import os
import re
import stat
import tempfile
import time
import unicodedata
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable

from autograder.text import csvsafe
from .lmsroster import RosterTable, name_key, read_table
from .intake import MAX_NOTEBOOK_BYTES, colliding_names, collision_reason, student_id_from_name

CANVAS_RE = re.compile(r"^(?P<name>[^_]+)_(?P<late>(?i:late)_)?(?P<uid>\d{1,20})_(?P<subid>\d{1,20})_(?P<orig>.+)$")
MOODLE_RE = re.compile(r"^(?P<name>.+)_(?P<uid>\d{1,20})_assignsubmission_(?:file|onlinetext)_?$")
RESUBMISSION_RE = re.compile(r"-(\d{1,6})\.ipynb$", re.I)   # attention-1.ipynb: Canvas' second upload

MAX_FILE_BYTES = MAX_NOTEBOOK_BYTES      # 64 MiB: a notebook larger than this is not read by intake either
MAX_TOTAL_BYTES = 2 << 30                # 2 GiB of notebooks from one zip
MAX_NAME_CHARS = 1024                    # an entry's whole name (a zip allows 65535 bytes)
REPORT_COLUMNS = ["source", "lms", "lms_id", "name", "student_id", "late", "status", "collected_as"]
IGNORED = "ignored:"                     # rows of folders and system files: in the report, not in grades.csv
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    """What became of one entry of the download (or file of the folder): a row of the collect
    report.  Frozen: ``collect`` replaces an entry with what it learns of it."""

    source: str
    lms: str = "folder"
    lms_id: str = ""
    name: str = ""
    late: bool = False
    student_id: str = ""
    status: str = ""
    target: str = ""


@dataclass
class _Item:
    """One entry of the zip (or file of the folder), before anything of it is read."""

    name: str                                # as stored, '/' between parts
    kind: str                                # "file", "dir", "link", "special"
    size: int                                # the declared size (the zip's directory, or stat)
    open: Callable[[], BinaryIO] | None = None
    when: int = 0                            # its date, YYYYMMDDhhmmss (the zip's entry date, or mtime)


def _fmt_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def _printable(text: str) -> str:
    """``text`` with control and format characters (newlines, bidi overrides) and the bytes
    of a file name that is not UTF-8 as escapes,
    and a name beyond MAX_NAME_CHARS shortened with a hash of the whole."""
    out = "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") else ch
                  for ch in text)
    if len(out) > MAX_NAME_CHARS:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        out = f"{out[:200]}... ({len(text)} characters, sha256 {digest})"
    return out


# ----------------------------------------------------------------------------- the roster

class RosterError(ValueError):
    """A roster that cannot be used as it is: one line naming the file and its lines."""


def roster_rows(path: Path, assignment: str | None = None) -> list[tuple[int, dict]]:
    """The rows of a roster CSV with their line numbers (``roster_table``)."""
    return roster_table(path, assignment).rows


def roster_table(path: Path, assignment: str | None = None) -> RosterTable:
    """The rows of a roster file with their line numbers, every cell in Unicode NFC and the two
    ids stripped: the course's roster CSV, or Canvas's gradebook export, or Moodle's participants
    or grades export, told apart by the header (``lmsroster``).  A row without a student id is
    skipped, with its line, as the LMS exports' rows without one are.  RosterError (one line,
    nothing else read) when there is no such file, when it cannot be read, is of no known format,
    has a student id that cannot be a file name (``<student id>_<assignment>.ipynb`` must read
    back as the same id), or names a student id or an LMS id twice (two rows of one id would merge
    two students into one, or split one).  The one reader of a roster file: ``load_roster``,
    ``read_roster`` and the command line's ``collect`` and ``grade`` all come here."""
    path = Path(path)
    if not path.is_file():
        raise RosterError(f"no such roster file: {path}")
    try:
        rows = csvsafe.read(path)
        with open(path, newline="", encoding="utf-8-sig") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        raise RosterError(f"roster {path}: cannot be read ({exc})") from None
    table = read_table(rows, header)
    if not rows or not table.format:
        raise RosterError(f"roster {path}: needs the columns student_id and lms_id, or to be Canvas's gradebook "
                          "export (Student, ID, SIS User ID, ...) or Moodle's participants or grades export "
                          f"(First name, Last name, ID number, ...) (it has: "
                          f"{', '.join(sorted(k for k in rows[0] if k)) if rows else 'no rows'})")
    out, lines = [], {"student id": {}, "lms id": {}}
    for line, row in table.rows:
        row = {k: _nfc(v) if isinstance(v, str) else "" for k, v in row.items() if k}
        row["student_id"], row["lms_id"] = row.get("student_id", "").strip(), row.get("lms_id", "").strip()
        sid = row["student_id"]
        if not sid:
            who = row["lms_id"] and f"lms id {row['lms_id']}" or (row.get("name") or "").strip() or "empty"
            table.skipped.append((line, f"no student_id: {who}"))
            continue
        if assignment and not usable_id(sid, assignment):
            raise RosterError(f"roster {path}, line {line}: student id {sid!r} cannot be a file name; use at most "
                              "100 letters, digits, '_', '.' and '-' (not first or last)")
        for what, value in (("student id", sid), ("lms id", row["lms_id"])):
            if value:
                lines[what].setdefault(value, []).append(line)
        out.append((line, row))
    repeated = [f"{what} {value!r} on lines {', '.join(map(str, at[:-1]))} and {at[-1]}"
                for what, seen in lines.items() for value, at in seen.items() if len(at) > 1]
    if repeated:
        raise RosterError(f"roster {path}: each student once, please: " + "; ".join(repeated))
    table.rows = out
    return table


def load_roster(path: Path, assignment: str | None = None) -> tuple[dict[str, dict], RosterTable]:
    """A roster file as the class: student id -> row, and the table it was read from (its
    format, the columns used, the rows skipped: ``RosterTable.describe``).  RosterError as
    ``roster_table``."""
    table = roster_table(path, assignment)
    return {row["student_id"]: row for _, row in table.rows}, table


def lms_index(rows) -> dict[str, dict]:
    """LMS id -> roster row, and for the rows without an LMS id (Moodle's exports) their full
    name (``name_key``) -> row, a name two students share left out (their folders stay unmatched,
    and say so)."""
    rows = list(rows)
    out = {r["lms_id"].strip(): r for r in rows if (r.get("lms_id") or "").strip()}
    names: dict[str, list] = {}
    for r in rows:
        if not (r.get("lms_id") or "").strip() and (r.get("name") or "").strip():
            names.setdefault(name_key(r["name"]), []).append(r)
    out.update({k: v[0] for k, v in names.items() if len(v) == 1})
    return out


def read_roster(path: Path | None, assignment: str | None = None) -> dict[str, dict]:
    """lms id -> roster row (``load_roster``: RosterError, one line, for a roster that cannot be
    used)."""
    if path is None:
        return {}
    return lms_index(load_roster(path, assignment)[0].values())


def usable_id(sid: str, assignment: str) -> bool:
    try:
        return student_id_from_name(Path(f"{sid}_{assignment}.ipynb"), assignment) == sid
    except ValueError:
        return False


# ----------------------------------------------------------------------------- reading the input

def _zip_items(zf: zipfile.ZipFile) -> list[_Item]:
    items = []
    for info in zf.infolist():
        kind_bits = stat.S_IFMT(info.external_attr >> 16)  # 0: the zip does not say (a plain file)
        if info.is_dir() or kind_bits == stat.S_IFDIR:
            kind = "dir"
        elif kind_bits == stat.S_IFLNK:
            kind = "link"
        elif kind_bits not in (0, stat.S_IFREG):
            kind = "special"
        else:
            kind = "file"
        items.append(_Item(info.filename, kind, info.file_size, (lambda i=info: zf.open(i)), _stamp(info.date_time)))
    return items


def _folder_items(root: Path) -> list[_Item]:
    """Every file, folder and link under ``root``, links never followed."""
    items = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            try:
                st = path.lstat()
            except OSError:
                items.append(_Item(rel, "special", 0))
                continue
            if stat.S_ISLNK(st.st_mode):
                items.append(_Item(rel, "link", st.st_size))
            elif stat.S_ISDIR(st.st_mode):
                items.append(_Item(rel + "/", "dir", 0))
            elif stat.S_ISREG(st.st_mode):
                items.append(_Item(rel, "file", st.st_size,
                                   (lambda p=path: os.fdopen(os.open(p, os.O_RDONLY | os.O_NOFOLLOW), "rb")),
                                   _stamp(time.localtime(st.st_mtime)[:6])))
            else:
                items.append(_Item(rel, "special", st.st_size))
    return items


def _stamp(date_time) -> int:
    """(2024, 3, 1, 12, 0, 58) -> 20240301120058: dates that sort as numbers."""
    try:
        return int("".join(f"{int(x):0{4 if i == 0 else 2}d}" for i, x in enumerate(tuple(date_time)[:6])))
    except (TypeError, ValueError):
        return 0


def _parts(name: str) -> tuple[str, ...]:
    return tuple(p for p in name.replace("\\", "/").split("/") if p not in ("", "."))


def _unsafe(name: str) -> str:
    """Why ``name`` would point outside the folder it is unpacked into ("" when it would not)."""
    plain = name.replace("\\", "/")
    if plain.startswith("/") or re.match(r"^[A-Za-z]:", plain):
        return "an absolute path"
    if ".." in plain.split("/"):
        return "a path with '..' (it leaves the folder)"
    return ""


def _identify(parts: tuple[str, ...], kind: str) -> dict:
    """The LMS, its id of the student, the name and lateness an entry's name says (none for a plain file)."""
    if parts and (m := MOODLE_RE.match(parts[0])) and (len(parts) > 1 or kind == "dir"):
        return {"lms": "moodle", "lms_id": m["uid"], "name": _printable(_nfc(m["name"]))}
    if parts and kind != "dir" and (m := CANVAS_RE.match(parts[-1])):
        return {"lms": "canvas", "lms_id": m["uid"], "name": _printable(_nfc(m["name"])), "late": bool(m["late"])}
    return {}


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _newest_first(e: Entry, item: _Item) -> tuple:
    """Sort key: the newest Canvas file first (the highest submission id, which Canvas
    gives out in order, then the highest -N suffix; the suffix alone could be the student's
    own file name); the newest Moodle attempt first, by the zip's own date of each entry (a
    file name says nothing of when it was handed in); other files keep their order."""
    if e.lms == "moodle":
        return (0, -item.when, 0)
    if e.lms != "canvas":
        return (0, 0, 0)
    m = CANVAS_RE.match(_parts(item.name)[-1])
    n = RESUBMISSION_RE.search(m["orig"]) if m else None
    return (0, -int(m["subid"]) if m else 0, -int(n.group(1)) if n else 0)


# ----------------------------------------------------------------------------- collect

def collect(assignment: str, source: Path, out: Path, roster: Path | None = None,
            max_file_bytes: int = MAX_FILE_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES,
            by_lms: dict | None = None) -> list[Entry]:
    """Write each student's notebook to ``out/<student id>_<assignment>.ipynb``.  Every entry
    gets an Entry saying what became of it; a file that is not a notebook is still matched
    to its student, so the student's row can say why it was not graded."""
    by_lms = read_roster(roster, assignment) if by_lms is None else by_lms
    source = Path(source)
    zf = None
    if source.is_file() and zipfile.is_zipfile(source):
        try:
            zf = zipfile.ZipFile(source)
            items = _zip_items(zf)
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
            raise SystemExit(f"cannot read the zip file {source}: {exc}") from None
    elif source.is_dir():
        items = _folder_items(source)
    else:
        raise SystemExit(f"not a folder or a zip file: {source}")
    try:
        entries = _collect(assignment, items, Path(out), by_lms, max_file_bytes, max_total_bytes)
    finally:
        if zf is not None:
            zf.close()
    _write_report(out, entries)
    _write_lms_ids(out, entries, by_lms)
    return entries


def _collect(assignment: str, items: list[_Item], out: Path, by_lms: dict, max_file: int,
             max_total: int) -> list[Entry]:
    out.mkdir(parents=True, exist_ok=True)
    items = sorted(items, key=lambda i: i.name)
    holders = {p for i in items for p in (_parts(i.name)[:k] for k in range(1, len(_parts(i.name))))}
    entries: list[Entry] = []             # each a frozen Entry: what is learned of one replaces it
    candidates: list[tuple[int, _Item]] = []  # (its place in entries, the item)

    def decide(at: int, **found) -> None:
        entries[at] = replace(entries[at], **found)

    for item in items:
        if item.kind == "dir" and _parts(item.name) in holders and not _unsafe(item.name):
            continue  # a folder that holds files: they have rows of their own
        e = Entry(_printable(item.name))
        try:
            e = _judge(e, item, assignment, by_lms, max_file)
        except Exception as exc:  # noqa: BLE001 - one entry never stops the class
            e = replace(e, status=f"could not be read: {type(exc).__name__}: {exc}"[:300])
        entries.append(e)
        if not e.status:
            candidates.append((len(entries) - 1, item))

    # two students never share an id: file names that name different students but make one id
    by_name = [(at, item) for at, item in candidates if not entries[at].lms_id]
    for sid, names in colliding_names([_parts(item.name)[-1] for _, item in by_name], assignment).items():
        for at, item in by_name:
            if _parts(item.name)[-1] in names:
                decide(at, status=collision_reason(sid, [_printable(n) for n in names], assignment), student_id="")
    candidates = [(at, item) for at, item in candidates if not entries[at].status]

    # one notebook per student: the newest Canvas file or Moodle attempt, else the first in name order
    kept: dict[str, tuple[Entry, _Item]] = {}
    for at, item in sorted(candidates, key=lambda c: (entries[c[0]].student_id, _newest_first(entries[c[0]], c[1]),
                                                      c[1].name)):
        e = entries[at]
        first, first_item = kept.get(e.student_id, (None, None))
        if first is None:
            kept[e.student_id] = (e, item)
        elif e.lms == "canvas" and first.lms == "canvas":
            decide(at, status=f"duplicate: an older file of student {e.student_id}; the newest, {first.source}, "
                              "is graded")
        elif e.lms == "moodle" and first.lms == "moodle" and first_item.when > item.when:
            decide(at, status=(f"duplicate: an older attempt of student {e.student_id} (by the zip's dates: "
                               f"{_date(item.when)}); the newest, {first.source} ({_date(first_item.when)}), "
                               "is graded"))
        else:
            decide(at, status=f"duplicate: student {e.student_id} already has {first.source}")

    written = 0
    for at, item in candidates:
        e = entries[at]
        if e.status:
            continue
        if written + item.size > max_total:
            decide(at, status=(f"not extracted: the notebooks of this zip pass {_fmt_bytes(max_total)} in all "
                               "(collect --max-total-mb)"))
            continue
        target = f"{e.student_id}_{assignment}.ipynb"
        try:
            size = _extract(item, out / target, min(max_file, max_total - written))
        except _TooBig as exc:
            decide(at, status=(f"too big: it inflates past {_fmt_bytes(exc.limit)} (its header said "
                               f"{_fmt_bytes(item.size)}): not extracted"))
            continue
        except Exception as exc:  # noqa: BLE001 - a corrupt or encrypted entry is its own row
            decide(at, status=f"could not be extracted: {_cause(exc)}"[:300])
            continue
        written += size
        decide(at, target=target, status="collected, LATE" if e.late else "collected")
    return entries


def _date(stamp: int) -> str:
    s = f"{stamp:014d}"
    return f"{s[:4]}-{s[4:6]}-{s[6:8]} {s[8:10]}:{s[10:12]}:{s[12:]}"


def _judge(e: Entry, item: _Item, assignment: str, by_lms: dict, max_file: int) -> Entry:
    """``e`` with what the entry's name, kind and declared size say: its status empty when it is a
    notebook to extract, else why it is not."""
    parts = _parts(item.name)
    if len(item.name) > MAX_NAME_CHARS:
        return replace(e, status=f"name too long ({len(item.name)} characters, at most {MAX_NAME_CHARS}): "
                                 "not extracted")
    if "__MACOSX" in parts or (parts and any(p.startswith(".") for p in parts) and ".." not in parts):
        return replace(e, status=f"{IGNORED} {'macOS metadata' if '__MACOSX' in parts else 'a hidden file or folder'}")
    e = replace(e, **_identify(parts, item.kind))
    notebook = bool(parts) and parts[-1].lower().endswith(".ipynb")
    if e.lms_id:
        row = by_lms.get(e.lms_id)
        if row is None and e.lms == "moodle":  # Moodle's exports carry no participant id: the full name
            row = by_lms.get(name_key(e.name))
        if row is not None or not by_lms:
            e = replace(e, student_id=(row or {}).get("student_id", "").strip() or f"{e.lms}{e.lms_id}")
    elif notebook and item.kind == "file" and not _unsafe(item.name):
        try:
            e = replace(e, student_id=student_id_from_name(PurePosixPath(parts[-1]), assignment))
        except ValueError as exc:
            return replace(e, status=f"unmatched: {exc}")
    if why := _unsafe(item.name):
        status = f"unsafe path, {why}: not extracted"
    elif item.kind == "link":
        status = "a symbolic link: not extracted (links are never followed)"
    elif item.kind == "special":
        status = "not a regular file (a device, pipe or socket): not extracted"
    elif e.lms_id and not e.student_id:
        status = f"unmatched: {e.lms} id {e.lms_id} ({e.name}) is not in the roster"
    elif item.kind == "dir":
        status = "empty folder: nothing was handed in"
    elif not notebook:
        suffix = PurePosixPath(parts[-1]).suffix if parts else ""
        status = f"not a notebook ({_printable(suffix) or 'no extension'}): not collected"
    elif item.size > max_file:
        status = (f"too big: {_fmt_bytes(item.size)}, more than the {_fmt_bytes(max_file)} a notebook may "
                  "have (collect --max-file-mb): not extracted")
    else:
        return e
    return replace(e, status=status)


def _cause(exc: Exception) -> str:
    if isinstance(exc, RuntimeError) and "encrypted" in str(exc):
        return "it is encrypted (a password would be needed)"
    if isinstance(exc, NotImplementedError):
        return f"its compression method is not supported ({exc})"
    if isinstance(exc, zipfile.BadZipFile):
        return f"the zip is corrupt there ({exc})"
    return f"{type(exc).__name__}: {exc}"


class _TooBig(Exception):
    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


def _extract(item: _Item, dest: Path, limit: int) -> int:
    """Copy the entry's bytes to ``dest`` (through a hidden temporary file beside it),
    counting what really comes out: past ``limit`` bytes it stops and writes nothing."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".collect-", suffix=".part")
    size = 0
    try:
        with os.fdopen(fd, "wb") as out, item.open() as src:
            while chunk := src.read(_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise _TooBig(limit)
                out.write(chunk)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


# ----------------------------------------------------------------------------- the report

def _write_report(out: Path, entries: list[Entry]) -> None:
    csvsafe.write(Path(out) / ".collect_report.csv", REPORT_COLUMNS,
                  [[e.source, e.lms, e.lms_id, e.name, e.student_id, "yes" if e.late else "", e.status, e.target]
                   for e in entries])


def _write_lms_ids(out: Path, entries: list[Entry], by_lms: dict) -> None:
    """LMS identities for the grade exports (canvas.csv, moodle.csv)."""
    rows = {(r.get("student_id") or "").strip(): r for r in by_lms.values()}
    lines, seen = [], set()
    for e in entries:
        if e.student_id and e.student_id not in seen and (e.target or not any(
                x.target for x in entries if x.student_id == e.student_id)):
            seen.add(e.student_id)
            r = rows.get(e.student_id, {})
            lines.append([e.student_id, e.lms_id or r.get("lms_id", ""), r.get("name", e.name), r.get("email", ""),
                          r.get("login", ""), r.get("section", ""), "yes" if e.late else ""])
    csvsafe.write(Path(out) / ".lms_ids.csv", ["student_id", "lms_id", "name", "email", "login", "section", "late"],
                  lines)


def read_report(folder: Path) -> list[Entry]:
    """The entries ``collect`` wrote into ``folder`` (none when it was not made by collect),
    less folders and system files, which need no row of their own in the class table."""
    path = Path(folder) / ".collect_report.csv"
    if not path.exists():
        return []
    return [Entry(r["source"], r["lms"], r["lms_id"], r["name"], r["late"] == "yes", r["student_id"],
                  r["status"], r["collected_as"]) for r in csvsafe.read(path, encoding="utf-8")
            if not r["status"].startswith(IGNORED)]


def summary(entries: list[Entry]) -> str:
    lines = [f"{e.source}: {e.status}" + (f" -> {e.target}" if e.target else "") for e in entries]
    files = [e for e in entries if not e.status.startswith(IGNORED)]
    ok = sum(1 for e in files if e.target)
    lines.append(f"{len(files)} files: {ok} collected, {len(files) - ok} not collected "
                 f"({sum(1 for e in files if e.late and e.target)} late)"
                 + (f"; {len(entries) - len(files)} system files ignored" if len(entries) > len(files) else ""))
    return "\n".join(lines)
