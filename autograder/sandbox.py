"""Run student kernels where they cannot read what they must not, nor reach the network.

nbgrader starts the kernel named ``course-sandbox``, whose command is this
module.  It starts the real IPython kernel inside bubblewrap (Debian package
``bubblewrap``) when that works on the machine:

* the whole file system read-only, with ``solutions/``, the repository's
  ``.git``, the grading folder (gradebook, other students' work) and the
  instructor's home hidden behind empty tmpfs mounts;
* the kernel's own working folder (one student's autograded copy) and the
  connection folder writable; ``/tmp`` private;
* no network (a private network namespace; the kernel talks to nbgrader over
  IPC sockets in the connection folder), its own PID namespace;
* an address-space limit, so a 10 GB allocation fails inside the cell;
* with ``--gpu``, the NVIDIA driver's device nodes (``/dev/nvidia*``) bound into
  the sandbox's ``/dev``, so torch finds the GPU.  CUDA reserves far more address
  space than it uses, so the memory limit then caps the data segment
  (``RLIMIT_DATA``: heap and private writable mappings, where a 10 GB tensor
  lives) instead.  ``grade`` passes ``--gpu`` only after ``gpu_works_in_sandbox``
  saw CUDA work that way on this machine.

Without bubblewrap only the resource limit applies, and ``grade`` prints a
warning saying so.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import resource
import shutil
import subprocess
import sys
from pathlib import Path

KERNEL_NAME = "course-sandbox"
DEFAULT_MEMORY_MB = 8192
DEV = Path("/dev")

# what --probe runs in place of the kernel: the limits and devices a kernel would get
PROBE = """
import json, os, resource
limits = {name: resource.getrlimit(getattr(resource, 'RLIMIT_' + name))[0] for name in ('AS', 'DATA')}
nodes = sorted(n for n in os.listdir('/dev') if n.startswith('nvidia'))
cuda = False
if nodes:
    try:
        import torch
        cuda = torch.cuda.is_available() and torch.ones(2, device='cuda').sum().item() == 2.0
    except Exception:
        cuda = False
print(json.dumps({'limits': limits, 'nvidia_nodes': nodes, 'cuda': cuda}))
"""


def bwrap_works() -> bool:
    """True when bubblewrap is installed and allowed to create namespaces here."""
    exe = shutil.which("bwrap")
    if not exe:
        return False
    try:
        proc = subprocess.run([exe, "--ro-bind", "/", "/", "--unshare-net", "--dev", "/dev", "true"],
                              capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def gpu_nodes() -> list[Path]:
    """The NVIDIA driver's device nodes (one per GPU, the control and UVM devices, the
    capabilities folder): what CUDA opens."""
    return sorted(DEV.glob("nvidia*")) if DEV.is_dir() else []


def probe(memory_mb: int = DEFAULT_MEMORY_MB, gpu: bool = False, use_bwrap: bool = True) -> dict:
    """Run PROBE exactly as a kernel would run (same sandbox, same limits) and return
    what it saw: {"limits": {"AS": .., "DATA": ..}, "nvidia_nodes": [...], "cuda": bool}."""
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as tmp:
        argv = [sys.executable, "-m", "autograder.sandbox", f"--memory-mb={memory_mb}", "--probe",
                *(["--gpu"] if gpu else []),
                *([] if use_bwrap else ["--no-bwrap"]), str(Path(tmp) / "probe.json")]
        proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=300)
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


def install_kernelspec(jupyter_dir: Path, hide: list[Path], memory_mb: int = DEFAULT_MEMORY_MB,
                       use_bwrap: bool = True, threads: int | None = None, gpu: bool = False) -> Path:
    """Write ``<jupyter_dir>/kernels/course-sandbox/kernel.json``; put ``jupyter_dir`` on
    JUPYTER_PATH to make it visible.  Returns the spec folder."""
    spec_dir = Path(jupyter_dir) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "autograder.sandbox", f"--memory-mb={memory_mb}"]
    argv += [f"--hide={p}" for p in hide]
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


def _bwrap_command(connection_file: Path, hide: list[Path], kernel_cmd: list[str],
                   gpu: bool = False) -> list[str]:
    cwd = Path.cwd()
    cmd = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev"]
    for node in gpu_nodes() if gpu else []:  # on top of the fresh /dev, which has no GPU
        cmd += ["--dev-bind", str(node), f"/dev/{node.name}"]
    cmd += ["--proc", "/proc",
           "--tmpfs", "/tmp", "--unshare-net", "--unshare-pid", "--die-with-parent",
           "--setenv", "HOME", "/tmp", "--setenv", "MPLCONFIGDIR", "/tmp/mpl",
           # the parent's PID is invisible in the new PID namespace; --die-with-parent does that job
           "--unsetenv", "JPY_PARENT_PID"]
    home = Path.home()
    # /tmp and the instructor's home are replaced by empty folders; put back, read-only,
    # what the kernel needs to run: Python (pyenv, the venv), the course checkout (coursekit
    # is installed from it), and the model caches.  Hidden folders are mounted after these.
    course_root = Path(__file__).resolve().parent.parent
    cache = Path(os.environ.get("COURSE_CACHE_DIR", home / ".cache" / "transformers-course"))
    keep_ro = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent,
               course_root, cache, home / ".cache" / "huggingface"}
    cmd += ["--tmpfs", str(home)]
    for p in sorted(keep_ro):
        p = p.resolve()
        if p.exists() and (p.is_relative_to(home) or p.is_relative_to("/tmp")):
            cmd += ["--ro-bind", str(p), str(p)]
    for p in hide:
        if Path(p).exists():
            cmd += ["--tmpfs", str(p)]
    # what the kernel may write: its own folder and the connection folder
    conn_dir = connection_file.resolve().parent
    cmd += ["--bind", str(cwd), str(cwd), "--bind", str(conn_dir), str(conn_dir), "--chdir", str(cwd)]
    return cmd + ["--"] + kernel_cmd


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autograder.sandbox")
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB)
    parser.add_argument("--hide", action="append", default=[], type=Path)
    parser.add_argument("--no-bwrap", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--gpu", action="store_true", help="bind the NVIDIA device nodes into the sandbox")
    parser.add_argument("--probe", action="store_true", help="run the probe instead of a kernel")
    parser.add_argument("connection_file", type=Path)
    # whatever follows (e.g. --HistoryManager.hist_file=:memory:) is for the kernel
    args, kernel_args = parser.parse_known_args(argv)

    limit = args.memory_mb * 1024 * 1024
    # inherited across exec; see the module docstring for why the GPU gets RLIMIT_DATA
    resource.setrlimit(resource.RLIMIT_DATA if args.gpu else resource.RLIMIT_AS, (limit, limit))
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", str(args.connection_file), *kernel_args]
    if args.probe:
        kernel_cmd = [sys.executable, "-c", PROBE]
    if args.no_bwrap:
        os.execv(sys.executable, kernel_cmd)
    cmd = _bwrap_command(args.connection_file, args.hide, kernel_cmd, gpu=args.gpu)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
