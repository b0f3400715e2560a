"""End-to-end autograding of the post_training assignment (the answer-only SFT loss, a LoRA layer from
scratch, LoRA parameter counts, the DPO loss): the filled exercise scores every autograded point, the
untouched exercise 0, and planted mistakes lose exactly the points of their question, whether a visible
or only a hidden test catches them. The written answer (Q5) is graded by hand.

The reference answers are also checked against independent implementations: peft's LoRA layer and the
trainable-parameter count of peft on small random Llama models, and Hugging Face's -100 labels."""
from __future__ import annotations

import nbformat
import pytest

from autograder.pipeline.run import grade
from conftest import ROOT, assert_hand_in_reports, filled_exercise, read_nb
from mistakes_catalogue import CAUGHT, HIDDEN_ONLY

NAME = "post_training"
SOURCE = ROOT / "solutions" / NAME / f"{NAME}.ipynb"
EXERCISE = ROOT / "exercises" / NAME / f"{NAME}.ipynb"
# one planted mistake of every autograded question (a kernel each: kept few); the last two pass every
# visible check and fail a hidden test
PLANTED = {"logits_not_shifted": "Q1", "base_not_frozen": "Q2", "frozen_weights_counted": "Q3",
           "sign_flipped": "Q4", "bias_assumed": "Q2", "log_of_sigmoid": "Q4"}


def cells_of(nb) -> dict:
    return {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}


def question_points(question: str, part: str = "") -> int:
    """Autograded points of a question (of its hidden tests with part="hidden"), from the test cells' docstrings."""
    return sum(c.metadata["nbgrader"]["points"] for c in read_nb(SOURCE).cells
               if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")
               and c.source.lstrip('"').startswith(f"{question} {part}"))


def with_mistake(name: str):
    """The source notebook with one mistake of tests/mistakes_catalogue.py planted in its answer cell."""
    mistake = next(m for m in CAUGHT + HIDDEN_ONLY if m.assignment == NAME and m.name == name)
    nb = read_nb(SOURCE)
    cell = cells_of(nb)[mistake.cell]
    for old, new in mistake.edits:
        assert old in cell.source, f"{name}: the reference answer no longer contains {old!r}"
        cell.source = cell.source.replace(old, new)
    return nb


def namespace(*gids: str, mistake: str | None = None) -> dict:
    """The solution's cells ``gids`` run in this process on CPU (with a mistake planted)."""
    cells = cells_of(with_mistake(mistake) if mistake else read_nb(SOURCE))
    ns = {"DEVICE": "cpu"}
    for gid in ("imports",) + gids:
        exec(compile(cells[gid].source, f"<{NAME}/{gid}>", "exec"), ns)
    return ns


# an answer cell that hides an unfrozen base from the given helpers the tests call in the kernel
HELPERS_REPLACED = '''

def trainable_parameters(module):
    return {n: tuple(p.shape) for n, p in module.named_parameters() if p.requires_grad and not n.startswith("base.")}


def gradients_after_backward(module, x):
    module.zero_grad(set_to_none=True)
    module(x).sum().backward()
    return {n: None if p.grad is None or n.startswith("base.") else p.grad.detach().clone()
            for n, p in module.named_parameters()}
'''


def helpers_replaced():
    nb = with_mistake("base_not_frozen")
    cells_of(nb)["lora_linear"].source += HELPERS_REPLACED
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp(f"{NAME}_submissions")
    nbformat.write(filled_exercise(NAME), subs / "full.ipynb")
    (subs / "untouched.ipynb").write_bytes(EXERCISE.read_bytes())
    for name in PLANTED:
        nbformat.write(with_mistake(name), subs / f"{name}.ipynb")
    nbformat.write(helpers_replaced(), subs / "helpers_replaced.ipynb")
    out = tmp_path_factory.mktemp(f"{NAME}_out")
    report = grade(NAME, subs, out_dir=out, grading_dir=out / "grading")
    return {r.student_id: r for r in report.results}, out / "grading"


def test_points_as_designed():
    auto = {q: question_points(q) for q in ("Q1", "Q2", "Q3", "Q4")}
    assert auto == {"Q1": 6, "Q2": 8, "Q3": 4, "Q4": 6}
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
    lost, question = 24 - result.score, PLANTED[name]
    if any(m.name == name and m.assignment == NAME and m.kind == "hidden" for m in HIDDEN_ONLY):
        assert lost == question_points(question, "hidden"), f"{name} passes the visible test of {question} and fails its hidden test"
    else:
        assert lost == question_points(question), f"{name} loses all of {question}, nothing else"


def test_redefining_a_given_helper_fails_every_hidden_test_that_relies_on_the_helpers(graded):
    """The visible test of Q2 runs the kernel's helpers and is fooled; the hidden tests see the second definition."""
    result = graded[0]["helpers_replaced"]
    assert result.status == "graded", result.message
    assert 24 - result.score == sum(question_points(q, "hidden") for q in ("Q1", "Q2", "Q4"))


