"""Self-checks for students: re-run an assignment's visible tests from any cell.

nbgrader's Validate button does not exist on Colab, so each exercise notebook calls
``check("q1")`` (one question) or ``check()`` (everything), and its last cell calls
``handin_report()``.  The visible tests come from ``coursekit/checks/<assignment>.json``,
which ``python -m autograder release`` writes from the *student* notebook: the visible test
code, the one-line descriptions of hidden tests, the written answers and their points, and
which notebook names come from which question (to tell a student that Q2 cannot be checked
while Q1 is unanswered, instead of "name 'train_ds' is not defined").

Visible tests are plain asserts.  A block ``with warn_only(): ...`` inside a visible test
holds checks for mistakes that only a hidden test grades: a failing assert there becomes a
warning that names the mistake, and costs no points by itself (the hidden test does).

Nothing here imports nbgrader, so the self-check works on Colab as in JupyterLab.
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

# Imports inside functions: IPython and google.colab are imported where the notebook is asked for its cells
# or history: the self-check also runs outside IPython (tests, the grader), and google.colab exists only on
# Colab.

CHECKS_DIR = Path(__file__).resolve().parent / "checks"
_current: dict[str, str] = {}

from . import REPO_URL
from .failures import MAX_TEXT, explain_failure
from .remote import LocalStudent
from .runtime import environment_problem

__all__ = ["use_assignment", "check", "handin_report", "load_spec", "student", "warn_only", "CheckReport"]

# how test cells call the notebook's code (see coursekit.remote): in the notebook, directly
student = LocalStudent()

PLACEHOLDER_TEXT = "YOUR ANSWER HERE"          # what nbgrader leaves in a written answer
PLACEHOLDER_CODE = "raise NotImplementedError()"  # ... and in a code answer


def use_assignment(name: str) -> None:
    """Remember which assignment this kernel works on (the setup cell calls this)."""
    load_spec(name)  # fail early with a clear message if it is unknown
    _current["assignment"] = name
    _quiet_hidden_test_cells()


_HIDDEN_DOC = re.compile(r"^\s*Q\d+\s+hidden\s*:")


class _NoEchoForHiddenTests(ast.NodeTransformer):
    """In a student's notebook a hidden-test cell holds only its docstring (its tests are
    removed), and IPython would echo that string as the cell's ``Out[]``. A ``pass`` after
    it makes the cell end in a statement, which IPython does not echo."""

    def visit_Module(self, node):
        body = node.body
        if (len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str) and _HIDDEN_DOC.match(body[0].value.value)):
            body.append(ast.copy_location(ast.Pass(), body[0]))
        return node


def _quiet_hidden_test_cells() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and not any(isinstance(t, _NoEchoForHiddenTests) for t in shell.ast_transformers):
        shell.ast_transformers.append(_NoEchoForHiddenTests())


def load_spec(name: str) -> dict:
    path = CHECKS_DIR / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in CHECKS_DIR.glob("*.json"))) or "none"
        raise ValueError(f"no self-checks for assignment {name!r} (known: {known}); "
                         f"update coursekit: pip install -U git+{REPO_URL}")
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------
# Warnings: checks that name a mistake a hidden test will grade
# ---------------------------------------------------------------------------------------

_collectors: list[list[str]] = []   # check() collects warnings here while a test runs
_running: list[tuple[str, dict]] = []  # ... and the question of that test, and the answers' questions


class Unchecked(str):
    """A warning that a check could not run at all (something it needs is not defined): it
    says nothing about a hidden test, which may well pass."""


def _warn(message: str) -> None:
    if _collectors:
        _collectors[-1].append(message)
    elif isinstance(message, Unchecked):
        print(f"Warning: {message}")
    else:  # the test cell itself, run by hand or by the grader: say it in the cell's output
        print(f"Warning: {message} (not graded here: a hidden test grades this)")


_DOCSTRING_QUESTION = re.compile(r'^\s*"""\s*(Q\d+)\b')


