"""coursekit: the plumbing shared by the book pages and the assignments.

Device choice, seeding, environment report, locating the course checkout.
Data and model loading live in ``coursekit.data`` and ``coursekit.models``;
plotting and glue helpers for book pages in ``coursekit.book``.

Reference solutions of graded functions never live here: students import this
package, so anything in it is visible to them.
"""
from __future__ import annotations

import os
import platform
import random
import sys
from pathlib import Path

# Imports inside functions: torch and numpy are imported by the functions that seed or place tensors (an
# assignment without torch never loads them); selfcheck is imported in setup_notebook because it imports
# this package (an import cycle).

__all__ = ["REPO", "BRANCH", "REPO_URL", "get_device", "seed_everything", "setup_notebook",
           "repo_root", "on_colab"]

# The GitHub repository students get the course from (course.yml's student repository;
# `python -m autograder release` writes coursekit/_course.py, and the notebooks' setup cells,
# Colab links and the book's launch buttons, from the same file).
from ._course import BRANCH, REPO
from . import envvars
from .runtime import install as _neutralise_known_clashes

# Known clashes between the packages of the runtime (Colab's), neutralised in this process
# before any notebook imports the libraries concerned (coursekit/runtime.py says which).
_neutralise_known_clashes()

REPO_URL = f"https://github.com/{REPO}"


def on_colab() -> bool:
    """True inside a Google Colab runtime."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def repo_root() -> Path | None:
    """The course checkout this package was installed from (editable install or
    a clone on sys.path), or None when installed from git without a checkout."""
    here = Path(__file__).resolve().parent.parent
    if (here / "_config.yml").exists() and (here / "solutions").is_dir():
        return here
    for parent in [Path.cwd(), *Path.cwd().parents]:
        if (parent / "_config.yml").exists() and (parent / "coursekit").is_dir():
            return parent
    return None


def get_device(prefer: str | None = None):
    """The torch device to use: ``COURSE_DEVICE`` if set, else CUDA, MPS, CPU."""
    import torch

    choice = prefer or envvars.get("COURSE_DEVICE", "").strip().lower()
    if choice:
        return torch.device(choice)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch (all devices) so a run can be repeated."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy ships with torch installs
        pass
    import torch

    torch.manual_seed(seed)  # also seeds every CUDA device


def setup_notebook(seed: int = 0, assignment: str | None = None, quiet: bool = False):
    """Seed everything, pick the device and print what was found.

    ``assignment`` names the exercise this kernel works on, so that
    ``coursekit.selfcheck.check("q1")`` knows which visible tests to run.
    Returns the device; notebooks keep it as ``DEVICE`` and move tensors there.
    """
    import torch

    if assignment:
        from .selfcheck import use_assignment

        use_assignment(assignment)
    seed_everything(seed)
    device = get_device()
    if not quiet:
        where = "Colab" if on_colab() else platform.node() or "local"
        gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "none"
        print(f"python {platform.python_version()} | torch {torch.__version__} | "
              f"device {device} (GPU: {gpu}) | runtime {where} | seed {seed}")
    return device
