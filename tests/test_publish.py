"""One course file, and the published student course: every link follows course.yml, the
student tree holds nothing of the instructor's, and re-hosting is one edit and one release."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.course.model import CourseFileError, load, parse
from autograder.authoring.publish import PublishError, leaks, publish, secrets
from autograder.authoring.stamp import check, setup_source
from conftest import ROOT, fork_checkout as _fork

COURSE_FILES = ["course.yml", "README.md", "_config.yml", "_toc.yml", "pyproject.toml", "requirements.txt",
                "nbgrader_config.py"]


def test_generated_files_match_the_course_file():
    """Setup cells, tables, launch buttons and coursekit's repository are what release writes
    from course.yml (run `python -m autograder release` after editing it)."""
    assert check(ROOT) == []


def _raw_points(path: Path) -> tuple[float, float]:
    """(auto, by hand) straight from the notebook's JSON: tests carry the first; answers a person
    grades (grade and solution) and task cells the second."""
    auto = hand = 0.0
    for cell in json.loads(path.read_text())["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        points = float(meta.get("points", 0) or 0)
        if meta.get("task") or (meta.get("grade") and meta.get("solution")):
            hand += points
        elif meta.get("grade"):
            auto += points
    return auto, hand


def test_the_readme_says_which_grading_steps_each_assignment_needs(tmp_path):
    """The grading-steps table of README.md follows the notebooks: one row per assignment of
    course.yml with its points graded automatically and by hand (issue 35: the sentence it
    replaced said finetune and project_aether needed only step 1, and uploads went out empty);
    a notebook whose points change makes the README stale."""
    course = load(ROOT)
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- grading-steps:start -->", 1)[1].split("<!-- grading-steps:end -->", 1)[0]
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(r"^\| `(\w+)` \| ([\d.]+) \| ([\d.]+) \| (.+) \|$",
                                                             table, re.M)}
    assert list(rows) == [a.id for a in course.assignments]
    for a in course.assignments:
        auto, hand = _raw_points(ROOT / "solutions" / a.id / a.notebook)
        got_auto, got_hand, steps = rows[a.id]
        assert (float(got_auto), float(got_hand)) == (auto, hand), a.id
        assert steps.startswith("1 only" if hand == 0 else "1–3"), (a.id, steps)
    assert any(float(r[1]) > 0 for name, r in rows.items() if name == "finetune")
    assert "need only step 1" not in readme
    # stale: a copy whose finetune written answers lost their points (the course files, no more)
    copy = tmp_path / "course"
    for name in ["course.yml", "README.md", "_config.yml", "_toc.yml", "book", "solutions", "coursekit/_course.py",
                 "instructor"]:
        src, dst = ROOT / name, copy / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    assert check(copy) == []
    path = copy / "solutions" / "finetune" / "finetune.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and meta.get("solution"):
            meta["points"] = 0
    nbformat.write(nb, path)
    assert check(copy) == [copy / "README.md"]


def test_every_notebook_has_the_one_setup_cell():
    course = load(ROOT)
    for a in course.assignments:
        nb = nbformat.read(ROOT / "solutions" / a.id / a.notebook, as_version=4)
        assert nb.cells[1].source == setup_source(course, a.id), a.id
    for page in sorted((ROOT / "book").glob("*.ipynb")):
        first = next(c for c in nbformat.read(page, as_version=4).cells if c.cell_type == "code")
        assert first.source == setup_source(course), page.name


def test_the_course_file_is_checked_key_by_key():
    base = {"title": "t", "repositories": {"student": {"name": "a/b"}, "instructor": {"name": "a/c"}},
            "assignments": {"x": {"title": "X"}}}
    assert parse(base, ROOT).assignment("x").grading.cell_timeout == 300
    for broken, needle in [({**base, "extra": 1}, "unknown key 'extra'"),
                           ({**base, "repositories": {"student": {"name": "nope"}, "instructor": {"name": "a/c"}}},
                            "owner/name"),
                           ({**base, "assignments": {"x": {"title": "X", "grading": {"cell_timeout": "slow"}}}},
                            r"cell_timeout must be a whole number \(int\), not str"),
                           ({**base, "assignments": {"x": {"title": "X", "models": ["gpt5"]}}}, "unknown model")]:
        with pytest.raises(CourseFileError, match=needle):
            parse(broken, ROOT)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    dest = tmp_path_factory.mktemp("student") / "course"
    files = publish(dest, ROOT)
    return dest, files


def test_the_student_course_holds_what_students_need_and_nothing_else(published):
    dest, files = published
    names = {p.relative_to(dest).parts[0] for p in files}
    assert {"book", "exercises", "coursekit", "data", "README.md", "requirements.txt", "pyproject.toml",
            "scripts", "tests", "_config.yml", "_toc.yml"} <= names
    assert not names & {"solutions", "autograder", "instructor", "course.yml", "nbgrader_config.py", "benchmarks",
                        "docs", "grading"}
    requirements = (dest / "requirements.txt").read_text().lower()
    assert "nbgrader" not in requirements and "torch==" in requirements
    assert "bubblewrap" not in (dest / "scripts" / "env.sh").read_text()
    meta = (dest / "pyproject.toml").read_text()
    # every package of coursekit is installed with it (coursekit.gpt, coursekit.remote: an import of
    # one left out works in this checkout and fails on Colab)
    listed = re.search(r"^packages = \[(.*)\]$", meta, re.M).group(1)
    on_disk = {".".join(p.parent.relative_to(dest).parts) for p in (dest / "coursekit").rglob("__init__.py")}
    assert {"coursekit.gpt", "coursekit.remote"} <= on_disk
    assert set(re.findall(r'"([\w.]+)"', listed)) == on_disk | {"coursekit.checks"} and "transformers>=" in meta
    assert 'course = "coursekit.sphinx_book:FigureRenderer"' in meta  # the book's alt text and captions


def test_no_solution_hidden_test_or_mark_scheme_reaches_the_student_course(published):
    dest, _ = published
    found = secrets(ROOT)
    assert len(found.lines) > 300 and len(found.windows) > 100  # the check looks for a lot
    assert leaks(dest, found) == []
    # and it would notice: plant one solution, one hidden test and one mark scheme
    planted = dest.parent / "planted"
    shutil.copytree(dest, planted)
    shutil.copy(ROOT / "solutions" / "attention" / "attention.ipynb", planted / "book" / "leak.ipynb")
    kinds = leaks(planted, found)
    assert any("def split_heads" in k or "split_heads(" in k for k in kinds)
    assert any("torch.einsum(\"btc,chd->bhtd\"" in k for k in kinds)  # a hidden test line
    aether = nbformat.read(ROOT / "solutions" / "project_aether" / "project_aether.ipynb", as_version=4)
    scheme = next(c.source for c in aether.cells if c.source.startswith("**Mark scheme"))
    (planted / "coursekit" / "notes.py").write_text('"""' + scheme + '"""\n')
    assert any(k.startswith("coursekit/notes.py") for k in leaks(planted, found))


def test_the_student_course_builds_its_book_and_runs_its_tests(published, tmp_path):
    """Its book builds (pages come from this checkout's execution cache when they are
    unchanged) and its own tests pass, with this checkout's packages."""
    dest, _ = published
    if (ROOT / "_build" / ".jupyter_cache").is_dir():
        shutil.copytree(ROOT / "_build" / ".jupyter_cache", dest / "_build" / ".jupyter_cache")
    jb = Path(sys.executable).parent / "jupyter-book"
    env = {**__import__("os").environ, "PYTHONPATH": str(dest)}
    proc = subprocess.run([str(jb), "build", ".", "--keep-going"], cwd=dest, capture_output=True, text=True,
                          env=env, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    html = (dest / "_build" / "html" / "book" / "assignments.html").read_text()
    course = load(ROOT)
    assert f"github/{course.student_repo.name}/blob/" in html
    assert leaks(dest / "_build" / "html", secrets(ROOT)) == []
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "tests"], cwd=dest, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_publish_refuses_a_folder_in_use(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "something").write_text("")
    with pytest.raises(PublishError, match="not empty"):
        publish(tmp_path / "x", ROOT)