def _current_question() -> str | None:
    """The question of the test that is running: known to check(); for a test cell run by
    hand, read from the docstring of the cell IPython is running."""
    if _running:
        return _running[-1][0]
    try:
        from IPython import get_ipython

        cell = get_ipython().user_ns["In"][-1]
    except Exception:  # noqa: BLE001 - not in IPython, or no input history
        return None
    m = _DOCSTRING_QUESTION.match(cell) if isinstance(cell, str) else None
    return m.group(1).upper() if m else None


def _not_defined(name: str) -> Unchecked:
    """What to say when a check needs ``name`` and the notebook has not defined it."""
    answers = _running[-1][1] if _running else {}
    if not _running:
        with contextlib.suppress(Exception):  # no assignment known: the message names no question
            answers = load_spec(_current["assignment"]).get("answers", {})
    own, theirs = _current_question(), answers.get(name)
    if theirs and theirs != own:
        return Unchecked(f"{own or 'this question'} could not be checked: it uses {name}, your answer to "
                         f"{theirs}, which is not defined (run the cell with your answer to {theirs} and fix "
                         "what it reports)")
    if theirs:
        return Unchecked(f"could not be checked: {name} is not defined (run the cell with your answer)")
    return Unchecked(f"could not be checked: {name} is not defined (run the cells above this one, "
                     "or Restart and run all)")


class warn_only:
    """``with warn_only(): assert ..., "message"``: a check that warns instead of failing.

    Visible tests use it for mistakes that only a hidden test grades (the value of a worked
    example, a property such as causality): the student learns about the mistake before
    handing in, and the visible test's points do not depend on it.  A failed assert, an
    exception raised by the student's code, or (at grading time) a kernel that the student's
    code ended or that did not answer in time ends the block and becomes one warning (the
    grader still sees the dead kernel and starts a fresh one); any other exception (a bug
    in the test) propagates.
    """

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        runtime = environment_problem(exc)
        if runtime:  # the runtime's packages, not the student's code nor the test
            _warn(Unchecked(f"could not be checked: {runtime}"))
            return True
        if getattr(exc, "from_student", False):
            undefined = _NAME_RE.search(str(exc)) if isinstance(exc, NameError) else None
            _warn(_not_defined(undefined.group(1)) if undefined else explain_failure(exc, "", "").message)
            return True
        if isinstance(exc, AssertionError):
            _warn(str(exc) or "a check failed")
            return True
        if getattr(exc, "student_caused", False):  # autograder.judge: KernelDied, RemoteTimeout
            _warn(f"could not be checked: {exc}")
            return True
        return False


# ---------------------------------------------------------------------------------------
# Running the visible tests
# ---------------------------------------------------------------------------------------

@dataclass
class CheckOutcome:
    question: str
    grade_id: str
    points: float
    description: str
    status: str                 # "pass", "fail", "unanswered" or "runtime" (the runtime's packages broke it)
    reason: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "pass"


_NAME_RE = re.compile(r"name '([^']+)' is not defined")


def _description(test: dict) -> str:
    """The test's docstring without its 'Q2 visible:' prefix."""
    return re.sub(r"^Q\d+\s+(visible|hidden)\s*:\s*", "", test["description"]).strip()


def _is_stub(obj) -> bool:
    """True for a function (or a class with a method) that only raises NotImplementedError,
    as nbgrader releases an unanswered question."""
    if inspect.isclass(obj):
        return any(_is_stub(v) for v in vars(obj).values() if inspect.isfunction(v))
    code = getattr(obj, "__code__", None)
    return code is not None and set(code.co_names) == {"NotImplementedError"}


def _answer_frames(exc: BaseException, answers: dict) -> list[tuple[str, str]]:
    """(answer name, question) of the frames of the student's answers that ``exc`` passed
    through, innermost last (a method counts for its class)."""
    found = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        head = getattr(code, "co_qualname", code.co_name).split(".")[0]
        if head in answers and tb.tb_frame.f_globals.get(head) is not None:
            found.append((head, answers[head]))
        tb = tb.tb_next
    return found


