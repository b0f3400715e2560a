"""Sandboxed kernels forked from a process that has already imported torch.

A fresh kernel spends most of its start-up importing: Python and ipykernel about 0.5 s of
CPU, torch about 1.4 s.  With several hundred submissions that is most of the grading
server's CPU.  The *zygote* pays it once per grading worker:

* ``grade`` starts one zygote per worker, inside bubblewrap with the kernel's sandbox
  (``sandbox.main --zygote``), except that its root, ``/dev`` and ``/dev/shm`` are
  read-only and it holds no working folder.  It imports torch and ipykernel, never runs
  student code, and never reads anything a submission sends.
* The kernelspec's launcher (``sandbox.main`` with ``COURSE_SANDBOX_ZYGOTE`` set) connects to
  the zygote's socket.  The zygote forks; everything after that happens in the child, which
  reads the request (connection file, environment, the submission's copy) itself, so no
  data of one submission is ever in the memory the next one is forked from.
* The child builds the same sandbox ``bwrap`` builds, anew for this kernel only: new user,
  mount, PID, network, IPC and UTS namespaces; a fresh size-limited tmpfs for ``/tmp``,
  ``/dev/shm`` and the working folder (with the copy in it); only its own connection folder
  bound in; a ``/proc`` of its own PID namespace.  It then forks the kernel as PID 1 of that
  namespace, which drops every capability (bounding set included, no new privileges), takes
  the memory and file-size limits, a cleared environment with the allow-list, a new session,
  fresh random seeds, and starts ipykernel.  Nothing it can write survives it: every
  writable mount it sees is its own, the rest is read-only.
* The launcher stays as the process the kernel manager watches: when it is killed the child
  kills the kernel, whose PID namespace dies with it; when the kernel exits the launcher
  exits with its status.

When the zygote is unreachable, or the child cannot build the sandbox, the launcher starts
the kernel with bubblewrap as before; no student code has run at that point.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import random
import select
import signal
import socket
import struct
import sys

# Imports inside functions: ipykernel is imported by the forked kernel once its sandbox stands (main()
# preloads it, with KERNEL_MODULES): importing this module, as the tests and the launcher do, starts no
# kernel.

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus")  # as bubblewrap leaves them
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_VERSION_3 = 0x20080522
HEADER = struct.Struct("!Q")
CONN_INSIDE = "/.course-conn"  # as autograder.isolation.policy.CONN_INSIDE (this file runs alone in its sandbox)
MAX_REQUEST = 64 << 20  # the copy of a submission is far smaller; anything larger is refused
# what a kernel imports before it runs any cell: ipykernel itself, then what IPKernelApp.initialize
# imports (its debugger brings debugpy: 0.1 s of CPU in every kernel); none of it starts a thread
KERNEL_MODULES = ("ipykernel.kernelapp", "ipykernel.debugger", "IPython.core.debugger", "IPython.core.completerlib",
                  "IPython.core.oinspect", "IPython.extensions.storemagic", "IPython.utils.wildcard", "psutil", "sqlite3",
                  "tornado.platform.asyncio")

_libc = ctypes.CDLL(None, use_errno=True)


def _confine_module():
    """autograder/confine.py: bound as /course_confine.py in the zygote's sandbox."""
    if "course_confine" not in sys.modules:
        try:
            importlib.import_module("course_confine")
        except ImportError:  # pragma: no cover - run outside its sandbox (tests)
            sys.modules["course_confine"] = importlib.import_module("autograder.isolation.confine")
    return sys.modules["course_confine"]


class SetupError(RuntimeError):
    """The child could not build the kernel's sandbox (nothing of the student ran)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        raise SetupError(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def drop_capabilities() -> None:
    """No capability now or after any exec: empty bounding, ambient, effective, permitted
    and inheritable sets, and no new privileges (as bubblewrap leaves its command)."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    _check(_libc.capset(ctypes.byref(Header(CAP_VERSION_3, 0)), (Data * 2)()), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


# --- the child: one kernel's sandbox -------------------------------------------------------
def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise SetupError("the launcher closed the connection")
        buf += chunk
    return bytes(buf)


def _recv_blob(conn: socket.socket) -> bytes:
    (n,) = HEADER.unpack(_recv_exact(conn, HEADER.size))
    if n > MAX_REQUEST:
        raise SetupError("request too large")
    return _recv_exact(conn, n)


def send_blob(conn: socket.socket, data: bytes) -> None:
    conn.sendall(HEADER.pack(len(data)) + data)


