"""End-to-end autograding of the post_training assignment (the answer-only SFT loss, a LoRA layer from
scratch, LoRA parameter counts, the DPO loss): the filled exercise scores every autograded point, the
untouched exercise 0, and planted mistakes lose exactly the points of their question, whether a visible
or only a hidden test catches them. The written answer (Q5) is graded by hand.

The reference answers are also checked against independent implementations: peft's LoRA layer and the
trainable-parameter count of peft on small random Llama models, and Hugging Face's -100 labels."""
from __future__ import annotations

import pytest

import assignment_e2e as e2e
from conftest import ROOT, assert_hand_in_reports, read_nb

NAME = "post_training"
SOURCE = ROOT / "solutions" / NAME / f"{NAME}.ipynb"
# one planted mistake of every autograded question (a kernel each: kept few); the last two pass every
# visible check and fail a hidden test
PLANTED = {"logits_not_shifted": "Q1", "base_not_frozen": "Q2", "frozen_weights_counted": "Q3",
           "sign_flipped": "Q4", "bias_assumed": "Q2", "log_of_sigmoid": "Q4"}


cells_of = e2e.cells_of


def question_points(question: str, part: str = "") -> int:
    return e2e.question_points(NAME, question, part)


def with_mistake(mistake: str):
    return e2e.with_mistake(NAME, mistake)


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
    return e2e.grade_planted(tmp_path_factory, NAME, PLANTED, extra={"helpers_replaced": helpers_replaced()})


(test_points_as_designed, test_solution_scores_every_autograded_point_and_the_untouched_exercise_none,
 test_a_planted_mistake_loses_the_points_of_its_question) = e2e.end_to_end_tests(
    NAME, PLANTED, points={"Q1": 6, "Q2": 8, "Q3": 4, "Q4": 6}, written=[6])


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
