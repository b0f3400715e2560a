"""The pieces that keep a verdict out of the student's hands: the reply format, `student` in
the notebook and from the grader, the judging of one test cell, and intake of any file.

All of these run in this process or with one plain kernel (seconds, no sandbox needed)."""
from __future__ import annotations

import json
import pickle
import random
import tempfile
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.pipeline.intake import IntakeError, read_submission
from conftest import ROOT
from autograder.judge.kernel import KernelSession
from autograder.judge.runner import judge_cell, judge_namespace
from coursekit.failures import HIDDEN_FAILURE
from coursekit.remote.client import RemoteStudent
from coursekit.remote import LocalStudent, ProtocolError, Ref, decode, encode
from coursekit.sourcecheck import SourceView

NOTEBOOK_CODE = '''
import torch, warnings, sys

def scale(x, k):
    """x * k; also writes to stderr and warns, which must not matter."""
    print("debug", file=sys.stderr)
    warnings.warn("careful")
    return x * k, {"k": k, "shape": tuple(x.shape), "nan": float("nan")}

def bump(x):
    x.add_(1)  # changes its input in place
    return None

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 3)
    def forward(self, x):
        return self.lin(x)

def draw(gen, n):
    return torch.randint(0, 1000, (n,), generator=gen)

def call_back(f, x):
    return f(x) + 1

def raises():
    raise ValueError("not like this")

def draw_around(f, gen):
    """Draws, lets f draw from the same generator, draws again."""
    a = torch.randint(0, 1000, (2,), generator=gen)
    b = f(gen)
    return a, b, torch.randint(0, 1000, (2,), generator=gen)

def unanswered():
    raise NotImplementedError()
'''


def _no_handle(*args):
    raise AssertionError("unexpected handle")


# ------------------------------------------------------------------------------ the reply format

def test_data_round_trips_with_its_types():
    value = {"f": 1.5, "i": 3, "b": True, "n": None, "s": "x", "t": (1, [2.0, {"k": float("inf")}]),
             "tensor": torch.arange(6, dtype=torch.int16).view(2, 3), "bf": torch.ones(2, dtype=torch.bfloat16),
             "dtype": torch.float64, "dev": torch.device("cpu"), "set": {1, 2}, "nan": float("nan")}
    header, blob = encode(value, lambda obj: 1)
    back = decode(header, blob, _no_handle)
    assert back["t"] == (1, [2.0, {"k": float("inf")}]) and type(back["t"]) is tuple
    assert type(back["f"]) is float and type(back["i"]) is int and back["b"] is True
    assert back["tensor"].dtype == torch.int16 and back["tensor"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["bf"].dtype == torch.bfloat16 and back["dtype"] is torch.float64 and back["set"] == {1, 2}
    assert back["nan"] != back["nan"]


def test_objects_that_are_not_data_travel_as_handles():
    seen = []
    header, blob = encode([torch.nn.Linear(1, 1)], lambda obj: seen.append(obj) or 7)
    back = decode(header, blob, lambda hid, kind, text: ("handle", hid, kind))
    assert back == [("handle", 7, "torch.nn.modules.linear.Linear")] and isinstance(seen[0], torch.nn.Linear)


@pytest.mark.parametrize("header", [
    b"not json", b'{"value": {"$tensor": "t0"}}', b'{"value": {"$unknown": 1}}', b'{"value": [1, 2]}',
    b'{"value": {"$dtype": "Tensor"}}', b'{"value": {"$dict": [[[1], 2]]}}', b'{"nothing": 1}',
    b'{"value": ' + b'{"$list": [' * 200 + b']}' * 200 + b'}',
])
def test_malformed_replies_raise_protocol_error(header):
    with pytest.raises(ProtocolError):
        decode(header, b"", _no_handle)


def test_a_pickle_is_never_decoded():
    class Boom:
        def __reduce__(self):
            return (print, ("pickle ran",))

    with pytest.raises(ProtocolError):
        decode(pickle.dumps(Boom()), b"", _no_handle)
    with pytest.raises(ProtocolError):
        decode(b'{"value": {"$tensor": "t0", "device": "cpu"}}', pickle.dumps(Boom()), _no_handle)


def test_random_bytes_never_escape_as_anything_but_protocol_error():
    rng = random.Random(0)
    for _ in range(300):
        header = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80)))
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80)))
        try:
            decode(header, blob, _no_handle)
        except ProtocolError:
            pass


