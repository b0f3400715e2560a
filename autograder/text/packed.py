"""A notebook kept in memory as compressed JSON until it is used.

A run reads every submission before it judges any (``autograder.pipeline.stages.read``), and
the notebooks then wait in memory for their turn. Parsed, an ``attention`` notebook takes about
80 KB of Python objects; the class's notebooks made the grader grow with the class (156 MB at 40
submissions, 289 MB at 1,000: issue "Grading near its floor"). Kept as zlib-compressed JSON
(its text written once, as the backends need it anyway) it takes a few kilobytes, and is
turned back into text or a notebook only where one is graded.
"""
from __future__ import annotations

import zlib

import nbformat

__all__ = ["PackedNotebook"]


class PackedNotebook:
    """``nbformat.writes(nb)``, compressed: ``text()`` gives that JSON back, ``load()`` the notebook."""

    __slots__ = ("_data",)

    def __init__(self, nb: nbformat.NotebookNode):
        # level 1: ~3.5 times smaller than the text (attention: 56 KB -> 16 KB), in ~0.4 ms, a fifth of
        # what writing the text takes
        self._data = zlib.compress(nbformat.writes(nb).encode("utf-8"), 1)

    def text(self) -> str:
        return zlib.decompress(self._data).decode("utf-8")

    def load(self) -> nbformat.NotebookNode:
        return nbformat.reads(self.text(), as_version=4)

    @property
    def size(self) -> int:
        """Bytes it takes (compressed)."""
        return len(self._data)

    def __eq__(self, other) -> bool:
        return isinstance(other, PackedNotebook) and other._data == self._data

    __hash__ = None  # like the notebook it holds

    def __repr__(self) -> str:
        return f"PackedNotebook({self.size:,d} bytes compressed)"
