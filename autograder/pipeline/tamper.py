"""Static flags for suspicious code, run on a submission before its code executes.

Grades do not depend on this scan: tests are judged outside the student's kernel
(``autograder.judge``), so rewiring torch, builtins or IPython inside the kernel cannot
change a verdict.  The scan only points the instructor at code that tried; the summary
shows its findings as flags.  It looks, from the source alone, for:

* assignments (``=``, ``setattr``, ``del``) to attributes of imported modules,
  e.g. ``torch.allclose = ...``, ``np.testing.assert_allclose = ...``,
  ``torch.Tensor.__eq__ = ...``, ``sys.modules[...] = ...``;
* rebinding a module name the tests use (``torch = ...``, ``F = ...``);
* redefining a helper that the assignment gives in a locked cell (tests use it);
* string literals pointing at instructor files (``solutions/``, the gradebook).

Locked cells are not scanned: nbgrader overwrites them from the source anyway.
"""
from __future__ import annotations

import ast
import re

from coursekit.sourcecheck import _dotted

PROTECTED_MODULES = {"torch", "numpy", "np", "F", "nn", "math", "builtins", "sys", "nbgrader",
                     "unittest", "pytest", "coursekit", "inspect", "types", "importlib", "random"}
# calls that reach into the kernel's own machinery (hooks, frames, history)
SUSPICIOUS_CALLS = {"get_ipython", "sys.displayhook", "sys.settrace", "sys.setprofile", "sys.addaudithook",
                    "sys._getframe", "inspect.stack", "inspect.currentframe", "inspect.getouterframes",
                    "linecache.getline", "linecache.getlines", "gc.get_objects", "gc.get_referrers"}
SECRET_PATH_RE = re.compile(r"solutions/|gradebook|/grading/|autograded/", re.I)


def _root_name(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _object_aliases(nodes, modules: set[str]) -> set[str]:
    """Names bound to something reached from a module (``T = torch.Tensor``): patching
    ``T.__float__`` patches torch.  ``nodes``: every node of a cell (``ast.walk``)."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.Assign) and _root_name(node.value) in modules:
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _module_aliases(nodes) -> set[str]:
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from torch import testing` binds a module-like object too
            names.update(a.asname or a.name for a in node.names)
    return names


def _given_names(released_nb) -> set[str]:
    """Functions, classes and names that locked cells of the assignment define."""
    names = set()
    for cell in released_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("locked") or meta.get("grade"):
            continue
        try:
            tree = ast.parse(cell.source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
    return names


def scan(nb, released_nb) -> list[str]:
    """Findings, one line each (empty when nothing suspicious was found)."""
    given = _given_names(released_nb)
    modules = set(PROTECTED_MODULES)
    code_cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        try:
            tree = ast.parse(_strip_magics(cell.source))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue  # unreadable code only costs the student that cell
        nodes = list(ast.walk(tree))  # walked once, read three times
        modules |= _module_aliases(nodes)
        modules |= _object_aliases(nodes, modules)
        if not meta.get("locked"):
            code_cells.append((meta.get("grade_id") or f"cell {len(code_cells) + 1}", nodes, cell.source))

    findings = []
    for where, nodes, source in code_cells:
        for node in nodes:
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                root = _root_name(t)
                if isinstance(t, (ast.Attribute, ast.Subscript)) and root in modules:
                    findings.append(f"{where}: assigns to {ast.unparse(t)} (changes a module the tests use)")
                elif isinstance(t, ast.Name) and t.id in modules and not _is_import_like(node):
                    findings.append(f"{where}: rebinds the module name {t.id}")
                elif isinstance(t, ast.Name) and t.id in given:
                    findings.append(f"{where}: overwrites the given helper {t.id}")
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in given \
                    and node.col_offset == 0:
                findings.append(f"{where}: redefines the given helper {node.name}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in {"setattr", "delattr"} and node.args \
                    and _root_name(node.args[0]) in modules:
                findings.append(f"{where}: {node.func.id}() on {ast.unparse(node.args[0])}")
            if isinstance(node, ast.Call):
                called = _dotted_name(node.func)
                if called in SUSPICIOUS_CALLS:
                    findings.append(f"{where}: calls {called}()")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and SECRET_PATH_RE.search(node.value):
                findings.append(f"{where}: refers to instructor files ({node.value[:60]!r})")
    return sorted(set(findings))


def _dotted_name(node) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    name = _dotted(node)
    return None if name is None or name.startswith("?.") else name


def _is_import_like(node) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom))


def _strip_magics(source: str) -> str:
    # IPython magics and shell escapes are not Python; blank them out
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
