"""Run student kernels where they see only what a kernel needs.

The grader starts the kernel named ``course-sandbox``, whose command is this module.  It
starts the real IPython kernel inside bubblewrap (Debian package ``bubblewrap``):

* **an allow-list of read-only folders**, nothing else of the host: the operating
  system's programs and libraries (``/usr`` and the ``/bin``, ``/lib`` links), a few
  files of ``/etc`` the dynamic loader and fonts need, the Python installation and the
  virtual environment, the course package ``coursekit`` and the course data, and the
  model cache.  No home folder, no other checkout, no ``solutions/``, no ``/var``, no
  ``/run``, no host ``/tmp``: a file or a UNIX socket that is not listed does not exist
  inside;
* **a private working folder** (a size-limited tmpfs holding a copy of the submission)
  and a size-limited ``/tmp``: what the kernel writes stays in memory the grader never
  reads, and dies with the sandbox;
* the kernel's connection folder (its ZeroMQ IPC sockets) is the only host folder it may
  write to; no network at all (a private network namespace), its own PID, IPC and UTS
  namespaces, a new session (no terminal to inject keystrokes into);
* a cleared environment with an allow-list of variables (no instructor tokens);
* limits: memory (the address space; with the GPU the data segment, because CUDA
  reserves far more address space than it uses), the size of any file it writes, no core
  dumps;
* with ``--gpu``, the NVIDIA driver's device nodes (``/dev/nvidia*``) and ``/sys`` read-only,
  so torch finds the GPU.  ``grade`` passes ``--gpu`` only after ``gpu_works_in_sandbox``
  saw CUDA work that way on this machine.

Without bubblewrap only the resource limits apply, and ``grade`` prints a warning.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KERNEL_NAME = "course-sandbox"
DEFAULT_MEMORY_MB = 8192
DEFAULT_TMP_MB = 512     # /tmp inside the sandbox (RAM)
DEFAULT_WORK_MB = 512    # the kernel's working folder (RAM)
DEFAULT_FILE_MB = 512    # the largest file the kernel may write
DEV = Path("/dev")
ZYGOTE_SCRIPT = "/course-zygote.py"  # where autograder/zygote.py is inside the zygote's sandbox
CONFINE_SCRIPT = "/course_confine.py"  # autograder/confine.py inside every sandbox (Landlock rules)
CONN_INSIDE = "/.course-conn"        # where a kernel sees its connection folder (never below /tmp)
COURSE_ROOT = Path(__file__).resolve().parents[2]

# /etc files the dynamic loader, locale, fonts and a few libraries read
ETC_FILES = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group", "hosts",
             "localtime", "fonts", "mime.types", "os-release"]
# variables the kernel keeps from the grader's environment (everything else is cleared)
ENV_KEEP = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
            "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM")
ENV_PREFIXES = ("COURSE_",)

# what --probe runs in place of the kernel: the limits, devices and files a kernel gets
PROBE = """
import json, os, resource
limits = {name: resource.getrlimit(getattr(resource, 'RLIMIT_' + name))[0] for name in ('AS', 'DATA', 'FSIZE')}
nodes = sorted(n for n in os.listdir('/dev') if n.startswith('nvidia'))
cuda = False
if nodes:
    try:
        import torch
        cuda = torch.cuda.is_available() and torch.ones(2, device='cuda').sum().item() == 2.0
    except Exception:
        cuda = False
import torch  # the kernel's first import: it must work inside
try:  # the connection folder takes sockets only (autograder.isolation.confine)
    open('/.course-conn/probe-file', 'w').close()
    confined = False
except OSError:
    confined = True
print(json.dumps({'limits': limits, 'nvidia_nodes': nodes, 'cuda': cuda, 'cwd': os.getcwd(),
                  'torch': torch.__version__, 'home': os.environ.get('HOME'), 'confined': confined}))
