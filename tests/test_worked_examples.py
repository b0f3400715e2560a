"""A worked example's printed value tells a right answer from the usual wrong ones (issue 35, item 16).

A worked example prints a number and says what a correct answer prints; its visible check warns when
the number differs. That only helps if a wrong answer prints something else: the L2 norm of the whole
query tensor, which attention's Q1 example once printed, is the same for every way of cutting
``x @ w_q`` into heads, right or wrong. Each test runs the example cell of the source notebook (on
CPU, in this process) with the reference answer, and with each planted mistake of
tests/mistakes_catalogue.py that the example must tell apart, and reads the printed numbers.
"""
from __future__ import annotations

import contextlib
import io
import re

import pytest

from conftest import ROOT, read_nb
from mistakes_catalogue import CAUGHT, HIDDEN_ONLY

pytest.importorskip("torch")

# (assignment, cells to run in order (the answer among them), example cell, planted mistakes)
EXAMPLES = [
    ("attention", ("imports", "get_multihead_qkv", "q1_example"), "q1_example",
     ("heads_viewed_without_transpose", "transpose_missing", "heads_interleaved")),
    ("post_training", ("imports", "answer_only_loss", "q1_example"), "q1_example",
     ("logits_not_shifted", "mask_aligned_with_logits", "prompt_scored", "padding_scored", "mean_of_sequence_means")),
    ("post_training", ("imports", "dpo_loss", "q4_example"), "q4_example",
     ("sign_flipped", "beta_ignored", "beta_outside_the_sigmoid", "reference_ignored", "summed_over_the_batch")),
]
CLAIM = re.compile(r"(-?\d+\.\d+)\s+\(a correct answer prints (-?\d+\.\d+)\)")
TOLERANCE = 1e-3  # the tolerance the visible check allows for the printed value


def printed(name: str, cells: tuple[str, ...], example: str, mistake=None) -> list[tuple[float, float, int]]:
    """(printed value, claimed value, decimals of the claim) of each line of the example that states one."""
    nb = read_nb(ROOT / "solutions" / name / f"{name}.ipynb")
    source = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in nb.cells}
    ns, out = {"DEVICE": "cpu"}, io.StringIO()
    for gid in cells:
        code = source[gid]
        if mistake is not None and gid == mistake.cell:
            for old, new in mistake.edits:
                assert old in code, f"{mistake.id}: the reference answer no longer contains {old!r}"
                code = code.replace(old, new)
        with contextlib.redirect_stdout(out if gid == example else io.StringIO()):
            exec(compile(code, f"<{name}/{gid}>", "exec"), ns)
    return [(float(got), float(claim), len(claim.split(".")[1])) for got, claim in CLAIM.findall(out.getvalue())]


def _mistake(name: str, mistake: str):
    return next(m for m in CAUGHT + HIDDEN_ONLY if m.assignment == name and m.name == mistake)


@pytest.mark.parametrize("name, cells, example", [e[:3] for e in EXAMPLES], ids=[e[2] for e in EXAMPLES])
def test_the_reference_answer_prints_what_the_example_claims(name, cells, example):
    lines = printed(name, cells, example)
    assert lines, f"{name}/{example} prints no '(a correct answer prints ...)' after a number"
    for got, claim, decimals in lines:
        assert round(got, decimals) == claim, f"{name}/{example} prints {got} but claims {claim}"


@pytest.mark.parametrize("name, cells, example, mistake",
                         [(*e[:3], m) for e in EXAMPLES for m in e[3]], ids=lambda v: v if isinstance(v, str) else "")
def test_a_wrong_head_split_does_not_print_the_claimed_value(name, cells, example, mistake):
    lines = printed(name, cells, example, _mistake(name, mistake))
    assert lines, f"{name}/{example} prints no '(a correct answer prints ...)' after a number"
    assert any(abs(got - claim) > TOLERANCE for got, claim, _ in lines), \
        f"with the mistake {mistake}, {name}/{example} still prints what a correct answer prints: {lines}"
