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
* an address-space limit, so a 10 GB allocation fails inside the cell.

Without bubblewrap only the resource limit applies, and ``grade`` prints a
warning saying so.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

KERNEL_NAME = "course-sandbox"
DEFAULT_MEMORY_MB = 8192


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


def install_kernelspec(jupyter_dir: Path, hide: list[Path], memory_mb: int = DEFAULT_MEMORY_MB,
                       use_bwrap: bool = True, threads: int | None = None) -> Path:
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
    argv += ["--", "{connection_file}"]
    # interrupts travel as messages: a signal to bubblewrap would not reach the kernel inside
    spec = {"argv": argv, "display_name": "Python 3 (course sandbox)", "language": "python",
            "interrupt_mode": "message", "metadata": {"debugger": False}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return spec_dir


def _bwrap_command(connection_file: Path, hide: list[Path], kernel_cmd: list[str]) -> list[str]:
    cwd = Path.cwd()
    cmd = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
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
    parser.add_argument("connection_file", type=Path)
    # whatever follows (e.g. --HistoryManager.hist_file=:memory:) is for the kernel
    args, kernel_args = parser.parse_known_args(argv)

    limit = args.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # inherited across exec
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", str(args.connection_file), *kernel_args]
    if args.no_bwrap:
        os.execv(sys.executable, kernel_cmd)
    cmd = _bwrap_command(args.connection_file, args.hide, kernel_cmd)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
