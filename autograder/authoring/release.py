"""Regenerate the student notebooks in exercises/ from the sources in solutions/."""
from __future__ import annotations

import ast
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import nbformat

from autograder import RELEASE_DIR, ROOT, assignments
from autograder.course.paths import GradingPaths, nbgrader_env, write_atomic

from .stamp import stamp

CHECKS_DIR = ROOT / "coursekit" / "checks"
_DOC_RE = re.compile(r'^\s*"""(.*?)"""', re.S)
_Q_RE = re.compile(r"^\s*(Q\d+)\b")


class ReleaseError(RuntimeError):
    pass


def normalize_notebook(path: Path) -> None:
    """Strip what must never be committed: outputs and execution counts.

    nbformat writes keys sorted with a fixed indent, so the same input gives the
    same bytes."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)


def _is_test(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _names_used(node) -> set[str]:
    """Names a statement reads from the notebook's globals (roughly: inside a function or
    class, names it binds itself and its parameters are left out)."""
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        local |= {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        loads -= local
    return loads


def _names_bound(node) -> list[str]:
    """Names a top-level statement binds (definitions, assignment and loop targets, imports)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    targets = []
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    elif isinstance(node, (ast.For, ast.With)):
        targets = [node.target] if isinstance(node, ast.For) else [i.optional_vars for i in node.items
                                                                   if i.optional_vars is not None]
    names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.For, ast.With, ast.If, ast.Try, ast.While)):
        for child in node.body:
            names += _names_bound(child)
    return names


def _dependencies(nb, questions_of_tests: list[tuple[int, str]]) -> tuple[dict, dict]:
    """Which question each answer belongs to (the question of the next test cell), and which
    other names of the notebook come from cells that call answers: {name: {"questions": [...],
    "via": [answer names]}}.  A definition (def, class) depends on what its body calls; any
    other statement makes what it binds, and everything after it in the cell, depend on what
    it runs."""
    answers: dict[str, str] = {}
    origins: dict[str, dict] = {}

    def deps(names) -> tuple[set, set]:
        qs, via = set(), set()
        for n in names:
            if n in answers:
                qs.add(answers[n])
                via.add(n)
            elif n in origins:
                qs.update(origins[n]["questions"])
                via.update(origins[n]["via"])
        return qs, via

    def record(name, qs, via):
        order = sorted(qs, key=lambda q: int(q[1:]))
        origins[name] = {"questions": order, "via": sorted(via)}

    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or _is_test(cell) or meta.get("grade_id") in ("setup", "handin_check"):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        if meta.get("solution") and not meta.get("grade"):  # an autograded answer
            question = next((q for i, q in questions_of_tests if i > index), None)
            if question:
                for node in tree.body:
                    for name in _names_bound(node):
                        answers[name] = question
                        origins.pop(name, None)
            continue
        run_qs, run_via = set(), set()  # what the statements run so far depend on
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qs, via = deps(_names_used(node))
            else:
                qs, via = deps(_names_used(node))
                run_qs |= qs
                run_via |= via
                qs, via = set(run_qs), set(run_via)
            for name in _names_bound(node):
                if name in answers:
                    continue
                if qs:
                    record(name, qs, via)
                else:
                    origins.pop(name, None)
    return answers, origins


_HEADING_RE = re.compile(r"^##\s+(Q\d+)\.?\s*(.*?)\s*(\([^()]*\bpoints?\b[^()]*\))?\s*$", re.M)
_PART_RE = re.compile(r"^\s*\*\*\(([a-z])\)")


def _questions_and_written(nb) -> tuple[dict, list]:
    """Question titles (from '## Q1. Title (6 points)' headings) and the written answers:
    cells graded by hand, with a label such as 'Q8b' and their points."""
    titles, written = {}, []
    question, previous = None, None
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown":
            m = _HEADING_RE.search(cell.source)
            if m:
                question = m.group(1).upper()
                titles.setdefault(question, m.group(2).strip().rstrip(".:"))
        if meta.get("solution") and meta.get("grade") and question:
            part = _PART_RE.match(previous.source) if previous is not None else None
            written.append({"grade_id": meta["grade_id"], "label": question + (part.group(1) if part else ""),
                            "points": meta.get("points", 0), "kind": cell.cell_type})
        if cell.cell_type == "markdown" and not meta.get("solution"):
            previous = cell
    return titles, written


