"""Every CSV file the grader writes goes through this module, so that no cell can be a formula.

Students choose their names (in the LMS) and the names of the files they hand in, and both
reach grades.csv, canvas.csv, moodle.csv, lms_ids.csv, the collect report and the roster copy.
A spreadsheet runs a cell that starts with ``=``, ``+``, ``-`` or ``@`` as a formula
(``=HYPERLINK(...)``, DDE's ``=cmd|...``), and some also after a leading tab or carriage
return.  OWASP's rule, applied here: such a text cell gets a leading ``'``, which the
spreadsheet shows as text.  ``defusedcsv`` (maintained, pinned in requirements.txt) does it
for ``= + - @ | %``; this module adds tab and carriage return, which it leaves alone.

Bidi controls (a right-to-left override in a name) are written visibly, ``<U+202E>``
(``autograder.text.visible``), in every cell.

Numbers stay numbers, so Canvas and Moodle still import the grade columns: a cell that is a
plain decimal number (``30``, ``29.5``, and also ``-2``, which no spreadsheet reads as a
formula) is written as it is.  Grades are never negative; a ``-`` followed by anything but
digits (``-2+3``, ``-inf``) is text and gets the ``'``.

``DictReader`` here reads such files back as they were before the ``'`` (for the grader's
own files: the collect report and the roster copy).
"""
from __future__ import annotations

import csv
from pathlib import Path

from defusedcsv import csv as _defused

from .visible import visible

_CONTROL_START = ("\t", "\r")
_DEFUSED_START = ("=", "+", "-", "@", "|", "%")  # what defusedcsv quotes (numbers excepted)


def cell(value):
    """A cell as it is written (for tests and for what defusedcsv does not cover); bidi
    controls written visibly (``autograder.text.visible``)."""
    value = visible(value)
    if isinstance(value, str) and value[:1] in _CONTROL_START:
        return "'" + value
    return value


class _Writer:
    def __init__(self, fh):
        self._w = _defused.writer(fh)

    def writerow(self, row):
        return self._w.writerow([cell(v) for v in row])

    def writerows(self, rows):
        for row in rows:
            self.writerow(row)


def writer(fh) -> _Writer:
    """A ``csv.writer`` whose text cells cannot start a formula."""
    return _Writer(fh)


def write(path: Path, header: list[str], rows) -> None:
    """Write ``header`` and ``rows`` (lists of cells) to ``path``."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = writer(fh)
        w.writerow(header)
        w.writerows(rows)


def unquote(value: str) -> str:
    """The cell as it was before ``writer`` protected it."""
    if value[:1] == "'" and value[1:2] in _CONTROL_START:
        return value[1:]
    if value[:1] == "'" and (value[1:2] in _DEFUSED_START or value[1:3] == "\\|"):
        return value[1:].replace("\\|", "|")
    return value


def read(path: Path, encoding: str = "utf-8-sig") -> list[dict[str, str]]:
    """The rows of a CSV file this module wrote (or any CSV file), cells unquoted."""
    with open(path, newline="", encoding=encoding) as fh:
        return [{k: unquote(v) if isinstance(v, str) else v for k, v in row.items()} for row in csv.DictReader(fh)]
