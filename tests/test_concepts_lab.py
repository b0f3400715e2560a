"""End-to-end autograding of the `concepts` and `llm_lab` assignments.

Both mix autograded code with manually graded answers. What nbgrader reports for the
manually graded cells, checked below:

* an answer cell the student changed (the solution notebook holds the mark scheme there) is
  left for a person: ``auto_score`` and ``manual_score`` are None (its ``score`` reads 0
  until graded) and ``needs_manual_grade`` is True, as for the whole submission; so the
  submission's score is the autograded points out of a maximum that includes the manual ones;
* an answer cell left exactly as released gets ``auto_score`` 0 at once and needs no
  manual grading.

The lab's filled notebook is handed in with outputs of its own (as if run on SmolLM2, with
hostile text in them): the hand-grading page of Q6 to Q8 shows them, marked "as handed in",
escaped, beside the grader's re-run on the offline model.
"""
from __future__ import annotations

import nbformat
import pytest

from autograder.pipeline.run import grade
from conftest import ROOT, assert_hand_in_reports, filled_exercise, read_nb, set_solution

CONCEPTS = ROOT / "solutions" / "concepts" / "concepts.ipynb"
LAB = ROOT / "solutions" / "llm_lab" / "llm_lab.ipynb"

# points (see the tables at the top of the notebooks)
CONCEPTS_MAX, CONCEPTS_AUTO, HEAD_IMPORTANCE = 100, 10, 6
LAB_MAX, LAB_AUTO, TOP_P = 50, 24, 6
CONCEPTS_MANUAL = {f"q{i}_answer" for i in range(1, 16)}
LAB_MANUAL = {"q6_answer", "own_experiment", "q8_answer"}

# the classic off-by-one: a token is kept only while the mass *including* it is below p
WRONG_TOP_P = '''
if not 0 < p <= 1:
    raise ValueError(f"p must be in (0, 1], got {p}")
if p >= 1:
    return logits.clone()
probs = F.softmax(logits, dim=-1)
sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
drop = torch.cumsum(sorted_probs, dim=-1) >= p
drop[..., 0] = False
return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
'''

# loss with the head on minus loss with it off: the sign is wrong
WRONG_HEAD_IMPORTANCE = '''
x, y = batch
model.eval()
out = torch.zeros(model.config.n_layer, model.config.n_head)
with torch.no_grad():
    base = model(x, y)[1].item()
    for l, block in enumerate(model.transformer.h):
        for h in range(model.config.n_head):
            block.attn.head_mask[h] = 0.0
            out[l, h] = base - model(x, y)[1].item()
            block.attn.head_mask[h] = 1.0
return out
'''


