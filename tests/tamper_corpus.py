"""A corpus of bad submissions of the `attention` assignment, each with the score it must get.

Every case writes one file into a folder.  ``score`` is out of 30; ``status`` is the
summary status; ``note`` is a piece of the line the summary must print; ``flagged`` says
whether the static scan must point the instructor at it (flags never change a score: the
tests are judged outside the student's kernel).  Cases marked ``sandbox=True`` rely on
bubblewrap.

Kinds: cheats that try for full marks with unanswered questions (they must score 0), code
that tries to read hidden tests or solutions, to write or connect outside its sandbox,
malformed files that must not stop the class, and honest mishaps that must not cost points.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat

from conftest import ROOT, filled_exercise, read_nb, set_solution

SOURCE = ROOT / "solutions" / "attention" / "attention.ipynb"
EXERCISE = ROOT / "exercises" / "attention" / "attention.ipynb"
ANSWERS = ["get_multihead_qkv", "calculate_multihead_attention", "multi_head_attention", "positional_encoding"]


@dataclass
class Case:
    name: str
    write: Callable[[Path], None]
    score: float
    status: str = "graded"
    note: str = ""
    sandbox: bool = False
    flagged: bool = False


def _src():
    return read_nb(SOURCE)


def _full():
    return filled_exercise("attention")


def _untouched():
    return read_nb(EXERCISE)


def _cell(nb, gid):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


def _index(nb, gid):
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


def _prepend(gid, code, base=_src):
    def build():
        nb = base()
        cell = _cell(nb, gid)
        cell.source = code + "\n" + cell.source
        return nb
    return build


def _append(gid, code, base=_src):
    def build():
        nb = base()
        cell = _cell(nb, gid)
        cell.source = cell.source + "\n" + code
        return nb
    return build


def _new_cell_after(gid, code, base=_full):
    """A cell of the student's own (no grading metadata) after cell ``gid``."""
    def build():
        nb = base()
        nb.cells.insert(_index(nb, gid) + 1, nbformat.v4.new_code_cell(code))
        return nb
    return build


def _at_end(code, base=_full):
    def build():
        nb = base()
        nb.cells.append(nbformat.v4.new_code_cell(code))
        return nb
    return build


def _replace_stub(nb, gid: str, body: str):
    """The first unanswered stub of a released answer cell replaced by ``body``."""
    import re

    cell = _cell(nb, gid)
    m = re.search(r"([ \t]*)# YOUR CODE HERE\n[ \t]*raise NotImplementedError\(\)", cell.source)
    indent = m.group(1)
    text = "\n".join(indent + ln if ln else ln for ln in body.strip("\n").splitlines())
    cell.source = cell.source[:m.start()] + text + cell.source[m.end():]
    return nb


def _answers(bodies: dict, before: str = "", base=_untouched):
    """Unanswered stubs replaced by ``bodies`` (grade id -> code), and an optional cell of the
    student's own right after the imports."""
    def build():
        nb = base()
        for gid, body in bodies.items():
            nb = _replace_stub(nb, gid, body)
        if before:
            nb.cells.insert(_index(nb, "imports") + 1, nbformat.v4.new_code_cell(before))
        return nb
    return build


def _nb(name, build):
    return lambda folder: nbformat.write(build(), folder / f"{name}.ipynb")


def _raw(filename, data: bytes):
    return lambda folder: (folder / filename).write_bytes(data)


def _json(name, build, edit):
    """Write the notebook as raw JSON after ``edit(dict)`` (shapes nbformat would refuse)."""
    def write(folder):
        raw = json.loads(nbformat.writes(build()))
        edit(raw)
        (folder / f"{name}.ipynb").write_text(json.dumps(raw))
    return write


def _old_format(folder):
    nb3 = nbformat.convert(_src(), 3)
    (folder / "old_format.ipynb").write_text(nbformat.writes(nb3, version=3))


def _edited_locked():
    nb = _src()
    _cell(nb, "test_get_multihead_qkv_shapes").source = '"""Q1 visible: trust me."""\npass'
    return nb


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
    i = _index(nb, "get_multihead_qkv")
    twin = copy.deepcopy(nb.cells[i])
    twin.id = "twin-answer"
    test = copy.deepcopy(_cell(nb, "test_get_multihead_qkv_shapes"))
    test.id = "twin-test"
    nb.cells[i + 1:i + 1] = [twin, test]
    return nb