FORGER = r'''
import json, sys, tempfile
from pathlib import Path
import torch
from autograder.judge.kernel import KernelSession
from coursekit.remote.client import RemoteStudent
from coursekit.remote import ProtocolError

kind, size = sys.argv[1], int(sys.argv[2])
session = KernelSession("python3", Path(tempfile.mkdtemp()) / "work", env={}, ipc=True)
session.start()
session.execute(f"""
import torch
from safetensors.torch import save
def _forged(token):
    k = get_ipython().kernel
    parent = k.get_parent("shell")
    if {kind!r} == "json":      # one huge structure
        header, blob = b'{{"value": [' + b'[],' * ({size} // 3) + b'[]]}}', b''
    elif {kind!r} == "values":  # a small structure of very many values
        header, blob = b'{{"value": [' + b'[],' * (2**20 // 3 - 10) + b'[]]}}', b''
    else:                       # tensors, as a fine-tuned model's weights would come
        header = b'{{"value": {{"$dict": [["result", {{"$tensor": "t0"}}]]}}}}'
        blob = save({{"t0": torch.zeros({size} // 4)}})
    if {kind!r} == "output":     # not a reply: an output message far larger than any kept
        k.session.send(k.iopub_socket, "display_data", {{"data": {{"text/plain": "x" * {size}}}, "metadata": {{}}}},
                       parent=parent)
        header, blob = b'{{"value": {{"$dict": [["result", 1]]}}}}', b''
    k.session.send(k.iopub_socket, "course_judge_reply", {{"token": token}}, parent=parent, buffers=[header, blob])
__course_judge__.handle = _forged
def f(): pass
""", timeout=60)
student = RemoteStudent(session, 60, [])


def peak() -> int:
    """This process's peak resident memory, in bytes (VmHWM: unlike getrusage's maxrss it starts
    afresh at exec, so the test process this one was forked from does not count)."""
    line = next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


base = peak()
try:
    out = student.f()
    what = f"{type(out).__name__} of {out.numel() * 4 if isinstance(out, torch.Tensor) else out} bytes"
except ProtocolError as exc:
    what = f"ProtocolError: {exc}"
top = peak()
session.stop()
print(json.dumps({"base": base, "peak": top, "what": what}))
'''


@pytest.mark.parametrize("kind,want", [("json", "ProtocolError: the notebook's code sent back a reply whose structure"),
                                       ("values", "ProtocolError: reply too large: more than 100000 values"),
                                       ("tensors", "Tensor of 100663296 bytes"),
                                       ("output", "int of 1 bytes")])
