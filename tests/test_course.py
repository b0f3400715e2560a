"""Course-wide wiring: config, Colab links, plumbing."""
from __future__ import annotations

import re

import pytest
import torch
import yaml

import coursekit
from autograder import assignments
from conftest import ROOT

COLAB = "https://colab.research.google.com/github/{repo}/blob/main/exercises/{a}/{a}.ipynb"


def test_repository_is_configured_once():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["repository"]["url"] == coursekit.REPO_URL
    assert config["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert config["execute"]["execute_notebooks"] == "cache"
    assert "solutions/*" in config["exclude_patterns"] and "exercises/*" in config["exclude_patterns"]


@pytest.mark.parametrize("name", assignments())
def test_every_exercise_has_a_colab_badge(name):
    link = COLAB.format(repo=coursekit.REPO, a=name)
    assert link in (ROOT / "README.md").read_text(), f"README lacks the Colab badge for {name}"
    assert link in (ROOT / "book" / "assignments.md").read_text(), f"book/assignments.md lacks {name}"
    assert (ROOT / "exercises" / name / f"{name}.ipynb").exists()


@pytest.mark.parametrize("name", assignments())
def test_exercise_setup_cell_names_its_assignment(name):
    text = (ROOT / "exercises" / name / f"{name}.ipynb").read_text()
    assert f'assignment=\\"{name}\\"' in text
    assert f"git+{coursekit.REPO_URL}" in text


def test_toc_lists_every_page_and_only_existing_ones():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [ch["file"] for part in toc["parts"] for ch in part["chapters"]]
    for f in files:
        assert any((ROOT / f"{f}{ext}").exists() for ext in (".md", ".ipynb")), f"_toc.yml: {f} missing"
    pages = {str(p.relative_to(ROOT).with_suffix("")) for p in (ROOT / "book").glob("*.ipynb")}
    assert pages <= set(files), f"pages not in the table of contents: {sorted(pages - set(files))}"
    assert all(part.get("caption") for part in toc["parts"])


def test_device_choice_and_seeding(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert coursekit.get_device() == torch.device("cpu")
    coursekit.seed_everything(7)
    a = torch.randn(3)
    coursekit.seed_everything(7)
    assert float((torch.randn(3) - a).abs().max()) == 0.0
    monkeypatch.delenv("COURSE_DEVICE")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        assert coursekit.get_device().type == expected


def test_setup_notebook_reports_and_registers_assignment(capsys):
    device = coursekit.setup_notebook(seed=1, assignment="attention")
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out and f"device {device}" in out
    from coursekit import selfcheck

    assert selfcheck._current["assignment"] == "attention"
    with pytest.raises(ValueError, match="no self-checks for assignment 'nope'"):
        coursekit.setup_notebook(assignment="nope", quiet=True)


def test_repo_root_found():
    assert coursekit.repo_root() == ROOT


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/test.sh" in ci and re.search(r"^bash scripts/test.sh$", readme, re.M)
    assert re.search(r"^bash scripts/build.sh$", readme, re.M)