def _foreign():
    """A given cell and an answer cell pasted from another assignment's notebook."""
    nb = _full()
    other = read_nb(ROOT / "solutions" / "project_aether" / "project_aether.ipynb")
    pasted = [copy.deepcopy(c) for c in other.cells
              if c.metadata.get("nbgrader", {}).get("grade_id") in ("aether_config", "ffn_params")]
    for c in pasted:
        c.id = "pasted-" + c.id
    nb.cells[_index(nb, "imports") + 1:_index(nb, "imports") + 1] = pasted
    return nb


def _empty(folder):
    nbformat.write(nbformat.v4.new_notebook(), folder / "empty_notebook.ipynb")


EQ_CHEAT = '''
class Anything:
    shape = None
    def __eq__(self, other):
        return True
    def __getattr__(self, name):
        return lambda *a, **k: self
return Anything(), Anything(), Anything()
'''

# --- cheats for full marks on an unanswered notebook ------------------------------------------

ANYTHING = '''
class _Anything:
    """Equal to everything, whatever it is asked."""
    shape = (3, 3, 4, 4)
    def __eq__(self, other): return True
    __le__ = __lt__ = __ge__ = __gt__ = __eq__
    def __getattr__(self, name): return lambda *a, **k: self
    def __iter__(self): return iter([self, self, self])
    def __len__(self): return 3
    def __float__(self): return 0.0
    def __getitem__(self, key): return self
# the tests call these by name: make them agree with anything
float = lambda *a: 0.0
abs = lambda x: x
type = lambda *a: torch.Tensor
'''
ANYTHING_ANSWERS = {"get_multihead_qkv": "return _Anything(), _Anything(), _Anything()",
                    "calculate_multihead_attention": "return _Anything(), _Anything()",
                    "positional_encoding": "pass"}

ALIAS_PATCH = '''
T = torch.Tensor   # patched through an alias: a scan that looks for `torch.` misses it
T.__float__ = lambda self: 0.0
T.__le__ = lambda self, other: True
T.__lt__ = lambda self, other: True
T.__eq__ = lambda self, other: True
'''
ZERO_ANSWERS = {"get_multihead_qkv": "return torch.zeros(1), torch.zeros(1), torch.zeros(1)",
                "calculate_multihead_attention": "return torch.zeros(1), torch.zeros(1)"}

AST_TRANSFORMER = '''
import ast

class _Blank(ast.NodeTransformer):
    """Every later cell, test cells included, becomes `pass`."""
    def visit_Module(self, node):
        node.body = [ast.Pass()]
        return node

get_ipython().ast_transformers.append(_Blank())
'''

INPUT_TRANSFORMER = '''
get_ipython().input_transformers_cleanup.append(lambda lines: ["pass\\n"])
'''

DISPLAYHOOK = '''
import sys
sys.displayhook("ok")  # nbgrader took the first such result of a test cell as full points
raise NotImplementedError()
'''

# --- reading hidden tests or solutions --------------------------------------------------------

PRINT_HISTORY = '''
import os
if os.environ.get("NBGRADER_EXECUTION") or os.environ.get("HOME") == "/tmp" or True:
    print("\\n".join(In))   # everything this kernel ever ran
    print(Out)
'''

FRAME_READER = '''
import inspect, linecache
for _frame in inspect.stack():  # the code that called this function, and its source
    try:
        print("CALLER", _frame.filename, "".join(linecache.getlines(_frame.filename)))
    except Exception:
        pass
'''

SYMLINKS = '''
import os
targets = [{solutions!r}, {gradebook!r}, os.path.expanduser("~/.bashrc")]
for i, target in enumerate(targets):
    for name in (f"leak{{i}}.ipynb", f"../leak{{i}}.ipynb", "attention.ipynb", "../attention.ipynb"):
        try:
            if os.path.lexists(name):
                os.remove(name)
            os.symlink(target, name)
        except OSError:
            pass
print(sorted(os.listdir(".")))
'''

OTHER_CLONE = '''
try:
    print(open({path!r}).read())
except OSError as exc:
    print("cannot read the other clone:", type(exc).__name__)
'''

