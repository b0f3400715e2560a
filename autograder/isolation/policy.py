"""The sandbox policy of a student's kernel, written once, as data.

Two mechanisms build a kernel's sandbox from the same ``Policy``: bubblewrap
(``autograder.isolation.sandbox.bwrap_command``) for a kernel started on its own, and the
zygote's forked child (``autograder.isolation.zygote.build_sandbox``), which makes the same
mounts and takes the same limits with system calls.  What a kernel gets:

* namespaces of its own: user, mount, PID, network (no interface at all), IPC, UTS;
* read-only: the system (``SYSTEM``: /usr, the /bin and /lib links, a few /etc files) and
  ``readonly`` (Python, the virtual environment, coursekit, the course data, the model cache);
  nothing else of the host exists inside;
* ``tmpfs``: the only places it may fill, each a size-limited tmpfs that dies with it (/tmp,
  /dev/shm, its working folder);
* its connection folder on the host, seen at ``CONN_INSIDE``, where it may make its sockets and
  nothing else (Landlock, ``autograder.isolation.confine``);
* existing files it may write to without creating any: ``/dev`` (/dev/null, a GPU's device
  nodes) and ``/proc`` (its own);
* limits: memory (the address space; with the GPU the data segment), the largest file, no core
  dumps; every capability dropped and no new privileges;
* ``env``: a cleared environment with an allow-list of the grader's variables;
* with ``gpu``, the NVIDIA device nodes and /sys read-only.
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coursekit import envvars
from coursekit.models import course_cache_dir

CONN_INSIDE = "/.course-conn"   # where a kernel sees its connection folder (outside every tmpfs)
SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")  # bound, or linked as on the host
# /etc files the dynamic loader, locale, fonts and a few libraries read
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group", "hosts",
             "localtime", "fonts", "mime.types", "os-release")
NAMESPACES = ("user", "mount", "pid", "net", "ipc", "uts")
WRITE_EXISTING = ("/dev", "/proc")
# variables a kernel keeps from the grader's environment (everything else is cleared)
ENV_KEEP = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
            "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM")
ENV_PREFIXES = ("COURSE_",)
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)  # never passed on, whatever the prefix
ENV_DROP = ("COURSE_SANDBOX_WORKDIR", "COURSE_SANDBOX_COPY", "COURSE_SANDBOX_ZYGOTE", "COURSE_SCRATCH",
            "COURSE_GRADER_PID")
COURSE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Policy:
    """One kernel's sandbox (see the module docstring)."""

    workdir: str                     # its working folder (a tmpfs, the submission's copy in it)
    connection: str                  # its connection folder on the host
    memory_mb: int                   # its limits (``confine.limit_resources``), from the run's settings:
    file_mb: int                     # no value of their own here (the defaults are course.yml's schema)
    readonly: tuple = ()             # host folders it sees, read-only, at their own path
    tmpfs: tuple = ()                # (path, MiB) pairs: where it may write
    gpu: bool = False
    env: dict = field(default_factory=dict)
    namespaces: tuple = NAMESPACES
    write_existing: tuple = WRITE_EXISTING

    def landlock(self) -> dict:
        """The Landlock rules of ``autograder.isolation.confine`` for this policy."""
        return {"writable": [path for path, _ in self.tmpfs], "sockets": [CONN_INSIDE],
                "write_existing": list(self.write_existing)}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Policy":
        data = json.loads(text)
        data["tmpfs"] = tuple(tuple(x) for x in data.get("tmpfs", ()))
        for key in ("readonly", "namespaces", "write_existing"):
            data[key] = tuple(data.get(key, ()))
        return cls(**data)


def readable_paths() -> list[Path]:
    """Host folders a kernel needs, read-only: Python, the venv, the course package and
    data, the model cache (on top of the system's), and any folder listed in
    ``COURSE_SANDBOX_READONLY`` (for packages installed elsewhere)."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent,
             COURSE_ROOT / "coursekit", COURSE_ROOT / "data", course_cache_dir()}
    paths |= {Path(p) for p in envvars.get("COURSE_SANDBOX_READONLY", "").split(os.pathsep) if p.strip()}
    # package folders on the grader's path beyond its own prefix: a virtual environment layered on
    # another one (Colab's grader venv on the runtime's packages) imports from both
    paths |= {Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages")}
    out = []
    for p in sorted(paths):
        try:
            p = p.resolve()
        except OSError:
            continue
        if p.exists() and not p.is_relative_to("/usr") and p != Path("/"):
            out.append(p)
    # drop folders inside others already listed
    return [p for p in out if not any(p != q and p.is_relative_to(q) for q in out)]


def kernel_env(source: dict | None = None, threads: int | None = None) -> dict:
    """The environment a kernel gets: an allow-list of the grader's variables plus a
    private HOME and matplotlib folder in the sandbox's /tmp."""
    source = os.environ if source is None else source
    env = {k: v for k, v in source.items() if k in ENV_KEEP or (k.startswith(ENV_PREFIXES) and not SECRET.search(k))}
    env.update(HOME="/tmp", TMPDIR="/tmp", MPLCONFIGDIR="/tmp/mpl", LANG=env.get("LANG", "C.UTF-8"),
               PYTHONDONTWRITEBYTECODE="1", PYDEVD_DISABLE_FILE_VALIDATION="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    for var in ENV_DROP:
        env.pop(var, None)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def kernel_policy(workdir: Path, connection: Path, *, memory_mb: int, tmp_mb: int, work_mb: int, file_mb: int,
                  gpu: bool = False, threads: int | None = None, env: dict | None = None) -> Policy:
    """The policy of one kernel, from the run's limits."""
    return Policy(workdir=str(workdir), connection=str(connection),
                  readonly=tuple(str(p) for p in readable_paths()),
                  tmpfs=(("/tmp", tmp_mb), ("/dev/shm", tmp_mb), (str(workdir), work_mb)),
                  memory_mb=memory_mb, file_mb=file_mb, gpu=gpu, env=kernel_env(env, threads))
