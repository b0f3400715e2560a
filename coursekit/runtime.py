"""The runtime a notebook meets: known clashes between its packages, and how to tell them apart
from a mistake in the student's code.

Students run the course on Google Colab, in whatever versions Colab's image ships; the setup
cell adds only this package. Some pairs of Colab's packages break a course notebook although
each works on its own. Each clash below is neutralised in this process only, at the moment the
library concerned is imported, and only when the clash is really there (a behavioural test,
not a version list), so nothing is installed, no runtime restart is needed, and a runtime that
no longer has the clash is left alone:

* **datasets ≤ 4.8.3 with torchvision ≥ 0.26.** Reading a row of a torch-formatted dataset runs
  ``from torchvision.io import VideoReader`` whenever torchvision is imported, and torchvision
  0.26 removed ``VideoReader``: every row raises ImportError (Colab 2026-08: datasets 4.0,
  torchvision 0.26). Fix: datasets is told torchvision is not there (``TORCHVISION_AVAILABLE``),
  which only affects decoding video with torchvision, gone from torchvision anyway.
* **peft with a torchao older than it supports.** peft 0.20 *raises* ImportError from
  ``is_torchao_available()`` when torchao < 0.16 is installed, so ``get_peft_model`` fails on
  any model (Colab 2026-08: peft 0.20, torchao 0.10). Fix: peft is told torchao is not there,
  as it would be told had torchao not been installed; the course quantises nothing with it.

``install()`` runs when ``coursekit`` is imported (every notebook's setup cell imports it first,
and so does the grader's process). ``environment_problem()`` is what the self-check asks before
it says "your code raised": an ImportError (or a version refusal) raised inside an installed
library is the runtime's problem, not the student's.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import site
import sys
import sysconfig
from pathlib import Path

# Imports inside functions: torchvision is imported by the check it serves (the clash it neutralises);
# on_colab comes from the package, which imports this module (an import cycle); importlib.metadata
# (~17 ms) where a version is named: every process that imports coursekit imports this module,
# the grader's launcher of each student's kernel among them.

__all__ = ["install", "applied", "environment_problem"]

_applied: list[str] = []   # one line per clash neutralised in this process


def applied() -> list[str]:
    """What ``install`` neutralised so far in this process, one line each."""
    return list(_applied)


def _note(line: str) -> None:
    if line not in _applied:
        _applied.append(line)
        print(f"coursekit: {line}", file=sys.stderr)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


# ---------------------------------------------------------------------------------------
# The clashes
# ---------------------------------------------------------------------------------------

def _datasets_without_videoreader(config) -> None:
    """datasets.config has run: keep its torch formatter away from a torchvision without VideoReader."""
    if not getattr(config, "TORCHVISION_AVAILABLE", False):
        return
    try:
        from torchvision.io import VideoReader  # noqa: F401 - the name datasets imports per row
    except Exception:  # noqa: BLE001 - ImportError, or a torchvision that fails to import at all
        config.TORCHVISION_AVAILABLE = False
        _note(f"datasets {_version('datasets')} reads rows through torchvision.io.VideoReader, which "
              f"torchvision {_version('torchvision')} no longer has: datasets will not use torchvision here")


def _peft_ignoring_old_torchao(import_utils) -> None:
    """peft.import_utils has run: an unsupported torchao counts as no torchao (peft 0.20 and 0.21
    both raise instead)."""
    original = getattr(import_utils, "is_torchao_available", None)
    if original is None or getattr(original, "_coursekit", False):
        return
    answer: list[bool] = []

    def is_torchao_available() -> bool:
        if not answer:
            try:
                answer.append(bool(original()))
            except ImportError as exc:
                answer.append(False)
                _note(f"peft {_version('peft')} refuses torchao {_version('torchao')} ({exc}); "
                      "the course does not use torchao, so peft ignores it here")
        return answer[0]

    is_torchao_available._coursekit = True  # type: ignore[attr-defined]
    is_torchao_available.__doc__ = original.__doc__
    # modules of peft that imported the name before this ran keep their own reference: replace those too
    for name, module in list(sys.modules.items()):
        if (name == "peft" or name.startswith("peft.")) and getattr(module, "is_torchao_available", None) is original:
            module.is_torchao_available = is_torchao_available


FIXES = {"datasets.config": _datasets_without_videoreader,
         "peft.import_utils": _peft_ignoring_old_torchao}


# ---------------------------------------------------------------------------------------
# Running a fix right after its module is imported
# ---------------------------------------------------------------------------------------

class _Loader(importlib.abc.Loader):
    def __init__(self, loader, fix):
        self._loader, self._fix = loader, fix

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._fix(module)

    def __getattr__(self, name):  # get_resource_reader, get_source, ... of the real loader
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module of FIXES it asks the other finders, then runs the fix
    once the module has executed."""

    def find_spec(self, fullname, path=None, target=None):
        fix = FIXES.get(fullname)
        if fix is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fix)
                return spec
        return None


