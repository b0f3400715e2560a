"""The grading sandbox: a kernel sees only what it needs, writes only to memory, reaches nothing.

Most tests run a small Python script inside the exact bubblewrap command a kernel gets
(``sandbox.bwrap_command``) and look at what it could do.
"""
from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from autograder.course.model import Grading
from autograder.isolation import policy, sandbox
from conftest import ROOT

needs_bwrap = pytest.mark.skipif(not sandbox.bwrap_works(), reason="bubblewrap does not work here")


@pytest.fixture
def fake_dev(tmp_path, monkeypatch):
    """A /dev stand-in with the names of the NVIDIA driver's nodes (plain files: binding them
    is the same mount as binding device nodes) and a disk that must stay out of the sandbox."""
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "sda"):
        (dev / name).write_text(name)
    monkeypatch.setattr(sandbox, "DEV", dev)
    return dev


def run_inside(tmp_path, script: str, gpu: bool = False, env: dict | None = None, tmp_mb: int = 64,
               timeout: int = 120) -> subprocess.CompletedProcess:
    """Run ``script`` with the sandbox's Python exactly as a kernel would be run."""
    work, conn = tmp_path / "work", tmp_path / "conn"
    work.mkdir(exist_ok=True)
    conn.mkdir(exist_ok=True)
    rules = policy.kernel_policy(work, conn, memory_mb=8192, tmp_mb=tmp_mb, work_mb=64, file_mb=512, gpu=gpu,
                                 env=env if env is not None else dict(os.environ))
    cmd = sandbox.bwrap_command(sandbox.confined([sys.executable, "-c", textwrap.dedent(script)], rules), rules)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_gpu_nodes_are_the_nvidia_ones(fake_dev):
    assert [p.name for p in sandbox.gpu_nodes()] == ["nvidia-caps", "nvidia-uvm", "nvidia0", "nvidiactl"]


@needs_bwrap
@pytest.mark.parametrize("gpu", [True, False])
def test_gpu_nodes_appear_in_the_sandbox_only_with_the_gpu_flag(fake_dev, tmp_path, gpu):
    proc = run_inside(tmp_path, """
        import os
        print(" ".join(sorted(os.listdir("/dev"))))
        print("---")
        print(open("/dev/nvidia0").read() if os.path.exists("/dev/nvidia0") else "")
        print("---")
        print(os.path.isdir("/sys/class"))
    """, gpu=gpu)
    assert proc.returncode == 0, proc.stderr
    listing, content, sys_visible = proc.stdout.split("---")
    seen = set(listing.split())
    nvidia = {"nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-caps"}
    assert nvidia <= seen if gpu else not nvidia & seen
    assert "sda" not in seen and "null" in seen  # the rest of /dev stays the sandbox's own
    assert (content.strip() == "nvidia0") == gpu  # the node inside is the host's node
    assert (sys_visible.strip() == "True") == gpu  # /sys only for the GPU driver


@needs_bwrap
def test_the_kernel_sees_only_the_allow_list(tmp_path, monkeypatch):
    """No solutions, no other checkout, no home, no /var, no /run, no host /tmp; Python,
    the venv, coursekit and the course data are there, read-only."""
    other = tmp_path / "second_clone"
    (other / "solutions").mkdir(parents=True)
    (other / "solutions" / "secret.txt").write_text("answers")
    home_secret = os.path.expanduser("~/.course-sandbox-test-secret")
    with open(home_secret, "w") as fh:
        fh.write("secret")
    try:
        proc = run_inside(tmp_path, f"""
            import json, os
            paths = {{
                "solutions": {str(ROOT / "solutions")!r}, "autograder": {str(ROOT / "autograder")!r},
                "git": {str(ROOT / ".git")!r}, "other_clone": {str(other / "solutions" / "secret.txt")!r},
                "home_secret": {home_secret!r}, "var": "/var", "run": "/run", "shadow": "/etc/shadow",
                "coursekit": {str(ROOT / "coursekit" / "remote" / "codec.py")!r}, "data": {str(ROOT / "data")!r},
            }}
            seen = {{k: os.path.exists(v) for k, v in paths.items()}}
            import torch, coursekit  # what a kernel needs works
            seen["torch"] = torch.ones(2).sum().item() == 2.0
            seen["root_listing"] = sorted(os.listdir("/"))
            print(json.dumps(seen))
        """)
    finally:
        os.remove(home_secret)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    for hidden in ("solutions", "autograder", "git", "other_clone", "home_secret", "var", "run", "shadow"):
        assert seen[hidden] is False, f"{hidden} is visible inside the sandbox"
    assert seen["coursekit"] and seen["data"] and seen["torch"]
    allowed_tops = {p.parts[1] for p in policy.readable_paths()}  # e.g. /opt when Python lives there
    forbidden = {"var", "run", "home", "srv", "mnt", "opt", "media"} - allowed_tops
    assert not forbidden & set(seen["root_listing"]), seen["root_listing"]