def test_hand_in_cell_reports_the_visible_checks(graded):
    assert_hand_in_reports(graded[1], NAME)


# ------------------------------------------------- the reference answers against independent implementations


@pytest.mark.parametrize("bias", [True, False])
def test_the_lora_layer_matches_peft(bias):
    import torch
    from peft import LoraConfig, get_peft_model

    ns = namespace("lora_linear")
    torch.manual_seed(0)
    base = torch.nn.Linear(9, 5, bias=bias)
    ours = ns["LoRALinear"](base, r=3, alpha=7)
    wrapper = torch.nn.Sequential()
    wrapper.add_module("proj", torch.nn.Linear(9, 5, bias=bias))
    wrapper.proj.load_state_dict(base.state_dict())
    peft_model = get_peft_model(wrapper, LoraConfig(r=3, lora_alpha=7, target_modules=["proj"], bias="none"))
    theirs = peft_model.base_model.model.proj
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(3, 9, generator=g), torch.randn(5, 3, generator=g)
    with torch.no_grad():
        ours.lora_A.copy_(a), ours.lora_B.copy_(b)
        theirs.lora_A["default"].weight.copy_(a), theirs.lora_B["default"].weight.copy_(b)
    x = torch.randn(4, 9, generator=g)
    with torch.no_grad():
        assert float((ours(x) - theirs(x)).abs().max()) <= 1e-5
        assert float((ours.merged()(x) - theirs(x)).abs().max()) <= 1e-5
    # a wrong scale differs from peft
    wrong = namespace("lora_linear", mistake="scaled_by_alpha")["LoRALinear"](base, r=3, alpha=7)
    with torch.no_grad():
        wrong.lora_A.copy_(a), wrong.lora_B.copy_(b)
        assert float((wrong(x) - theirs(x)).abs().max()) > 1e-2


TINY = [  # (n_layer, d_model, n_head, n_kv_head, head_size, d_ff, targets): n_head * head_size != d_model in two
    (2, 32, 4, 2, 8, 48, ("q_proj", "k_proj", "v_proj", "o_proj")),
    (3, 24, 6, 3, 6, 40, ("q_proj", "v_proj")),
    (2, 30, 3, 1, 12, 20, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    (1, 16, 4, 4, 6, 8, ("k_proj", "o_proj", "down_proj"))]


@pytest.mark.parametrize("dims", TINY, ids=lambda d: "-".join(map(str, d[:6])))
def test_the_count_equals_peft_on_random_llama_models(dims):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    n_layer, d_model, n_head, n_kv_head, head_size, d_ff, targets = dims
    config = LlamaConfig(vocab_size=50, hidden_size=d_model, intermediate_size=d_ff, num_hidden_layers=n_layer,
                         num_attention_heads=n_head, num_key_value_heads=n_kv_head, head_dim=head_size,
                         max_position_embeddings=32)
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules=list(targets),
                                                                bias="none", task_type="CAUSAL_LM"))
    peft_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ns = namespace("decoder_shapes", "lora_trainable_parameters")
    shape = ns["DecoderShape"]("tiny", n_layer, d_model, n_head, n_kv_head, head_size, d_ff)
    assert ns["lora_trainable_parameters"](shape, 4, list(targets)) == peft_count


def test_the_answer_only_loss_equals_minus_100_labels():
    import torch
    import torch.nn.functional as F

    ns = namespace("answer_only_loss")
    g = torch.Generator().manual_seed(2)
    logits, ids = torch.randn(3, 9, 11, generator=g), torch.randint(11, (3, 9), generator=g)
    prompt, mask = torch.tensor([2, 5, 1]), torch.tensor([[1] * 9, [1] * 7 + [0] * 2, [1] * 3 + [0] * 6])
    labels = ids.clone()
    for b in range(3):
        labels[b, :int(prompt[b])] = -100
    labels[mask == 0] = -100
    # what Hugging Face's causal LM loss does with these labels: shift inside, ignore -100
    want = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    assert abs(float(ns["answer_only_loss"](logits, ids, prompt, mask)) - float(want)) <= 1e-6
    wrong = namespace("answer_only_loss", mistake="padding_scored")["answer_only_loss"](logits, ids, prompt, mask)
    assert abs(float(wrong) - float(want)) > 1e-3


def test_the_worked_example_counts_are_the_reference_counts():
    """The counts the notebook states for Llama 3 8B are what its reference answer computes."""
    ns = namespace("decoder_shapes", "lora_trainable_parameters")
    llama = next(s for s in ns["PUBLISHED"] if s.name == "Llama 3 8B")
    stated = cells_of(read_nb(SOURCE))["q3_example"].source
    attn = ns["lora_trainable_parameters"](llama, 16, ns["ATTENTION"])
    every = ns["lora_trainable_parameters"](llama, 16, ns["ALL_LINEAR"])
    assert f"{attn:,} and {every:,} for Llama 3 8B" in stated
