"""Scratch folders of a grading run, and deleting what a kernel may have touched.

Kernels talk to the grader over UNIX sockets in a connection folder, and each grading process
runs a zygote with a socket of its own.  Socket paths must stay under about 100 bytes, so these
folders live in a short folder of the system's ``/tmp``, one per grading run
(``COURSE_SCRATCH``, made by ``grade``) or, for a process that grades on its own (a Dask
worker), one per process.  Each such folder names its owner's process id; a folder whose owner
is gone (a worker killed at its time limit, say) is removed by the next run, so nothing a
kernel or a killed worker made outlives the run that made it.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from coursekit import envvars

ENV = "COURSE_SCRATCH"          # the run's folder, handed to its worker processes
PREFIX = "course-grading-"
OWNER = "owner.pid"
_MINE: dict = {}


def remove_tree(path: str | os.PathLike) -> bool:
    """Delete ``path`` and everything below it, never following a link, whatever a kernel
    made there (trees thousands of folders deep, odd names, folders without permissions).
    Never raises; returns True when nothing is left."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        return True
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return not os.path.lexists(path)
    with contextlib.suppress(Exception):  # RecursionError on a deep tree, PermissionError, ...
        shutil.rmtree(path)
    if os.path.lexists(path):  # coreutils walk any depth without following links
        for cmd in (["chmod", "-R", "u+rwx", "--", path], ["rm", "-rf", "--one-file-system", "--", path]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(cmd, capture_output=True, timeout=600)
    return not os.path.lexists(path)


def short_tmp() -> str:
    """The system's temporary folder, when its path is short enough for the sockets below it
    (UNIX socket paths must stay under about 100 bytes), else ``/tmp``."""
    for base in (tempfile.gettempdir(), "/tmp"):
        if len(base) <= 40 and os.path.isdir(base) and os.access(base, os.W_OK):
            return base
    return tempfile.gettempdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove the scratch folders of this user whose owner process is gone."""
    removed = []
    base = Path(short_tmp())
    for folder in base.glob(PREFIX + "*"):
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / OWNER).read_text().strip())
        except (OSError, ValueError):
            continue
        if not _alive(pid) and remove_tree(folder):
            removed.append(str(folder))
    return removed


def new_folder(owner: int | None = None) -> Path:
    """A fresh scratch folder in the short ``/tmp``, owned by process ``owner`` (this one)."""
    remove_stale()
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=short_tmp()))
    (folder / OWNER).write_text(str(owner or os.getpid()))
    return folder


def process_folder() -> Path:
    """Where this process puts connection folders and its zygote: the run's folder
    (``COURSE_SCRATCH``) when one was handed down, else a folder of this process's own,
    removed when it exits (and by a later run when it was killed)."""
    given = envvars.get(ENV)
    if given and os.path.isdir(given):
        return Path(given)
    if "folder" not in _MINE or not _MINE["folder"].is_dir():
        _MINE["folder"] = new_folder()
        atexit.register(remove_tree, _MINE["folder"])
    return _MINE["folder"]


@contextlib.contextmanager
def run_folder():
    """The scratch folder of one grading run: made before its workers start, handed to them
    in ``COURSE_SCRATCH``, and removed with everything in it when the run ends, however it
    ends."""
    folder = new_folder()
    try:
        yield folder
    finally:
        remove_tree(folder)