@needs_bwrap
def test_writes_stay_inside_and_tmp_is_limited(tmp_path):
    """Everything outside the working folder and /tmp is read-only; /tmp is a small tmpfs."""
    target = ROOT / "coursekit" / "sandbox-write-test.txt"
    proc = run_inside(tmp_path, f"""
        import os
        results = []
        for path in [{str(target)!r}, "/usr/sandbox-test", {str(tmp_path / "outside.txt")!r}]:
            try:
                open(path, "w").write("x")
                results.append("wrote " + path)
            except OSError as exc:
                results.append("refused")
        open("in-workdir.txt", "w").write("fine")
        try:
            with open("/tmp/big", "wb") as fh:
                for _ in range(100):
                    fh.write(b"x" * (1 << 20))
            results.append("tmp unlimited")
        except OSError:
            results.append("tmp full")
        print(results)
    """, tmp_mb=32)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = proc.stdout
    assert results.count("refused") >= 2 and "tmp full" in results, results  # the course and /usr
    # a path under the host's /tmp exists only in the sandbox's own /tmp: nothing reaches the host
    assert not target.exists() and not (tmp_path / "outside.txt").exists()
    assert not (tmp_path / "work" / "in-workdir.txt").exists()  # the working folder is the sandbox's memory


@needs_bwrap
def test_no_connection_leaves_the_sandbox(tmp_path):
    """Neither TCP to the host's loopback nor a UNIX socket of the host can be reached."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.3)
    port = srv.getsockname()[1]
    unix_path = str(tmp_path / "host.sock")
    usrv = socket.socket(socket.AF_UNIX)
    usrv.bind(unix_path)
    usrv.listen()
    usrv.settimeout(0.3)
    hits = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            for s in (srv, usrv):
                try:
                    conn, _ = s.accept()
                    hits.append(1)
                    conn.close()
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        proc = run_inside(tmp_path, f"""
            import socket
            out = []
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2)
                out.append("tcp connected")
            except OSError:
                out.append("tcp refused")
            try:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(2)
                s.connect({unix_path!r})
                out.append("unix connected")
            except OSError:
                out.append("unix refused")
            print(out)
        """)
    finally:
        stop.set()
        t.join(2)
        srv.close()
        usrv.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "connected" not in proc.stdout, proc.stdout
    assert hits == []


@needs_bwrap
def test_the_environment_is_cleared(tmp_path):
    proc = run_inside(tmp_path, """
        import os, json
        print(json.dumps(dict(os.environ)))
    """, env={**os.environ, "GITHUB_TOKEN": "s3cr3t", "COURSE_PROFILE": "cpu"})
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "GITHUB_TOKEN" not in env and "s3cr3t" not in json.dumps(env)
    assert env["COURSE_PROFILE"] == "cpu" and env["HOME"] == "/tmp"


def test_probe_reports_the_limits():
    got = sandbox.probe(memory_mb=4096, use_bwrap=False)
    assert got["limits"]["AS"] == 4096 * 1024 * 1024
    assert got["limits"]["DATA"] == resource.getrlimit(resource.RLIMIT_DATA)[0]
    assert got["limits"]["FSIZE"] == Grading().file_mb * 1024 * 1024


def test_a_probe_runs_once_per_process_and_environment(monkeypatch):
    """A second grading run in one process reuses the probe's success; another environment
    or other limits probe again, and a failure is never remembered."""
    calls = []

    def fake_run(memory_mb, gpu, use_bwrap):
        calls.append((memory_mb, gpu, use_bwrap))
        if len(calls) == 1:
            raise RuntimeError("sandbox probe failed: the first try")
        return {"limits": {"AS": memory_mb}, "torch": True}

    monkeypatch.setattr(sandbox, "_PROBED", {})
    monkeypatch.setattr(sandbox, "_run_probe", fake_run)
    with pytest.raises(RuntimeError):
        sandbox.probe(memory_mb=123)
    first = sandbox.probe(memory_mb=123)        # the failure was not remembered: tried again
    first["limits"]["AS"] = 0                   # the caller's copy, not the remembered one
    assert sandbox.probe(memory_mb=123) == {"limits": {"AS": 123}, "torch": True}
    assert len(calls) == 2
    sandbox.probe(memory_mb=456)                # other limits
    monkeypatch.setenv("COURSE_PROBE_TEST", "1")
    sandbox.probe(memory_mb=123)                # another environment
    assert calls == [(123, False, True)] * 2 + [(456, False, True), (123, False, True)]


@needs_bwrap
def test_probe_with_the_gpu_flag_caps_the_data_segment_instead():
    """CUDA reserves far more address space than it uses: with the GPU the limit moves to the
    data segment, which still holds every large tensor."""
    got = sandbox.probe(memory_mb=4096, gpu=True)
    assert got["limits"]["DATA"] == 4096 * 1024 * 1024
    assert got["limits"]["AS"] == resource.getrlimit(resource.RLIMIT_AS)[0]
    assert got["nvidia_nodes"] == [p.name for p in sandbox.gpu_nodes()]
    assert got["cuda"] == bool(got["nvidia_nodes"]) or not got["cuda"]


def test_no_gpu_here_means_no_gpu_in_the_sandbox(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "DEV", tmp_path)  # a machine without NVIDIA nodes
    assert sandbox.gpu_nodes() == [] and sandbox.gpu_works_in_sandbox() is False


def test_a_broken_sandbox_stops_the_run_before_anyone_is_graded(tmp_path):
    """(From tests/test_class_grading.py, which judges with the fake backend now.)  A kernel that cannot start Python (here: 40 MB of address space) is found by the
    self-test: exit status 2, one line, and no grades written."""
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "s1_attention.ipynb").write_bytes((ROOT / "exercises" / "attention" / "attention.ipynb").read_bytes())
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", "attention", str(subs), "--memory-mb", "40",
                           "--out", str(tmp_path / "out"), "--grading-dir", str(tmp_path / "g")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot run Python" in proc.stderr and "no submission was graded" in proc.stderr
    assert not (tmp_path / "out" / "grades.csv").exists()
