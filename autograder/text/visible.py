"""Unicode bidi controls shown as what they are: the one place the grader neutralises them.

A right-to-left override (U+202E) in a student's name, a file name or a notebook's output
turns the text after it around: ``evil`` + U+202E + ``gnp.ipynb`` reads as ``evilbnpi.png`` in a
spreadsheet, a feedback page or a terminal, and a row of grades.csv can show another
student's id.  Every text the grader writes for a person (the CSV files through
``csvsafe``, the pages through ``htmlsafe``, the summaries the command line prints) shows
each bidi control as ``<U+202E>`` instead.

The controls: the embeddings and overrides U+202A..U+202E, the isolates U+2066..U+2069,
the marks U+200E (LRM), U+200F (RLM) and U+061C (ALM).
"""
from __future__ import annotations

import contextlib
import sys

BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
_TEXT = {ord(c): f"<U+{ord(c):04X}>" for c in BIDI_CONTROLS}
_HTML = {ord(c): f"&lt;U+{ord(c):04X}&gt;" for c in BIDI_CONTROLS}


def visible(value):
    """``value`` with each bidi control written as ``<U+XXXX>`` (anything but text as it is)."""
    return value.translate(_TEXT) if isinstance(value, str) else value


def visible_html(markup: str) -> str:
    """HTML (a page or a fragment) with each bidi control written as ``&lt;U+XXXX&gt;``, which
    reads the same in text and in quoted attribute values."""
    return markup.translate(_HTML) if isinstance(markup, str) else markup


class VisibleStream:
    """A text stream (``sys.stdout``) that writes every bidi control visibly."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._stream.write(visible(text))

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def visible_output():
    """Within the block, whatever is printed to stdout and stderr shows bidi controls visibly."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = VisibleStream(out), VisibleStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
