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
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from coursekit import envvars

from autograder.course import schema
from autograder.course.errors import GradingError
from autograder.course.settings import GradingSettings

from .confine import limit_resources
from .policy import CONN_INSIDE, ETC_FILES, SYSTEM_DIRS, Policy, kernel_policy
from .zygote import launch_through

# Imports inside functions: the `import` lines inside PROBE are the probe's own code (it runs in the
# sandbox), not imports of this module.

KERNEL_NAME = "course-sandbox"
DEV = Path("/dev")
ZYGOTE_SCRIPT = "/course-zygote.py"    # autograder/isolation/zygote.py inside the zygote's sandbox
CONFINE_SCRIPT = "/course_confine.py"  # autograder/isolation/confine.py inside every sandbox (Landlock)

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


def bwrap_command(command: list[str], policy: Policy, *, copy_fd: int | None = None, copy_name: str | None = None,
                  zygote: dict | None = None) -> list[str]:
    """The bubblewrap command line that runs ``command`` in the sandbox ``policy`` describes
    (``copy_fd`` is written into the working folder as ``copy_name``).  For a zygote
    (``autograder.isolation.zygote``: ``zygote`` holds its ``workbase`` and ``rebind``): the host's
    /proc (it runs no student code; each forked kernel mounts its own), no working folder but an
    empty mount point at ``workbase`` where each kernel's will go, its own socket folder at its own
    path, and the root and /dev read-only, so that nothing a kernel forked from it could write
    outlives that kernel.  ``rebind`` ([second place, folder] pairs) binds the read-only folders
    that live under /tmp a second time outside it: a forked kernel covers /tmp with a fresh tmpfs
    and binds them back from there."""
    ns = {"net": "--unshare-net", "pid": "--unshare-pid", "ipc": "--unshare-ipc", "uts": "--unshare-uts"}
    cmd = ["bwrap", *[ns[n] for n in policy.namespaces if n in ns], "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--clearenv", "--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        top = Path("/") / name
        if top.is_symlink():
            cmd += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            cmd += ["--ro-bind", str(top), str(top)]
    for name in ETC_FILES:
        cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    cmd += ["--bind", "/proc", "/proc"] if zygote else ["--proc", "/proc"]
    cmd += ["--dev", "/dev"]
    if policy.gpu:  # on top of the fresh /dev, which has no GPU
        for node in gpu_nodes():
            cmd += ["--dev-bind", str(node), f"/dev/{node.name}"]
        cmd += ["--ro-bind", "/sys", "/sys"]
    tmpfs = dict(policy.tmpfs)
    # the private /tmp first: the folders bound below may live under the host's /tmp
    cmd += ["--size", str(tmpfs.get("/tmp", 64) << 20), "--tmpfs", "/tmp"]
    for path in policy.readonly:
        cmd += ["--ro-bind", path, path]
    for second, folder in (zygote or {}).get("rebind", []):
        cmd += ["--ro-bind", str(folder), str(second)]
    if zygote:
        base = Path(zygote["workbase"])
        if not base.is_relative_to("/tmp"):
            cmd += ["--dir", str(base)]
        cmd += ["--bind", policy.connection, policy.connection, "--chdir", "/",
                "--ro-bind", str(Path(__file__).with_name("zygote.py")), ZYGOTE_SCRIPT]
    else:
        for path, mb in policy.tmpfs:
            if path != "/tmp":
                cmd += ["--size", str(mb << 20), "--tmpfs", path]
        if copy_fd is not None and copy_name:
            cmd += ["--file", str(copy_fd), str(Path(policy.workdir) / copy_name)]
        cmd += ["--bind", policy.connection, CONN_INSIDE, "--chdir", policy.workdir]
    cmd += ["--ro-bind", str(Path(__file__).with_name("confine.py")), CONFINE_SCRIPT]
    if zygote:
        cmd += ["--dir", CONN_INSIDE, "--remount-ro", "/dev", "--remount-ro", "/"]
    for key, value in sorted(policy.env.items()):
        cmd += ["--setenv", key, value]
    return cmd + ["--"] + command


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


def confined(command: list[str], policy: Policy) -> list[str]:
    """``command`` started under the policy's Landlock rules (``autograder.isolation.confine``):
    it may fill only its tmpfs folders and make sockets in its connection folder."""
    return [sys.executable, "-I", CONFINE_SCRIPT, json.dumps(policy.landlock()), "--", *command]


def set_limits(policy: Policy) -> None:
    """The policy's resource limits, for this process and all it starts (``confine.limit_resources``,
    which the zygote's kernels get theirs from too)."""
    limit_resources(asdict(policy))


@dataclass
class SandboxInfo:
    """How the kernels of a run are isolated, once checked where they run."""

    bwrap: bool
    gpu: bool

    @property
    def device(self) -> str:
        return "cuda" if self.gpu else "cpu"


# what an unsandboxed kernel can do, said in every such warning
UNSANDBOXED = "it can read files and reach the network; only the resource limits apply."


def check(mode: str, memory_mb: int) -> tuple[SandboxInfo, list[str]]:
    """Decide how kernels run on this machine (``mode``: auto, on, off) and prove Python and
    torch run that way, before any student code.  Raises GradingError with one line."""
    warnings = []
    use_bwrap = mode != "off" and bwrap_works()
    if mode == "on" and not use_bwrap:
        raise GradingError("the sandbox was required (--sandbox on) but bubblewrap does not work here; "
                           "install it with: apt-get install bubblewrap")
    if not use_bwrap:
        warnings.append("WARNING: student code runs WITHOUT a sandbox (bubblewrap " +
                        ("disabled" if mode == "off" else "not available: apt-get install bubblewrap") +
                        "): " + UNSANDBOXED)
    try:
        seen = probe(memory_mb, use_bwrap=use_bwrap)
    except Exception as exc:  # noqa: BLE001 - any failure of the self-test stops the run
        raise GradingError(f"the grading sandbox cannot run Python ({exc}); no submission was graded. "
                           "Check `python -m autograder.isolation.sandbox --probe` or grade with --sandbox off") from None
    if not seen.get("torch"):
        raise GradingError("the grading sandbox cannot import torch; no submission was graded")
    if use_bwrap and not seen.get("confined"):
        warnings.append("NOTE: this Linux kernel has no Landlock: a kernel's connection folder (on the host's "
                        "disk) is not write-protected; its file-size limit still applies.")
    gpu = use_bwrap and gpu_works_in_sandbox(memory_mb)
    if use_bwrap and gpu_nodes() and not gpu:
        warnings.append("NOTE: this machine has an NVIDIA GPU, but CUDA did not work inside the "
                        "sandbox: student code runs on the CPU (use --sandbox off to give it the GPU).")
    if not use_bwrap and gpu_nodes():
        import torch

        gpu = torch.cuda.is_available()
    return SandboxInfo(use_bwrap, gpu), warnings


_PROBED: dict = {}  # what probe() saw, per arguments and environment, in this process


def probe(memory_mb: int = schema.BY_NAME["memory_mb"].default, gpu: bool = False, use_bwrap: bool = True) -> dict:
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


def gpu_works_in_sandbox(memory_mb: int = schema.BY_NAME["memory_mb"].default) -> bool:
    """True when this machine has an NVIDIA GPU and a kernel in the sandbox, under the
    memory limit, can compute on it with torch."""
    if not gpu_nodes() or not bwrap_works():
        return False
    try:
        return bool(probe(memory_mb, gpu=True)["cuda"])
    except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired):
        return False


