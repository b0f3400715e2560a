"""End-to-end autograding of the two arithmetic assignments: project_aether and parameters_and_lora.

Manually graded cells (written answers, the Q3 plot) count towards max_score but autograding
never awards them: a submission that answered them scores 0 there until a grader does, and an
untouched one is zero automatically. So the solution scores exactly its autograded points.
"""
from __future__ import annotations

import nbformat
import pytest

from autograder.pipeline.run import grade
from conftest import ROOT, assert_hand_in_reports, filled_exercise, read_nb, set_solution


def paths(name):
    return ROOT / "solutions" / name / f"{name}.ipynb", ROOT / "exercises" / name / f"{name}.ipynb"


def points(name) -> tuple[int, int]:
    """(autograded points, manually graded points) of an assignment, from its source notebook."""
    auto = manual = 0
    for cell in read_nb(paths(name)[0]).cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            if meta.get("solution"):
                manual += meta["points"]
            else:
                auto += meta["points"]
    return auto, manual


def question_points(name, grade_ids) -> int:
    return sum(c.metadata["nbgrader"]["points"] for c in read_nb(paths(name)[0]).cells
               if c.metadata.get("nbgrader", {}).get("grade_id") in grade_ids)


def run_grading(tmp_path_factory, name, variants):
    source, exercise = paths(name)
    subs = tmp_path_factory.mktemp(f"{name}_submissions")
    nbformat.write(filled_exercise(name), subs / "full.ipynb")  # what a student hands in
    (subs / "untouched.ipynb").write_bytes(exercise.read_bytes())
    for sid, (grade_id, body) in variants.items():
        nbformat.write(set_solution(read_nb(source), grade_id, body), subs / f"{sid}.ipynb")
    out = tmp_path_factory.mktemp(f"{name}_out")
    report = grade(name, subs, out_dir=out, grading_dir=out / "grading")
    results = Graded({r.student_id: r for r in report.results})
    results.grading = out / "grading"
    return results


class Graded(dict):
    """Results by student id; .grading is the grading folder (autograded notebooks)."""
    grading = None


# ------------------------------------------------------------------------ project_aether

FFN_WITHOUT_BIASES = "return n_layers * 2 * hidden * 4 * hidden"

# right numbers, but counted by building the model: the question asks for a formula
FFN_BY_MODEL = '''
with torch.device("meta"):
    layers = [torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden))
              for _ in range(n_layers)]
return sum(p.numel() for layer in layers for p in layer.parameters())
'''

# a softmax that overflows for large logits
NAIVE_SOFTMAX = '''
z = [float(v) for v in logits]
p = math.exp(z[target_index]) / sum(math.exp(v) for v in z)
return p, -math.log(p)
'''


@pytest.fixture(scope="module")
def aether(tmp_path_factory):
    return run_grading(tmp_path_factory, "project_aether", {
        "ffn_no_bias": ("ffn_params", FFN_WITHOUT_BIASES),
        "ffn_by_model": ("ffn_params", FFN_BY_MODEL),
        "naive_softmax": ("mlm_probability_and_loss", NAIVE_SOFTMAX),
    })


def test_aether_points_as_designed():
    assert points("project_aether") == (22, 8)


def test_aether_solution_scores_all_autograded_points(aether):
    full = aether["full"]
    assert full.status == "graded", full.message
    assert full.max_score == 30  # 22 autograded + 8 graded by hand
    assert full.score == 22


def test_aether_untouched_exercise_scores_zero(aether):
    assert aether["untouched"].status == "graded", aether["untouched"].message
    assert aether["untouched"].score == 0
    assert aether["untouched"].max_score == 30


def test_aether_ffn_without_biases_loses_exactly_q5(aether):
    q5 = question_points("project_aether", {"test_ffn_params_basics", "test_ffn_params_values"})
    assert q5 == 4
    assert aether["ffn_no_bias"].score == 22 - q5  # Q8 substitutes correct helpers: no double penalty


def test_aether_ffn_counted_with_torch_loses_the_hidden_points(aether):
    assert aether["ffn_by_model"].score == 22 - question_points("project_aether", {"test_ffn_params_values"})


def test_aether_overflowing_softmax_loses_the_hidden_points(aether):
    lost = question_points("project_aether", {"test_mlm_probability_and_loss_values"})
    assert aether["naive_softmax"].score == 22 - lost


# ------------------------------------------------------------------- parameters_and_lora

ENCODER_WITHOUT_LAYER_NORMS = '''
d = d_model
per_layer = 4 * (d * d + d) + d * d_ff + d_ff + d_ff * d + d  # the two LayerNorms of each layer forgotten
extra = 2 * d * (int(embedding_norm) + int(final_norm))
return n_layers * per_layer + (vocab_size + max_len) * d + extra
'''


@pytest.fixture(scope="module")
def plora(tmp_path_factory):
    return run_grading(tmp_path_factory, "parameters_and_lora", {
        "no_layer_norms": ("encoder_params", ENCODER_WITHOUT_LAYER_NORMS),
    })


def test_plora_points_as_designed():
    assert points("parameters_and_lora") == (25, 11)


def test_plora_solution_scores_all_autograded_points(plora):
    full = plora["full"]
    assert full.status == "graded", full.message
    assert full.max_score == 36  # 25 autograded + 11 graded by hand (written answers and the plot)
    assert full.score == 25


def test_plora_untouched_exercise_scores_zero(plora):
    assert plora["untouched"].status == "graded", plora["untouched"].message
    assert plora["untouched"].score == 0


def test_plora_encoder_without_layer_norms_loses_exactly_q1(plora):
    q1 = question_points("parameters_and_lora", {"test_encoder_params_seed", "test_encoder_params_values"})
    assert q1 == 6
    assert plora["no_layer_norms"].status == "graded"
    assert plora["no_layer_norms"].score == 25 - q1


@pytest.mark.parametrize("fixture,name", [("aether", "project_aether"), ("plora", "parameters_and_lora")])
def test_hand_in_cell_reports_the_visible_checks(fixture, name, request):
    assert_hand_in_reports(request.getfixturevalue(fixture).grading, name)
