"""An exercise notebook's code cells executed in this process, as a kernel would run them,
so that ``check()`` can be called on the namespace directly (fast: no kernel, no nbclient).

The answer cells hold the reference answers (``conftest.filled_exercise``); ``with_answer``
swaps one answer cell for other code (a planted mistake, or the released stub) and re-runs
only the later cells that use what that cell defines.  Cells that take long (training runs,
plots, models the visible tests do not use) are skipped, or replaced by short stand-ins.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import io
import os
import warnings

from autograder.authoring.release import _is_test, _names_bound, _names_used
from conftest import ROOT, filled_exercise, read_nb, set_solution

os.environ.setdefault("COURSE_MODEL_SOURCE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")

# cells a visible test does not need, per assignment (grade id -> stand-in code, or None to skip)
SKIP = {
    "attention": {},
    "project_aether": {},
    "parameters_and_lora": {
        "train_pretrained": None, "train_scratch": None, "plot_comparison": None},
    "finetune": {"training_run": None, "training_plot": None, "news_table": None,
                 "second_model_run": None, "comparison_table": None},
    "concepts": {"q7_example": None, "q12_model": None, "q12_example": None, "q12_proxy": None},
    "llm_lab": {"load_model": None, "first_answer": None, "experiment_tools": None, "basic_experiments": None,
                "basic_plot": None, "offline_model": None, "compare_tool": None, "own_experiment": None},
}
STAND_INS = {  # what the two training cells leave behind, without training
    "parameters_and_lora": {"train_scratch": 'accuracies = {"pretrained": [0.5, 0.75], "scratch": [0.25, 0.25]}'},
}


def _definitions_only(tree) -> bool:
    """A cell of imports, definitions and assignments without calls: cheap to run again."""
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and not any(isinstance(n, ast.Call) for n in ast.walk(node)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        return False
    return True


def _gid(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


class NotebookRun:
    """The filled exercise ``name`` run once in this process; see the module docstring."""

    def __init__(self, name: str):
        import torch

        self.name = name
        self.nb = filled_exercise(name)
        self.source_nb = read_nb(ROOT / "solutions" / name / f"{name}.ipynb")
        self.stub_nb = read_nb(ROOT / "exercises" / name / f"{name}.ipynb")
        skip, stand = SKIP.get(name, {}), STAND_INS.get(name, {})
        self.cells = []  # (grade id, source) of the code cells a kernel runs, in order
        for cell in self.nb.cells:
            gid = _gid(cell)
            if cell.cell_type != "code" or _is_test(cell) or gid in ("setup", "handin_check"):
                continue
            if gid in stand:
                self.cells.append((gid, stand[gid]))
            elif gid not in skip:
                self.cells.append((gid, cell.source))
        self.base = self._fresh()
        self.base["DEVICE"] = torch.device("cpu")
        self.errors = self._execute(self.base, range(len(self.cells)), self.cells)
        assert not self.errors, f"{name}: the filled notebook failed in this process: {self.errors}"

    @staticmethod
    def _fresh() -> dict:
        from coursekit.selfcheck import warn_only

        ns = {"__name__": "__main__", "__builtins__": builtins, "display": lambda *a, **k: None,
              "warn_only": warn_only}
        exec("import importlib.util, subprocess, sys", ns)
        return ns

    @staticmethod
    def _execute(ns, indices, cells) -> dict:
        errors = {}
        for i in indices:
            gid, src = cells[i]
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    exec(compile(src, f"<cell {gid}>", "exec"), ns)
                except Exception as exc:  # noqa: BLE001 - a failing cell, as in a notebook
                    errors[gid] = f"{type(exc).__name__}: {exc}"
        return errors

    def answer_source(self, grade_id: str, body: str | None = None, stub: bool = False) -> str:
        """The code of answer cell ``grade_id``: the reference, ``body`` in place of the
        reference's solution region, or the released stub."""
        if stub:
            return next(c.source for c in self.stub_nb.cells if _gid(c) == grade_id)
        nb = self.source_nb if body is None else set_solution(read_nb(ROOT / "solutions" / self.name /
                                                                        f"{self.name}.ipynb"), grade_id, body)
        return next(c.source for c in nb.cells if _gid(c) == grade_id)

    def namespace(self, replace: dict[str, str] | None = None) -> dict:
        """A copy of the run's namespace in which the answer cells in ``replace`` (grade id ->
        code) ran instead, followed by every later cell that uses what they define."""
        from coursekit.remote import LocalStudent

        replace = replace or {}
        cells = [(gid, replace.get(gid, src)) for gid, src in self.cells]
        ns = dict(self.base)
        changed: set[str] = set()
        rerun = []
        for i, (gid, src) in enumerate(cells):
            tree = ast.parse(src)
            bound = {n for node in tree.body for n in _names_bound(node)}
            used = {n for node in tree.body for n in _names_used(node)}
            if gid in replace or used & changed:
                rerun.append(i)
                changed |= bound
            elif _definitions_only(tree):
                # functions and classes again, so that their globals are this namespace
                # (student.replaced(...) swaps names here, where they must look them up)
                rerun.append(i)
        for name in changed:
            ns.pop(name, None)
        self.last_errors = self._execute(ns, rerun, cells)
        ns["student"] = LocalStudent(ns)
        ns["In"] = [""] + [src for _, src in cells]
        return ns

    def check(self, question: str | None = None, replace: dict[str, str] | None = None) -> str:
        """What check(question) prints for the notebook with ``replace`` applied."""
        from coursekit.selfcheck import check

        ns = self.namespace(replace)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            check(question, assignment=self.name, namespace=ns)
        return out.getvalue()