READ_SOLUTIONS = '''
import json, os
_root = next(d for d in [os.environ.get("COURSE_ROOT", ""), "%s"] if d)
_f = os.path.join(_root, "soluti" + "ons", "attention", "attention.ipynb")
_nb = json.load(open(_f))
exec(next(c["source"] for c in _nb["cells"] if "def get_multihead_qkv" in "".join(c["source"])))
''' % ROOT

# --- writing or connecting outside --------------------------------------------------------------

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

REPLACE_FILES = '''
import os
# replace every file the kernel can see around it by a link to a file of the instructor
for folder in (".", "..", "../..", "/tmp"):
    try:
        names = os.listdir(folder)
    except OSError:
        continue
    for name in names:
        path = os.path.join(folder, name)
        try:
            os.remove(path)
            os.symlink({sentinel!r}, path)
        except OSError:
            pass
try:
    open({sentinel!r}, "w").write("overwritten by a student")
except OSError as exc:
    print("cannot write:", type(exc).__name__)
'''

NETWORK = '''
import socket
try:
    socket.create_connection(("127.0.0.1", %d), timeout=3).sendall(b"leak")
except OSError:
    pass
'''

UNIX_SOCKET = '''
import socket
try:
    _s = socket.socket(socket.AF_UNIX)
    _s.settimeout(3)
    _s.connect({path!r})
    _s.sendall(b"leak")
except OSError as exc:
    print("no socket:", type(exc).__name__)
'''

FILL_TMP = '''
written = 0
try:
    with open("/tmp/fill", "wb") as fh:
        for _ in range(1536):
            fh.write(b"x" * (1 << 20))
            written += 1
except OSError as exc:
    print(f"/tmp is full after {written} MiB ({type(exc).__name__})")
'''

HTML_FLOOD = '''
from IPython.display import HTML, display
display(HTML("<b>flood</b>" * 3_000_000))   # about 36 MB of HTML
'''

# --- honest mishaps ---------------------------------------------------------------------------

STDERR_ANSWER = '''
import sys, warnings
print("debugging the shapes", file=sys.stderr)
warnings.warn("a leftover warning", UserWarning)
B, T, C = x.shape
hs = C // n_head
split = lambda t: t.view(B, T, n_head, hs).transpose(1, 2)  # (B, T, C) -> (B, nh, T, hs)
return split(x @ w_q), split(x @ w_k), split(x @ w_v)
'''

SWALLOW_INTERRUPT = '''
import time
while True:          # a scratch loop the student forgot, that ignores interrupts
    try:
        time.sleep(0.05)
    except KeyboardInterrupt:
        pass
'''

ALIAS_Q3 = '''
B, T, C = query.shape
split = lambda t: t.view(B, -1, self.n_head, self.head_size).transpose(1, 2)
q, k, v = split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value))
y, weights = _attend(q, k, v, mask)
return self.out_proj(y.transpose(1, 2).reshape(B, T, C)), weights
'''

HELPER_MHA = '''
return _torch_attention(self, query, key, value, mask)
'''
HELPER_MHA_CELL = '''
def _torch_attention(module, query, key, value, mask):
    """A helper of my own: torch's attention with the module's weights."""
    C = module.q_proj.in_features
    ref = nn.MultiheadAttention(C, module.n_head, batch_first=True, bias=module.q_proj.bias is not None)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight]))
        ref.out_proj.weight.copy_(module.out_proj.weight)
        if module.q_proj.bias is not None:
            ref.in_proj_bias.copy_(torch.cat([module.q_proj.bias, module.k_proj.bias, module.v_proj.bias]))
            ref.out_proj.bias.copy_(module.out_proj.bias)
    ref = ref.to(query.device)
    B, T, S = query.size(0), query.size(1), key.size(1)
    attn_mask = None if mask is None else ~mask.expand(B, module.n_head, T, S).reshape(B * module.n_head, T, S)
    out, w = ref(query, key, value, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)
    return out, w
'''

V_PROJ_KEY = '''
B, T, C = query.shape
S = key.size(1)
q = self.q_proj(query).view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
k = self.k_proj(key).view(B, S, self.n_head, self.head_size).transpose(1, 2)    # (B, nh, S, hs)
v = self.v_proj(key).view(B, S, self.n_head, self.head_size).transpose(1, 2)    # projects the key, not the value
weights = (q @ k.transpose(-2, -1) / math.sqrt(self.head_size))
if mask is not None:
    weights = weights.masked_fill(~mask, float("-inf"))
weights = weights.softmax(dim=-1)
y = (weights @ v).transpose(1, 2).contiguous().view(B, T, C)
return self.out_proj(y), weights
'''

