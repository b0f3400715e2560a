"""Publish proves every file it writes (issue 34, item 10): a solution kept in a notebook's
metadata or attachments, a lightly reformatted solution, and a binary or an archive (a zip of
the solutions under data/) are each caught; the course's own data and the book's short common
lines still publish."""
from __future__ import annotations

import base64
import hashlib
import io
import re
import shutil
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.publish import PublishError, leaks, publish, secrets
from conftest import ROOT, fork_checkout as _fork

SOLUTION_RE = re.compile(r"### BEGIN SOLUTION(.*?)### END SOLUTION", re.S)


def _solution(assignment: str = "attention") -> str:
    """The longest solution region of an assignment (a whole function body or more)."""
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    regions = [r for c in nb.cells for r in SOLUTION_RE.findall(c.source)]
    return max(regions, key=len)


@pytest.fixture(scope="module")
def found():
    return secrets(ROOT)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    dest = tmp_path_factory.mktemp("proof") / "course"
    publish(dest, ROOT)
    return dest


def _planted(course: Path, tmp_path: Path) -> Path:
    planted = tmp_path / "planted"
    shutil.copytree(course, planted)
    return planted


def test_a_solution_in_metadata_or_attachments_is_caught(course, tmp_path, found):
    """Cell metadata, notebook metadata (a string or a list of lines) and an attachment (base64)
    are scanned as a cell's source is."""
    planted = _planted(course, tmp_path)
    assert leaks(planted, found) == []
    solution = _solution()
    page = planted / "book" / "02_multihead_attention.ipynb"
    nb = nbformat.read(page, as_version=4)
    nb.cells[-1].metadata["notes"] = solution
    nbformat.write(nb, page)
    nb = nbformat.read(planted / "book" / "03_positional_encoding.ipynb", as_version=4)
    nb.metadata["draft"] = {"answer": solution.splitlines(keepends=True)}
    nbformat.write(nb, planted / "book" / "03_positional_encoding.ipynb")
    nb = nbformat.read(planted / "exercises" / "attention" / "attention.ipynb", as_version=4)
    md = next(c for c in nb.cells if c.cell_type == "markdown")
    md.attachments = {"answer.txt": {"text/plain": base64.b64encode(solution.encode()).decode()}}
    nbformat.write(nb, planted / "exercises" / "attention" / "attention.ipynb")
    where = {k.split(":")[0] for k in leaks(planted, found)}
    assert where == {"book/02_multihead_attention.ipynb", "book/03_positional_encoding.ipynb",
                     "exercises/attention/attention.ipynb"}, where


