"""The grading sandbox: which devices a kernel sees, and which memory limit it gets."""
from __future__ import annotations

import resource
import subprocess

import pytest

from autograder import sandbox

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


def test_gpu_nodes_are_the_nvidia_ones(fake_dev):
    assert [p.name for p in sandbox.gpu_nodes()] == ["nvidia-caps", "nvidia-uvm", "nvidia0", "nvidiactl"]


@needs_bwrap
@pytest.mark.parametrize("gpu", [True, False])
def test_gpu_nodes_appear_in_the_sandbox_only_with_the_gpu_flag(fake_dev, tmp_path, monkeypatch, gpu):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cmd = sandbox._bwrap_command(work / "kernel.json", [], ["sh", "-c", "ls /dev; echo ---; cat /dev/nvidia0; true"],
                                 gpu=gpu)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listing, _, content = proc.stdout.partition("---")
    seen = set(listing.split())
    nvidia = {"nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-caps"}
    assert nvidia <= seen if gpu else not nvidia & seen
    assert "sda" not in seen and "null" in seen  # the rest of /dev stays the sandbox's own
    assert (content.strip() == "nvidia0") == gpu  # the node inside is the host's node


def test_probe_reports_the_address_space_limit():
    got = sandbox.probe(memory_mb=4096, use_bwrap=False)
    assert got["limits"]["AS"] == 4096 * 1024 * 1024
    assert got["limits"]["DATA"] == resource.getrlimit(resource.RLIMIT_DATA)[0]


@needs_bwrap
def test_probe_with_the_gpu_flag_caps_the_data_segment_instead():
    """CUDA reserves far more address space than it uses: with the GPU the limit moves to the
    data segment, which still holds every large tensor."""
    got = sandbox.probe(memory_mb=4096, gpu=True)
    assert got["limits"]["DATA"] == 4096 * 1024 * 1024
    assert got["limits"]["AS"] == resource.getrlimit(resource.RLIMIT_AS)[0]
    assert got["nvidia_nodes"] == [p.name for p in sandbox.gpu_nodes()]  # none here: no GPU lent
    assert not got["cuda"] or got["nvidia_nodes"]


def test_no_gpu_here_means_no_gpu_in_the_sandbox(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "DEV", tmp_path)  # a machine without NVIDIA nodes
    assert sandbox.gpu_nodes() == [] and sandbox.gpu_works_in_sandbox() is False
