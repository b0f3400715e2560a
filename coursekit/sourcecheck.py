"""Read how a notebook's code is written: what a function or class can reach.

Some requirements cannot be judged from the values a function returns, e.g. "implement
the attention in the class; do not call the Q1/Q2 functions or torch's own attention" or
"compute the count by formula, without torch".  ``student.source`` gives a
:class:`SourceView` of the notebook's code (at grading time: the submitted cells, read by
the grader; in the notebook: the cells this kernel ran), and a test asks::

    assert not student.source.reaches("MultiHeadAttention", {"get_multihead_qkv", ...})

``reaches`` follows every name the definition uses to the notebook's other top-level
definitions (functions, classes, assignments such as ``f = get_multihead_qkv``, imports),
so calling through an alias or a helper is found.  Dynamic lookups (``eval``, ``exec``,
``globals()``, ``getattr`` with a computed name, ``__import__``, ...) cannot be followed;
they are reported as hits of their own.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

__all__ = ["SourceView", "DYNAMIC"]

# calls whose target cannot be read from the code
DYNAMIC = frozenset({"eval", "exec", "compile", "globals", "locals", "vars", "__import__",
                     "import_module", "getattribute", "__getattribute__", "__dict__"})


def _strip_magics(source: str) -> str:
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if parts:
        return "?." + ".".join(reversed(parts))
    return None


def _local_names(fn) -> frozenset:
    """Names local to a function or lambda: its parameters and what its body binds
    (not looking into nested functions and classes), minus ``global`` declarations."""
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    declared_global = set()
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Global):
            declared_global.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        todo.extend(ast.iter_child_nodes(node))
    return frozenset(names - declared_global)


@dataclass
class SourceView:
    """The code cells of a notebook, in order; see the module docstring."""

    cells: list[str]
    unreadable: list[int] = field(default_factory=list)  # cells that are not valid Python

    def __post_init__(self):
        self._defs: dict[str, list[ast.AST]] = {}
        self._imports: dict[str, str] = {}
        for i, src in enumerate(self.cells):
            try:
                tree = ast.parse(_strip_magics(src))
            except (SyntaxError, ValueError, RecursionError, MemoryError, TypeError):
                self.unreadable.append(i)
                continue
            for node in tree.body:
                self._collect(node)

    def _collect(self, node) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._defs.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for name in ast.walk(t):
                    if isinstance(name, ast.Name):
                        self._defs.setdefault(name.id, []).append(node)
        elif isinstance(node, ast.Import):
            for a in node.names:
                self._imports[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                self._imports[a.asname or a.name] = f"{node.module or ''}.{a.name}"
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            # definitions inside top-level blocks (if/try/with/for/while) count too
            for part in ("body", "orelse", "finalbody"):
                for child in getattr(node, part, None) or []:
                    self._collect(child)
            for handler in getattr(node, "handlers", None) or []:
                for child in handler.body:
                    self._collect(child)

    def defines(self, name: str) -> bool:
        """True when some cell defines ``name`` at the top level."""
        return name in self._defs

    def times_defined(self, name: str) -> int:
        """How many top-level statements of all cells bind ``name`` (a given helper: 1, its own cell; more when
        an answer cell defines it again, as a submission that replaces a helper the tests rely on does)."""
        return len(self._defs.get(name, ()))

    def definition(self, name: str):
        """The last top-level definition of ``name`` (an ``ast`` node), or None."""
        return self._defs[name][-1] if name in self._defs else None

    def called_in_loop(self, entry: str, names) -> list[str]:
        """The names of ``names`` (by their last part) that ``entry``'s own definition calls
        inside a ``for`` or ``while`` loop, e.g. an optimizer created once per epoch."""
        node = self.definition(entry)
        wanted = {n.split(".")[-1] for n in names}
        hits = set()
        for loop in (n for n in ast.walk(node) if isinstance(n, (ast.For, ast.While))) if node else []:
            for call in (c for c in ast.walk(loop) if isinstance(c, ast.Call)):
                dotted = _dotted(call.func) or ""
                if dotted.split(".")[-1] in wanted:
                    hits.add(dotted.split(".")[-1])
        return sorted(hits)

    def references(self, entry: str) -> set[str]:
        """Every name ``entry`` reaches: dotted names with imports resolved (``F.softmax`` ->
        ``torch.nn.functional.softmax``), the notebook's top-level names, and
        ``dynamic:<call>`` for lookups that cannot be followed."""
        seen_defs: set[str] = set()
        out: set[str] = set()
        todo = [entry]
        while todo:
            name = todo.pop()
            if name in seen_defs:
                continue
            seen_defs.add(name)
            for node in self._defs.get(name, []):
                for ref in self._names_in(node):
                    out.add(ref)
                    head = ref.split(".")[0]
                    if head in self._defs and head not in seen_defs:
                        todo.append(head)
        return out

    def _names_in(self, node) -> set[str]:
        """Global names (with their attribute chains) that ``node`` uses, scope-aware:
        parameters and names a function assigns are its own, not the notebook's."""
        found: set[str] = set()
        self._scan(node, frozenset(), found)
        return found

    def _scan(self, node, local: frozenset, found: set) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            # defaults, decorators and annotations belong to the enclosing scope
            for expr in [*args.defaults, *[d for d in args.kw_defaults if d is not None],
                         *getattr(node, "decorator_list", [])]:
                self._scan(expr, local, found)
            inner = local | _local_names(node)
            body = node.body if isinstance(node.body, list) else [node.body]
            for stmt in body:
                self._scan(stmt, inner, found)
            return
        if isinstance(node, ast.ClassDef):
            for expr in [*node.bases, *[k.value for k in node.keywords], *node.decorator_list]:
                self._scan(expr, local, found)
            for stmt in node.body:  # methods do not see the class body's names
                self._scan(stmt, local, found)
            return
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id not in local:
                found.add(self._resolve(node.id))
            return
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted and not dotted.startswith("?."):
                head, _, rest = dotted.partition(".")
                if head not in local:
                    found.add(self._resolve(head) + ("." + rest if rest else ""))
            found.add("?." + node.attr)
            if node.attr in ("__dict__", "__getattribute__", "__globals__", "__builtins__"):
                found.add(f"dynamic:{node.attr}")
            base = node
            while isinstance(base, ast.Attribute):
                base = base.value
            self._scan(base, local, found)  # e.g. the call in f(x).attr
            return
        if isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id not in local:
                if fn.id in DYNAMIC:
                    found.add(f"dynamic:{fn.id}")
                if fn.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
                    if isinstance(node.args[1], ast.Constant):
                        found.add("?." + str(node.args[1].value))
                    else:
                        found.add(f"dynamic:{fn.id}")
            if isinstance(fn, ast.Attribute) and fn.attr in ("import_module", "__import__"):
                found.add(f"dynamic:{fn.attr}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                mod = getattr(node, "module", None)
                found.add(f"{mod}.{a.name}" if mod else a.name)
                if mod in ("__main__", "builtins", "importlib"):
                    found.add(f"dynamic:import from {mod}")
        for child in ast.iter_child_nodes(node):
            self._scan(child, local, found)

    def _resolve(self, name: str) -> str:
        return self._imports.get(name, name)

    def reaches(self, entry: str, names) -> list[str]:
        """The names of ``names`` that ``entry`` reaches (by their last part: ``"MultiheadAttention"``
        matches ``nn.MultiheadAttention`` and ``torch.nn.MultiheadAttention``), plus every
        dynamic lookup it reaches.  Empty when ``entry`` uses none of them.  A missing
        definition is reported as ``"<entry> is not defined"``."""
        if entry not in self._defs:
            return [f"{entry} is not defined"]
        wanted = {n.split(".")[-1] for n in names}
        hits = set()
        for ref in self.references(entry):
            if ref.startswith("dynamic:"):
                hits.add(ref)
                continue
            last = ref.split(".")[-1]
            parts = set(ref.split("."))
            if last in wanted or (parts & wanted and not ref.startswith("?.")):
                hits.add(next(iter(sorted(parts & wanted))) if parts & wanted else last)
        return sorted(hits)