DEEP_EXPRESSION = "total = " + " + ".join(["1"] * 3000) + "\nprint(total)"


def _no_outputs(raw):
    for cell in raw["cells"]:
        if cell["cell_type"] == "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)


def _null_metadata(raw):
    for cell in raw["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") in ("get_multihead_qkv", "intro"):
            cell["metadata"]["nbgrader"] = None


def _bom(folder):
    (folder / "bom.ipynb").write_bytes(b"\xef\xbb\xbf" + nbformat.writes(_full()).encode())


def cases(port: int, grading_dir: Path | None, places: dict | None = None) -> list[Case]:
    """``places``: paths the corpus points at (a sentinel file, a UNIX socket, another clone)."""
    places = places or {"sentinel": "/nonexistent/sentinel", "socket": "/nonexistent/socket",
                        "clone": "/nonexistent/clone.ipynb"}
    full_marks_cheats = [
        Case("cheat_builtins", _nb("cheat_builtins", _answers(ANYTHING_ANSWERS, ANYTHING)), 0, flagged=False),
        Case("cheat_alias_patch", _nb("cheat_alias_patch", _answers(ZERO_ANSWERS, ALIAS_PATCH)), 0, flagged=True),
        Case("cheat_ast_transformer", _nb("cheat_ast_transformer", _answers({}, AST_TRANSFORMER)), 0, flagged=True),
        Case("cheat_input_transformer", _nb("cheat_input_transformer", _answers({}, INPUT_TRANSFORMER)), 0,
             flagged=True),
        Case("cheat_displayhook", _nb("cheat_displayhook", _answers({g: DISPLAYHOOK for g in ANSWERS[:2]})), 0,
             flagged=True),
    ]
    return full_marks_cheats + [
        # --- reading hidden tests or solutions (graded normally; nothing leaks)
        Case("prints_history", _nb("prints_history", _new_cell_after("test_positional_encoding_values",
                                                                     PRINT_HISTORY)), 30),
        Case("frame_reader", _nb("frame_reader", lambda: set_solution(
            _full(), "get_multihead_qkv", FRAME_READER + STDERR_ANSWER.split("warnings.warn", 1)[1].split("\n", 1)[1])),
             30, flagged=True),
        Case("symlink_leak", _nb("symlink_leak", _new_cell_after("test_positional_encoding_values", SYMLINKS.format(
            solutions=str(SOURCE), gradebook=str((grading_dir or Path("/")) / "gradebook.db")))), 30,
             sandbox=True, flagged=True),
        Case("reads_other_clone", _nb("reads_other_clone", _new_cell_after(
            "imports", OTHER_CLONE.format(path=places["clone"]))), 30, sandbox=True),
        Case("reads_solutions", _nb("reads_solutions", _prepend("get_multihead_qkv", READ_SOLUTIONS)), 24,
             sandbox=True),
        # --- writing or connecting outside
        Case("writes_gradebook", _nb("writes_gradebook", _prepend("get_multihead_qkv", WRITE_GRADEBOOK % grading_dir)),
             30, sandbox=True),
        Case("replaces_files", _nb("replaces_files", _new_cell_after(
            "test_positional_encoding_values", REPLACE_FILES.format(sentinel=places["sentinel"]))), 30, sandbox=True),
        Case("network_socket", _nb("network_socket", _prepend("get_multihead_qkv", NETWORK % port)), 30,
             sandbox=True),
        Case("unix_socket", _nb("unix_socket", _new_cell_after("imports", UNIX_SOCKET.format(path=places["socket"]))),
             30, sandbox=True),
        Case("fills_tmp", _nb("fills_tmp", _new_cell_after("imports", FILL_TMP)), 30, sandbox=True),
        Case("html_flood", _nb("html_flood", _new_cell_after("imports", HTML_FLOOD)), 30),
        # 11.7 MB in 25,000 lines (untruncated it would break test_huge_outputs_are_truncated); one
        # short line at a time, 200,000 messages, once ran past the 5 s cell limit on a loaded machine
        Case("huge_output", _nb("huge_output", _append(
            "get_multihead_qkv", "for _i in range(25000):\n    print('spam ' * 92, _i)")), 30),
        Case("huge_allocation", _nb("huge_allocation", _prepend(
            "positional_encoding", "_big = torch.empty(10 * 1024**3, dtype=torch.uint8)\n_big.fill_(1)")), 24),
        # --- broken code and broken kernels
        Case("infinite_loop", _nb("infinite_loop", _prepend("positional_encoding", "while True:\n    pass")),
             24, note="longer than"),
        Case("swallows_interrupt", _nb("swallows_interrupt", _new_cell_after(
            "test_calculate_multihead_attention_values", SWALLOW_INTERRUPT)), 30, note="did not stop when interrupted"),
        Case("kernel_crash", _nb("kernel_crash", _prepend("get_multihead_qkv", "import os\nos._exit(3)")),
             24, note="kernel died"),
        Case("kills_itself_at_the_end", _nb("kills_itself_at_the_end", _at_end("import os\nos.kill(os.getpid(), 9)")),
             30),
        Case("sys_exit", _nb("sys_exit", _prepend("get_multihead_qkv", "import sys\nsys.exit(0)")), 24),
        Case("syntax_error", _nb("syntax_error", _append("calculate_multihead_attention", "def oops(:\n    pass")), 24),
        Case("deep_expression", _nb("deep_expression", _new_cell_after("imports", DEEP_EXPRESSION)), 30),
        # --- malformed files
        Case("empty_notebook", _empty, 0, note="restored from the original"),
        Case("invalid_json", _raw("invalid_json.ipynb", b'{"cells": [ {"cell_type": "code", "source": "'), 0, "error",
             "not valid JSON"),
        Case("binary_junk", _raw("binary_junk.ipynb", bytes(range(256)) * 40), 0, "error", "corrupt notebook"),
        Case("not_a_notebook", _raw("notebook.docx", b"PK\x03\x04 a word document"), 0, "error", "not a notebook"),
        Case("wrong_file_name", _raw("Copy of attention.ipynb", SOURCE.read_bytes()), 0, "error",
             "cannot tell the student"),
        Case("null_metadata", _json("null_metadata", _full, _null_metadata), 30),
        Case("no_outputs_key", _json("no_outputs_key", _full, _no_outputs), 30),
        Case("old_format", _old_format, 30),
        Case("edited_locked_test", _nb("edited_locked_test", _edited_locked), 30),
        Case("changed_points", _nb("changed_points", _changed_points), 30),
        Case("deleted_test_cell", _nb("deleted_test_cell", _deleted_test), 30, note="restored from the original"),
        Case("duplicated_cells", _nb("duplicated_cells", _duplicated), 30),
        # --- honest mishaps
        Case("bom", _bom, 30, note="byte-order mark"),
        Case("stderr_and_warnings", _nb("stderr_and_warnings", lambda: set_solution(
            _full(), "get_multihead_qkv", STDERR_ANSWER)), 30),
        Case("foreign_cells", _nb("foreign_cells", _foreign), 30, note="another notebook"),
        # --- wrong answers the tests must catch
        Case("eq_always_true", _nb("eq_always_true", lambda: set_solution(_src(), "get_multihead_qkv", EQ_CHEAT)),
             24),
        Case("q3_through_alias", _nb("q3_through_alias", lambda: set_solution(
            _with_alias(), "multi_head_attention", ALIAS_Q3)), 18),
        Case("q3_through_helper", _nb("q3_through_helper", lambda: set_solution(
            _new_cell_after("attention_config", HELPER_MHA_CELL)(), "multi_head_attention", HELPER_MHA)), 18),
        Case("q3_value_from_key", _nb("q3_value_from_key", lambda: set_solution(
            _full(), "multi_head_attention", V_PROJ_KEY)), 22),
        # --- patches that no longer matter (flagged for the instructor, graded on their merits)
        Case("patched_allclose", _nb("patched_allclose", _append(
            "get_multihead_qkv", "torch.allclose = lambda *a, **k: True")), 30, flagged=True),
        Case("patched_torch_testing", _nb("patched_torch_testing", _append(
            "get_multihead_qkv", "torch.testing.assert_close = lambda *a, **k: None")), 30, flagged=True),
        Case("patched_tensor_eq", _nb("patched_tensor_eq", _append(
            "get_multihead_qkv", "torch.Tensor.__eq__ = lambda self, other: True")), 30, flagged=True),
        Case("overwritten_helper", _nb("overwritten_helper", _append(
            "calculate_multihead_attention",
            "def causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool, device=device)")),
             30, flagged=True),
    ] + edge_cases() + budget_cases()


