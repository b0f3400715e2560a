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


# ---------------------------------------------------------------- where the rebuilt runtimes are kept

def test_a_runtime_is_kept_in_the_course_cache_outside_the_checkout(tmp_path, monkeypatch):
    """A fresh clone reuses the runtimes an earlier run built: they live in the course's cache, by key."""
    import colab_runtime

    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    want = {"spec": requirements(snapshots()[0]), "list": "abc", "recipe": colab_runtime.RECIPE}
    folder = colab_runtime.env_folder("2026-08-19", want)
    assert folder.parent == tmp_path / "cache" / "colab-venvs" and folder.name.startswith("2026-08-19-")
    assert ROOT not in folder.parents
    monkeypatch.delenv("COURSE_CACHE_DIR")
    assert ROOT not in colab_runtime.env_folder("2026-08-19", want).parents


def test_the_key_follows_what_the_runtime_is_built_from():
    """The same list and requirements give the same folder; a changed one gives another."""
    import colab_runtime

    want = {"spec": ["numpy==2.0.2"], "list": "abc", "recipe": 2}
    same = colab_runtime.env_folder("d", dict(want))
    assert same == colab_runtime.env_folder("d", want)
    for changed in ({**want, "spec": ["numpy==2.0.3"]}, {**want, "list": "abd"}, {**want, "recipe": 3}):
        assert colab_runtime.env_folder("d", changed) != same, changed


def test_a_built_runtime_is_reused_and_a_stale_one_rebuilt(tmp_path, monkeypatch):
    """runtime_python builds nothing when the keyed folder holds a finished build (its stamp), and
    builds when the stamp is missing or says otherwise."""
    import colab_runtime

    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path))
    builds = []
    monkeypatch.setattr(colab_runtime, "_build_runtime", lambda snap, folder, spec, want: builds.append(folder))
    compiled = []  # a runtime built, or found, without bytecode gets it (tests/test_colab.py checks it does)
    monkeypatch.setattr(colab_runtime, "_compile", compiled.append)
    snap = snapshots()[0]
    colab_runtime.runtime_python(snap)  # nothing there: built
    (folder,) = builds
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    want = {"spec": requirements(snap), "list": colab_runtime.hashlib.sha256(snap.path.read_bytes()).hexdigest(),
            "recipe": colab_runtime.RECIPE}
    (folder / "colab-spec.json").write_text(colab_runtime.json.dumps(want))
    assert colab_runtime.runtime_python(snap) == folder / "bin" / "python"
    assert len(builds) == 1, "a finished build was built again"
    (folder / "colab-spec.json").write_text(colab_runtime.json.dumps({**want, "recipe": -1}))
    colab_runtime.runtime_python(snap)
    assert builds == [folder, folder]
    assert compiled == [folder] * 3


def test_the_tier_runs_each_exercise_at_its_smallest_profile():
    """The tier checks that every cell runs on Colab's packages: an exercise with run profiles runs
    there with the one that trains on the fewest rows (the graded profile is tests/test_finetune.py's)."""
    import re

    from colab_tier import _env
    from conftest import read_nb

    profile = _env()["COURSE_PROFILE"]
    sized = 0
    for source in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        code = "\n".join(c.source for c in read_nb(source).cells if c.cell_type == "code")
        if "COURSE_PROFILE" not in code:
            continue
        rows = {name: int(n) for name, n in re.findall(r'"(\w+)": dict\(n_train=(\d+)', code)}
        assert profile in rows, f"{source.name} has no {profile!r} profile (it has {sorted(rows)})"
        assert rows[profile] == min(rows.values()) < rows["cpu"], (source.name, rows)
        sized += 1
    assert sized, "no exercise reads COURSE_PROFILE any more: drop the tier's profile"
