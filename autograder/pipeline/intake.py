"""Intake: from a file on disk to a clean notebook that the rest of the pipeline can trust.

Every submitted file is read under its own error boundary and rebuilt from scratch:
only each cell's type, source, id and (well-formed) nbgrader metadata survive; outputs,
attachments, widgets and any other metadata are dropped (grading executes the notebook
again anyway).  Only the outputs of the cells ``course.yml`` names under ``handed_in_outputs``
are kept aside, as bounded plain text (``handed_in_outputs``), for the hand grader to see what
the student saw.  Whatever is wrong with a file (not JSON, a byte-order mark, ``"nbgrader":
null``, a code cell without ``outputs``, binary junk) either gets repaired with a note or
becomes a one-line reason; it never raises past ``read_submission``.
"""
from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import nbformat

from autograder.text.outputs import output_text, text_of
from autograder.text.packed import PackedNotebook

MAX_NOTEBOOK_BYTES = 64 << 20  # a notebook larger than this is not read
MAX_CELLS = 10_000             # nor one with more cells (the assignments have under 100)
MAX_ID_CHARS = 100             # a student id taken from a file name
NBGRADER_FIELDS = {"grade": bool, "solution": bool, "locked": bool, "task": bool, "grade_id": str,
                   "points": (int, float), "schema_version": int, "checksum": str, "cell_type": str}


class IntakeError(ValueError):
    """A file that cannot be graded; the message is one line for the summary."""


@dataclass(frozen=True, slots=True)
class Submission:
    """One student's file after intake (the ``read`` stage builds it; later stages make changed
    copies with ``dataclasses.replace``)."""

    student_id: str
    file: str
    nb: PackedNotebook | None = None                 # the repaired notebook, compressed (.load(), .text())
    error: str | None = None
    notes: tuple[str, ...] = ()                       # repairs (for the instructor)
    flags: tuple[str, ...] = ()                       # suspicious code (for the instructor)
    late: bool = False
    lms: Mapping[str, str] = field(default_factory=dict)      # lms_id, name: what the LMS download said
    source: str = ""                                  # the file's name as it came (an LMS zip's entry)
    grade_ids: frozenset[str] = frozenset()           # the grade ids its cells carried, before repair
    remarks: tuple[str, ...] = ()                     # other files of this student, and what became of them
    handed_in: Mapping[str, str] = field(default_factory=dict)  # grade id -> the text of its outputs as handed in


def _name_part(path: Path, assignment: str) -> str:
    """The part of a file name that names the student, in Unicode NFC (one name typed on a Mac,
    NFD, and elsewhere, NFC, is one name): ``Copy of José-attention (1).ipynb`` -> ``José``."""
    stem = unicodedata.normalize("NFC", Path(path.name).stem)
    stem = re.sub(r"^copy of\s+", "", stem, flags=re.I)
    stem = re.sub(r"\s*\(\d+\)$", "", stem)
    return re.sub(rf"[_\-\s]*{re.escape(assignment)}$", "", stem, flags=re.I)


def student_id_from_name(path: Path, assignment: str) -> str:
    """``s123_attention.ipynb`` -> ``s123``; ``Copy of s123-attention (1).ipynb`` -> ``s123``.

    The name is normalised to Unicode NFC first.  An id longer than MAX_ID_CHARS is shortened
    to that length, its end replaced by a hash of the whole, so that two different names never
    give the same id.  Raises ValueError when nothing identifies a student.  Two names that
    differ in what an id cannot hold (``José`` and ``Josè`` both give ``Jos``) give one id:
    ``colliding_names`` finds them, and the files are refused rather than merged."""
    rest = _name_part(path, assignment)
    sid = re.sub(r"[^A-Za-z0-9_.-]", "_", rest).strip("._-")
    if not sid or sid.lower() == assignment.lower():
        raise ValueError(f"cannot tell the student from the file name {path.name!r}: "
                         f"rename it <student id>_{assignment}.ipynb")
    if len(sid) > MAX_ID_CHARS:  # shortened, with a hash of the whole: two long names never meet
        digest = hashlib.sha256(sid.encode()).hexdigest()[:8]
        sid = f"{sid[:MAX_ID_CHARS - 9].rstrip('._-')}-{digest}"
    return sid


def _who(path: Path, assignment: str) -> str:
    """The student a file name names, loosely: letters and digits of any script kept (accents
    too), every run of other characters one ``_``: ``s1.`` and ``s1`` are one student, ``José``
    and ``Josè`` two."""
    return re.sub(r"[\W_]+", "_", _name_part(path, assignment)).strip("_").casefold()


def colliding_names(names: list[str], assignment: str) -> dict[str, list[str]]:
    """student id -> the file names (two or more) that name different students but would each
    become that id (``José_x.ipynb`` and ``Josè_x.ipynb``: ``Jos``).  Such files are refused,
    each naming the others: two students never share an id."""
    by_id: dict[str, dict[str, list[str]]] = {}
    for name in names:
        try:
            sid = student_id_from_name(Path(name), assignment)
        except ValueError:
            continue
        by_id.setdefault(sid, {}).setdefault(_who(Path(name), assignment), []).append(name)
    return {sid: sorted(n for ns in who.values() for n in ns) for sid, who in by_id.items() if len(who) > 1}


def collision_reason(sid: str, names: list[str], assignment: str) -> str:
    """The one line a file of a collision gets (nothing of it is graded)."""
    return (f"refused: the file names {', '.join(repr(n) for n in names)} name different students but each "
            f"becomes student id {sid!r} (an id keeps only letters, digits, '_', '.' and '-'); rename them "
            f"<student id>_{assignment}.ipynb")