# --- the judge's values, the grader's pages and the host's disk ---------------------------------

def _zeroing(zero: bool):
    """Q1 and Q2 answers that compute no attention: Q1 returns zeros of the right shape, Q2 the
    uniform weights that all-zero scores would give.  With ``zero`` they also zero their inputs
    in place, which would make a reference computed from the test's own (changed) tensors agree
    with them: they must score exactly what the same code without the zeroing scores."""
    wipe = "{}.zero_()\n" if zero else ""
    q1 = "".join(wipe.format(n) for n in ("x", "w_q", "w_k", "w_v")) + \
        "B, T, C = x.shape\nz = torch.zeros(B, n_head, T, C // n_head)\nreturn z, z.clone(), z.clone()"
    q2 = "".join(wipe.format(n) for n in ("q", "k", "v")) + \
        "w = torch.full(q.shape[:-1] + (k.size(-2),), 1.0 / k.size(-2))\nreturn w @ v, w"
    return _answers({"get_multihead_qkv": q1, "calculate_multihead_attention": q2})


MARKDOWN_XSS = """## My notes
<script>document.body.setAttribute('data-pwned', 'markdown script')</script>
<img src="x" onerror="document.body.setAttribute('data-pwned', 'markdown img')">
<style>body { display: none }</style>
[a link](javascript:document.body.setAttribute('data-pwned','link')) and $e^{i\\pi} + 1 = 0$
"""
OUTPUT_XSS = r'''
from IPython.display import HTML, SVG, Javascript, Markdown, display
display(HTML("<b>bold</b><script>document.body.setAttribute('data-pwned', 'html script')</script>"
             "<img src=x onerror=\"document.body.setAttribute('data-pwned', 'html img')\">"))
display(Javascript("document.body.setAttribute('data-pwned', 'javascript output')"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><script>'
            "document.body.setAttribute('data-pwned', 'svg')</script><rect width='10' height='10'/></svg>"))
display(Markdown("<img src=x onerror=\"document.body.setAttribute('data-pwned', 'markdown output')\">"))
'''


