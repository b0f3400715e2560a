"""Where a kernel may write, enforced by the Linux kernel (Landlock), inside its sandbox.

The sandbox gives a kernel size-limited tmpfs mounts to write to (``/tmp``, ``/dev/shm``, its
working folder) and one folder of the host's disk: its connection folder, where the kernel must
create its ZeroMQ sockets.  A bind mount cannot limit what is written there, so before the
kernel starts this module asks Landlock to allow, from then on and for every process the kernel
starts:

* anything in the tmpfs folders (their size is the limit);
* in the connection folder, only creating and removing sockets: no file, folder or link, and
  no writing to the connection file;
* writing to existing files of ``/dev`` (``/dev/null``, a GPU's device nodes) and ``/proc``
  (the kernel's own), without creating anything there;
* nothing else (the rest is read-only anyway).

It also holds the kernel's resource limits (``limit_resources``: memory, the largest file, no
core dumps), which both kinds of sandbox take from here.

Self-contained (standard library and ``ctypes`` only): the zygote loads it inside its sandbox,
where the grading package is not, and a plain bubblewrap sandbox runs it as the kernel's first
command (``python course_confine.py RULES -- kernel command``).
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on x86-64 and arm64
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
O_PATH, O_CLOEXEC = 0o10000000, 0o2000000
PR_SET_NO_NEW_PRIVS = 38

# LANDLOCK_ACCESS_FS_*: the rights that change the file system (reading and executing stay free)
WRITE_FILE, REMOVE_DIR, REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << n for n in range(6, 13))
REFER, TRUNCATE = 1 << 13, 1 << 14      # Landlock ABI 2 and 3
MAKE_ANY = MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM


def limit_resources(policy: dict) -> None:
    """The kernel's resource limits, read from its policy (``autograder.isolation.policy.Policy``
    as data), for this process and all it starts (inherited across exec): ``memory_mb`` of address
    space (with ``gpu``, of data segment instead: CUDA reserves far more address space than it
    uses), files of at most ``file_mb``, no core dumps.  Both kinds of sandbox set them here."""
    memory, largest_file = policy["memory_mb"] << 20, policy["file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_DATA if policy.get("gpu") else resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (largest_file, largest_file))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def rules(conn_dir: str, writable: list[str]) -> dict:
    """The policy for one kernel, as data: folders it may fill (each a size-limited tmpfs), its
    connection folder (sockets only), and the trees whose existing files it may write to."""
    return {"writable": list(writable), "sockets": [conn_dir], "write_existing": ["/dev", "/proc"]}


def abi() -> int:
    """The Landlock ABI version of the running Linux kernel (0: none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, int(version))


def apply(policy: dict) -> int:
    """Restrict this process and everything it starts to ``policy`` (``rules``).  Returns the
    Landlock ABI used; raises OSError when Landlock is not available or a rule cannot be set."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = abi()
    if version < 1:
        raise OSError("Landlock is not available in this Linux kernel")
    write = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_ANY
    write |= (REFER if version >= 2 else 0) | (TRUNCATE if version >= 3 else 0)
    attr = _RulesetAttr(write)
    ruleset = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        grants = [(p, write) for p in policy.get("writable", [])]
        grants += [(p, MAKE_SOCK | REMOVE_FILE) for p in policy.get("sockets", [])]
        grants += [(p, WRITE_FILE | (TRUNCATE if version >= 3 else 0)) for p in policy.get("write_existing", [])]
        for path, allowed in grants:
            if not os.path.isdir(path):
                continue
            fd = os.open(path, O_PATH | O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(allowed, fd)
                if libc.syscall(SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "no_new_privs")
        if libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return version


def main(argv: list[str]) -> None:
    """``course_confine.py RULES_JSON -- COMMAND...``: apply the rules, then become COMMAND.
    Without Landlock the command still runs (the sandbox's other walls stand) and one line on
    stderr says so; the grader's sandbox probe reports it before grading."""
    cut = argv.index("--")
    policy, command = json.loads(argv[0]), argv[cut + 1:]
    try:
        apply(policy)
    except OSError as exc:
        print(f"course sandbox: no Landlock ({exc}); the connection folder is not write-protected",
              file=sys.stderr, flush=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