def test_publish_goes_into_an_empty_clone_and_updates_it(tmp_path, published):
    """A fresh clone (nothing but .git) takes the course; publishing again into it removes what is
    no longer published and leaves alone what publish never wrote there (and .git)."""
    dest, files = published
    clone = tmp_path / "clone"
    (clone / ".git").mkdir(parents=True)
    (clone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert {p.relative_to(clone) for p in publish(clone, ROOT)} == {p.relative_to(dest) for p in files}
    (clone / "LICENSE").write_text("the instructor's own file\n")
    gone = "exercises/attention/attention.ipynb"
    manifest = clone / ".course-published"
    manifest.write_text(manifest.read_text() + "book/old_page.ipynb\n")  # published by an earlier version
    (clone / "book" / "old_page.ipynb").write_text("{}")
    publish(clone, ROOT)
    assert not (clone / "book" / "old_page.ipynb").exists() and (clone / gone).exists()
    assert (clone / "LICENSE").read_text() == "the instructor's own file\n"
    assert (clone / ".git" / "HEAD").exists()


def test_rehosting_is_one_edit_and_one_release(tmp_path):
    """A copy of the course moved to other repositories: after `release` and `publish`, no file
    of either tree names the old repositories, and every badge, setup cell and launch button
    names the new student repository."""
    course = load(ROOT)
    old = [course.student_repo.name, course.instructor_repo.name]
    copy = _fork(tmp_path / "fork")  # what a fork holds: nothing local
    text = (copy / "course.yml").read_text()
    text = text.replace(f"name: {old[0]},", "name: another-uni/transformers-2027,")
    text = text.replace(f"name: {old[1]},", "name: another-uni/transformers-2027-private,")
    (copy / "course.yml").write_text(text)
    proc = subprocess.run([sys.executable, "-m", "autograder", "release"], cwd=copy, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    student = tmp_path / "student"
    proc = subprocess.run([sys.executable, "-m", "autograder", "publish", str(student)], cwd=copy,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for tree in (copy, student):
        for path in tree.rglob("*"):
            if path.is_file() and path.suffix in (".md", ".ipynb", ".yml", ".py", ".json", ".toml", ".txt", ".sh"):
                body = path.read_text(errors="replace")
                for name in old:
                    assert f"{name}/" not in body and f"{name}@" not in body and f"{name}\n" not in body \
                        and f"{name})" not in body and f"{name}'" not in body, (path, name)
    assert "github.com/another-uni/transformers-2027\n" in (copy / "_config.yml").read_text()
    setup = json.loads((student / "exercises" / "attention" / "attention.ipynb").read_text())["cells"][1]
    assert "git+https://github.com/another-uni/transformers-2027@main" in "".join(setup["source"])
    readme = (student / "README.md").read_text()
    assert "colab.research.google.com/github/another-uni/transformers-2027/blob/main/exercises/attention" in readme
    assert "another-uni/transformers-2027-private" in (copy / "instructor" / "grade_on_colab.ipynb").read_text()


def test_publish_refuses_what_it_cannot_prove_clean(tmp_path):
    """Rendered exports of a solution (HTML, PDF, .py) left in exercises/ or book/, a draft page,
    a link, and a page with outputs each stop publish with one line naming the file (issue 25:
    an HTML export holds no line of the solution intact, so the line scan alone let it through)."""
    import zlib

    from autograder.authoring.publish import unproven

    fork = _fork(tmp_path / "fork")
    assert unproven(fork) == []
    solution = ROOT / "solutions" / "attention" / "attention.ipynb"
    for fmt, out in (("html", "exercises/attention"), ("python", "book")):
        proc = subprocess.run([sys.executable, "-m", "nbconvert", "--to", fmt, str(solution), "--output-dir",
                               str(fork / out)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
    # the book's theme folders publish: no rendered notebook there either, with or without markers
    shutil.copy(fork / "exercises" / "attention" / "attention.html", fork / "book" / "_templates" / "page.html")
    rendered = (fork / "exercises" / "attention" / "attention.html").read_text()
    (fork / "book" / "_static" / "notes.html").write_text(rendered.replace("BEGIN SOLUTION", "").replace(
        "END SOLUTION", "").replace("BEGIN HIDDEN TESTS", "").replace("END HIDDEN TESTS", ""))
    (fork / "exercises" / "attention" / "attention.pdf").write_bytes(
        b"%PDF-1.4\n" + zlib.compress(solution.read_bytes()))
    shutil.copy(ROOT / "book" / "07_gpt.ipynb", fork / "book" / "drafts_gpt.ipynb")
    (fork / "book" / "notes.md").symlink_to(solution)
    page = nbformat.read(fork / "book" / "02_multihead_attention.ipynb", as_version=4)
    code = next(c for c in page.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("display_data", {"text/html": "<b>an answer</b>"})]
    nbformat.write(page, fork / "book" / "02_multihead_attention.ipynb")

    found = unproven(fork)
    expected = {"exercises/attention/attention.html": "not a file publish can prove clean",
                "exercises/attention/attention.pdf": "not a file publish can prove clean",
                "book/attention.py": "not a file publish can prove clean",
                "book/drafts_gpt.ipynb": "not a file publish can prove clean",
                "book/notes.md": "a link",
                "book/02_multihead_attention.ipynb": "has outputs",
                "book/_templates/page.html": "grading marker",
                "book/_static/notes.html": "larger than a template"}
    assert len(found) == len(expected)
    for name, why in expected.items():
        assert any(line.startswith(f"{name}: ") and why in line for line in found), (name, found)
    proc = subprocess.run([sys.executable, "-m", "autograder", "publish", str(tmp_path / "student")], cwd=fork,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "exercises/attention/attention.html: not a file" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "student").exists()
