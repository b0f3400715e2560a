"""On a machine with a CUDA GPU: the checks of `attention` give the same points when the
student's kernel computes on CUDA as on the CPU, for the reference solution and for a wrong
answer.  The kernel runs the notebook with ``COURSE_DEVICE`` set; the tests are judged in this
process with ``DEVICE`` set to the same device, exactly as ``autograder grade`` does it (no
sandbox: this checks the tests, not the isolation).

Where torch sees no GPU (the course's CI machines) only the CPU half runs and the comparison
is skipped; run it where a GPU is lent: ``python -m pytest -o addopts="" tests/test_gpu.py``.
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from autograder.course.settings import GradingSettings
from autograder.isolation import sandbox
from autograder.course.model import load
from autograder.judge.kernel import KernelSession
from autograder.judge.runner import context_sources, is_test_cell, run_and_judge
from conftest import ROOT, read_nb, set_solution, WRONG_SOFTMAX

SOURCE = ROOT / "solutions" / "attention" / "attention.ipynb"

def points(nb) -> dict[str, float]:
    """Points of each test cell, read the way nbgrader reads them: an error output means 0."""
    out = {}
    for cell in nb.cells:
        if is_test_cell(cell):
            failed = any(o.get("output_type") == "error" for o in cell.outputs)
            out[cell.metadata["nbgrader"]["grade_id"]] = 0.0 if failed else float(cell.metadata["nbgrader"]["points"])
    return out


def grade_on(device: str, nb, tmp_path, monkeypatch, sandboxed: bool = False) -> dict[str, float]:
    """Points of ``nb`` with the kernel on ``device``: a plain kernel, or the grading sandbox
    with the GPU passed through."""
    jupyter = tmp_path / f"jupyter-{device}-{sandboxed}"
    if sandboxed:
        sandbox.install_kernelspec(jupyter, GradingSettings(bwrap=True, gpu=device == "cuda"))
        name = sandbox.KERNEL_NAME
    else:
        (jupyter / "kernels" / "course-plain").mkdir(parents=True, exist_ok=True)
        (jupyter / "kernels" / "course-plain" / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "plain", "language": "python"}))
        name = "course-plain"
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter))
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    session = KernelSession(name, tmp_path / f"work-{device}-{sandboxed}", env={"COURSE_DEVICE": device},
                            ipc=True)
    context = context_sources(nb, load().assignment("attention").judge_context)
    try:
        notes = run_and_judge(nb, session, context, device, timeout=120, notebook_timeout=900)
    finally:
        session.stop()
    assert not notes, notes
    return points(nb)


@pytest.mark.parametrize("variant", ["reference", "wrong_q2"])
def test_checks_give_the_same_points_on_the_cpu_and_on_cuda(variant, tmp_path, monkeypatch):
    make = (lambda: read_nb(SOURCE)) if variant == "reference" else \
        (lambda: set_solution(read_nb(SOURCE), "calculate_multihead_attention", WRONG_SOFTMAX))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    got = {d: grade_on(d, make(), tmp_path, monkeypatch) for d in devices}
    expected = 30.0 if variant == "reference" else 24.0
    for d in devices:
        assert sum(got[d].values()) == expected, (d, got[d])
    if "cuda" not in devices:
        pytest.skip("checked on the CPU only: no CUDA GPU on this machine")
    assert got["cuda"] == got["cpu"]


@pytest.mark.skipif(not sandbox.gpu_works_in_sandbox(), reason="no GPU that works inside the grading sandbox here")
def test_the_sandboxed_kernel_computes_on_the_gpu_with_the_same_points(tmp_path, monkeypatch):
    """Inside bubblewrap with the NVIDIA nodes passed through, the reference still gets 30 and
    the kernel really ran on CUDA."""
    nb = read_nb(SOURCE)
    got = grade_on("cuda", nb, tmp_path, monkeypatch, sandboxed=True)
    assert sum(got.values()) == 30.0, got
    setup = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    assert "device cuda" in "".join(o.get("text", "") for o in setup.outputs), setup.outputs
