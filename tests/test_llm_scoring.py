"""How the LLM lab scores generated text (coursekit/llm/ and the lab's ``evaluate``).

A chat model's answer ends at its end-of-turn token: ``decode`` cuts everything after it off,
so the log-prob per token must count only the tokens ``decode`` keeps. The model here is a
tiny randomly initialised GPT-2 with a word-level tokenizer and a chat template, built in
memory (no hub, no training: fast tier); a ``next_logits`` that forces the end-of-turn token
in the middle of each row makes sure that tokens after it exist.
"""
from __future__ import annotations

import pytest
import torch

from conftest import ROOT, read_nb

WORDS = ["<|im_start|>", "<|im_end|>", "<unk>", "user", "assistant", "what", "is", "the", "capital",
         "of", "france", "paris", "it", "a", "city", "big", "river", "and"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")


@pytest.fixture(scope="module")
def chat_lm():
    """coursekit.llm.LocalHubChat around a tiny chat model (as the hub's SmolLM2 would be)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from coursekit.llm import LocalHubChat

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                        bos_token="<|im_start|>")
    tokenizer.chat_template = TEMPLATE
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(WORDS), n_positions=64, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                        eos_token_id=1, initializer_range=0.5)  # large weights: the tokens differ in log-prob
    model = GPT2LMHeadModel(config).eval()
    lm = LocalHubChat.__new__(LocalHubChat)
    lm.tokenizer, lm.model, lm.device, lm.name = tokenizer, model, torch.device("cpu"), "tiny chat"
    lm.end_of_turn = tokenizer.eos_token_id
    return lm


def _forcing(base, rows):
    """A next_logits (around ``base``) that writes ``rows[b]`` (token ids) after the prompt of row b."""
    def next_logits(ids):
        logits = base(ids)  # (B, V)
        step = ids.size(1) - _forcing.start
        for b, tokens in enumerate(rows):
            logits[b] = -1e4
            logits[b, tokens[step]] = 1e4
        return logits
    return next_logits


def _lab_tools(lm) -> dict:
    """The lab's Part A functions (the reference answers) and its experiment tools, run here with
    ``LM = lm``, as the notebook runs them."""
    nb = read_nb(ROOT / "solutions" / "llm_lab" / "llm_lab.ipynb")
    ns = {"LM": lm}
    for gid in ("imports", "apply_temperature", "top_k_filter", "top_p_filter", "sample_next", "generate_tokens",
                "experiment_tools"):
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
        exec(compile(cell.source, gid, "exec"), ns)  # noqa: S102 - the course's own notebook
    return ns


def test_chat_decode_stops_at_the_end_of_turn(chat_lm):
    eot, words = chat_lm.end_of_turn, chat_lm.tokenizer.convert_tokens_to_ids(["paris", "is", "big"])
    ids = torch.tensor(words[:2] + [eot] + words[2:])
    assert chat_lm.shown_length(ids) == 2
    assert chat_lm.decode(ids) == "paris is"
    assert chat_lm.shown_length(torch.tensor(words)) == 3  # no end of turn: all of it


def test_lab_scores_only_the_tokens_decode_shows(chat_lm):
    ns = _lab_tools(chat_lm)
    assert ns["LM"].kind == "chat" and ns["MAX_NEW_TOKENS"] > 0
    v = chat_lm.tokenizer.convert_tokens_to_ids
    eot = chat_lm.end_of_turn
    rows = [v(["paris", "is", "a"]) + [eot] + v(["big", "big", "river", "and"]),  # 3 shown, 4 after the end
            v(["it"]) + [eot] + v(["city", "city", "city", "city", "city", "city"]),  # 1 shown, 6 after
            v(["paris", "and", "river", "is", "a", "big", "city"]) + [eot]]        # 7 shown, the end last
    prompt = "what is the capital of france"
    _forcing.start = chat_lm.prompt_ids(prompt).size(1)
    samples = ns["run_setting"]([prompt], n_samples=3, max_new_tokens=8, next_logits=_forcing(chat_lm.next_logits, rows),
                                temperature=0)
    assert [s["text"] for s in samples] == ["paris is a", "it", "paris and river is a big city"]
    batch, start = samples[0]["ids"], samples[0]["start"]
    assert batch[:, start:].tolist() == rows  # the tokens after the end of turn are there
    logp = chat_lm.token_logprobs(batch, start)  # (3, 8): the plain model's log-prob of every token
    shown = [3, 1, 7]
    want = sum(float(logp[r, :n].mean()) for r, n in enumerate(shown)) / 3
    every_token = float(logp.mean())  # what counting the hidden tokens too gives
    assert abs(want - every_token) > 0.2, (want, every_token)  # the test can tell them apart
    got = ns["evaluate"](samples)["log-prob / token"]
    assert got == pytest.approx(want, abs=1e-6), f"log-prob / token {got:.4f}: the tokens after the end of turn " \
        f"were scored too (all tokens: {every_token:.4f}, shown tokens only: {want:.4f})"


def test_an_empty_answer_is_not_scored(chat_lm):
    ns = _lab_tools(chat_lm)
    v, eot = chat_lm.tokenizer.convert_tokens_to_ids, chat_lm.end_of_turn
    rows = [[eot] + v(["big", "river", "and"]), v(["paris", "is"]) + [eot, eot]]
    _forcing.start = chat_lm.prompt_ids("what is it").size(1)
    samples = ns["run_setting"](["what is it"], n_samples=2, max_new_tokens=4, next_logits=_forcing(chat_lm.next_logits, rows),
                                temperature=0)
    logp = chat_lm.token_logprobs(samples[0]["ids"], samples[0]["start"])
    assert samples[0]["text"] == ""
    assert ns["evaluate"](samples)["log-prob / token"] == pytest.approx(float(logp[1, :2].mean()), abs=1e-6)


def test_the_backends_sampler_reports_the_log_probs_of_the_shown_tokens(chat_lm, monkeypatch):
    v, eot = chat_lm.tokenizer.convert_tokens_to_ids, chat_lm.end_of_turn
    rows = [v(["paris", "is"]) + [eot] + v(["big", "city"])] * 2
    _forcing.start = chat_lm.prompt_ids("what is it").size(1)
    monkeypatch.setattr(chat_lm, "next_logits", _forcing(chat_lm.next_logits, rows))
    out = chat_lm.sample(["what is it"], n_samples=2, max_new_tokens=5, temperature=0)
    assert [s["text"] for s in out] == ["paris is"] * 2
    assert [len(s["logprobs"]) for s in out] == [2, 2]