class _Context:
    """What the failure messages need: the spec, the namespace, the outcomes so far."""

    def __init__(self, spec: dict, ns: dict):
        self.spec, self.ns = spec, ns
        self.answers: dict = spec.get("answers", {})      # name -> question
        self.origins: dict = spec.get("origins", {})      # name -> {"questions", "via"}
        self.status: dict[str, str] = {}                   # question -> pass / fail / unanswered

    def note(self, outcome: CheckOutcome) -> None:
        old = self.status.get(outcome.question, "pass")
        order = ["pass", "fail", "runtime", "unanswered"]
        self.status[outcome.question] = max(old, outcome.status, key=order.index)

    def unanswered(self, names) -> list[str]:
        return [n for n in names if n not in self.ns or _is_stub(self.ns[n])]

    def explain(self, exc: BaseException, test: dict, source: str) -> tuple[str, str]:
        """(status, one-line reason) for a failed visible test."""
        own = test["question"]
        runtime = environment_problem(exc)
        if runtime:  # an installed library failed to import or refused a version: not the student's mistake
            return "runtime", f"could not be checked: {runtime}"
        if isinstance(exc, NameError) and _NAME_RE.search(str(exc)):
            name = _NAME_RE.search(str(exc)).group(1)
            # "... in the notebook": the test asked for a global the notebook does not have;
            # otherwise the name is missing inside the student's own code
            inside_code = getattr(exc, "from_student", False) and "in the notebook" not in str(exc)
            if not inside_code or name in self.answers or name in self.origins:
                return self._undefined(name, own)
        frames = _answer_frames(exc, self.answers)
        if frames and frames[-1][1] != own:
            fn, q = frames[-1]  # an answer to another question broke: that question is the one to fix
            if isinstance(exc, NotImplementedError):
                return "fail", f"{q} is not answered yet ({fn} raises NotImplementedError), so {own} cannot be checked"
            name = getattr(exc, "student_type", None) or type(exc).__name__
            detail = f"{name}: {str(exc)[:MAX_TEXT]}" if str(exc) else name
            return "fail", f"{q} does not work yet ({fn} raised {detail}), so {own} cannot be checked"
        failure = explain_failure(exc, source, f"<check {test['grade_id']}>", culprit=frames[-1][0] if frames else None)
        return ("unanswered" if failure.unanswered else "fail"), failure.reason

    def _undefined(self, name: str, own: str) -> tuple[str, str]:
        if name in self.answers:
            q = self.answers[name]
            if q == own:
                return "unanswered", f"not answered yet: {name} is not defined (run the cell with your answer)"
            return "fail", (f"{q} is not answered yet ({name} is not defined: run the cell with your "
                            f"answer to {q}), so {own} cannot be checked")
        origin = self.origins.get(name)
        if origin:
            via = origin["via"]
            where = f"{name} comes from the cell that calls {', '.join(via)}"
            for q in origin["questions"]:
                mine = [fn for fn in via if self.answers.get(fn) == q]
                if self.unanswered(mine):
                    if q == own:
                        return "unanswered", f"not answered yet ({where})"
                    return "fail", f"{q} is not answered yet, so {own} cannot be checked ({where})"
                if q != own and self.status.get(q, "pass") != "pass":
                    return "fail", f"{q} does not pass its visible tests yet, so {own} cannot be checked ({where})"
            return "fail", (f"{name} is not defined: run the cell that calls {', '.join(via)} "
                            "(or Restart and run all); if that cell fails, fix what it reports")
        return "fail", f"{name} is not defined: run the cells above this one (or Restart and run all)"


@contextlib.contextmanager
def _quiet():
    """Nothing the tests print or show reaches the notebook: no text, no warnings, and no
    progress bars (tqdm draws widgets in notebooks, which no redirection catches)."""
    restore = []
    tqdm_std = sys.modules.get("tqdm.std")
    if tqdm_std is not None:
        cls = tqdm_std.tqdm
        original = cls.__dict__["__init__"]

        def quiet_init(self, *args, **kwargs):
            kwargs["disable"] = True
            original.__get__(self, type(self))(*args, **kwargs)

        cls.__init__ = quiet_init
        restore.append(lambda: setattr(cls, "__init__", original))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            for undo in restore:
                undo()