def _manual_grades(grading_dir, assignment, student):
    """{grade_id: (auto_score, manual_score, needs_manual_grade)} of the manually graded
    cells, and the submission's needs_manual_grade."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{grading_dir / 'gradebook.db'}") as gb:
        sub = gb.find_submission(assignment, student)
        out = {}
        for nb in sub.notebooks:
            for g in nb.grades:
                if g.cell_type == "markdown" or g.name == "own_experiment":
                    out[g.name] = (g.auto_score, g.manual_score, g.needs_manual_grade)
        return out, sub.needs_manual_grade


@pytest.fixture(scope="module")
def concepts(tmp_path_factory):
    subs = tmp_path_factory.mktemp("concepts_subs")
    nbformat.write(filled_exercise("concepts"), subs / "full.ipynb")  # what a student hands in
    (subs / "untouched.ipynb").write_bytes((ROOT / "exercises" / "concepts" / "concepts.ipynb").read_bytes())
    nbformat.write(set_solution(read_nb(CONCEPTS), "head_importance", WRONG_HEAD_IMPORTANCE),
                   subs / "wrong_sign.ipynb")
    out = tmp_path_factory.mktemp("concepts_out")
    report = grade("concepts", subs, out_dir=out, grading_dir=out / "grading")
    return {r.student_id: r for r in report.results}, out / "grading"


# what the student's own run printed (another model than the grader's), with hostile text
HANDED_IN = {
    "load_model": "model used in this notebook: hub: HuggingFaceTB/SmolLM2-135M-Instruct (135M parameters)\n",
    "basic_experiments": "greedy  0.412  0.655  0.018  -0.871\n[Paris] 'The capital of France is Paris.'\n"
                         "<script>document.title='pwned'</script> \u202egnp.exe\x1b[31m red\x1b[0m\n",
    "own_experiment": "greedy, no repeated 3-grams  0.530\n" + "x" * 50_000 + "\nTHE END\n",
}


def _with_outputs(nb, texts):
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in texts:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=texts[gid]),
                            nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=",
                                                                          "text/plain": "<Figure size 640x420>"})]
    return nb


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    subs = tmp_path_factory.mktemp("lab_subs")
    nbformat.write(_with_outputs(filled_exercise("llm_lab"), HANDED_IN), subs / "full.ipynb")  # as handed in
    (subs / "untouched.ipynb").write_bytes((ROOT / "exercises" / "llm_lab" / "llm_lab.ipynb").read_bytes())
    nbformat.write(set_solution(read_nb(LAB), "top_p_filter", WRONG_TOP_P), subs / "wrong_top_p.ipynb")
    out = tmp_path_factory.mktemp("lab_out")
    report = grade("llm_lab", subs, out_dir=out, grading_dir=out / "grading")
    return {r.student_id: r for r in report.results}, out / "grading"


@pytest.mark.parametrize("which", ["concepts", "llm_lab"])
def test_hand_in_cell_reports_the_visible_checks(which, request):
    _, grading = request.getfixturevalue("concepts" if which == "concepts" else "lab")
    assert_hand_in_reports(grading, which)


def test_points_in_the_notebooks_add_up():
    for path, total, auto, manual in [(CONCEPTS, CONCEPTS_MAX, CONCEPTS_AUTO, CONCEPTS_MANUAL),
                                      (LAB, LAB_MAX, LAB_AUTO, LAB_MANUAL)]:
        cells = [c.metadata["nbgrader"] for c in read_nb(path).cells
                 if c.metadata.get("nbgrader", {}).get("grade")]
        assert sum(m["points"] for m in cells) == total
        assert {m["grade_id"] for m in cells if m["solution"]} == manual
        assert sum(m["points"] for m in cells if not m["solution"]) == auto


# fixture, assignment, maximum, autograded points, written answers (they wait for a person:
# 90 points of concepts, Q6 to Q8 with 26 points of the lab)
BATCHES = [("concepts", "concepts", CONCEPTS_MAX, CONCEPTS_AUTO, CONCEPTS_MANUAL),
           ("lab", "llm_lab", LAB_MAX, LAB_AUTO, LAB_MANUAL)]


@pytest.mark.parametrize("fixture, assignment, max_score, auto, manual_ids", BATCHES, ids=["concepts", "lab"])
def test_filled_exercise_gets_every_autograded_point(request, fixture, assignment, max_score, auto, manual_ids):
    res, grading = request.getfixturevalue(fixture)
    full = res["full"]
    assert full.status == "graded", full.message
    assert full.max_score == max_score
    assert full.score == auto
    manual, waiting = _manual_grades(grading, assignment, "full")
    assert set(manual) == manual_ids and waiting
    assert set(manual.values()) == {(None, None, True)}


@pytest.mark.parametrize("fixture, assignment", [b[:2] for b in BATCHES], ids=["concepts", "lab"])
def test_untouched_exercise_scores_zero(request, fixture, assignment):
    res, grading = request.getfixturevalue(fixture)
    assert res["untouched"].status == "graded", res["untouched"].message
    assert res["untouched"].score == 0
    manual, waiting = _manual_grades(grading, assignment, "untouched")
    assert set(manual.values()) == {(0.0, None, False)} and not waiting  # unchanged: 0 at once


def test_concepts_wrong_head_importance_loses_exactly_its_points(concepts):
    res, _ = concepts
    assert res["wrong_sign"].status == "graded", res["wrong_sign"].message
    assert res["wrong_sign"].score == CONCEPTS_AUTO - HEAD_IMPORTANCE


def test_lab_wrong_top_p_loses_exactly_its_points(lab):
    res, _ = lab
    assert res["wrong_top_p"].status == "graded", res["wrong_top_p"].message
    assert res["wrong_top_p"].score == LAB_AUTO - TOP_P  # sample_next and generate_tokens unaffected


def test_hand_grading_shows_the_outputs_as_handed_in_beside_the_rerun(lab):
    from autograder.records.handgrade import HandGrading, cell_page

    _, grading = lab
    cells = {c.grade_id: c for c in HandGrading("llm_lab", grading, ROOT).cells()}
    assert cells["q6_answer"].shown == ("load_model", "first_answer", "basic_experiments")
    full = next(a for a in cells["q6_answer"].answers if a.student_id == "full")
    runs = {gid: (mine, rerun) for gid, mine, rerun in full.outputs}
    assert "SmolLM2" in runs["load_model"][0] and "small GPT" in runs["load_model"][1]  # theirs, and the grader's
    mine = runs["basic_experiments"][0]
    assert "'The capital of France is Paris.'" in mine and "\x1b" not in mine and " red" in mine
    assert "greedy" in runs["basic_experiments"][1] and "Paris." not in runs["basic_experiments"][1]
    assert runs["first_answer"][0] == "" and "Oil prices" in runs["first_answer"][1]  # not in the file handed in
    long = {gid: mine for gid, mine, _ in next(a for a in cells["q8_answer"].answers
                                               if a.student_id == "full").outputs}["own_experiment"]
    assert len(long) < 7000 and long.endswith("THE END\n") and "characters left out" in long
    page = cell_page(HandGrading("llm_lab", grading, ROOT), cells["q6_answer"], "tok").decode()
    assert page.count("as handed in") >= 3 and "grader's re-run" in page
    assert "<script>" not in page and "&lt;script&gt;document.title" in page and "&lt;U+202E&gt;gnp.exe" in page
    untouched = next(a for a in cells["q8_answer"].answers if a.student_id == "untouched")
    assert [m for _, m, _ in untouched.outputs] == ["", ""]  # released without outputs


def test_lab_says_what_to_expect_from_the_offline_model(lab):
    """The grader's run (offline) measures the small GPT in the notebook itself: size, held-out
    perplexity against a uniform guess, diversity beside real news, one sample (issue 35, item 21)."""
    _, grading = lab
    nb = nbformat.read(grading / "autograded" / "full" / "llm_lab" / "llm_lab.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "offline_model")
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
    lines = {line.split(":")[0]: line for line in text.splitlines() if ":" in line}
    assert "parameters" in lines["offline model"] and "context of" in lines["offline model"]
    ppl = float(lines["held-out perplexity"].split()[2])
    vocab = int(lines["held-out perplexity"].rsplit(" ", 1)[1].rstrip(")").replace(",", ""))
    assert 1 < ppl < vocab  # better than a uniform guess, far from perfect
    assert "real news (held out)" in text and "one sample at temperature 1.0: [" in text
    # the offline chat model (issue 37): held-out topic accuracy with its interval, above a guess
    line = lines["offline chat model"]
    low = float(line.split("95% interval ")[1].split("%")[0])
    guess = float(line.split("a guess: ")[1].split("%")[0])
    assert low > guess == 25, line
