"""End-to-end autograding of the modern_decoder assignment (rotary positions, grouped-query attention,
generation with a key-value cache, cache bytes): the filled exercise scores every autograded point, the
untouched exercise 0, and planted mistakes lose exactly the points of their question, whether a visible
or only a hidden test catches them. The written answer (Q5) is graded by hand."""
from __future__ import annotations

import nbformat
import pytest

from autograder.pipeline.run import grade
from conftest import ROOT, assert_hand_in_reports, filled_exercise, read_nb
from mistakes_catalogue import CAUGHT, HIDDEN_ONLY

NAME = "modern_decoder"
SOURCE = ROOT / "solutions" / NAME / f"{NAME}.ipynb"
EXERCISE = ROOT / "exercises" / NAME / f"{NAME}.ipynb"
# one planted mistake of every autograded question; the last two pass every visible check
PLANTED = {"rotate_half_pairing": "Q1", "heads_grouped_by_modulo": "Q2", "no_cache": "Q3",
           "base_ignored": "Q1", "batch_ignored": "Q4",
           # rotary positions meet the cache (issue 35, item 18): the last two only warn in the visible test
           "rope_on_values": "Q2", "new_keys_offset_zero": "Q2", "cached_keys_rotated_twice": "Q2"}


def question_points(question: str) -> int:
    """Autograded points of a question, from the test cells' docstrings ("Q2 visible: ...")."""
    return sum(c.metadata["nbgrader"]["points"] for c in read_nb(SOURCE).cells
               if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")
               and c.source.lstrip('"').startswith(f"{question} "))


def with_mistake(name: str):
    """The source notebook with one mistake of tests/mistakes_catalogue.py planted in its answer cell."""
    mistake = next(m for m in CAUGHT + HIDDEN_ONLY if m.assignment == NAME and m.name == name)
    nb = read_nb(SOURCE)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == mistake.cell)
    for old, new in mistake.edits:
        assert old in cell.source, f"{name}: the reference answer no longer contains {old!r}"
        cell.source = cell.source.replace(old, new)
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp(f"{NAME}_submissions")
    nbformat.write(filled_exercise(NAME), subs / "full.ipynb")
    (subs / "untouched.ipynb").write_bytes(EXERCISE.read_bytes())
    for name in PLANTED:
        nbformat.write(with_mistake(name), subs / f"{name}.ipynb")
    out = tmp_path_factory.mktemp(f"{NAME}_out")
    report = grade(NAME, subs, out_dir=out, grading_dir=out / "grading")
    results = {r.student_id: r for r in report.results}
    return results, out / "grading"


def test_points_as_designed():
    auto = {q: question_points(q) for q in ("Q1", "Q2", "Q3", "Q4")}
    assert auto == {"Q1": 6, "Q2": 8, "Q3": 6, "Q4": 4}
    written = [c.metadata["nbgrader"]["points"] for c in read_nb(SOURCE).cells
               if c.metadata.get("nbgrader", {}).get("grade") and c.metadata["nbgrader"].get("solution")]
    assert written == [6]


def test_solution_scores_every_autograded_point(graded):
    full = graded[0]["full"]
    assert full.status == "graded", full.message
    assert full.max_score == 30 and full.score == 24  # 24 autograded + 6 graded by hand


def test_untouched_exercise_scores_zero(graded):
    untouched = graded[0]["untouched"]
    assert untouched.status == "graded", untouched.message
    assert untouched.score == 0 and untouched.max_score == 30


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_mistake_loses_the_points_of_its_question(graded, name):
    result = graded[0][name]
    assert result.status == "graded", result.message
    lost = 24 - result.score
    question = PLANTED[name]
    if any(m.name == name and m.assignment == NAME and m.kind in ("hidden", "warn") for m in CAUGHT + HIDDEN_ONLY):
        hidden = sum(c.metadata["nbgrader"]["points"] for c in read_nb(SOURCE).cells
                     if c.metadata.get("nbgrader", {}).get("grade") and c.source.lstrip('"').startswith(f"{question} hidden"))
        assert lost == hidden, f"{name} passes the visible test of {question} (at most a warning) and fails its hidden test"
    else:
        assert lost == question_points(question), f"{name} loses all of {question}, nothing else"


def test_hand_in_cell_reports_the_visible_checks(graded):
    assert_hand_in_reports(graded[1], NAME)


# ------------------------------------------- rotary positions meet the key-value cache (issue 35, item 18)


def decoder_namespace(mistake: str | None = None) -> dict:
    """The solution's cells up to the decoder, run in this process on CPU (with a mistake planted)."""
    nb = with_mistake(mistake) if mistake else read_nb(SOURCE)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in nb.cells}
    ns = {"DEVICE": "cpu"}
    for gid in ("imports", "apply_rope", "decoder_config", "grouped_query_attention", "decoder"):
        exec(compile(cells[gid], f"<{NAME}/{gid}>", "exec"), ns)
    return ns


def chunked_minus_full(ns: dict) -> float:
    """Largest difference between the logits of a text fed at once and fed as a prompt of 5, then one token at a time."""
    torch = ns["torch"]
    torch.manual_seed(3)
    model = ns["TinyDecoder"](ns["DecoderConfig"]()).eval()
    ids = torch.randint(50, (2, 12), generator=torch.Generator().manual_seed(4))
    full, _ = model(ids)
    parts, cache = [], None
    for a, b in [(0, 5)] + [(t, t + 1) for t in range(5, 12)]:
        logits, cache = model(ids[:, a:b], cache)
        parts.append(logits)
    return float((torch.cat(parts, 1) - full).abs().max())


def test_the_decoder_takes_its_positions_from_rope_in_the_attention():
    ns = decoder_namespace()
    model = ns["TinyDecoder"](ns["DecoderConfig"]())
    assert not hasattr(model, "wpe"), "the decoder has no learned position table: positions come from apply_rope"
    (gqa,) = [c.source for c in read_nb(SOURCE).cells if c.metadata.get("nbgrader", {}).get("grade_id") == "grouped_query_attention"]
    assert "apply_rope(q, offset=P)" in gqa and "apply_rope(k, offset=P)" in gqa
    # without positions the last token would see the same set of tokens in both orders, and give the same logits
    torch = ns["torch"]
    model.eval()
    a, b = model(torch.tensor([[3, 9, 5]]))[0][0, -1], model(torch.tensor([[9, 3, 5]]))[0][0, -1]
    assert float((a - b).abs().max()) > 1e-3, "the order of the earlier tokens must matter"


def test_chunked_decoding_equals_decoding_at_once():
    assert chunked_minus_full(decoder_namespace()) <= 1e-4


@pytest.mark.parametrize("mistake", ["new_keys_offset_zero", "cached_keys_rotated_twice"])
def test_a_rotary_mistake_with_the_cache_breaks_chunked_decoding(mistake):
    assert chunked_minus_full(decoder_namespace(mistake)) > 1e-2
