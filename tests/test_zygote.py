"""Kernels forked from the zygote (``autograder.isolation.zygote``) get a sandbox as strict as the one
bubblewrap builds for a kernel started on its own, and nothing of one kernel reaches the next.

Each test drives real kernels the way ``JudgedExecute`` does: a kernelspec of the course
sandbox, one zygote per grading process, one ``KernelSession`` per submission.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from autograder.course.settings import GradingSettings
from autograder.isolation import sandbox
from autograder.judge import execute

pytestmark = pytest.mark.skipif(not sandbox.bwrap_works(), reason="bubblewrap cannot create namespaces here")

PROBE = '''\
import json, os, resource
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
def writable(path):
    try:
        with open(os.path.join(path, ".probe"), "w") as f:
            f.write("x")
        os.remove(os.path.join(path, ".probe"))
        return True
    except OSError:
        return False
def makes(path):
    """What the kernel can make in a folder: a file, a folder, a link (each removed again)."""
    out = {}
    for kind, make, undo in (("file", lambda p: open(p, "w").close(), os.remove), ("dir", os.mkdir, os.rmdir),
                             ("link", lambda p: os.symlink("/etc/passwd", p), os.remove)):
        try:
            make(os.path.join(path, ".made-" + kind))
            undo(os.path.join(path, ".made-" + kind))
            out[kind] = True
        except OSError:
            out[kind] = False
    return out
from ipykernel.kernelapp import IPKernelApp
conn = os.path.dirname(IPKernelApp.instance().abs_connection_file)
shared = "@SHARED@"
found = {"shared": sorted(os.listdir(shared)) if os.path.isdir(shared) else None}
for place in ("/tmp", "/dev/shm", "."):
    found[place] = sorted(os.listdir(place))
print(json.dumps({
    "pid": os.getpid(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "cap_eff": int(status["CapEff"].strip(), 16), "cap_bnd": int(status["CapBnd"].strip(), 16),
    "no_new_privs": status.get("NoNewPrivs", "").strip(),
    "memory": resource.getrlimit(resource.RLIMIT_AS)[0],
    "file": resource.getrlimit(resource.RLIMIT_FSIZE)[0], "core": resource.getrlimit(resource.RLIMIT_CORE)[0],
    "env": sorted(os.environ),
    "writable": {p: writable(p) for p in ("/", "/dev", "/dev/shm", "/tmp", ".", shared)},
    "proc_sys_ro": any(m.split()[4] == "/proc/sys" and "ro" in m.split()[5].split(",")
                       for m in open("/proc/self/mountinfo")),
    "found": found,
    "conn": {"where": conn, "makes": makes(conn), "sockets": sorted(os.listdir(conn))},
    "fills": {p: makes(p) for p in ("/tmp", "/dev/shm", ".")},
}))
for place in ("/tmp", "/dev/shm", "."):
    open(os.path.join(place, "planted"), "w").write("from the previous kernel")
'''


@pytest.fixture
def grader(tmp_path, monkeypatch):
    """A course kernelspec, a scratch base and the JudgedExecute that owns the zygote."""
    sandbox.install_kernelspec(tmp_path / "jupyter", GradingSettings(memory_mb=4096), threads=1)
    # a read-only folder under /tmp (a checkout or venv there, as in CI): /tmp is replaced
    # in each forked kernel, and the folder must still be there
    shared = Path("/tmp") / f"course-ro-{os.getpid()}"
    shared.mkdir(exist_ok=True)
    (shared / "marker").write_text("x")
    monkeypatch.setenv("COURSE_SANDBOX_READONLY", str(shared))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("GRADER_API_TOKEN", "not for kernels")  # not on the allow-list
    base = tmp_path / "base"
    base.mkdir()
    je = execute.JudgedExecute()
    yield je, base, shared
    execute._stop_zygote()
    import shutil

    shutil.rmtree(shared, ignore_errors=True)


def _run(je, base: Path, code: str, shared: Path, copy_text: str = "{}"):
    scratch = Path(os.path.join(base, f"s{time.monotonic_ns()}"))
    scratch.mkdir()
    copy = scratch / "submission.ipynb"
    copy.write_text(copy_text)
    session = je._session(scratch, copy)
    session.start()
    try:
        run = session.execute(code.replace("@SHARED@", str(shared)), timeout=60)
        assert run.status == "ok", run.outputs
        text = "".join(o.get("text", "") for o in run.outputs if o.get("name") == "stdout")
        return json.loads(text.strip().splitlines()[-1])
    finally:
        session.stop()


def test_a_forked_kernel_gets_a_sandbox_of_its_own(grader):
    je, base, shared = grader
    je._ensure_zygote(base)
    assert execute._ZYGOTE.get("proc") is not None, "the zygote did not start"
    first = _run(je, base, PROBE, shared)
    # shape: the kernel is PID 1 of a namespace of its own (bubblewrap's kernel is PID 2)
    assert first["pid"] == 1, first
    assert max(first["pids"]) < 100, first["pids"]
    # values: no capability now or after exec, the memory limit, the cleared environment
    assert first["cap_eff"] == 0 and first["cap_bnd"] == 0 and first["no_new_privs"] == "1", first
    assert first["memory"] == 4096 << 20
    assert (first["file"], first["core"]) == (GradingSettings().file_mb << 20, 0), first  # as bubblewrap's kernels
    assert "GRADER_API_TOKEN" not in first["env"] and "COURSE_SANDBOX_ZYGOTE" not in first["env"]
    assert first["found"]["."] == ["submission.ipynb"] and "planted" not in first["found"]["/tmp"]
    assert first["writable"] == {"/": False, "/dev": False, "/dev/shm": True, "/tmp": True, ".": True,
                                 str(shared): False}, first
    assert first["found"]["shared"] == ["marker"], "a read-only folder under /tmp went missing"
    assert first["proc_sys_ro"]
    _assert_confined(first)
    # behaviour: what the first kernel planted everywhere it could write is gone for the next
    second = _run(je, base, PROBE, shared)
    assert second["pid"] == 1
    assert all("planted" not in names for names in second["found"].values()), second["found"]
    assert second["found"]["/dev/shm"] == [] and second["found"]["."] == ["submission.ipynb"]
    assert second["found"]["shared"] == ["marker"]


def test_kernels_fall_back_to_bubblewrap_when_the_zygote_is_gone(grader):
    je, base, shared = grader
    je._ensure_zygote(base)
    os.killpg(execute._ZYGOTE["proc"].pid, 9)
    execute._ZYGOTE["proc"].wait()
    execute._ZYGOTE["proc"] = None  # keep the dead zygote's socket path in the kernels' environment
    out = _run(je, base, PROBE, shared)
    print(out["found"])
    assert out["pid"] == 2, "expected a kernel started by bubblewrap (PID 2 under bwrap's init)"
    assert out["found"]["."] == ["submission.ipynb"]
    _assert_confined(out)


def _assert_confined(seen: dict) -> None:
    """The kernel's one folder on the host's disk, its connection folder, takes its sockets and
    nothing else; its tmpfs folders take anything."""
    assert seen["conn"]["where"] == sandbox.CONN_INSIDE, seen["conn"]
    assert seen["conn"]["makes"] == {"file": False, "dir": False, "link": False}, seen["conn"]
    assert any(name.startswith("k-") for name in seen["conn"]["sockets"]), seen["conn"]
    assert all(made == {"file": True, "dir": True, "link": True} for made in seen["fills"].values()), seen["fills"]


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def test_stopping_a_session_kills_its_forked_kernel(grader):
    je, base, shared = grader
    je._ensure_zygote(base)
    zygote = execute._ZYGOTE["proc"].pid
    idle = len(_descendants(zygote))
    scratch = base / "one"
    scratch.mkdir()
    session = je._session(scratch, None)
    session.start()
    assert session.execute("import os; os.getpid()", timeout=60).status == "ok"
    assert len(_descendants(zygote)) >= idle + 2  # the child that built the sandbox, and the kernel
    session.stop()
    deadline = time.monotonic() + 5
    while len(_descendants(zygote)) > idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_descendants(zygote)) == idle


def test_a_session_stops_its_kernel_without_waiting_on_a_poll(grader, monkeypatch):
    """stop() kills the kernel's launcher and reaps it at once: jupyter_client's own shutdown
    polls the process every 0.1 s (asleep in between), which stop() no longer reaches."""
    import asyncio

    import jupyter_client.manager
    import jupyter_client.provisioning.local_provisioner as local

    je, base, shared = grader
    je._ensure_zygote(base)
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def counted(delay, *args, **kwargs):
        slept.append(delay)
        return await real_sleep(delay, *args, **kwargs)

    for module in (jupyter_client.manager, local):
        monkeypatch.setattr(module.asyncio, "sleep", counted)
    for i in range(3):
        scratch = base / f"stop{i}"
        scratch.mkdir()
        session = je._session(scratch, None)
        session.start()
        launcher = session.km.provisioner.process
        slept.clear()
        session.stop()
        assert launcher.poll() is not None and session.km is None  # gone, and reaped
        assert not [d for d in slept if d >= 0.05], slept


def test_the_zygote_has_imported_what_a_kernel_imports_as_it_starts(tmp_path):
    """A kernel forked from the zygote imports nothing heavy of its own before its first cell: what
    ipykernel's start-up imports (its debugger brings debugpy) is in ``zygote.KERNEL_MODULES``,
    and importing it starts no thread (the zygote forks)."""
    import subprocess
    import sys

    code = f"""
import importlib, json, os, sys
from autograder.isolation.zygote import KERNEL_MODULES
import torch  # the zygote's preload, as JudgedExecute starts it
threads = len(os.listdir("/proc/self/task"))
for name in KERNEL_MODULES:
    importlib.import_module(name)
assert len(os.listdir("/proc/self/task")) == threads, "an import started a thread before the zygote forks"
before = set(sys.modules)
from ipykernel.kernelapp import IPKernelApp
IPKernelApp.instance().initialize(["-f", {str(tmp_path / "kernel.json")!r}])
new = sorted(m for m in set(sys.modules) - before
             if m.split(".")[0] in ("debugpy", "_pydevd_bundle", "_pydev_bundle", "pydevd", "IPython", "ipykernel",
                                    "jupyter_client", "zmq", "tornado", "psutil", "sqlite3", "traitlets"))
print(json.dumps(new), file=sys.__stdout__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
