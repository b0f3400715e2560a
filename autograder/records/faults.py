"""The faults a test may ask for at the named steps where the class record and its files are
written (``COURSE_FAULT=<step>:kill`` or ``<step>:enospc``): a kill with SIGKILL, or the error
of a full disk, exactly there.  Nothing happens when the variable is not set."""
from __future__ import annotations

import errno
import os
import signal

from coursekit import envvars

FAULT_ENV = "COURSE_FAULT"


def fault(step: str) -> None:
    """The fault a test asked for at ``step`` (``COURSE_FAULT=<step>:kill`` kills this process
    with SIGKILL there; ``<step>:enospc`` raises the OSError of a full disk); nothing otherwise."""
    want = envvars.get(FAULT_ENV)
    if not want:
        return
    name, _, what = want.rpartition(":")
    if name != step:
        return
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), step)
