"""Course-wide wiring: config, Colab links, plumbing."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

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


# ---------------------------------------------------------------- chapter numbers (issue 35, item 12)
# The book numbers its chapters itself, in the order of _toc.yml. A number typed into a text goes
# stale when a page moves, so texts name a chapter by a link to its page instead.
_TYPED_NUMBER = re.compile(r"\b(?:chapters?|ch\.)\s*\d+"        # "chapter 11", "Chapters 8 to 11", "ch. 12"
                           r"|\bfig(?:ure|s?\.)\s*\d+\.\d+",     # "Fig. 11.1", "figure 3.2": the book's numbering
                           re.I)
_NOT_PROSE = ("data/",)  # the data sets' own texts (news articles about Chapter 11 bankruptcies)


def typed_chapter_numbers(text: str) -> list[str]:
    """The chapter or figure numbers written by hand in ``text``."""
    return [m.group(0) for m in _TYPED_NUMBER.finditer(text)]


def test_typed_chapter_numbers_are_found():
    planted = ("and chapters 8 to 11 (assistants); see Ch. 12, Fig. 11.1 and figure 3.2; chapter\n7 trains it; "
               "the paper's Table 2.1, section 3 and Figure 2 are not the book's")
    assert typed_chapter_numbers(planted) == ["chapters 8", "Ch. 12", "Fig. 11.1", "figure 3.2", "chapter\n7"]


def test_no_text_states_a_chapter_number_by_hand():
    """Pages, notebooks, docs, README and code name chapters by link or title, never by number."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    me = Path(__file__).resolve().relative_to(ROOT).as_posix()
    found = []
    for name in filter(None, files):
        path = ROOT / name
        if name == me or name.startswith(_NOT_PROSE) or path.suffix not in {".ipynb", ".md", ".py", ".yml", ".txt"}:
            continue
        for hit in typed_chapter_numbers(path.read_text(errors="replace")):
            found.append(f"{name}: {hit!r}")
    assert not found, ("chapter numbers typed by hand (link the page instead, e.g. [*Scale arithmetic*]"
                       f"(10_scale_arithmetic.ipynb), or a {{numref}} role): {found[:10]}")


def _numbered_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [ch["file"] for part in toc["parts"] if part.get("numbered") for ch in part["chapters"]]


def test_file_numbers_follow_the_table_of_contents():
    """book/NN_name is the NN-th numbered chapter, so a page's file name and its number agree."""
    pages = _numbered_pages()
    numbers = [int(re.match(r"book/(\d+)_", p).group(1)) if re.match(r"book/(\d+)_", p) else None for p in pages]
    assert numbers == list(range(1, len(pages) + 1)), \
        f"_toc.yml order and file numbers disagree: {list(zip(range(1, len(pages) + 1), pages))}"
    unnumbered = sorted(p.stem for p in (ROOT / "book").glob("*.ipynb") if not re.match(r"\d+_", p.stem))
    assert not unnumbered, f"book pages without a number in their file name: {unnumbered}"


def test_renamed_pages_keep_their_old_address():
    """Every page name the book has dropped (git history) redirects to a page that exists."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]
    assert "sphinx_reredirects" in config["extra_extensions"]
    redirects = config["config"].get("redirects", {})
    for old, new in redirects.items():
        assert not (ROOT / f"{old}.ipynb").exists(), f"_config.yml redirects {old}, a page that exists"
        target = (ROOT / old).parent / new
        assert target.suffix == ".html" and target.with_suffix(".ipynb").exists(), \
            f"_config.yml redirects {old} to {new}, which is no page of the book"
    log = subprocess.run(["git", "log", "--diff-filter=DR", "--name-status", "--format=", "--", "book/"],
                         cwd=ROOT, capture_output=True, text=True)
    if log.returncode != 0:
        pytest.skip("no git history here (a published copy): the redirects are checked in the course repository")
    dropped = {Path(line.split("\t")[1]).with_suffix("").as_posix() for line in log.stdout.splitlines()
               if line[:1] in "DR" and line.split("\t")[1].endswith(".ipynb")}
    dropped = {d for d in dropped if not (ROOT / f"{d}.ipynb").exists()}
    missing = sorted(dropped - set(redirects))
    assert not missing, f"pages renamed or removed without a redirect in _config.yml (sphinx: config: redirects): {missing}"