def checks_spec(nb, assignment: str, notebook: str) -> dict:
    """What the students' self-check needs, taken from the *released* notebook: visible test
    code, for hidden tests only their one-line description, the written answers, question
    titles, and which notebook names come from which question."""
    tests, code_cells, counting = [], 0, False
    test_questions = []
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and "handin_report(" in cell.source:
            counting = False
        # test cells are not counted: at grading time they run in the grader, not the kernel
        if counting and cell.cell_type == "code" and not _is_test(cell):
            code_cells += 1
        if meta.get("grade_id") == "setup":
            counting = True
        if not _is_test(cell):
            continue
        doc = _DOC_RE.match(cell.source)
        q = _Q_RE.match(doc.group(1)) if doc else None
        if not q:
            raise ReleaseError(f"{assignment}: test cell {meta.get('grade_id')} must start with a "
                               'one-line docstring that names its question, e.g. """Q1 visible: ..."""')
        body = cell.source[doc.end():].strip()
        test_questions.append((index, q.group(1).upper()))
        tests.append({"grade_id": meta["grade_id"], "question": q.group(1).upper(),
                      "description": doc.group(1).strip(), "points": meta.get("points", 0),
                      "hidden": not body, "source": cell.source if body else ""})
    answers, origins = _dependencies(nb, test_questions)
    # only what visible tests ask the notebook for (student.NAME) needs an origin
    asked = {m for t in tests for m in re.findall(r"\bstudent\.([A-Za-z_]\w*)", t["source"])}
    origins = {k: v for k, v in origins.items() if k in asked}
    titles, written = _questions_and_written(nb)
    return {"assignment": assignment, "notebook": notebook, "tests": tests,
            "code_cells_between_setup_and_handin": code_cells, "answers": answers,
            "origins": origins, "titles": titles, "written": written}


def nbgrader(args: list[str], root: Path = ROOT, grading_dir: Path | None = None,
             timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    """Run one nbgrader command in the course directory, with optional overrides."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    if grading_dir is not None:
        paths = GradingPaths(Path(grading_dir), root)
        paths.root.mkdir(parents=True, exist_ok=True)  # sqlite cannot create the folder
        cmd += paths.nbgrader_flags()
    kw.setdefault("env", nbgrader_env())
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout, **kw)


def _remove_leftovers(out_dir: Path, name: str) -> None:
    """The half-written folders of a release that was killed (its process is gone)."""
    for folder in list(out_dir.glob(f".{name}.new-*")) + list(out_dir.glob(f".{name}.old-*")):
        try:
            os.kill(int(folder.name.rsplit("-", 2)[-2]), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError, IndexError):
            continue


def swap_into_place(fresh: Path, target: Path) -> None:
    """The folder ``fresh`` becomes ``target`` by a rename; the old ``target`` is removed after.
    On Linux the two trade places in one step (renameat2 RENAME_EXCHANGE), so a reader never
    finds ``target`` missing; elsewhere the old one is renamed away first (an instant without it)."""
    if not target.exists():
        os.rename(fresh, target)
        return
    if not _exchange(fresh, target):
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
        os.rename(fresh, target)
        fresh = old
    shutil.rmtree(fresh, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def release(names: list[str] | None = None, out_dir: Path | None = None,
            grading_dir: Path | None = None, root: Path = ROOT,
            checks_dir: Path | None = None) -> list[Path]:
    """Generate student notebooks for ``names`` (default: all) into ``out_dir``
    (default: exercises/) and their self-check specs into ``checks_dir``
    (default: coursekit/checks/, or out_dir/.checks when out_dir is given).
    Returns the files written."""
    names = names or assignments(root)
    if out_dir is None:  # the real release: first every setup cell, link and table from course.yml
        stamp(root)
    if checks_dir is None:
        checks_dir = Path(out_dir) / ".checks" if out_dir else root / "coursekit" / "checks"
    out_dir = Path(out_dir) if out_dir else root / RELEASE_DIR
    written = []
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        # nbgrader records the assignment in a gradebook; keep that one private
        # unless the caller grades with it.
        gdir = Path(grading_dir) if grading_dir else Path(tmp) / "grading"
        for name in names:
            stage = Path(tmp) / "stage"
            shutil.rmtree(stage, ignore_errors=True)
            proc = nbgrader(["generate_assignment", name, "--force",
                             f"--CourseDirectory.release_directory={stage}"],
                            root=root, grading_dir=gdir)
            if proc.returncode != 0 and "there are submissions associated with it" in proc.stderr:
                raise ReleaseError(
                    f"the source of '{name}' gained or lost cells after submissions were graded with it; "
                    f"grade into a fresh folder (--grading-dir) or move the gradebook of {gdir} away")
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
                raise ReleaseError(f"nbgrader generate_assignment {name} failed:\n" + "\n".join(tail))
            target = out_dir / name
            # written whole beside its place, then renamed into it: a reader never sees half of it
            fresh = out_dir / f".{name}.new-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            out_dir.mkdir(parents=True, exist_ok=True)
            _remove_leftovers(out_dir, name)
            shutil.copytree(stage / name, fresh)
            for nb_path in sorted(fresh.glob("*.ipynb")):
                normalize_notebook(nb_path)
            swap_into_place(fresh, target)
            nb_paths = sorted(target.glob("*.ipynb"))
            written += nb_paths
            spec = checks_spec(nbformat.read(nb_paths[0], as_version=4), name, nb_paths[0].name)
            Path(checks_dir).mkdir(parents=True, exist_ok=True)
            spec_path = Path(checks_dir) / f"{name}.json"
            write_atomic(spec_path, json.dumps(spec, indent=1, sort_keys=True) + "\n")
            written.append(spec_path)
    return written