def install_kernelspec(jupyter_dir: Path, settings: GradingSettings, threads: int | None = None) -> Path:
    """Write ``<jupyter_dir>/kernels/course-sandbox/kernel.json`` for the run's ``settings``
    (limits, bubblewrap or not, the GPU); put ``jupyter_dir`` on JUPYTER_PATH to make it
    visible.  Returns the spec folder."""
    spec_dir = Path(jupyter_dir) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "autograder.isolation.sandbox", *schema.kernel_argv(settings)]
    if not settings.bwrap:
        argv.append("--no-bwrap")
    if threads:
        argv.append(f"--threads={threads}")
    if settings.gpu:
        argv.append("--gpu")
    argv += ["--", "{connection_file}"]
    # interrupts travel as messages: a signal to bubblewrap would not reach the kernel inside
    spec = {"argv": argv, "display_name": "Python 3 (course sandbox)", "language": "python",
            "interrupt_mode": "message", "metadata": {"debugger": False}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return spec_dir


def die_with_parent(parent_env: str = "JPY_PARENT_PID") -> None:
    """This process (and what it becomes by exec: bubblewrap, for a kernel's launcher) is killed
    when the process that started it dies, and does not start anything when that process is
    already gone (its pid is in ``parent_env``): a grading worker killed at its time limit leaves
    no kernel behind, and a killed ``grade`` no worker.  (bubblewrap's own ``--die-with-parent``
    would tie the sandbox to this process only.)"""
    parent = os.environ.get(parent_env) if parent_env else None  # JPY_PARENT_PID: jupyter_client's
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent and parent.isdigit() and os.getppid() != int(parent):
        sys.exit(1)  # the process that asked for this kernel is gone


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autograder.isolation.sandbox")
    for s in schema.KERNEL:  # the kernel's limits (install_kernelspec writes them from the run's settings)
        parser.add_argument(s.flag, dest=s.name, type=s.type, default=s.default, help=s.help)
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

    # a kernel's launcher is started by jupyter_client, which names the process it belongs to;
    # a probe or a zygote is started by the grader directly (and may inherit an outer Jupyter's)
    die_with_parent("JPY_PARENT_PID" if not (args.probe or args.zygote) else "")
    conn_dir = args.connection_file.resolve().parent
    workdir = Path(envvars.get("COURSE_SANDBOX_WORKDIR") or os.getcwd()).resolve()
    policy = kernel_policy(workdir, conn_dir, memory_mb=args.memory_mb, tmp_mb=args.tmp_mb, work_mb=args.work_mb,
                           file_mb=args.file_mb, gpu=args.gpu, threads=args.threads)
    set_limits(policy)
    if args.zygote:  # one zygote per grading process: the kernels' sandboxes are made by its children
        readable = list(policy.readonly)
        setup = {"workbase": str(Path(args.workbase).resolve()), "readable": readable,
                 "rebind": [[f"/.course-ro/{i}", p] for i, p in enumerate(readable) if Path(p).is_relative_to("/tmp")]}
        own = Policy(workdir="/", connection=str(conn_dir), readonly=policy.readonly,
                     tmpfs=(("/tmp", args.tmp_mb),), memory_mb=args.memory_mb, file_mb=args.file_mb, env=policy.env)
        cmd = bwrap_command([sys.executable, ZYGOTE_SCRIPT, str(args.connection_file), "--setup", json.dumps(setup),
                             *[f"--preload={m}" for m in args.preload]], own, zygote=setup)
        os.execvp(cmd[0], cmd)
    kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", str(args.connection_file), *kernel_args]
    if args.probe:
        kernel_cmd = [sys.executable, "-c", PROBE]
    copy = envvars.get("COURSE_SANDBOX_COPY")
    zygote = envvars.get("COURSE_SANDBOX_ZYGOTE")
    if zygote and not (args.no_bwrap or args.probe or args.gpu):
        request = {"connection_file": str(args.connection_file.resolve()), "policy": policy.to_json(),
                   "kernel_args": kernel_args, "copy_name": Path(copy).name if copy else None}
        data = Path(copy).read_bytes() if copy and Path(copy).is_file() else b""
        code = launch_through(zygote, request, data)
        if code is not None:
            sys.exit(code)
    if args.no_bwrap:
        os.chdir(workdir)
        os.execve(sys.executable, kernel_cmd, {**policy.env, "HOME": str(workdir), "TMPDIR": str(workdir),
                                                "MPLCONFIGDIR": str(workdir / ".mpl")})
    copy_fd = None
    if copy and Path(copy).is_file():
        copy_fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW)
        os.set_inheritable(copy_fd, True)
    if not args.probe:  # the kernel reads its sockets' place inside the sandbox
        inside = connection_inside(args.connection_file)
        kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", f"{CONN_INSIDE}/{inside.name}", *kernel_args]
    cmd = bwrap_command(confined(kernel_cmd, policy), policy, copy_fd=copy_fd,
                        copy_name=Path(copy).name if copy else None)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
