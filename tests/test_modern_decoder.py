"""End-to-end autograding of the modern_decoder assignment (rotary positions, grouped-query attention,
generation with a key-value cache, cache bytes): the filled exercise scores every autograded point, the
untouched exercise 0, and planted mistakes lose exactly the points of their question, whether a visible
or only a hidden test catches them. The written answer (Q5) is graded by hand."""
from __future__ import annotations

import pytest

import assignment_e2e as e2e
from conftest import ROOT, assert_hand_in_reports, read_nb

NAME = "modern_decoder"
SOURCE = ROOT / "solutions" / NAME / f"{NAME}.ipynb"
# one planted mistake of every autograded question; the last two pass every visible check
PLANTED = {"rotate_half_pairing": "Q1", "heads_grouped_by_modulo": "Q2", "no_cache": "Q3",
           "base_ignored": "Q1", "batch_ignored": "Q4",
           # rotary positions meet the cache (issue 35, item 18): the last two only warn in the visible test
           "rope_on_values": "Q2", "new_keys_offset_zero": "Q2", "cached_keys_rotated_twice": "Q2"}


def with_mistake(mistake: str):
    return e2e.with_mistake(NAME, mistake)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return e2e.grade_planted(tmp_path_factory, NAME, PLANTED)


# "warn": the visible test only warns (rotary positions meet the cache), a hidden test fails
(test_points_as_designed, test_solution_scores_every_autograded_point_and_the_untouched_exercise_none,
 test_a_planted_mistake_loses_the_points_of_its_question) = e2e.end_to_end_tests(
    NAME, PLANTED, points={"Q1": 6, "Q2": 8, "Q3": 6, "Q4": 4}, written=[6], hidden_kinds=("hidden", "warn"))


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
