"""A code cell's outputs as bounded plain text, from a structure nobody checked.

The hand-grading pages show, beside the grader's re-run, the outputs a student handed in: the
cell outputs of the submitted notebook, which the student controls byte for byte. This module
turns such a list into one string a person can read, and nothing else: any value of the wrong
type is skipped, terminal colour codes and other control characters go (line breaks and tabs
stay), a figure or other rich output is named, not shown, and the text is cut to ``limit``
characters (its start and its end kept, the cut said in words). Escaping for HTML and showing
bidi controls is the page's job (``htmlsafe``); this text is still the student's.

``HANDED_IN_FILE`` is the file, beside a student's graded notebook, that keeps these texts (cell
grade id -> text) for the cells ``course.yml`` names under ``handed_in_outputs``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

HANDED_IN_FILE = "handed-in.json"
CELL_LIMIT = 6000          # characters kept of one cell's outputs
MAX_OUTPUTS = 200          # outputs of one cell looked at
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def text_of(value) -> str:
    """A notebook field that is a string or a list of strings, joined (anything else: "")."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "".join(value)
    return ""


def clean(text: str) -> str:
    """``text`` without terminal escape codes and control characters (bar line breaks and tabs)."""
    return _CONTROL.sub("", _ANSI.sub("", text.replace("\r\n", "\n").replace("\r", "\n")))


def shorten(text: str, limit: int = CELL_LIMIT) -> str:
    """``text`` cut to about ``limit`` characters, its start and its end kept."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]}\n[... {len(text) - head - tail:,d} characters left out ...]\n{text[-tail:]}"


def output_text(outputs, limit: int = CELL_LIMIT) -> str:
    """The outputs of one code cell (nbformat's list of dicts, or anything else) as plain text."""
    if not isinstance(outputs, list):
        return ""
    parts: list[str] = []
    size = 0
    for out in outputs[:MAX_OUTPUTS]:
        if size > 4 * limit:  # enough to cut from
            break
        if not isinstance(out, dict):
            continue
        kind = out.get("output_type")
        if kind == "stream":
            piece = text_of(out.get("text"))
        elif kind == "error":
            piece = f"{text_of(out.get('ename'))[:200]}: {text_of(out.get('evalue'))[:2000]}\n"
        elif kind in ("execute_result", "display_data"):
            data = out.get("data") if isinstance(out.get("data"), dict) else {}
            piece = text_of(data.get("text/plain"))
            if any(k.startswith("image/") for k in data):
                piece = "[a figure, not shown here]\n" if not piece or piece.startswith("<Figure") else piece
            piece = piece if piece.endswith("\n") or not piece else piece + "\n"
        else:
            continue
        piece = shorten(piece, 4 * limit)  # a single huge output keeps its end too
        parts.append(piece)
        size += len(piece)
    return shorten(clean("".join(parts)), limit)


def write_handed_in(folder: Path, texts: dict[str, str]) -> None:
    """Keep the handed-in output texts of a student's cells beside their graded notebook."""
    (Path(folder) / HANDED_IN_FILE).write_text(json.dumps(texts, ensure_ascii=True, indent=1), encoding="utf-8")


def read_handed_in(folder: Path) -> dict[str, str] | None:
    """What ``write_handed_in`` kept in ``folder`` (None: nothing was kept, e.g. graded before)."""
    try:
        data = json.loads((Path(folder) / HANDED_IN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {str(k): shorten(clean(v)) for k, v in data.items() if isinstance(v, str)}
