"""A corpus of bad submissions of the `attention` assignment, each with the score it must get.

Every case writes one file into a folder.  ``score`` is out of 30; ``status`` is the
summary status; ``note`` is a piece of the line the summary must print.  Cases marked
``sandbox=True`` rely on bubblewrap (no file access, no network).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat

from conftest import ROOT, read_nb, set_solution

SOURCE = ROOT / "solutions" / "attention" / "attention.ipynb"


@dataclass
class Case:
    name: str
    write: Callable[[Path], None]
    score: float
    status: str = "graded"
    note: str = ""
    sandbox: bool = False


def _src():
    return read_nb(SOURCE)


def _cell(nb, gid):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


def _prepend(gid, code):
    def build():
        nb = _src()
        cell = _cell(nb, gid)
        cell.source = code + "\n" + cell.source
        return nb
    return build


def _append(gid, code):
    def build():
        nb = _src()
        cell = _cell(nb, gid)
        cell.source = cell.source + "\n" + code
        return nb
    return build


def _nb(name, build):
    return lambda folder: nbformat.write(build(), folder / f"{name}.ipynb")


def _raw(filename, data: bytes):
    return lambda folder: (folder / filename).write_bytes(data)


def _old_format(folder):
    nb3 = nbformat.convert(_src(), 3)
    (folder / "old_format.ipynb").write_text(nbformat.writes(nb3, version=3))


def _edited_locked(build_name):
    def build():
        nb = _src()
        _cell(nb, "test_get_multihead_qkv_shapes").source = '"""Q1 visible: trust me."""\npass'
        return nb
    return _nb(build_name, build)


def _changed_points():
    nb = _src()
    _cell(nb, "test_get_multihead_qkv_shapes").metadata["nbgrader"]["points"] = 100
    return nb


def _deleted_test():
    nb = _src()
    nb.cells = [c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") != "test_calculate_multihead_attention_values"]
    return nb


def _duplicated():
    nb = _src()
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "get_multihead_qkv")
    twin = copy.deepcopy(nb.cells[i])
    twin.id = "twin-answer"
    test = copy.deepcopy(_cell(nb, "test_get_multihead_qkv_shapes"))
    test.id = "twin-test"
    nb.cells[i + 1:i + 1] = [twin, test]
    return nb


def _empty(folder):
    nb = nbformat.v4.new_notebook()
    nbformat.write(nb, folder / "empty_notebook.ipynb")


EQ_CHEAT = '''
class Anything:
    shape = None
    def __eq__(self, other):
        return True
    def __getattr__(self, name):
        return lambda *a, **k: self
return Anything(), Anything(), Anything()
'''

# builds the path at run time so that only the sandbox, not the static scan, stops it
READ_SOLUTIONS = '''
import json, os
_p = os.path.join(os.path.dirname(os.path.dirname(os.getcwd())), "..", "..", "..")
_root = next(d for d in [os.environ.get("COURSE_ROOT", ""), "%s"] if d)
_f = os.path.join(_root, "soluti" + "ons", "attention", "attention.ipynb")
_nb = json.load(open(_f))
exec(next(c["source"] for c in _nb["cells"] if "def get_multihead_qkv" in "".join(c["source"])))
''' % ROOT

WRITE_GRADEBOOK = '''
import os, sqlite3
for _base in ["%s", os.path.expanduser("~")]:
    _db = os.path.join(_base, "grad" + "ebook.db")
    try:
        _con = sqlite3.connect(_db)
        _con.execute("CREATE TABLE IF NOT EXISTS pwned (x)")
        _con.execute("UPDATE grade SET manual_score = 999")
        _con.commit()
    except Exception:
        pass
'''

NETWORK = '''
import socket
try:
    socket.create_connection(("127.0.0.1", %d), timeout=3).sendall(b"leak")
except OSError:
    pass
'''


def cases(port: int, grading_dir: Path) -> list[Case]:
    return [
        Case("infinite_loop", _nb("infinite_loop", _prepend("positional_encoding", "while True:\n    pass")),
             24, note="time limit"),
        Case("kernel_crash", _nb("kernel_crash", _prepend("get_multihead_qkv", "import os\nos._exit(3)")),
             0, "error", "kernel crashed"),
        Case("sys_exit", _nb("sys_exit", _prepend("get_multihead_qkv", "import sys\nsys.exit(0)")), 24),
        Case("syntax_error", _nb("syntax_error", _append("calculate_multihead_attention", "def oops(:\n    pass")), 24),
        Case("huge_allocation", _nb("huge_allocation", _prepend(
            "positional_encoding", "_big = torch.empty(10 * 1024**3, dtype=torch.uint8)\n_big.fill_(1)")), 24),
        Case("huge_output", _nb("huge_output", _append(
            "get_multihead_qkv", "for _i in range(200000):\n    print('spam ' * 8, _i)")), 30),
        Case("empty_notebook", _empty, 0, note="restored from the original"),
        Case("invalid_json", _raw("invalid_json.ipynb", b'{"cells": [ {"cell_type": "code", "source": "'), 0, "error",
             "not valid JSON"),
        Case("not_a_notebook", _raw("notebook.docx", b"PK\x03\x04 a word document"), 0, "error", "not a notebook"),
        Case("wrong_file_name", _raw("Copy of attention.ipynb", SOURCE.read_bytes()), 0, "error",
             "cannot tell the student"),
        Case("old_format", _old_format, 30),
        Case("edited_locked_test", _edited_locked("edited_locked_test"), 30),
        Case("changed_points", _nb("changed_points", _changed_points), 30),
        Case("deleted_test_cell", _nb("deleted_test_cell", _deleted_test), 30, note="restored from the original"),
        Case("duplicated_cells", _nb("duplicated_cells", _duplicated), 30),
        Case("eq_always_true", _nb("eq_always_true", lambda: set_solution(_src(), "get_multihead_qkv", EQ_CHEAT)),
             24),
        Case("patched_allclose", _nb("patched_allclose", _append(
            "get_multihead_qkv", "torch.allclose = lambda *a, **k: True")), 0, "flagged", "torch.allclose"),
        Case("patched_torch_testing", _nb("patched_torch_testing", _append(
            "get_multihead_qkv", "torch.testing.assert_close = lambda *a, **k: None")), 0, "flagged",
             "torch.testing.assert_close"),
        Case("patched_numpy_testing", _nb("patched_numpy_testing", _append(
            "get_multihead_qkv", "import numpy as np\nsetattr(np.testing, 'assert_allclose', print)")), 0,
             "flagged", "np.testing"),
        Case("patched_tensor_eq", _nb("patched_tensor_eq", _append(
            "get_multihead_qkv", "torch.Tensor.__eq__ = lambda self, other: True")), 0, "flagged",
             "torch.Tensor.__eq__"),
        Case("overwritten_helper", _nb("overwritten_helper", _append(
            "calculate_multihead_attention",
            "def causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool, device=device)")),
             0, "flagged", "causal_mask"),
        Case("reads_solutions", _nb("reads_solutions", _prepend("get_multihead_qkv", READ_SOLUTIONS)), 24,
             sandbox=True),
        Case("writes_gradebook", _nb("writes_gradebook", _prepend("get_multihead_qkv", WRITE_GRADEBOOK % grading_dir)),
             30, sandbox=True),
        Case("network_socket", _nb("network_socket", _prepend("get_multihead_qkv", NETWORK % port)), 30,
             sandbox=True),
    ]
