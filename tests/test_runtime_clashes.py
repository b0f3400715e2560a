"""coursekit.runtime: the package clashes of Colab's runtime neutralised, and the self-check
telling the runtime's problems from the student's (issue 33, items 1 and 3).

Fast: the clashes are planted with stand-in packages on a temporary ``site-packages`` folder
(a torchvision without ``io.VideoReader``, a torchao 0.10 with its metadata), each in a fresh
interpreter, so the course's own environment is left alone. The real packages meet in the
Colab tier (tests/test_colab.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT


def _site(tmp_path: Path, files: dict[str, str]) -> Path:
    site = tmp_path / "lib" / "site-packages"
    for name, text in files.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return site


TORCHVISION_026 = {  # what datasets asks of torchvision: the package, and io without VideoReader
    "torchvision/__init__.py": "__version__ = '0.26.0'\nfrom . import io\n",
    "torchvision/io/__init__.py": "def read_image(path):\n    raise NotImplementedError\n",
    "torchvision-0.26.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.26.0\n",
}
TORCHAO_010 = {
    "torchao/__init__.py": "__version__ = '0.10.0'\n",
    "torchao-0.10.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torchao\nVersion: 0.10.0\n",
}


def _run(site: Path, code: str, with_coursekit: bool) -> dict:
    prelude = "import coursekit\n" if with_coursekit else ""
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + prelude +
                           textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


READ_A_TORCH_ROW = """
    import json, torchvision, datasets
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "label": [1]})
    ds.set_format("torch")
    try:
        row = ds[0]
        out = {"ok": True, "ids": row["input_ids"].tolist()}
    except ImportError as exc:
        out = {"ok": False, "error": str(exc)}
    print(json.dumps(dict(out, torchvision_used=datasets.config.TORCHVISION_AVAILABLE)))
"""


@pytest.mark.parametrize("with_coursekit", [False, True])
def test_datasets_rows_read_beside_a_torchvision_without_videoreader(tmp_path, with_coursekit):
    """Beside torchvision 0.26, coursekit keeps datasets' formatter off torchvision and rows read."""
    site = _site(tmp_path, TORCHVISION_026)
    out = _run(site, READ_A_TORCH_ROW, with_coursekit)
    # the course's own datasets guards the import itself (datasets 4.0 does not: the Colab tier
    # shows that); what coursekit changes is datasets' view of torchvision, and only here
    assert out["torchvision_used"] is (not with_coursekit), out
    if with_coursekit:
        assert out["ok"] and out["ids"] == [1, 2, 3], out
        assert "no longer has: datasets will not use torchvision here" in out["stderr"]


PEFT_ON_A_TINY_MODEL = """
    import json, torch
    from peft import LoraConfig, get_peft_model

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(4, 4)
        def forward(self, x):
            return self.q_proj(x)

    try:
        model = get_peft_model(Tiny(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(json.dumps({"ok": True, "trainable": n}))
    except ImportError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
"""


@pytest.mark.parametrize("with_coursekit", [False, True])
def test_peft_wraps_a_model_beside_an_old_torchao(tmp_path, with_coursekit):
    """get_peft_model works beside torchao 0.10 once coursekit is imported, and says it ignored it."""
    site = _site(tmp_path, TORCHAO_010)
    out = _run(site, PEFT_ON_A_TINY_MODEL, with_coursekit)
    if with_coursekit:
        assert out["ok"] and out["trainable"] == 2 * 4 + 4 * 2, out
        assert "ignores it here" in out["stderr"] and "torchao 0.10.0" in out["stderr"]
    else:  # the clash is real with the course's own peft: the test above proves the fix, not a no-op
        assert not out["ok"] and "torchao" in out["error"], out


def test_nothing_is_neutralised_where_nothing_clashes(tmp_path):
    """In a runtime without the clashes coursekit changes nothing and says nothing."""
    out = _run(tmp_path, "import json, coursekit.runtime as r, datasets, peft.import_utils\n"
                         "print(json.dumps({'applied': r.applied()}))", with_coursekit=True)
    assert out["applied"] == [] and "coursekit:" not in out["stderr"]


# ---------------------------------------------------------------------------------------
# The self-check's message
# ---------------------------------------------------------------------------------------

BROKEN_LIBRARY = {
    "brokenlib/__init__.py": """
        def load_rows():
            # what datasets 4.0 does per row beside torchvision 0.26
            from brokenlib_other.io import VideoReader
            return VideoReader
    """,
    "brokenlib_other/__init__.py": "",
    "brokenlib_other/io.py": "def read_image(path):\n    return path\n",
}

SELF_CHECK = """
    import json
    from coursekit import selfcheck
    from coursekit.remote import LocalStudent
    import brokenlib

    def preprocess(rows):          # the student's answer: correct, but the library breaks
        return brokenlib.load_rows()

    def tokenize(rows):            # the student's own mistake: a module that does not exist
        import no_such_module_in_any_runtime
        return rows

    ns = {"preprocess": preprocess, "tokenize": tokenize}
    spec = {"answers": {"preprocess": "Q1", "tokenize": "Q2"}}
    ctx = selfcheck._Context(spec, ns)
    out = {}
    for fn, q in (("preprocess", "Q1"), ("tokenize", "Q2")):
        test = {"question": q, "grade_id": f"t{q}", "description": ""}
        try:
            LocalStudent(ns).__getattr__(fn)([1])
        except Exception as exc:
            out[q] = ctx.explain(exc, test, "")
    selfcheck._collectors.append(warned := [])
    with selfcheck.warn_only():
        LocalStudent(ns).preprocess([1])
    selfcheck._collectors.pop()
    out["warned"] = list(warned)
    print(json.dumps(out))
"""


def test_the_self_check_names_the_library_not_the_students_code(tmp_path, monkeypatch):
    """An ImportError raised inside an installed library is reported as the runtime's, naming the package."""
    site = _site(tmp_path, BROKEN_LIBRARY)
    out = _run(site, SELF_CHECK, with_coursekit=True)
    status, reason = out["Q1"]
    assert status == "runtime", out
    assert "incompatible brokenlib" in reason and "VideoReader" in reason and "pip install -U brokenlib" in reason
    assert "your code raised" not in reason and "preprocess raised" not in reason
    assert out["warned"] and "incompatible brokenlib" in out["warned"][0]
    # the student's own ImportError stays the student's
    status, reason = out["Q2"]
    assert status == "fail" and "incompatible" not in reason and "no_such_module_in_any_runtime" in reason, out


def test_the_hand_in_verdict_does_not_blame_the_student():
    """A question the runtime broke is listed as not checked, not as failing."""
    from coursekit.selfcheck import CheckOutcome, CheckReport

    report = CheckReport("x", {}, [CheckOutcome("Q1", "t1", 5, "d", "runtime", "could not be checked: ...")], [])
    assert report.problems() == ["Q1 could not be checked in this runtime (an incompatible package: see Q1 above)"]
    assert not report.passed