def _nbgrader_meta(meta) -> dict | None:
    """A copy of well-formed nbgrader cell metadata, or None (then repair recognises the
    cell by its content, as for a cell that lost its metadata)."""
    if not isinstance(meta, dict):
        return None
    out = {}
    for key, kind in NBGRADER_FIELDS.items():
        if key not in meta:
            continue
        value = meta[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return None
        out[key] = value
    gid = out.get("grade_id")
    if not gid or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,200}", gid):
        return None
    if "points" in out and (out["points"] != out["points"] or out["points"] < 0):
        return None
    out.setdefault("schema_version", 3)
    for key in ("grade", "solution", "locked", "task"):
        out.setdefault(key, False)
    return out


def rebuild(raw: dict) -> tuple[nbformat.NotebookNode, list[str]]:
    """A fresh nbformat 4.5 notebook holding what grading needs from ``raw`` (a parsed
    notebook of any nbformat version 3 or 4)."""
    notes: list[str] = []
    if "worksheets" in raw and "cells" not in raw:  # nbformat 3: cells live in worksheets
        cells = [c for ws in raw.get("worksheets") or [] if isinstance(ws, dict) for c in ws.get("cells") or []]
        cells = [dict(c, source=c.get("input", c.get("source", ""))) if isinstance(c, dict) else c for c in cells]
    else:
        cells = raw.get("cells")
    if not isinstance(cells, list):
        raise IntakeError("has no list of cells")
    if len(cells) > MAX_CELLS:
        raise IntakeError(f"has {len(cells):,d} cells (at most {MAX_CELLS:,d} are graded)")
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    seen: set[str] = set()
    dropped = 0
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict):
            dropped += 1
            continue
        kind = cell.get("cell_type")
        source = text_of(cell.get("source", ""))
        if kind == "heading":  # nbformat 3
            kind, source = "markdown", "#" * int(cell.get("level", 1) or 1) + " " + source
        if kind not in ("code", "markdown", "raw"):
            dropped += 1
            continue
        new = (nbformat.v4.new_code_cell(source) if kind == "code" else
               nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_raw_cell(source))
        meta = cell.get("metadata")
        nbg = _nbgrader_meta(meta.get("nbgrader")) if isinstance(meta, dict) else None
        if nbg is not None:
            new.metadata["nbgrader"] = nbg
        elif isinstance(meta, dict) and meta.get("nbgrader") is not None:
            notes.append(f"cell {i + 1} had malformed grading metadata, which was ignored")
        cid = cell.get("id") or (meta.get("id") if isinstance(meta, dict) else None)
        cid = re.sub(r"[^A-Za-z0-9_-]", "-", str(cid or f"cell-{i}"))[:64] or f"cell-{i}"
        new["id"] = cid if cid not in seen else f"cell-{i}"
        seen.add(new["id"])
        nb.cells.append(new)
    if dropped:
        notes.append(f"{dropped} malformed cell(s) were dropped")
    return nb, notes


def handed_in_outputs(raw: dict, grade_ids) -> dict[str, str]:
    """grade id -> the outputs of that code cell of ``raw`` (a parsed notebook, untrusted) as the
    student handed it in: bounded plain text (``autograder.text.outputs``), first cell of an id."""
    wanted, out = set(grade_ids), {}
    cells = raw.get("cells") if isinstance(raw, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        if not wanted - set(out):
            break
        if not isinstance(cell, dict) or cell.get("cell_type") != "code" or not isinstance(cell.get("metadata"), dict):
            continue
        meta = _nbgrader_meta(cell["metadata"].get("nbgrader"))
        gid = meta and meta.get("grade_id")
        if gid in wanted and gid not in out:
            out[gid] = output_text(cell.get("outputs"))
    return out


def read_submission(path: Path, handed_in: dict | None = None, keep=()) -> tuple[nbformat.NotebookNode, list[str]]:
    """Parse a submitted file as a notebook: (notebook, repair notes), or IntakeError with
    a one-line reason.  ``handed_in`` (a dict), when given, receives the handed-in outputs of
    the cells whose grade ids ``keep`` names (``handed_in_outputs``)."""
    if path.suffix.lower() != ".ipynb":
        raise IntakeError(f"not a notebook: {path.name} (expected a .ipynb file)")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise IntakeError(f"cannot read {path.name} ({exc.strerror})") from None
    if size > MAX_NOTEBOOK_BYTES:
        raise IntakeError(f"not graded: {path.name} is {size >> 20} MiB, larger than {MAX_NOTEBOOK_BYTES >> 20} MiB")
    data = path.read_bytes()
    notes = []
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (some editors on Windows) is fine
    except UnicodeDecodeError:
        raise IntakeError(f"corrupt notebook: {path.name} is not UTF-8 text") from None
    if data.startswith(b"\xef\xbb\xbf"):
        notes.append("the file started with a byte-order mark, which was ignored")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IntakeError(f"corrupt notebook: {path.name} is not valid JSON (line {exc.lineno})") from None
    except RecursionError:
        raise IntakeError(f"corrupt notebook: {path.name} is nested too deeply") from None
    if not isinstance(raw, dict) or ("cells" not in raw and "worksheets" not in raw):
        raise IntakeError(f"corrupt notebook: {path.name} has no cells")
    if handed_in is not None and keep:
        try:
            handed_in.update(handed_in_outputs(raw, keep))
        except (RecursionError, MemoryError, TypeError, ValueError, AttributeError):
            notes.append("the outputs it was handed in with could not be read")
    try:
        nb, more = rebuild(raw)
    except IntakeError as exc:
        raise IntakeError(f"corrupt notebook: {path.name} {exc}") from None
    except (RecursionError, MemoryError, TypeError, ValueError, AttributeError) as exc:
        raise IntakeError(f"corrupt notebook: {path.name} ({type(exc).__name__})") from None
    return nb, notes + more