def _markdown_after(gid, text, base=_full):
    def build():
        nb = base()
        nb.cells.insert(_index(nb, gid) + 1, nbformat.v4.new_markdown_cell(text))
        return nb
    return build


# the kernel's one folder on the host's disk takes sockets only; its tmpfs folders anything
FILLS_DISK = '''
import os
from ipykernel.kernelapp import IPKernelApp
_conn = os.path.dirname(IPKernelApp.instance().abs_connection_file)
_refused = []
for _try in (lambda: open(os.path.join(_conn, "fill.bin"), "wb").write(b"x" * (64 << 20)),
             lambda: os.makedirs(os.path.join(_conn, "deep")),
             lambda: os.symlink("/", os.path.join(_conn, "root")),
             lambda: open(IPKernelApp.instance().abs_connection_file, "a").write("x" * 1000)):
    try:
        _try()
    except OSError:
        _refused.append(True)
print("refused", len(_refused), "of 4")
_d = "/tmp"
for _i in range(3000):  # a tree far deeper than Python's recursion limit, in the kernel's own /tmp
    _d = os.path.join(_d, "d")
    os.mkdir(_d)
'''


def _schema(version):
    def edit(raw):
        for cell in raw["cells"]:
            if "nbgrader" in cell.get("metadata", {}):
                cell["metadata"]["nbgrader"]["schema_version"] = version
    return edit


def _test_cell_with_answer_id():
    """A test cell (grade, locked, points) carrying the grade id of an answer cell."""
    nb = _full()
    _cell(nb, "get_multihead_qkv").metadata["nbgrader"].update(grade=True, solution=False, locked=True, points=5)
    return nb


