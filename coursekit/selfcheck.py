"""Self-checks for students: re-run an assignment's visible tests from any cell.

nbgrader's Validate button does not exist on Colab, so each exercise notebook
calls ``check("q1")`` (one question) or ``check()`` (everything).  The visible
tests come from ``coursekit/checks/<assignment>.json``, which
``python -m autograder release`` writes from the *student* notebook: it holds
the visible test code and only the one-line descriptions of hidden tests.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import json
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

CHECKS_DIR = Path(__file__).resolve().parent / "checks"
_current: dict[str, str] = {}

from .remote import LocalStudent

__all__ = ["use_assignment", "check", "handin_report", "load_spec", "student"]

# how test cells call the notebook's code (see coursekit.remote): in the notebook, directly
student = LocalStudent()


def use_assignment(name: str) -> None:
    """Remember which assignment this kernel works on (the setup cell calls this)."""
    load_spec(name)  # fail early with a clear message if it is unknown
    _current["assignment"] = name


def load_spec(name: str) -> dict:
    path = CHECKS_DIR / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in CHECKS_DIR.glob("*.json"))) or "none"
        from . import REPO_URL

        raise ValueError(f"no self-checks for assignment {name!r} (known: {known}); "
                         f"update coursekit: pip install -U git+{REPO_URL}")
    return json.loads(path.read_text())


@dataclass
class Outcome:
    question: str
    grade_id: str
    passed: bool
    reason: str = ""


def _failure_reason(exc: BaseException, source: str) -> str:
    if isinstance(exc, NotImplementedError):
        return "not answered yet (the function still raises NotImplementedError)"
    if isinstance(exc, NameError):
        return f"{exc}: run the cell that defines it first"
    if isinstance(exc, AssertionError):
        if str(exc):
            return str(exc)
        # no message: quote the failing line of the (visible) test
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<check")]
        if frames and frames[-1].lineno:
            line = source.splitlines()[frames[-1].lineno - 1].strip()
            return f"failed: {line}"
        return "an assertion failed"
    return f"{type(exc).__name__}: {exc}"


def _run_test(test: dict, namespace: dict) -> Outcome:
    code = compile(test["source"], f"<check {test['grade_id']}>", "exec")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, namespace)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none propagates
        return Outcome(test["question"], test["grade_id"], False, _failure_reason(exc, test["source"]))
    return Outcome(test["question"], test["grade_id"], True)


def _caller_namespace(depth: int = 2) -> dict:
    frame = inspect.currentframe()
    for _ in range(depth):
        frame = frame.f_back
    return frame.f_globals


def check(question: str | None = None, *, assignment: str | None = None,
          namespace: dict | None = None, quiet: bool = False) -> bool:
    """Run the visible tests of ``question`` (e.g. "q1"), or of every question.

    Prints one line per test and returns True when all of them passed.  Hidden
    tests run only at grading time; their descriptions are listed so nothing
    about grading is a surprise.
    """
    name = assignment or _current.get("assignment")
    if not name:
        raise ValueError("which assignment? run the setup cell first, or call check(..., assignment='name')")
    spec = load_spec(name)
    ns = namespace if namespace is not None else _caller_namespace()
    wanted = None if question is None else question.strip().upper()
    tests = [t for t in spec["tests"] if wanted is None or t["question"] == wanted]
    if not tests:
        qs = sorted({t["question"] for t in spec["tests"]})
        raise ValueError(f"no question {question!r} in {name}; questions: {', '.join(qs)}")
    outcomes = [_run_test(t, ns) for t in tests if not t["hidden"]]
    if not quiet:
        for o in outcomes:
            mark = "PASS" if o.passed else "FAIL"
            print(f"[{mark}] {o.question} {o.grade_id}" + ("" if o.passed else f": {o.reason}"))
        hidden = [t for t in tests if t["hidden"]]
        if hidden:
            print(f"{len(hidden)} hidden test(s) run at grading time: "
                  + "; ".join(f"{t['question']} {t['description']}" for t in hidden))
        ok = sum(o.passed for o in outcomes)
        verdict = "all visible checks passed" if ok == len(outcomes) else f"{len(outcomes) - ok} visible check(s) failed"
        print(f"{ok}/{len(outcomes)} visible checks passed: {verdict}")
    return all(o.passed for o in outcomes)


def _cells_run_since_setup() -> int | None:
    """How many cells this kernel ran after the last run of the setup cell,
    or None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    if ip is None:
        return None
    history = ip.user_ns.get("In", [])
    starts = [i for i, src in enumerate(history) if "setup_notebook(" in src]
    if not starts:
        return 0
    return len(history) - 1 - starts[-1] - 1  # minus the setup cell and this cell


def handin_report(*, assignment: str | None = None, namespace: dict | None = None) -> bool:
    """The last cell of every exercise: run order, all visible checks, file name."""
    name = assignment or _current.get("assignment")
    spec = load_spec(name) if name else None
    ns = namespace if namespace is not None else _caller_namespace()
    ran = _cells_run_since_setup()
    expected = spec["code_cells_between_setup_and_handin"] if spec else None
    in_order = True
    if ran is not None and expected is not None and ran < expected:
        in_order = False
        print(f"WARNING: only {ran} of the {expected} code cells after the setup cell ran in this session. "
              "Restart and run all (Colab: Runtime > Restart session and run all) before you download.")
    passed = check(assignment=name, namespace=ns)
    if spec:
        print(f"Hand in: File > Download > Download .ipynb, keep the name {spec['notebook']} "
              f"(or prefix your student id: s1234567_{spec['notebook']}).")
    return in_order and passed


_Q_RE = re.compile(r'^\s*"""\s*(Q\d+)\b')


def question_of(source: str) -> str | None:
    """'Q3' from a test cell whose docstring starts with 'Q3 ...'."""
    m = _Q_RE.match(source)
    return m.group(1).upper() if m else None
