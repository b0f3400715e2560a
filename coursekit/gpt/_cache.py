"""Where the small GPT and its tokenizer are cached on disk, and how a file is written there."""
from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def building(folder: Path):
    """Hold the lock of the cache entry ``folder`` while it is looked up and, if missing, trained
    and saved: a second process that needs the same model at the same time (two notebooks, two
    test workers, the book's build beside a lab) waits for the first and then reads its copy
    instead of training it again. A cache where no lock file can be made (read-only, as in a
    grading sandbox) is used without one."""
    handle = None
    if fcntl is not None:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            handle = open(folder.parent / f".{folder.name}.lock", "a")
        except OSError:
            handle = None
    if handle is None:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some network mounts): go on unlocked
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