def edge_cases() -> list[Case]:
    """Kinds of issue "Hostile at every edge" (each with its intended outcome)."""
    return [
        Case("zeroes_its_inputs", _nb("zeroes_its_inputs", _zeroing(True)), 0),
        Case("same_without_zeroing", _nb("same_without_zeroing", _zeroing(False)), 0),
        Case("markdown_xss", _nb("markdown_xss", _markdown_after("get_multihead_qkv", MARKDOWN_XSS)), 30),
        Case("output_xss", _nb("output_xss", _new_cell_after("imports", OUTPUT_XSS)), 30),
        Case("fills_host_disk", _nb("fills_host_disk", _new_cell_after("imports", FILLS_DISK)), 30, sandbox=True),
        Case("schema_too_new", _json("schema_too_new", _full, _schema(99)), 0, "error",
             "nbgrader refused the notebook (SchemaTooNewError: Schema version is too new: 99"),
        Case("test_cell_with_answer_id", _nb("test_cell_with_answer_id", _test_cell_with_answer_id), 0, "error",
             "nbgrader refused the notebook (MissingEntry: No such grade cell"),
        Case("many_cells", _nb("many_cells", _many_cells), 0, "error", "has 20,040 cells (at most 10,000"),
    ]


# --- what one test may take from the kernel (autograder.judge.budget; the corpus grades with small
# limits: BUDGET in test_tamper.py).  Q4's tests list the module's parameters (the visible one to warn,
# the hidden one to check there are none) and subtract a reference from the module's output.

FLOOD_PARAMETERS = '''
def _flood(self, recurse=True):
    """40 tensors of 64 MiB each, made one at a time: 2.5 GiB for whoever lists them."""
    for _ in range(40):
        yield torch.ones(16 << 20)


PositionalEncoding.parameters = _flood
'''

TRICKLE_PARAMETERS = '''
import time as _time


def _trickle(self, recurse=True):
    """Each item just inside the 5 s a request may take: 40 of them take 160 s."""
    for _ in range(40):
        _time.sleep(4)
        yield torch.zeros(1)


PositionalEncoding.parameters = _trickle
'''

BROADCAST_OUTPUT = '''
_honest_forward = PositionalEncoding.forward


def _forward(self, x):
    """An honest output, except for a batch of 2 sequences of 3 tokens: 8 MiB of shape (2**21, 1, 1, 1),
    which a test's reference of shape (2, 3, C) broadcasts to gigabytes."""
    if x.dim() == 3 and tuple(x.shape[:2]) == (2, 3):
        return torch.zeros(2 << 20, 1, 1, 1)
    return _honest_forward(self, x)


PositionalEncoding.forward = _forward
'''


def budget_cases() -> list[Case]:
    """Submissions that make a test pull, wait or compute without end: each test they stop fails
    with its reason (BUDGET_REASONS); the rest of the notebook grades as usual."""
    return [
        Case("parameters_flood", _nb("parameters_flood", _append("positional_encoding", FLOOD_PARAMETERS)), 24),
        Case("parameters_trickle", _nb("parameters_trickle", _append("positional_encoding", TRICKLE_PARAMETERS)),
             24),
        Case("broadcast_blowup", _nb("broadcast_blowup", _append("positional_encoding", BROADCAST_OUTPUT)), 26),
    ]


# student id -> {test's grade id: what its failure says (its start; a tuple: one of them)}
BUDGET_REASONS = {
    "parameters_flood": {"test_positional_encoding_shapes": "stopped: the test took more than",
                         "test_positional_encoding_values": "stopped: the test took more than"},
    "parameters_trickle": {"test_positional_encoding_shapes": "stopped: the test ran longer than",
                           # the notebook's deadline may come first (what is left of it bounds each
                           # request): then the kernel is stopped at that deadline, with its reason
                           "test_positional_encoding_values": ("stopped: the test ran longer than",
                                                               "the student's code ran longer than")},
    "broadcast_blowup": {"test_positional_encoding_values": "stopped: the test ran out of the grader's memory limit"},
}


def _many_cells():
    """A notebook of tens of thousands of cells: refused at intake, in one line."""
    nb = _full()
    nb.cells += [nbformat.v4.new_code_cell("pass") for _ in range(20_040 - len(nb.cells))]
    return nb


def _with_alias():
    """The Q1/Q2 functions reached through a name of the student's own."""
    nb = _full()
    nb.cells.insert(_index(nb, "calculate_multihead_attention") + 1,
                    nbformat.v4.new_code_cell("_attend = calculate_multihead_attention  # an alias"))
    return nb