def test_a_forged_reply_costs_the_grader_about_its_own_size(tmp_path, kind, want):
    """A kernel that forges a 96 MiB reply (or output) costs the grading process about that
    much memory, never a multiple of it: sizes are checked before anything is parsed, and
    tensors are read in place.  The whole process, torch loaded, stays under 0.5 GiB."""
    import subprocess
    import sys

    script = tmp_path / "forger.py"
    script.write_text(FORGER)
    size = 96 << 20
    proc = subprocess.run([sys.executable, str(script), kind, str(size)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["what"].startswith(want), seen
    assert seen["peak"] - seen["base"] <= size + (24 << 20), seen
    assert seen["peak"] < 512 << 20, seen


# ------------------------------------------------------------------------------ `student`

@pytest.fixture(scope="module")
def kernel():
    """One plain kernel (no sandbox) holding NOTEBOOK_CODE, and the grader's student for it."""
    tmp = Path(tempfile.mkdtemp())
    session = KernelSession("python3", tmp / "work", env={}, ipc=True)
    session.start()
    run = session.execute(NOTEBOOK_CODE, timeout=60)
    assert run.status == "ok", run
    yield session, RemoteStudent(session, 30, [NOTEBOOK_CODE])
    session.stop()


@pytest.fixture(scope="module")
def local():
    ns: dict = {}
    exec(NOTEBOOK_CODE, ns)
    return LocalStudent(ns)


@pytest.fixture(params=["local", "remote"])
def student(request, local, kernel):
    return local if request.param == "local" else kernel[1]


def test_calls_return_the_same_data_in_the_notebook_and_from_the_grader(student):
    out, meta = student.scale(torch.ones(2), 3)
    assert out.tolist() == [3.0, 3.0] and meta["k"] == 3 and meta["shape"] == (2,)
    assert type(meta["nan"]) is float and meta["nan"] != meta["nan"]


def test_arguments_travel_as_copies_and_generators_come_back(student):
    """The test's tensors are never written to: a call that changes its argument in place says
    so through changed_inputs(), and the caller's tensor keeps its values; a generator moves on."""
    x = torch.zeros(3)
    student.bump(x)
    assert x.tolist() == [0.0, 0.0, 0.0], "the caller's tensor was written to"
    assert student.changed_inputs() == [0]
    student.scale(torch.ones(2), 3)
    assert student.changed_inputs() == []
    g, ref = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert student.draw(g, 4).tolist() == torch.randint(0, 1000, (4,), generator=ref).tolist()
    assert torch.equal(g.get_state(), ref.get_state()), "the generator's state moved on as in a local call"


def test_objects_stay_there_and_can_be_inspected(student):
    m = student.Model()
    assert isinstance(m, Ref)
    m.eval()
    assert student.fetch(m.training) is False
    assert tuple(m(torch.ones(4, 2)).shape) == (4, 3)
    assert set(m.state_dict()) == {"lin.weight", "lin.bias"}
    with pytest.raises(TypeError, match="fetch"):
        bool(m.training)


def test_functions_passed_in_are_called_back(student):
    assert student.call_back(lambda t: t * 10, torch.ones(1)).tolist() == [11.0]
    with student.replaced(raises=lambda: "substituted"):
        assert student.raises() == "substituted"
    with pytest.raises(ValueError, match="not like this"):
        student.raises()


def test_generators_passed_to_callbacks_keep_one_stream(student):
    """A callback that draws from the student's generator moves it on in the kernel too, as
    if it had run there; a callback may not make requests of its own."""
    gen, ref = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    a, b, c = student.draw_around(lambda g: torch.randint(0, 1000, (3,), generator=g), gen)
    expected = [torch.randint(0, 1000, (n,), generator=ref).tolist() for n in (2, 3, 2)]
    assert [a.tolist(), b.tolist(), c.tolist()] == expected
    assert torch.equal(gen.get_state(), ref.get_state())
    if not isinstance(student, LocalStudent):
        with pytest.raises(RuntimeError, match="cannot itself ask the notebook"):
            student.draw_around(lambda g: student.fetch(student.scale), gen)


def test_errors_of_the_students_code_come_back_as_their_type(student):
    with pytest.raises(NotImplementedError):
        student.unanswered()
    with pytest.raises(NameError, match="not defined in the notebook"):
        student.missing()


def test_a_kernel_just_started_shows_its_first_cell_and_answers_its_first_request(monkeypatch):
    """The start-up handshake (KernelSession._wait_ready) waits until IOPub is connected: a kernel's
    first cell keeps its output and the first request is answered, kernel after kernel; the
    handshake is the session's own (jupyter_client's wait_for_ready waits for IOPub to be quiet)."""
    from jupyter_client.blocking.client import BlockingKernelClient

    def not_here(*args, **kwargs):
        raise AssertionError("jupyter_client's wait_for_ready was used")

    monkeypatch.setattr(BlockingKernelClient, "wait_for_ready", not_here)
    for i in range(4):
        session = KernelSession("python3", Path(tempfile.mkdtemp()) / "work", env={}, ipc=True)
        try:
            session.start()
            run = session.execute(f"print('first {i}')\ndef twice(x): return 2 * x", timeout=60)
            assert run.status == "ok", run
            assert "".join(o.get("text", "") for o in run.outputs) == f"first {i}\n"
            assert RemoteStudent(session, 30, []).twice(i + 1) == 2 * (i + 1)
        finally:
            session.stop()


def test_local_objects_must_be_sent_explicitly(kernel):
    _, remote = kernel
    with pytest.raises(TypeError, match="student.send"):
        remote.fetch(remote.call_back)(torch.nn.Linear(1, 1))
    lin = remote.send(torch.nn.Linear(1, 1))
    assert tuple(remote.fetch(lin.weight).shape) == (1, 1)


def test_a_kernel_that_lies_about_its_replies_gets_a_protocol_error(kernel):
    session, remote = kernel
    session.execute("__saved_server__ = __course_judge__\n"
                    "class _Liar:\n"
                    "    def handle(self, token):\n"
                    "        print('all tests passed')\n"
                    "__course_judge__ = _Liar()", timeout=30)
    try:
        with pytest.raises(ProtocolError):
            remote.scale(torch.ones(1), 2)
    finally:
        session.execute("__course_judge__ = __saved_server__", timeout=30)


# ------------------------------------------------------------------------------ judging a cell

def test_verdict_messages_name_visible_lines_and_hide_hidden_ones(local):
    ns = judge_namespace([], "cpu")
    ns["student"] = local
    visible = judge_cell('"""Q1 visible: x"""\n_x = student.scale(torch.ones(1), 2)[0]\nassert float(_x) == 3.0\n',
                         "t", ns)
    assert not visible.passed and visible.message == "failed: assert float(_x) == 3.0"
    hidden = judge_cell('"""Q1 hidden: x"""\n### BEGIN HIDDEN TESTS\n_secret = 41\nassert _secret == 42\n'
                        '### END HIDDEN TESTS', "t", ns)
    assert not hidden.passed and hidden.message == HIDDEN_FAILURE and "41" not in hidden.message
    unanswered = judge_cell('"""Q1 visible: x"""\nstudent.unanswered()', "t", ns)
    assert "not answered yet" in unanswered.message
    ok = judge_cell('"""Q1 visible: x"""\nprint("fine")\nassert student.scale(torch.ones(1), 2)[0].item() == 2.0', "t", ns)
    assert ok.passed and ok.printed == "fine\n" and ok.outputs()[0]["text"] == "fine\n"


# ------------------------------------------------------------------------------ one notebook's time

def _logging_cell(log: Path, sleep: float) -> str:
    """A cell that notes each run (with whether the grader sent it silently), sleeps, and notes its end."""
    return (f"import time\nfrom IPython import get_ipython\n"
            f"open({str(log)!r}, 'a').write('start ' + str(get_ipython().kernel.get_parent()['content'].get('silent'))"
            f" + '\\n')\ntime.sleep({sleep})\nopen({str(log)!r}, 'a').write('end\\n')")


def _run_notebook(tmp_path, cells: list[str], notebook_timeout: float) -> tuple[list[str], object]:
    from autograder.judge.runner import run_and_judge

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    session = KernelSession("python3", tmp_path / "work", env={}, ipc=True)
    try:
        notes = run_and_judge(nb, session, [], "cpu", timeout=30, notebook_timeout=notebook_timeout)
    finally:
        session.stop()
    return notes, nb


def test_a_replayed_cell_cannot_tell_it_is_replayed(tmp_path):
    """After a kernel dies, the cells that had run are replayed exactly as they ran the first
    time (the same request): a cell cannot behave differently, e.g. sleep, when it is replayed."""
    log = tmp_path / "runs.log"
    notes, _ = _run_notebook(tmp_path, [_logging_cell(log, 0)] * 3 + ["import os\nos._exit(3)", "x = 1"], 120)
    assert any("re-ran the cells" in n for n in notes), notes
    assert log.read_text().split("\n").count("start False") == 6, log.read_text()


def test_replays_count_against_the_notebook_limit(tmp_path):
    """A replay draws on the notebook's own time limit, never past it, whatever the cell limit
    allows: here the notebook's 8 s are spent before the replay could run its 6 s cell."""
    log = tmp_path / "runs.log"
    notes, nb = _run_notebook(tmp_path, [_logging_cell(log, 6), "import os\nos._exit(3)", "x = 1", "y = 2"], 8)
    runs = log.read_text().split("\n")
    assert runs.count("end") == 1, f"the replay ran past the notebook's limit: {runs}"
    assert any("ran longer than 8 s" in n for n in notes), notes
    assert [c.outputs[0]["evalue"] for c in nb.cells[-2:]] == ["not run: the notebook's time limit was reached"] * 2


def test_an_interrupted_kernel_is_killed_once_its_grace_is_over(monkeypatch):
    """A cell's watch interrupts the kernel at the deadline and kills it only after the session's
    grace (the ``interrupt_grace`` setting), not after a grace of its own."""
    from types import SimpleNamespace

    from autograder.judge import kernel

    now = [100.0]
    monkeypatch.setattr(kernel, "time", SimpleNamespace(monotonic=lambda: now[0]))
    done = []
    session = SimpleNamespace(grace=3, alive=lambda: True, stop=lambda: done.append("stopped"),
                              km=SimpleNamespace(interrupt_kernel=lambda: done.append("interrupted")))
    watch = kernel._Watch(session, timeout=5)
    seen = []
    for t in (104.0, 105.5, 107.0, 108.4, 108.6):
        now[0] = t
        seen.append(watch.check())
    assert seen == [None, "interrupted", None, None, "killed"], seen
    assert done == ["interrupted", "stopped"]


# ------------------------------------------------------------------------------ reading the source

def test_source_view_follows_aliases_helpers_and_defaults():
    view = SourceView(['import torch.nn.functional as F\n'
                       'def q1(x): pass\n'
                       'alias = q1\n'
                       'def helper(x): return alias(x)\n'
                       'class A:\n    def forward(self, x): return helper(x)\n'
                       'class B:\n    def forward(self, x, f=q1): return f(x)\n'
                       'class C:\n    def forward(self, x): return F.scaled_dot_product_attention(x, x, x)\n'
                       'class D:\n    def forward(self, x):\n        q1 = x.view(1)\n        return q1.softmax(-1)\n'
                       'class E:\n    def forward(self, x): return eval("q" + "1")(x)\n',
                       'x = ((((('])
    names = {"q1", "scaled_dot_product_attention"}
    assert view.reaches("A", names) == ["q1"]
    assert view.reaches("B", names) == ["q1"]
    assert view.reaches("C", names) == ["scaled_dot_product_attention"]
    assert view.reaches("D", names) == []  # a local variable of the same name is not the function
    assert view.reaches("E", names) == ["dynamic:eval"]
    assert view.reaches("Z", names) == ["Z is not defined"] and view.unreadable == [1]
    assert view.times_defined("q1") == 1 and view.times_defined("alias") == 1 and view.times_defined("Z") == 0
    again = SourceView(["def helper(x): return x\n", "import math\nif True:\n    helper = math.floor\n"])
    assert again.times_defined("helper") == 2


# ------------------------------------------------------------------------------ intake of any file

def _notebook_json():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title"), nbformat.v4.new_code_cell("x = 1")]
    nb.cells[1].metadata["nbgrader"] = {"grade": False, "grade_id": "answer", "locked": False,
                                        "schema_version": 3, "solution": True, "task": False}
    return json.loads(nbformat.writes(nb))


@pytest.mark.parametrize("mutate", [
    lambda raw: raw["cells"][1]["metadata"].update(nbgrader=None),
    lambda raw: raw["cells"][1]["metadata"].update(nbgrader={"grade_id": 5}),
    lambda raw: raw["cells"][1]["metadata"].update(nbgrader={"grade_id": "a b/c", "points": "many"}),
    lambda raw: raw["cells"][1]["metadata"].update(nbgrader=[1, 2]),
    lambda raw: raw["cells"][1].pop("outputs"),
    lambda raw: raw["cells"][1].pop("metadata"),
    lambda raw: raw["cells"][1].update(source=["a = 1\n", 2]),
    lambda raw: raw["cells"][1].update(cell_type="widget"),
    lambda raw: raw["cells"].append("not a cell"),
    lambda raw: raw["cells"].append({"cell_type": "code", "source": "x" * 10, "outputs": "nope", "id": "../.."}),
    lambda raw: raw.update(metadata=None),
    lambda raw: raw.update(nbformat="four"),
    lambda raw: raw["cells"][0].update(attachments={"a.png": {"image/png": "!!!"}}),
])
def test_malformed_notebooks_are_rebuilt_or_refused_in_one_line(tmp_path, mutate):
    raw = _notebook_json()
    mutate(raw)
    path = tmp_path / "s1_x.ipynb"
    path.write_text(json.dumps(raw))
    try:
        nb, notes = read_submission(path)
    except IntakeError as exc:
        assert "\n" not in str(exc)
        return
    nbformat.validate(nb)  # what comes out is a valid notebook, whatever went in
    assert all("outputs" in c for c in nb.cells if c.cell_type == "code")


def test_fuzzed_files_never_raise_anything_but_intake_error(tmp_path):
    rng = random.Random(1)
    base = json.dumps(_notebook_json()).encode()
    for i in range(150):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 6)):
            pos = rng.randrange(len(data))
            data[pos:pos + rng.randrange(1, 4)] = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 3)))
        path = tmp_path / f"s{i}_x.ipynb"
        path.write_bytes(bytes(data))
        try:
            nb, _ = read_submission(path)
        except IntakeError:
            continue
        nbformat.validate(nb)