def install() -> None:
    """Neutralise the known clashes in this process: now for modules already imported, at
    import for the others. Calling it again changes nothing."""
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    for name, fix in FIXES.items():
        module = sys.modules.get(name)
        if module is not None:
            fix(module)


# ---------------------------------------------------------------------------------------
# Telling the runtime's problems from the student's
# ---------------------------------------------------------------------------------------

_VERSION_REFUSAL = re.compile(r"\bversions?\b|requires? \S+ ?[<>=]=?|incompatible", re.I)


def _library_dirs() -> list[str]:
    dirs = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib")}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except Exception:  # noqa: BLE001 - a stripped-down site module
        pass
    return sorted({os.path.realpath(d) for d in dirs if d})


def _installed_library(filename: str) -> str | None:
    """The top-level module of an installed library that ``filename`` belongs to, or None
    (the student's cells, this package, the standard library)."""
    path = os.path.realpath(filename)
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            top = parts[parts.index(marker) + 1] if parts.index(marker) + 1 < len(parts) else ""
            break
    else:
        top = next((Path(path[len(d):].lstrip(os.sep)).parts[0] for d in _library_dirs()
                    if path.startswith(d + os.sep)), "")
    top = top.removesuffix(".py")
    if not top or top in ("coursekit", "autograder") or top.startswith("_"):
        return None
    return top


def _distribution(module: str) -> str:
    from importlib.metadata import packages_distributions

    try:
        return (packages_distributions().get(module) or [module])[0]
    except Exception:  # noqa: BLE001 - broken metadata of some other package
        return module


def environment_problem(exc: BaseException) -> str | None:
    """A one-line message when ``exc`` comes from the runtime rather than the student's code:
    an ImportError, or an error refusing a version, raised inside an installed library. None
    for everything else (the student's own mistakes, including errors a library raises about
    the student's arguments)."""
    if not isinstance(exc, ImportError) and not (
            isinstance(exc, (RuntimeError, ValueError)) and _VERSION_REFUSAL.search(str(exc))):
        return None
    tb, library = exc.__traceback__, None
    while tb is not None:  # the innermost frame decides: where the error was raised
        library = _installed_library(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    if library is None:
        return None
    package = _distribution(library)
    other = ""
    missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    if missing and missing.split(".")[0] != library:
        other_pkg = _distribution(missing.split(".")[0])
        other = f" (with {other_pkg} {_version(other_pkg)})"
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 300:
        text = text[:297] + "..."
    from . import on_colab

    where = "your Colab runtime" if on_colab() else "this Python environment"
    return (f"{where} has an incompatible {package} {_version(package)}{other}, not a mistake in your code: "
            f"{text}. Fix: run `pip install -U {package}` in a new cell, then Runtime → Restart session and "
            "run the notebook again")