"""


def bwrap_works() -> bool:
    """True when bubblewrap is installed and allowed to create namespaces here."""
    exe = shutil.which("bwrap")
    if not exe:
        return False
    try:
        proc = subprocess.run([exe, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--dev", "/dev", "true"],
                              capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def gpu_nodes() -> list[Path]:
    """The NVIDIA driver's device nodes (one per GPU, the control and UVM devices, the
    capabilities folder): what CUDA opens."""
    return sorted(DEV.glob("nvidia*")) if DEV.is_dir() else []


def readable_paths() -> list[Path]:
    """Host folders a kernel needs, read-only: Python, the venv, the course package and
    data, the model cache (on top of /usr, the /bin and /lib links and a few /etc files),
    and any folder listed in ``COURSE_SANDBOX_READONLY`` (for packages installed elsewhere)."""
    from coursekit.models import course_cache_dir

    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent,
             COURSE_ROOT / "coursekit", COURSE_ROOT / "data", course_cache_dir()}
    paths |= {Path(p) for p in os.environ.get("COURSE_SANDBOX_READONLY", "").split(os.pathsep) if p.strip()}
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


def bwrap_command(kernel_cmd: list[str], *, workdir: Path | None, conn_dir: Path, gpu: bool = False,
                  tmp_mb: int = DEFAULT_TMP_MB, work_mb: int = DEFAULT_WORK_MB,
                  copy_fd: int | None = None, copy_name: str | None = None,
                  env: dict | None = None, zygote_base: Path | None = None,
                  zygote_rebind: list | None = None) -> list[str]:
    """The bubblewrap command line that runs ``kernel_cmd`` as described in the module
    docstring.  ``workdir`` becomes an empty tmpfs (``copy_fd`` is written into it as
    ``copy_name``); ``conn_dir`` is bound read-write.  For a zygote (``autograder.isolation.zygote``):
    no working folder, an empty mount point at ``zygote_base`` where each kernel's working
    folder will go, and the root and ``/dev`` read-only, so that nothing a kernel forked from
    it could write outlives that kernel.  ``zygote_rebind`` ([second place, folder] pairs)
    binds the read-only folders that live under /tmp a second time outside it: a kernel
    forked from the zygote covers /tmp with a fresh tmpfs and binds them back from there."""
    cmd = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--clearenv",
           "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            cmd += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            cmd += ["--ro-bind", str(top), str(top)]
    for name in ETC_FILES:
        cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # a zygote sees the host's /proc (it runs no student code): each kernel forked from it
    # mounts a /proc of its own PID namespace, which the kernel allows only where some /proc
    # is fully visible; bubblewrap's /proc has read-only parts bound over it
    cmd += ["--bind", "/proc", "/proc"] if zygote_base is not None else ["--proc", "/proc"]
    cmd += ["--dev", "/dev"]
    if zygote_base is None:  # a kernel: its /dev/shm is a size-limited tmpfs too
        cmd += ["--size", str(tmp_mb << 20), "--tmpfs", "/dev/shm"]
    if gpu:  # on top of the fresh /dev, which has no GPU
        for node in gpu_nodes():
            cmd += ["--dev-bind", str(node), f"/dev/{node.name}"]
        cmd += ["--ro-bind", "/sys", "/sys"]
    # the private /tmp first: the folders bound below may live under the host's /tmp
    cmd += ["--size", str(tmp_mb << 20), "--tmpfs", "/tmp"]
    for p in readable_paths():
        cmd += ["--ro-bind", str(p), str(p)]
    for second, folder in zygote_rebind or []:
        cmd += ["--ro-bind", str(folder), str(second)]
    if workdir is not None:
        cmd += ["--size", str(work_mb << 20), "--tmpfs", str(workdir)]
        if copy_fd is not None and copy_name:
            cmd += ["--file", str(copy_fd), str(workdir / copy_name)]
    if zygote_base is not None and not Path(zygote_base).is_relative_to("/tmp"):
        cmd += ["--dir", str(zygote_base)]
    # a kernel sees its connection folder at CONN_INSIDE, outside every folder it may fill, and
    # may only make sockets there (confine.py); the zygote keeps its own folder at its own path
    inside = str(conn_dir) if zygote_base is not None else CONN_INSIDE
    cmd += ["--bind", str(conn_dir), inside, "--chdir", str(workdir or "/")]
    cmd += ["--ro-bind", str(Path(__file__).with_name("confine.py")), CONFINE_SCRIPT]
    if zygote_base is not None:  # the zygote's code: one file, the grading package stays outside
        cmd += ["--ro-bind", str(Path(__file__).with_name("zygote.py")), ZYGOTE_SCRIPT,
                "--dir", CONN_INSIDE, "--remount-ro", "/dev", "--remount-ro", "/"]
    for key, value in sorted((env or {}).items()):
        cmd += ["--setenv", key, value]
    return cmd + ["--"] + kernel_cmd


def connection_inside(connection_file: Path) -> Path:
    """The kernel's connection file as the kernel sees it: the same ports and key, with its
    IPC sockets in CONN_INSIDE.  Written next to the grader's own (the grader connects to the
    same socket files through the host path)."""
    info = json.loads(Path(connection_file).read_text())
    if info.get("transport") == "ipc":
        info["ip"] = f"{CONN_INSIDE}/{Path(str(info.get('ip', 'k'))).name}"
    inside = Path(connection_file).with_name("inside.json")
    inside.write_text(json.dumps(info))
    return inside


def confined(command: list[str], workdir: Path | None) -> list[str]:
    """``command`` started under the Landlock rules of ``autograder.isolation.confine``: it may fill
    only its tmpfs folders and make sockets in its connection folder."""
    from .confine import rules

    writable = ["/tmp", "/dev/shm"] + ([str(workdir)] if workdir is not None else [])
    return [sys.executable, "-I", CONFINE_SCRIPT, json.dumps(rules(CONN_INSIDE, writable)), "--", *command]


def kernel_env(source: dict | None = None) -> dict:
    """The environment a kernel gets: an allow-list of the grader's variables plus a
    private HOME and matplotlib folder in the sandbox's /tmp."""
    source = os.environ if source is None else source
    env = {k: v for k, v in source.items() if k in ENV_KEEP or k.startswith(ENV_PREFIXES)}
    env.update(HOME="/tmp", TMPDIR="/tmp", MPLCONFIGDIR="/tmp/mpl", LANG=env.get("LANG", "C.UTF-8"),
               PYTHONDONTWRITEBYTECODE="1", PYDEVD_DISABLE_FILE_VALIDATION="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    for var in ("COURSE_SANDBOX_WORKDIR", "COURSE_SANDBOX_COPY", "COURSE_SANDBOX_ZYGOTE", "COURSE_SCRATCH"):
        env.pop(var, None)
    return env


_PROBED: dict = {}  # what probe() saw, per arguments and environment, in this process


def probe(memory_mb: int = DEFAULT_MEMORY_MB, gpu: bool = False, use_bwrap: bool = True) -> dict:
    """Run PROBE exactly as a kernel would run (same sandbox, same limits) and return what
    it saw: {"limits": {...}, "nvidia_nodes": [...], "cuda": bool, ...}.  Raises
    RuntimeError with the last line of its error output when Python cannot run there.
    A success is remembered for this process, these arguments and this exact environment
    (a session that grades several times pays about 2 s once); a failure is tried again."""
    key = (memory_mb, gpu, use_bwrap, sys.executable, tuple(sorted(os.environ.items())))
    if key not in _PROBED:
        _PROBED[key] = _run_probe(memory_mb, gpu, use_bwrap)
    return json.loads(json.dumps(_PROBED[key]))  # a copy: the caller may change it


def _run_probe(memory_mb: int, gpu: bool, use_bwrap: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as tmp:
        conn = Path(tmp) / "conn"
        conn.mkdir()
        argv = [sys.executable, "-m", "autograder.isolation.sandbox", f"--memory-mb={memory_mb}", "--probe",
                *(["--gpu"] if gpu else []), *([] if use_bwrap else ["--no-bwrap"]), str(conn / "probe.json")]
        env = dict(os.environ, COURSE_SANDBOX_WORKDIR=str(Path(tmp) / "work"))
        (Path(tmp) / "work").mkdir()
        proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"sandbox probe failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gpu_works_in_sandbox(memory_mb: int = DEFAULT_MEMORY_MB) -> bool:
    """True when this machine has an NVIDIA GPU and a kernel in the sandbox, under the
    memory limit, can compute on it with torch."""
    if not gpu_nodes() or not bwrap_works():
        return False
    try:
        return bool(probe(memory_mb, gpu=True)["cuda"])
    except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired):
        return False


def install_kernelspec(jupyter_dir: Path, memory_mb: int = DEFAULT_MEMORY_MB, use_bwrap: bool = True,
                       threads: int | None = None, gpu: bool = False, tmp_mb: int = DEFAULT_TMP_MB,
                       work_mb: int = DEFAULT_WORK_MB, file_mb: int = DEFAULT_FILE_MB) -> Path:
    """Write ``<jupyter_dir>/kernels/course-sandbox/kernel.json``; put ``jupyter_dir`` on
    JUPYTER_PATH to make it visible.  Returns the spec folder."""
    spec_dir = Path(jupyter_dir) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "autograder.isolation.sandbox", f"--memory-mb={memory_mb}", f"--tmp-mb={tmp_mb}",
            f"--work-mb={work_mb}", f"--file-mb={file_mb}"]
    if not use_bwrap:
        argv.append("--no-bwrap")
    if threads:
        argv.append(f"--threads={threads}")
    if gpu:
        argv.append("--gpu")
    argv += ["--", "{connection_file}"]
    # interrupts travel as messages: a signal to bubblewrap would not reach the kernel inside
    spec = {"argv": argv, "display_name": "Python 3 (course sandbox)", "language": "python",
            "interrupt_mode": "message", "metadata": {"debugger": False}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return spec_dir


def _die_with_parent() -> None:
    """This launcher (and bubblewrap, which it becomes) is killed when the grading process that
    started it dies, and does not start anything when that process is already gone: a grading
    worker killed at its time limit leaves no kernel behind.  (bubblewrap's own
    ``--die-with-parent`` would tie the sandbox to this process only.)"""
    import ctypes
    import signal

    parent = os.environ.get("JPY_PARENT_PID")  # set by jupyter_client for the kernels it starts
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent and parent.isdigit() and os.getppid() != int(parent):
        sys.exit(1)  # the process that asked for this kernel is gone


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autograder.isolation.sandbox")
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB)
    parser.add_argument("--tmp-mb", type=int, default=DEFAULT_TMP_MB)
    parser.add_argument("--work-mb", type=int, default=DEFAULT_WORK_MB)
    parser.add_argument("--file-mb", type=int, default=DEFAULT_FILE_MB)
    parser.add_argument("--no-bwrap", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--gpu", action="store_true", help="bind the NVIDIA device nodes into the sandbox")
    parser.add_argument("--probe", action="store_true", help="run the probe instead of a kernel")
    parser.add_argument("--zygote", action="store_true",
                        help="run a zygote (autograder.isolation.zygote) listening on the socket given in place of "
                             "the connection file")
    parser.add_argument("--workbase", default="/tmp", help="zygote: the folder the kernels' working folders are in")
    parser.add_argument("--preload", action="append", default=[], help="zygote: a module to import once")
    parser.add_argument("connection_file", type=Path)
    # whatever follows (e.g. --HistoryManager.hist_file=:memory:) is for the kernel
    args, kernel_args = parser.parse_known_args(argv)

    _die_with_parent()
    limit = args.memory_mb << 20
    # inherited across exec; see the module docstring for why the GPU gets RLIMIT_DATA
    resource.setrlimit(resource.RLIMIT_DATA if args.gpu else resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_mb << 20, args.file_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    env = kernel_env()
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(args.threads)
    kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", str(args.connection_file), *kernel_args]
    if args.probe:
        kernel_cmd = [sys.executable, "-c", PROBE]
    if args.zygote:
        readable = [str(p) for p in readable_paths()]
        limits = {"memory_mb": args.memory_mb, "file_mb": args.file_mb, "tmp_mb": args.tmp_mb,
                  "work_mb": args.work_mb, "workbase": str(Path(args.workbase).resolve()), "readable": readable,
                  "rebind": [[f"/.course-ro/{i}", p] for i, p in enumerate(readable) if Path(p).is_relative_to("/tmp")]}
        zygote_cmd = [sys.executable, ZYGOTE_SCRIPT, str(args.connection_file),
                      "--limits", json.dumps(limits), *[f"--preload={m}" for m in args.preload]]
        cmd = bwrap_command(zygote_cmd, workdir=None, conn_dir=args.connection_file.resolve().parent,
                            tmp_mb=args.tmp_mb, env=env, zygote_base=Path(limits["workbase"]),
                            zygote_rebind=limits["rebind"])
        os.execvp(cmd[0], cmd)
    workdir = Path(os.environ.get("COURSE_SANDBOX_WORKDIR") or os.getcwd())
    copy = os.environ.get("COURSE_SANDBOX_COPY")
    zygote = os.environ.get("COURSE_SANDBOX_ZYGOTE")
    if zygote and not (args.no_bwrap or args.probe or args.gpu):
        from .zygote import launch_through

        request = {"connection_file": str(args.connection_file.resolve()), "workdir": str(workdir.resolve()),
                   "env": env, "kernel_args": kernel_args, "copy_name": Path(copy).name if copy else None}
        data = Path(copy).read_bytes() if copy and Path(copy).is_file() else b""
        code = launch_through(zygote, request, data)
        if code is not None:
            sys.exit(code)
    if args.no_bwrap:
        os.chdir(workdir)
        os.execve(sys.executable, kernel_cmd, {**env, "HOME": str(workdir), "TMPDIR": str(workdir),
                                                "MPLCONFIGDIR": str(workdir / ".mpl")})
    copy_fd = None
    if copy and Path(copy).is_file():
        copy_fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW)
        os.set_inheritable(copy_fd, True)
    conn_dir = args.connection_file.resolve().parent
    if not args.probe:  # the kernel reads its sockets' place inside the sandbox
        inside = connection_inside(args.connection_file)
        kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", f"{CONN_INSIDE}/{inside.name}", *kernel_args]
    kernel_cmd = confined(kernel_cmd, workdir)
    cmd = bwrap_command(kernel_cmd, workdir=workdir, conn_dir=conn_dir,
                        gpu=args.gpu, tmp_mb=args.tmp_mb, work_mb=args.work_mb, copy_fd=copy_fd,
                        copy_name=Path(copy).name if copy else None, env=env)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