def build_sandbox(setup: dict, request: dict, copy: bytes) -> dict:
    """In the forked child: new namespaces and the mounts of the kernel's policy (the same data
    bubblewrap applies, ``autograder.isolation.policy``).  Returns the policy."""
    policy = json.loads(request["policy"])
    uid, gid = os.getuid(), os.getgid()
    conn_dir = policy["connection"]
    workdir = policy["workdir"]
    if os.path.realpath(conn_dir) != conn_dir or not os.path.isdir(conn_dir) \
            or os.path.dirname(request["connection_file"]) != conn_dir:
        raise SetupError(f"no connection folder {conn_dir}")
    flags = {"user": CLONE_NEWUSER, "mount": CLONE_NEWNS, "pid": CLONE_NEWPID, "net": CLONE_NEWNET,
             "ipc": CLONE_NEWIPC, "uts": CLONE_NEWUTS}
    _check(_libc.unshare(sum(flags[n] for n in policy["namespaces"])), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # only its own connection folder, at CONN_INSIDE: outside every folder the kernel may fill
    _mount(conn_dir, CONN_INSIDE, None, MS_BIND)
    mount_flags, owner = MS_NOSUID | MS_NODEV, f"uid={uid},gid={gid}"
    tmpfs = dict((path, mb) for path, mb in policy["tmpfs"])
    _mount("tmpfs", "/tmp", "tmpfs", mount_flags, f"size={tmpfs['/tmp']}m,mode=755,{owner}")
    own = setup.get("own", "")
    if own and os.path.isdir(own):  # the zygote's folder (other kernels' sockets): out of sight
        _mount("tmpfs", own, "tmpfs", mount_flags | MS_RDONLY, f"size=4k,mode=555,{owner}")
    for second, folder in setup.get("rebind", []):  # read-only folders that live under /tmp
        os.makedirs(folder, exist_ok=True)
        _mount(second, folder, None, MS_BIND | MS_REC)
        _mount(None, folder, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    base = setup["workbase"]
    if not (workdir == base or workdir.startswith(base.rstrip("/") + "/")):
        raise SetupError(f"the working folder {workdir} is not under {base}")
    if not base.startswith("/tmp/") and base != "/tmp":  # a place for the mount point
        _mount("tmpfs", base, "tmpfs", mount_flags, f"size=1m,mode=755,{owner}")
    for path, mb in policy["tmpfs"]:  # the rest of the policy's tmpfs folders, each with its size
        if path == "/tmp":
            continue
        os.makedirs(path, exist_ok=True)
        mode = "1777" if path == "/dev/shm" else "755"
        _mount("tmpfs", path, "tmpfs", mount_flags | (MS_NOEXEC if path == "/dev/shm" else 0),
               f"size={mb}m,mode={mode},{owner}")
    if request.get("copy_name"):
        name = os.path.basename(request["copy_name"])
        with open(os.path.join(workdir, name), "wb") as f:
            f.write(copy)
    # the kernel's connection file, with its sockets where it sees them
    with open(os.path.join(CONN_INSIDE, os.path.basename(request["connection_file"]))) as f:
        info = json.load(f)
    if info.get("transport") == "ipc":
        info["ip"] = os.path.join(CONN_INSIDE, os.path.basename(str(info.get("ip", "k"))))
    with open(os.path.join(CONN_INSIDE, "inside.json"), "w") as f:
        json.dump(info, f)
    return policy


def become_kernel(setup: dict, policy: dict, request: dict, ready_fd: int) -> None:
    """PID 1 of the new PID namespace: its own /proc, limits, environment, no capability;
    then ipykernel.  Writes b"1" to ``ready_fd`` just before ipykernel starts, or b"E" and
    the reason when the sandbox could not be finished.  Never returns."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        _mount("proc", "/proc", "proc", proc_flags)
        for name in PROC_READONLY:
            path = f"/proc/{name}"
            if os.path.exists(path):
                _mount(path, path, None, MS_BIND | MS_REC)
                _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | proc_flags)
        os.setsid()
        _confine_module().limit_resources(policy)  # as a bubblewrap sandbox's (sandbox.set_limits)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.closerange(3, ready_fd)
        os.closerange(ready_fd + 1, 65536)
        missing = [p for p in policy["readonly"] if not os.path.isdir(p)]
        if missing:
            raise SetupError(f"not visible in the sandbox: {missing[0]}")
        os.chdir(policy["workdir"])
        sys.path[0] = policy["workdir"]  # as ``python -m ipykernel_launcher`` started there would have it
        env = {str(k): str(v) for k, v in policy["env"].items()}
        os.environ.clear()
        os.environ.update(env)
        drop_capabilities()
        confine = _confine_module()
        try:  # as in a bubblewrap sandbox: without Landlock the kernel still runs, and says so
            confine.apply({"writable": [path for path, _ in policy["tmpfs"]], "sockets": [CONN_INSIDE],
                           "write_existing": list(policy["write_existing"])})
        except OSError as exc:
            print(f"course sandbox: no Landlock ({exc}); the connection folder is not write-protected",
                  file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001
        os.write(ready_fd, b"E" + f"{exc}".encode()[:500])
        os._exit(70)
    # what a freshly started interpreter would not share with its siblings
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    torch = sys.modules.get("torch")
    if torch is not None and env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    argv = ["-f", os.path.join(CONN_INSIDE, "inside.json"), *request.get("kernel_args", [])]
    sys.argv = [sys.executable, *argv]
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    code = 0
    try:
        from ipykernel.kernelapp import IPKernelApp

        IPKernelApp.launch_instance(argv=argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001
        code = 1
    os._exit(code)


def serve_child(conn: socket.socket, setup: dict) -> None:
    """The forked child (outside the kernel's PID namespace, inside its other namespaces):
    read the request, build the sandbox, fork the kernel, then relay its exit, or kill it
    when the launcher goes away.  Never returns."""
    try:
        request = json.loads(_recv_blob(conn))
        copy = _recv_blob(conn)
        policy = build_sandbox(setup, request, copy)
        del copy
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            conn.close()
            become_kernel(setup, policy, request, ready_w)
        os.close(ready_w)
        with os.fdopen(ready_r, "rb") as ready:
            answer = ready.read(501)  # b"1" then the end of the pipe, or b"E<why>"
        if answer != b"1":
            os.waitpid(pid, 0)
            raise SetupError(answer[1:].decode(errors="replace") or "the kernel process died")
    except Exception as exc:  # noqa: BLE001 - the launcher falls back to bubblewrap
        msg = str(exc) if isinstance(exc, SetupError) else f"{type(exc).__name__}: {exc}"
        try:
            send_blob(conn, json.dumps({"error": msg}).encode())
        finally:
            os._exit(1)
    send_blob(conn, json.dumps({"started": True}).encode())
    code = None
    while code is None:
        ready, _, _ = select.select([conn], [], [], 0.2)
        if ready and not conn.recv(1):  # the launcher is gone: so is the kernel
            os.kill(pid, signal.SIGKILL)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
    try:
        send_blob(conn, json.dumps({"exit": code}).encode())
    except OSError:
        pass
    os._exit(0)


# --- the zygote -------------------------------------------------------------------------------
def serve(sock_path: str, setup: dict, preload: list[str]) -> None:
    """Listen first (a launcher may connect while the imports run), import, then fork one
    child per connection.  Single-threaded, so forking is safe."""
    setup = dict(setup, own=os.path.dirname(os.path.abspath(sock_path)))
    _confine_module()  # before any child changes sys.path
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(64)
    for name in [*KERNEL_MODULES, *preload]:  # the kernel's own start-up, paid once
        try:
            importlib.import_module(name)
        except ImportError:
            if name not in KERNEL_MODULES[1:] or name in preload:
                raise
            # another version of ipykernel may not use it: each kernel imports what it needs
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    while True:
        ready, _, _ = select.select([server], [], [], 1.0)
        while True:  # reap finished children
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not ready:
            continue
        conn, _ = server.accept()
        pid = os.fork()
        if pid == 0:
            server.close()
            serve_child(conn, setup)
        conn.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autograder.isolation.zygote")
    parser.add_argument("socket")
    parser.add_argument("--setup", required=True, help="JSON: workbase, readable, rebind (sandbox.main)")
    parser.add_argument("--preload", action="append", default=[])
    args = parser.parse_args(argv)
    serve(args.socket, json.loads(args.setup), args.preload)


# --- the launcher's side ----------------------------------------------------------------------
def launch_through(sock_path: str, request: dict, copy: bytes) -> int | None:
    """Ask the zygote for a kernel and wait until it exits; returns its exit status, or None
    when no kernel could be started this way (then nothing of the student has run)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(120)
        conn.connect(sock_path)
        send_blob(conn, json.dumps(request).encode())
        send_blob(conn, copy)
        reply = json.loads(_recv_blob(conn))
    except (OSError, ValueError, SetupError):
        conn.close()
        return None
    if not reply.get("started"):
        print(f"course sandbox: zygote: {reply.get('error', '?')}; starting the kernel with bubblewrap",
              file=sys.stderr, flush=True)
        conn.close()
        return None
    # from here on the kernel runs: its end is this process's end
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    conn.settimeout(None)
    try:
        reply = json.loads(_recv_blob(conn))
    except (OSError, ValueError, SetupError):
        return 1
    code = reply.get("exit", 1)
    return code if isinstance(code, int) and code >= 0 else 1


if __name__ == "__main__":
    main()