def _run_test(test: dict, ns: dict, ctx: _Context) -> CheckOutcome:
    out = CheckOutcome(test["question"], test["grade_id"], test.get("points", 0), _description(test), "pass")
    code = compile(test["source"], f"<check {test['grade_id']}>", "exec")
    _collectors.append(out.warnings)
    _running.append((test["question"], ctx.answers))
    try:
        exec(code, ns)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none propagates
        out.status, out.reason = ctx.explain(exc, test, test["source"])
    finally:
        _collectors.pop()
        _running.pop()
    return out


def _caller_namespace(depth: int = 2) -> dict:
    frame = inspect.currentframe()
    for _ in range(depth):
        frame = frame.f_back
    return frame.f_globals


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _points(p) -> str:
    p = float(p)
    return _plural(int(p), "point") if p == int(p) else f"{p:g} points"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class CheckReport:
    """What check() found. True when every visible test passed without a warning.

    In a notebook the report shows nothing of its own (check() has printed it already), so a
    cell ending in ``check()`` gets no ``Out[]`` line."""

    def __init__(self, assignment: str, spec: dict, outcomes: list[CheckOutcome], hidden: list[dict]):
        self.assignment, self.spec, self.outcomes, self.hidden = assignment, spec, outcomes, hidden

    @property
    def failed(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if not o.passed]

    @property
    def warned(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.warnings]

    @property
    def passed(self) -> bool:
        return not self.failed and not self.warned

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self):  # printed already; no Out[] echo
        return None

    def __repr__(self) -> str:
        ok = len(self.outcomes) - len(self.failed)
        return f"<check {self.assignment}: {ok}/{len(self.outcomes)} visible tests passed, " \
               f"{sum(len(o.warnings) for o in self.outcomes)} warning(s)>"

    def problems(self) -> list[str]:
        """Short phrases for the hand-in verdict, e.g. 'Q2 fails a visible test'."""
        out = []
        questions = list(dict.fromkeys(o.question for o in self.outcomes))
        for q in questions:
            mine = [o for o in self.outcomes if o.question == q]
            if any(o.status == "unanswered" for o in mine):
                out.append(f"{q} is not answered")
            elif any(o.status == "runtime" for o in mine):
                out.append(f"{q} could not be checked in this runtime (an incompatible package: see {q} above)")
            elif any(not o.passed for o in mine):
                out.append(f"{q} fails a visible test")
            elif any(o.warnings for o in mine):
                out.append(f"{q} has a warning")
        return out

    def lines(self) -> list[str]:
        titles = self.spec.get("titles", {})
        questions = list(dict.fromkeys([o.question for o in self.outcomes] + [t["question"] for t in self.hidden]))
        questions.sort(key=lambda q: int(q[1:]))
        text = []
        for q in questions:
            title = titles.get(q, "")
            text.append(f"{q}" + (f"  {title}" if title else ""))
            for o in (o for o in self.outcomes if o.question == q):
                head = f"  [{'PASS' if o.passed else 'FAIL'}] visible ({_points(o.points)}): "
                text.append(head + (o.description if o.passed else o.reason))
                for w in o.warnings:
                    text.append(f"  [WARN] {w}" if isinstance(w, Unchecked) else
                                f"  [WARN] {w} (no points lost here, but a hidden test of {q} will fail)")
            for t in (t for t in self.hidden if t["question"] == q):
                text.append(f"  hidden ({_points(t.get('points', 0))}, run when graded): {_description(t)}")
        n, bad = len(self.outcomes), len(self.failed)
        warnings = sum(len(o.warnings) for o in self.outcomes)
        hidden_points = sum(float(t.get("points", 0)) for t in self.hidden)
        if not bad and not warnings:
            summary = f"All {n} visible tests passed" if n > 1 else "The visible test passed"
        else:
            summary = f"{n - bad} of {n} visible tests passed"
            if warnings:
                summary += f", {_plural(warnings, 'warning')}"
            where = list(dict.fromkeys(o.question for o in self.outcomes if not o.passed or o.warnings))
            summary += f": see {_and(where)}"
        if hidden_points:
            summary += f". Hidden tests ({_points(hidden_points)}) run when your notebook is graded."
        else:
            summary += "."
        text.append(summary)
        return text