def _reformat(code: str) -> str:
    """The same code, lightly disguised: comments gone, spaces moved, blank lines added,
    indentation halved, a local name changed throughout."""
    out = []
    for line in code.splitlines():
        line = re.sub(r"\s+#.*$", "", line)
        if line.strip().startswith("#") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        body = re.sub(r"\s*([=+*/,()\[\]])\s*", r"\1", line.strip())
        out += [" " * (indent // 2) + body, ""]
    text = "\n".join(out)
    names = [n for n in re.findall(r"^\s*([a-z_]\w*)\s*=", text, re.M) if n not in ("self",)]
    for name in names[:1]:
        text = re.sub(rf"\b{name}\b", f"{name}_renamed", text)
    return text


def test_a_reformatted_solution_is_caught(course, tmp_path, found):
    planted = _planted(course, tmp_path)
    for assignment, target in (("attention", "coursekit/notes.py"), ("modern_decoder", "book/notes.md")):
        disguised = _reformat(_solution(assignment))
        assert not set(disguised.splitlines()) & set(_solution(assignment).splitlines()) - {""}
        (planted / target).write_text(disguised + "\n")
    nb = nbformat.read(planted / "book" / "07_gpt.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(_reformat(_solution("llm_lab"))))
    nbformat.write(nb, planted / "book" / "07_gpt.ipynb")
    where = {k.split(":")[0] for k in leaks(planted, found)}
    assert {"coursekit/notes.py", "book/notes.md", "book/07_gpt.ipynb"} <= where, where


def test_short_common_lines_still_publish(course, tmp_path, found):
    """Single lines a solution shares with the book (``loss.backward()``, a softmax) are no leak."""
    planted = _planted(course, tmp_path)
    short = []
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for region in SOLUTION_RE.findall(cell.source):
                short += [ln.strip() for ln in region.splitlines()
                          if ln.strip() and not ln.strip().startswith("#") and len(ln.strip()) < 40][:1]
    assert len(short) > 10
    page = "\n\n".join(f"Step {i}: you will write\n\n    {line}\n\nand then read on." for i, line in enumerate(short))
    (planted / "book" / "common.md").write_text(page + "\nloss.backward()\noptimizer.step()\n")
    assert leaks(planted, found) == []


def _zip_of_solutions() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
            z.write(path, path.relative_to(ROOT).as_posix())
    return buf.getvalue()


def test_binary_and_archive_files_publish_only_when_listed_with_their_checksum(tmp_path):
    fork = _fork(tmp_path / "fork")
    manifest = (fork / "data" / "MANIFEST").read_text()
    listed = {line.split(None, 1)[1].strip() for line in manifest.splitlines()
              if line.strip() and not line.startswith("#")}
    on_disk = {p.relative_to(fork / "data").as_posix() for p in (fork / "data").rglob("*")
               if p.is_file() and p.name != "MANIFEST"}
    assert listed == on_disk and "small_ag_news/train.csv" in listed
    # a zip of the solutions under data/, unlisted: refused, nothing written
    (fork / "data" / "solutions.zip").write_bytes(_zip_of_solutions())
    with pytest.raises(PublishError, match=r"data/solutions\.zip: .*not listed in data/MANIFEST"):
        publish(tmp_path / "a", fork)
    assert not (tmp_path / "a").exists()
    # a binary elsewhere in what publish copies: refused too (only data/ lists files)
    (fork / "data" / "solutions.zip").unlink()
    (fork / "coursekit" / "checks" / "extra.gz").write_bytes(b"\x1f\x8b\x08\x00" + _zip_of_solutions())
    with pytest.raises(PublishError, match=r"coursekit/checks/extra\.gz: .*binary"):
        publish(tmp_path / "b", fork)
    (fork / "coursekit" / "checks" / "extra.gz").unlink()
    # a listed file whose bytes changed since it was listed: refused
    train = fork / "data" / "small_ag_news" / "train.csv"
    train.write_text(train.read_text() + "1,\"one more row\"\n")
    with pytest.raises(PublishError, match=r"data/small_ag_news/train\.csv: .*sha256"):
        publish(tmp_path / "c", fork)
    shutil.copy2(ROOT / "data" / "small_ag_news" / "train.csv", train)
    # a binary listed with its checksum publishes, byte for byte
    blob = bytes(range(256)) * 4
    (fork / "data" / "weights.bin").write_bytes(blob)
    with (fork / "data" / "MANIFEST").open("a") as f:
        f.write(f"{hashlib.sha256(blob).hexdigest()}  weights.bin\n")
    publish(tmp_path / "d", fork)
    assert (tmp_path / "d" / "data" / "weights.bin").read_bytes() == blob


# ------------------------------------------------------------ the exercises' solutions and answers (issue 38)

def test_the_student_course_holds_no_exercise_solution_and_no_answer(course, found):
    """The exercises are published (every chapter page ends with its own), their worked solutions
    and their answers are not: no file of instructor/, no {solution} directive, no answer in any form."""
    from autograder.authoring.publish import answers_found, exercise_answers, solutions_found

    answers = exercise_answers(ROOT)
    assert answers, "instructor/exercises/answers.json lists the compute exercises' answers"
    assert not (course / "instructor").exists()
    pages = sorted((course / "book").glob("*.ipynb"))
    assert pages and all("{exercise}" in p.read_text() for p in pages if p.name[:2].isdigit())
    assert answers_found(course, answers) == []
    assert solutions_found(course) == []


@pytest.mark.parametrize("form", ["digits", "separated", "rounded", "scientific", "mantissa"])
def test_an_answer_written_anywhere_in_a_form_a_student_might_search_is_caught(course, tmp_path, form):
    from autograder.authoring.publish import answers_found, exercise_answers

    planted = _planted(course, tmp_path)
    answers = exercise_answers(ROOT)
    written = {}
    for i, (name, value) in enumerate(sorted(answers.items())):
        text = {"digits": repr(value), "separated": f"{value:,.2f}" if abs(value) >= 100 else f"{value:,.6f}", "rounded": f"{value:.4g}",
                "scientific": f"{value:.3e}", "mantissa": f"{value:.4e}".replace("e+0", "e").replace("e+", "e")}[form]
        written[name] = text
        page = sorted((planted / "book").glob("*.ipynb"))[0]
        nb = nbformat.read(page, as_version=4)
        nb.cells[-1].metadata[f"note{i}"] = f"(the answer is {text}.)"  # in metadata, as anywhere
        nbformat.write(nb, page)
    caught = answers_found(planted, answers)
    assert {line.split("'s answer")[0].rsplit(" ", 1)[1] for line in caught} == set(answers), (written, caught)


def test_a_solution_page_or_its_code_copied_into_the_course_is_caught(course, tmp_path, found):
    from autograder.authoring.publish import solutions_found

    planted = _planted(course, tmp_path)
    solutions = ROOT / "instructor" / "exercises"
    page = (solutions / "scaling.md").read_text()
    (planted / "book" / "notes.md").write_text(page.replace("````{solution}", "Notes on"))  # the directive gone
    (planted / "coursekit" / "bpe.py").write_text(_reformat((solutions / "answers.py").read_text()))
    (planted / "book" / "more.md").write_text("```{solution} ex-13-1\nsee the lecture\n```\n")
    where = {k.split(":")[0] for k in leaks(planted, found)}
    assert {"book/notes.md", "coursekit/bpe.py"} <= where, where
    assert [k.split(":")[0] for k in solutions_found(planted)] == ["book/more.md"]



def test_the_student_courses_own_tests_name_only_what_they_import_or_define(tmp_path):
    """The test file publish writes into the student course (``STUDENT_TEST``) runs there on its
    own: every global name its tests read is imported or defined in that file (an import moved
    to the top of publish.py does not reach it)."""
    import builtins
    import dis
    import types

    from autograder.authoring.publish import STUDENT_TEST

    path = tmp_path / "tests" / "test_course.py"
    path.parent.mkdir()
    path.write_text(STUDENT_TEST)
    namespace = {"__file__": str(path), "__name__": "student_test_course"}
    exec(compile(STUDENT_TEST, str(path), "exec"), namespace)  # noqa: S102 - the course's own file

    def globals_read(code):
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_GLOBAL":
                yield ins.argval
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from globals_read(const)

    tests = {k: v for k, v in namespace.items() if k.startswith("test_") and callable(v)}
    assert tests
    for name, fn in tests.items():
        unknown = {n for n in globals_read(fn.__code__) if n not in namespace and not hasattr(builtins, n)}
        assert not unknown, f"{name} of the student course's tests reads {sorted(unknown)}, which its file never defines"
