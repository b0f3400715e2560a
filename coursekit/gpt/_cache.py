"""Where the small GPT and its tokenizer are cached on disk, and how a file is written there."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no lock; two notebooks that train at once each train (as before)
    fcntl = None

from coursekit.models import course_cache_dir

# Bump when the model code, the tokenizer or the training loop changes in a way that
# changes the trained weights: cached models made by another version are not reused.
CODE_VERSION = 2


def cache_root(cache_dir=None, kind: str = "small-gpt") -> Path:
    """``cache_dir`` if given, else ``$COURSE_CACHE_DIR/<kind>`` (see coursekit.models)."""
    return Path(cache_dir) if cache_dir is not None else course_cache_dir() / kind


def write_text_atomically(path: Path, text: str) -> None:
    """Write beside the target and rename, so that a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=path.suffix, dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _lock(folder: Path):
    """The open lock file of the cache entry ``folder``, locked; None where no lock can be had
    (Windows, a read-only cache as in a grading sandbox, a file system without locks)."""
    if fcntl is None:
        return None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        handle = open(folder.parent / f".{folder.name}.lock", "a")
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # waits while another process builds this entry
    except OSError:  # e.g. some network mounts: go on unlocked
        handle.close()
        return None
    return handle


def load_or_build(folder: Path, load, build, retrain: bool = False):
    """``(load(), "cache")`` when the cache entry ``folder`` holds a model, else ``(build(),
    "trained")``: ``build`` trains and saves it. A second process that needs the same entry
    meanwhile (two notebooks, two test workers, the book's build beside a lab) waits for the
    first one's ``build`` under the entry's lock and then loads its copy instead of training
    it again; where no lock can be had, each builds, as before."""
    found = None if retrain else load()
    if found is not None:
        return found, "cache"
    handle = _lock(folder)
    try:
        found = None if retrain else load()
        return (found, "cache") if found is not None else (build(), "trained")
    finally:
        if handle is not None:
            handle.close()  # closing the file releases the lock