def test_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "s1_x.ipynb"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_notebook_json()).encode())
    nb, notes = read_submission(path)
    assert nb.cells[1].source == "x = 1" and any("byte-order mark" in n for n in notes)


# ------------------------------------------------------------------------------ one test's budget

BUDGET_CODE = '''
import time, torch

def big_items(n=40, mib=4):
    """A generator of n tensors of mib MiB each."""
    for _ in range(n):
        yield torch.zeros(mib << 18)

def many_items():
    yield from range(2000)

def trickle(n=10, pause=0.4):
    """Answers every request, each one a little slowly."""
    for i in range(n):
        time.sleep(pause)
        yield i

huge_id = 10**8
'''


def _test_cell(code: str, gid: str):
    cell = nbformat.v4.new_code_cell(code)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": gid, "points": 1, "solution": False, "locked": True}
    return cell


def _judged(tmp_path, tests: dict, limits, timeout=30, notebook_timeout=120) -> dict:
    """{grade id: (passed, message)} for test cells run against BUDGET_CODE within ``limits``."""
    from autograder.judge.runner import run_and_judge

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(BUDGET_CODE)] + [_test_cell(c, g) for g, c in tests.items()]
    session = KernelSession("python3", tmp_path / "work", env={}, ipc=True)
    try:
        run_and_judge(nb, session, [], "cpu", timeout=timeout, notebook_timeout=notebook_timeout, limits=limits)
    finally:
        session.stop()
    out = {}
    for cell in nb.cells[1:]:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        out[cell.metadata["nbgrader"]["grade_id"]] = (not errors, errors[0]["evalue"] if errors else "")
    return out