def check(question: str | None = None, *, assignment: str | None = None,
          namespace: dict | None = None, quiet: bool = False) -> CheckReport:
    """Run the visible tests of ``question`` (e.g. "q1"), or of every question.

    Prints one line per test (and per warning), lists the hidden tests under their
    question, and returns a :class:`CheckReport` that is true when every visible test passed
    without a warning.  Nothing the tests run prints anything (no progress bars)."""
    name = assignment or _current.get("assignment")
    if not name:
        raise ValueError("which assignment? run the setup cell first, or call check(..., assignment='name')")
    spec = load_spec(name)
    ns = namespace if namespace is not None else _caller_namespace()
    ns.setdefault("warn_only", warn_only)  # notebooks released before warn_only existed
    wanted = None if question is None else str(question).strip().upper()
    tests = [t for t in spec["tests"] if wanted is None or t["question"] == wanted]
    if not tests:
        qs = sorted({t["question"] for t in spec["tests"]}, key=lambda q: int(q[1:]))
        raise ValueError(f"no question {question!r} in {name}; questions: {', '.join(qs)}")
    ctx = _Context(spec, ns)
    outcomes = []
    with _quiet():
        for t in tests:
            if not t["hidden"]:
                outcome = _run_test(t, ns, ctx)
                ctx.note(outcome)
                outcomes.append(outcome)
    report = CheckReport(name, spec, outcomes, [t for t in tests if t["hidden"]])
    if not quiet:
        print("\n".join(report.lines()))
    return report


# ---------------------------------------------------------------------------------------
# The hand-in cell
# ---------------------------------------------------------------------------------------

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


