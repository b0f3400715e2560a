"""Repair a submission before grading, so that lost metadata never scores a silent zero.

Colab, JupyterLab and LMS round trips can drop nbgrader's cell metadata, and
students delete and re-create cells.  Before autograding we give nbgrader back
what it needs to find each graded cell:

* an answer cell that lost its metadata (or was re-created) is recognised by the
  function or class it defines;
* a locked cell that lost its metadata is recognised by its unchanged source;
* anything still missing is put back from the released notebook, after the
  graded cell that precedes it there (an answer comes back as the unanswered
  stub; locked cells and tests are then overwritten from the gradebook).

Every repair is listed in a note at the top of the notebook (and so in the
feedback) and returned to the caller for the summary.
"""
from __future__ import annotations

import copy
import re

import nbformat

_DEF_RE = re.compile(r"^(?:def|class)\s+([A-Za-z_]\w*)", re.M)


def _gid(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _norm(src: str) -> str:
    return "\n".join(ln.rstrip() for ln in src.strip().splitlines())


def defined_names(src: str) -> set[str]:
    return set(_DEF_RE.findall(src))


def repair(nb, released) -> list[str]:
    """Fix ``nb`` in place against the released student notebook; return notes."""
    notes: list[str] = []
    known = {_gid(c) for c in released.cells if _gid(c)}
    # a cell pasted from another assignment: its grade id means nothing here.  An answer
    # cell stays as ordinary code; a given or test cell of the other notebook is removed.
    kept = []
    for cell in nb.cells:
        gid = _gid(cell)
        if gid and gid not in known:
            meta = cell.metadata.pop("nbgrader")
            if meta.get("solution") and not meta.get("grade") or meta.get("solution") and cell.cell_type == "code":
                notes.append(f"a cell from another notebook (grade id '{gid}') runs as ordinary code, ungraded")
            else:
                notes.append(f"a cell from another notebook (grade id '{gid}') was removed")
                continue
        kept.append(cell)
    nb.cells = kept
    # a copied cell keeps its grade id; nbgrader would choke on the duplicate, so the
    # copy loses its grading metadata and runs as ordinary code
    first: set[str] = set()
    for cell in nb.cells:
        gid = _gid(cell)
        if gid and gid in first:
            cell.metadata.pop("nbgrader")
            notes.append(f"a copy of cell '{gid}' was found; only the first one is graded")
        elif gid:
            first.add(gid)
    present = {_gid(c) for c in nb.cells if _gid(c)}
    orphans = [c for c in nb.cells if not _gid(c)]
    for ref in released.cells:
        gid = _gid(ref)
        if not gid or gid in present:
            continue
        meta = copy.deepcopy(ref.metadata["nbgrader"])
        match = None
        if meta.get("solution") and ref.cell_type == "code":
            names = defined_names(ref.source)
            if names:
                # the last definition is the one the student's kernel used
                hits = [c for c in orphans if c.cell_type == "code" and names & defined_names(c.source)]
                match = hits[-1] if hits else None
        else:
            hits = [c for c in orphans if c.cell_type == ref.cell_type and _norm(c.source) == _norm(ref.source)]
            match = hits[0] if hits else None
        if match is not None:
            match.metadata["nbgrader"] = meta
            orphans.remove(match)
            present.add(gid)
            what = "answer cell" if meta.get("solution") else "cell"
            notes.append(f"{what} '{gid}' had lost its grading metadata and was recognised by its content")
    # second pass: put back what is still missing, in the released order
    last = -1
    for ref in released.cells:
        gid = _gid(ref)
        if not gid:
            continue
        idx = next((i for i, c in enumerate(nb.cells) if _gid(c) == gid), None)
        if idx is None:
            cell = copy.deepcopy(ref)
            cell.pop("id", None)
            restored = nbformat.from_dict(dict(cell, id=f"restored-{gid}"[:64].replace("_", "-")))
            nb.cells.insert(last + 1, restored)
            idx = last + 1
            notes.append(f"cell '{gid}' was missing and is restored from the original")
        last = max(last, idx)
    if notes:
        text = "**Grading notes** (added by the autograder):\n\n" + "\n".join(f"- {n}" for n in notes)
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(text))
    return notes
