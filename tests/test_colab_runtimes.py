"""The kept Colab package lists and the student package's declared ranges (issue 33, items 2 and 5).

Fast: nothing is installed. The Colab tier itself (tests/test_colab.py) runs the course there.
"""
from __future__ import annotations

import subprocess

import pytest
from packaging.requirements import Requirement

from autograder.authoring.publish import STUDENT_DEPENDENCIES
from colab_runtime import SNAPSHOTS, normalise, read_snapshot, refresh, requirements, snapshots
from conftest import ROOT


def test_todays_and_the_previous_runtime_are_kept():
    """Two dated lists, newest first, each naming its source and Colab's Python."""
    kept = snapshots()
    assert len(kept) >= 2, "keep today's Colab runtime and the one before it (python tests/colab_runtime.py refresh)"
    assert kept[0].date > kept[1].date
    for snap in kept[:2]:
        assert snap.source.startswith("https://github.com/googlecolab/backend-info/blob/"), snap.path
        assert snap.python.startswith("3.") and snap.version("transformers") and snap.elsewhere.get("torch")


@pytest.mark.parametrize("which", [0, 1], ids=["today", "previous"])
def test_colabs_versions_lie_in_the_declared_ranges(which):
    """pip keeps Colab's own packages only if each lies in the student package's range."""
    snap = snapshots()[which]
    outside = []
    for line in STUDENT_DEPENDENCIES:
        req = Requirement(line)
        have = snap.version(req.name) or snap.elsewhere.get(normalise(req.name), "").split("/")[-1].split("-")[1:2]
        version = have if isinstance(have, str) else (have[0].replace("%2B", "+") if have else None)
        assert version, f"{snap.label} has no {req.name}"
        if not req.specifier.contains(version, prereleases=True):
            outside.append(f"{req.name} {version} (declared {req.specifier})")
    assert not outside, f"{snap.label}: the setup cell would replace " + ", ".join(outside)


def test_the_tier_installs_colabs_versions_of_what_the_course_imports():
    """The rebuilt runtime asks for Colab's exact versions (torch's family: the nearest build)."""
    snap = snapshots()[0]
    asked = dict(r.split("==") for r in requirements(snap))
    for name in ("transformers", "datasets", "peft", "torchao", "numpy", "ipython", "ipykernel"):
        assert asked[name] == snap.version(name), name
    assert asked["torch"].startswith("2.") and "torchvision" in asked


def test_the_declared_runtimes_are_the_ones_documented():
    """docs/ASSIGNMENTS.md names every kept runtime the tier runs (date and Python)."""
    text = (ROOT / "docs" / "ASSIGNMENTS.md").read_text(encoding="utf-8")
    for snap in snapshots()[:2]:
        assert snap.date in text and f"Python {'.'.join(snap.python.split('.')[:2])}" in text, snap.label


def _fake_upstream(tmp_path, python: str, pins: str):
    repo = tmp_path / "backend-info"
    repo.mkdir(exist_ok=True)
    (repo / "pip-freeze.txt").write_text(pins)
    (repo / "os-info.txt").write_text(f"# generated\nUbuntu 22.04.5 LTS\nPython {python}\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    if not (repo / ".git").exists():
        subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "Upgrade to Python 3.14", "--date", "2027-01-05T12:00:00"],
                   check=True, env={"GIT_COMMITTER_DATE": "2027-01-05T12:00:00", "PATH": "/usr/bin:/bin"})
    return repo


def test_refresh_adds_colabs_newest_list_once(tmp_path, monkeypatch):
    """refresh keeps a new list under its date with its source; a second refresh adds nothing."""
    import colab_runtime

    monkeypatch.setattr(colab_runtime, "SNAPSHOTS", tmp_path / "kept")
    (tmp_path / "kept").mkdir()
    upstream = _fake_upstream(tmp_path, "3.14.1", "numpy==2.3.0\ntorch @ https://example.org/torch-2.12.0.whl\n")
    path = refresh(upstream)
    assert path is not None and path.name == "colab-2027-01-05.txt"
    snap = read_snapshot(path)
    assert snap.python == "3.14.1" and snap.version("numpy") == "2.3.0" and "torch" in snap.elsewhere
    assert refresh(upstream) is None
    assert SNAPSHOTS.is_dir()
