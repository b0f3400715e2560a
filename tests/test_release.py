"""solutions/ -> exercises/: deterministic, in sync, nothing leaks, nbgrader validates."""
from __future__ import annotations

import json

import pytest
from nbgrader.validator import Validator
from traitlets.config import Config

from autograder import assignments
from autograder.judge.nbconfig import configure
from autograder.authoring.release import release
from conftest import ROOT, read_nb, secret_lines, source_notebooks

ASSIGNMENTS = assignments()


def test_every_source_has_a_committed_exercise():
    assert ASSIGNMENTS, "no assignment in solutions/"
    for src in source_notebooks():
        ex = ROOT / "exercises" / src.parent.name / src.name
        assert ex.exists(), f"{ex.relative_to(ROOT)} missing: run `python -m autograder release`"


def test_release_is_deterministic_and_in_sync(tmp_path):
    """Regenerating gives files byte-identical to the committed exercises/, which an earlier
    run (another process, another day, maybe another machine) wrote: deterministic and in sync."""
    first = release(out_dir=tmp_path / "a")
    assert any(p.suffix == ".json" for p in first), "release must write the self-check specs"
    for p in first:
        rel = p.relative_to(tmp_path / "a")
        committed = (ROOT / "coursekit" / "checks" / rel.name if rel.parts[0] == ".checks"
                     else ROOT / "exercises" / rel)
        assert committed.exists(), f"{committed.relative_to(ROOT)} is not committed"
        assert p.read_bytes() == committed.read_bytes(), \
            f"{committed.relative_to(ROOT)} is out of date: run `python -m autograder release`"


@pytest.mark.parametrize("path", [p for p in (ROOT / "exercises").rglob("*.ipynb")], ids=str)
def test_committed_notebooks_have_no_outputs(path):
    nb = read_nb(path)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs committed"


@pytest.mark.parametrize("src", source_notebooks(), ids=lambda p: p.parent.name)
def test_no_solution_or_hidden_test_in_exercises(src):
    nb = read_nb(src)
    secrets = secret_lines(nb)
    assert len(secrets) > 10, "the leak check found almost nothing to look for"
    text = (ROOT / "exercises" / src.parent.name / src.name).read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    student_lines = {ln.strip() for c in read_nb(ROOT / "exercises" / src.parent.name / src.name).cells
                     for ln in c.source.splitlines()}
    leaked = secrets & student_lines
    assert not leaked, f"solution/hidden lines in the student notebook: {sorted(leaked)[:5]}"
    # the self-check's spec: visible test code, descriptions, titles, names; nothing secret
    spec = json.loads((ROOT / "coursekit" / "checks" / f"{src.parent.name}.json").read_text())
    spec_lines = {ln.strip() for t in spec["tests"] for ln in t["source"].splitlines()}
    spec_lines |= {ln.strip() for ln in json.dumps(spec, indent=1).splitlines()}
    leaked = secrets & spec_lines
    assert not leaked, f"solution/hidden lines in coursekit/checks/{src.parent.name}.json: {sorted(leaked)[:5]}"
    assert all(t["source"] == "" for t in spec["tests"] if t["hidden"]), "hidden tests must have no code in the spec"


def _validator(**kw) -> Validator:
    """nbgrader's Validator with the course's configuration (per-cell limit 300 s, not 30 s)."""
    c = Config()
    configure(c)
    return Validator(config=c, **kw)


# nbgrader validate (what `nbgrader validate` and the notebook server's Validate button do) with
# the course's configuration, on one assignment: that it reads course.yml's limits and runs a
# source notebook and its exercise as grading does.  That every assignment's reference answers
# earn every point and its untouched exercise none (so that no test cell passes on it) is checked
# by grading each one end to end: attention tests/test_autograde.py, concepts and llm_lab
# tests/test_concepts_lab.py, modern_decoder and post_training tests/assignment_e2e.py,
# project_aether and parameters_and_lora tests/test_arithmetic_assignments.py, finetune
# tests/test_finetune.py.  Validating the others too cost 80 s of the suite and checked nothing
# more (issue 36).
VALIDATED = "attention"


def test_nbgrader_validate_solution_passes():
    """nbgrader validate on the source notebook: every cell runs and every test passes."""
    src = ROOT / "solutions" / VALIDATED / f"{VALIDATED}.ipynb"
    result = _validator().validate(str(src))
    assert not result, f"nbgrader validate failed on {src.name}: {str(result)[:2000]}"


def test_nbgrader_validate_invert_on_exercise():
    """Untouched, every test cell with a visible assertion fails; only hidden-only cells pass."""
    exercise = ROOT / "exercises" / VALIDATED / f"{VALIDATED}.ipynb"
    result = _validator(invert=True).validate(str(exercise))
    passed = [c["source"] for c in result.get("passed", [])]
    hidden_only, visible = _test_cells(exercise)
    assert visible, "every assignment needs visible tests"
    assert len(passed) == len(hidden_only), f"cells passed on an untouched notebook: {passed}"


def _test_cells(exercise):
    """(hidden-only, visible) autograded test cells of a released notebook."""
    nb = read_nb(exercise)
    test_cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")
                  and not c.metadata["nbgrader"].get("solution") and c.cell_type == "code"]
    return ([c for c in test_cells if "assert" not in c.source], [c for c in test_cells if "assert" in c.source])


@pytest.mark.parametrize("src", source_notebooks(), ids=lambda p: p.parent.name)
def test_every_exercise_has_visible_tests_and_hidden_cells_keep_their_docstring(src):
    """Every released exercise has visible tests; a hidden-only cell keeps its one-line docstring."""
    hidden_only, visible = _test_cells(ROOT / "exercises" / src.parent.name / src.name)
    assert visible, "every assignment needs visible tests"
    for cell in hidden_only:
        assert cell.source.strip().startswith('"""') and len(cell.source.strip().splitlines()) == 1, \
            f"a hidden-only cell keeps only its one-line docstring: {cell.source[:200]!r}"


def _names_a_cell_binds(tree) -> set[str]:
    import ast

    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    names |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    names |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names}
    names |= {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}
    return names


@pytest.mark.parametrize("src", source_notebooks(), ids=lambda p: p.parent.name)
def test_visible_tests_use_only_names_defined_above_them(src):
    """Run from top to bottom, every name a visible test reads is defined by a cell above it: a
    helper defined further down made the correct finetune solution warn "NameError:
    tiny_classifier is not defined"."""
    import ast
    import builtins

    from autograder.authoring.release import _is_test, _names_used

    defined = set(dir(builtins)) | {"display", "In", "Out", "get_ipython"}  # what a kernel provides
    for cell in read_nb(ROOT / "exercises" / src.parent.name / src.name).cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        if _is_test(cell):
            own = _names_a_cell_binds(tree)
            used = {n for node in tree.body for n in _names_used(node)}
            missing = sorted(used - own - defined)
            assert not missing, (f"{src.parent.name}: visible test {cell.metadata['nbgrader']['grade_id']} "
                                 f"uses {missing}, defined only below it (or nowhere)")
        else:
            defined |= _names_a_cell_binds(tree)