def _notebook_cells(spec: dict, ns: dict) -> tuple[list | None, str]:
    """The cells of this notebook as saved (or, on Colab, as they are now), and where they
    were read from; (None, reason) when the notebook cannot be found."""
    try:  # Colab hands the live notebook to the kernel on request
        from google.colab import _message  # type: ignore

        nb = _message.blocking_request("get_ipynb", timeout_sec=10)["ipynb"]
        return nb["cells"], "this notebook"
    except Exception:  # noqa: BLE001 - not on Colab, or Colab did not answer
        pass
    candidates = []
    for key in ("__vsc_ipynb_file__",):  # VS Code names the notebook in the namespace
        if isinstance(ns.get(key), str):
            candidates.append(Path(ns[key]))
    session = os.environ.get("JPY_SESSION_NAME", "")  # Jupyter Server 2 (JupyterLab 4, Notebook 7)
    if session.endswith(".ipynb"):
        candidates += [Path(session), Path.cwd() / Path(session).name]
    candidates.append(Path.cwd() / spec.get("notebook", ""))
    marker = f'assignment=\\"{spec["assignment"]}\\"'
    try:
        others = sorted(Path.cwd().glob("*.ipynb"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        others = []
    candidates += others
    for path in candidates:
        try:
            if not path.is_file():
                continue
            text = path.read_text(encoding="utf-8-sig")
            if marker not in text:
                continue
            cells = json.loads(text).get("cells", [])
        except (OSError, ValueError):
            continue
        age = time.time() - path.stat().st_mtime
        when = "just now" if age < 90 else (f"{age / 60:.0f} min ago" if age < 5400 else f"{age / 3600:.0f} h ago")
        return cells, f"{path.name} as last saved ({when})"
    return None, "the notebook file was not found"


def _cell_text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def written_answers(spec: dict, cells: list) -> tuple[list[dict], list[dict]]:
    """(answered, unanswered) written answers of the spec, judged from the notebook's cells."""
    by_id = {}
    for cell in cells:
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if isinstance(meta, dict) and meta.get("grade_id"):
            by_id.setdefault(meta["grade_id"], cell)
    answered, missing = [], []
    for w in spec.get("written", []):
        cell = by_id.get(w["grade_id"])
        text = _cell_text(cell).strip() if cell is not None else ""
        if w["kind"] == "markdown":
            empty = not text or text == PLACEHOLDER_TEXT
        else:
            empty = not text or PLACEHOLDER_CODE in text
        (missing if empty else answered).append(w)
    return answered, missing


def _label_list(items: list[dict]) -> str:
    return _and([f"{w['label']} ({_points(w['points'])})" for w in items])


class HandinReport:
    """What handin_report() found: true when the notebook is ready to hand in."""

    def __init__(self, ready: bool, verdict: str, checks: CheckReport | None):
        self.ready, self.verdict, self.checks = ready, verdict, checks

    def __bool__(self) -> bool:
        return self.ready

    def _ipython_display_(self):
        return None

    def __repr__(self) -> str:
        return f"<hand-in check: {self.verdict}>"


def handin_report(*, assignment: str | None = None, namespace: dict | None = None) -> HandinReport:
    """The last cell of every exercise: run order, every visible test, the written answers,
    how to hand in, and one last line: ready to hand in, or what is missing."""
    name = assignment or _current.get("assignment")
    if not name:
        raise ValueError("which assignment? run the setup cell first, or call handin_report(assignment='name')")
    spec = load_spec(name)
    ns = namespace if namespace is not None else _caller_namespace()
    missing: list[str] = []
    ran = _cells_run_since_setup()
    expected = spec.get("code_cells_between_setup_and_handin")
    if ran is not None and expected is not None and ran < expected:
        print(f"WARNING: only {ran} of the {expected} code cells after the setup cell ran in this session. "
              "Restart and run all (Colab: Runtime > Restart session and run all) before you download.")
        missing.append("the notebook was not run from top to bottom")
    report = check(assignment=name, namespace=ns)
    missing = report.problems() + missing
    written = spec.get("written", [])
    unsure = False
    if written:
        cells, where = _notebook_cells(spec, ns)
        if cells is None:
            unsure = True
            print(f"Written answers (graded by hand): {_label_list(written)}. This cell could not read the "
                  f"notebook ({where}) to see whether you answered them; check them yourself.")
        else:
            answered, empty = written_answers(spec, cells)
            if empty:
                print(f"Written answers still reading \"{PLACEHOLDER_TEXT}\" (read from {where}): "
                      f"{_label_list(empty)}.")
                missing.append(f"written answer{'s' if len(empty) > 1 else ''} "
                               f"{_and([w['label'] for w in empty])} "
                               f"({_points(sum(w['points'] for w in empty))}) "
                               f"{'are' if len(empty) > 1 else 'is'} empty")
            else:
                print(f"Written answers (graded by hand): all {len(answered)} filled in "
                      f"({_label_list(answered)}; read from {where}).")
    print(f"Hand in: File > Download > Download .ipynb, keep the name {spec['notebook']} "
          f"(or prefix your student id: s1234567_{spec['notebook']}).")
    if missing:
        verdict = "Not ready to hand in: " + "; ".join(missing) + "."
    elif unsure:
        verdict = "Ready to hand in, once you have checked the written answers yourself."
    else:
        verdict = "Ready to hand in."
    print(verdict)
    return HandinReport(not missing, verdict, report)


_Q_RE = re.compile(r'^\s*"""\s*(Q\d+)\b')


def question_of(source: str) -> str | None:
    """'Q3' from a test cell whose docstring starts with 'Q3 ...'."""
    m = _Q_RE.match(source)
    return m.group(1).upper() if m else None