HONEST = "assert sum(float(t.sum()) for t in student.big_items(3, 1)) == 0\nassert student.fetch(student.huge_id) > 0"


def test_a_test_stops_at_its_budget_of_bytes_and_items(tmp_path):
    """A test that iterates over what the student's code hands it stops at its budget of bytes
    (40 items of 4 MiB against 16 MiB) and of items, even when the test catches the error; a
    test within its budget passes as before."""
    from autograder.judge.budget import Limits

    got = _judged(tmp_path, {
        "bytes": "assert sum(float(t.sum()) for t in student.big_items()) == 0",
        "caught": "try:\n    list(student.big_items())\nexcept Exception:\n    pass\nassert True",
        "items": "assert sum(student.many_items()) > 0",
        "honest": HONEST,
    }, Limits(seconds=60, items=200, mb=16, memory_mb=0))
    assert got["honest"] == (True, ""), got
    assert not got["bytes"][0] and "took more than 16 MiB" in got["bytes"][1], got
    assert not got["caught"][0] and "took more than 16 MiB" in got["caught"][1], got
    assert not got["items"][0] and "more than 200 items" in got["items"][1], got


def test_a_test_has_one_clock_for_its_requests_and_its_own_work(tmp_path):
    """A slow trickle (each item well within the 20 s per request) stops at the test's 3 s, not
    after its 8 s; so does a test's own arithmetic; and every request of a test draws on the
    notebook's deadline too, not on a fresh cell limit."""
    from autograder.judge.budget import Limits

    slow = "assert sum(student.trickle(10, 0.8)) == 45"
    own = "import time\nfor _ in range(60):\n    time.sleep(0.1)\nassert student.fetch(student.huge_id) > 0"
    got = _judged(tmp_path, {"trickle": slow, "own": own, "honest": HONEST},
                  Limits(seconds=3, items=10_000, mb=1024, memory_mb=0), timeout=20)
    assert got["honest"] == (True, ""), got
    assert got["trickle"] == (False, "stopped: the test ran longer than 3 s"), got
    assert got["own"] == (False, "stopped: the test ran longer than 3 s"), got
    slow = "assert sum(student.trickle(30, 0.8)) == 435"  # 24 s, past the notebook's 10
    got = _judged(tmp_path, {"trickle": slow}, Limits(seconds=600, items=10_000, mb=1024, memory_mb=0),
                  timeout=20, notebook_timeout=10)
    assert got["trickle"] == (False, "stopped: the notebook's time limit was reached during this test"), got


def test_a_tests_own_arithmetic_on_a_students_value_stops_at_the_memory_limit(tmp_path):
    """A small reply holding a huge id (10**8) that a test feeds to torch.bincount (800 MB) fails
    that test with a reason once the grading process's memory is limited; the process's limit is
    put back afterwards, and an honest test under the same limit passes."""
    import resource

    from autograder.judge.budget import Limits

    before = resource.getrlimit(resource.RLIMIT_DATA)
    limit = 400  # MiB a test may add to this process
    got = _judged(tmp_path, {
        "bincount": "counts = torch.bincount(torch.tensor([student.fetch(student.huge_id)]))\nassert counts.sum() == 1",
        "honest": HONEST,
    }, Limits(seconds=60, items=10_000, mb=1024, memory_mb=limit))
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert got["honest"] == (True, ""), got
    assert not got["bincount"][0] and "memory limit" in got["bincount"][1], got
