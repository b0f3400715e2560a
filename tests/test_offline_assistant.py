"""The offline assistant (coursekit.gpt.assistant): a Llama model pre-trained on AG News and
fine-tuned on instructions, its chat template, the answer-only SFT labels, the instruction
split, what the fine-tuned model can do, and its cache."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from coursekit.gpt import assistant as A  # noqa: E402

# a model small enough to train in a second or two: for the interface and the cache
TINY = dict(config=A.AssistantConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, context=32))
TINY_BASE = A.BaseSettings(steps=3, batch_size=4, eval_every=3, eval_batches=1)
TINY_CHAT = A.ChatSettings(steps=3, batch_size=4, n_train=64)


@pytest.fixture(scope="module")
def tok():
    return A.make_tokenizer()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = tmp_path_factory.mktemp("assistant-cache")
    base = A.load_or_train_base(verbose=False, settings=TINY_BASE, cache_dir=cache, **TINY)
    chat = A.load_or_train_chat(verbose=False, base_settings=TINY_BASE, settings=TINY_CHAT, cache_dir=cache, **TINY)
    return cache, base, chat


def test_models_are_llama_with_a_fast_tokenizer_and_the_info_asked_for(tiny):
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    _, (base, btok, binfo), (chat, ctok, cinfo) = tiny
    for model, tok, info, what in ((base, btok, binfo, "base"), (chat, ctok, cinfo, "chat")):
        assert isinstance(model, LlamaForCausalLM) and isinstance(tok, PreTrainedTokenizerFast)
        assert {"description", "history", "key", "path", "source"} <= set(info)
        assert info["source"] == "trained" and "\n" not in info["description"]
        assert f"offline {what} model" in info["description"] and "parameters" in info["description"]
        assert model.config.vocab_size == len(tok) and tok.chat_template == A.CHAT_TEMPLATE
        names = {n.rsplit(".", 2)[-2] for n, _ in model.named_parameters() if n.endswith(".weight")}
        assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= names  # what the seed's LoRA targets
    assert binfo["key"] != cinfo["key"]
    assert not torch.equal(base.model.layers[0].self_attn.q_proj.weight, chat.model.layers[0].self_attn.q_proj.weight)


def test_default_context_is_at_least_128_tokens():
    assert A.AssistantConfig().context >= 128


def test_lora_config_of_the_seed_applies_unchanged(tiny):
    peft = pytest.importorskip("peft")
    _, (base, _, _), _ = tiny
    import copy

    cfg = peft.LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], bias="none",
                          task_type="CAUSAL_LM")
    lora = peft.get_peft_model(copy.deepcopy(base), cfg)
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    n_layers = base.config.num_hidden_layers
    assert trainable == n_layers * 4 * 16 * (base.config.hidden_size * 2)  # A and B of every projection


def test_chat_template_round_trip(tok):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the topic of this headline? Stocks fall"},
                {"role": "assistant", "content": "Business"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == "<|system|> Be brief.<|end|>\n<|user|> What is the topic of this headline? Stocks fall<|end|>\n" \
                   "<|assistant|> Business<|end|>\n"
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert tok.decode(ids) == text
    for special in ("<|user|>", "<|assistant|>", "<|end|>"):  # one token each, never split
        assert ids.count(tok.convert_tokens_to_ids(special)) == text.count(special)
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|end|>\n<|assistant|>") and text.startswith(prompt)
    with pytest.raises(Exception, match="unknown chat role: tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_sft_labels_cover_the_answer_and_its_end_only(tok):
    pair = A.instruction_pairs("train", n=1)[0]
    enc = A.encode_chat(tok, pair["messages"])
    assert len(enc["input_ids"]) == len(enc["labels"])
    full = tok.apply_chat_template(pair["messages"], tokenize=True, return_dict=True)["input_ids"]
    assert enc["input_ids"] == full  # the same tokens as the template gives
    learned = [i for i, y in zip(enc["input_ids"], enc["labels"]) if y != -100]
    assert [y for y in enc["labels"] if y != -100] == learned
    assert tok.decode(learned) == " " + pair["messages"][1]["content"] + "<|end|>"
    first = enc["labels"].index(learned[0])
    assert set(enc["labels"][:first]) == {-100}  # the question and <|assistant|> are not learned
    # a two-turn conversation: both answers are learned, neither question
    two = pair["messages"] + [{"role": "user", "content": "Write a headline about sports."},
                              {"role": "assistant", "content": "Team wins"}]
    enc2 = A.encode_chat(tok, two)
    assert tok.decode([y for y in enc2["labels"] if y != -100]) == " " + pair["messages"][1]["content"] + "<|end|> Team wins<|end|>"


def test_instruction_pairs_shape_and_tasks():
    pairs = A.instruction_pairs("train")
    assert {p["task"] for p in pairs} == set(A.TASKS)
    for p in pairs[:50]:
        assert [m["role"] for m in p["messages"]] == ["user", "assistant"]
        assert p["label"] in A.TOPICS
        if p["task"] == "topic":
            assert p["messages"][1]["content"] == p["label"]
            assert p["messages"][0]["content"].endswith("\nWhat is the topic of this news?")
    counts = {t: sum(p["label"] == t and p["task"] == "topic" for p in pairs) for t in A.TOPICS}
    assert max(counts.values()) - min(counts.values()) <= 0.05 * max(counts.values())  # balanced topics
    assert A.instruction_pairs("train", n=5, seed=1) == A.instruction_pairs("train", seed=1)[:5]
    assert A.instruction_pairs("train", n=5, seed=1) != A.instruction_pairs("train", n=5, seed=2)
    with pytest.raises(ValueError, match="split='dev'"):
        A.instruction_pairs("dev")


def test_train_and_test_instructions_never_overlap():
    from coursekit.data import load_small_ag_news

    def news(pairs):  # the article text each pair was made from
        return {p["messages"][0]["content"].lower().split("\n")[0].removesuffix(" ...")[:60]
                for p in pairs if p["task"] == "topic"} | \
            {p["messages"][1]["content"].lower()[:60] for p in pairs if p["task"] == "headline"}

    train, test = A.instruction_pairs("train"), A.instruction_pairs("test")
    assert len(test) > 1000 and not news(train) & news(test)
    # the test questions come from AG News' test file
    test_text = " ".join(load_small_ag_news()["test"]["text"])
    for p in test[:40]:
        if p["task"] == "headline":
            assert p["messages"][1]["content"] in test_text


def test_wilson_interval():
    lo, hi = A.wilson_interval(50, 100)
    assert lo < 0.5 < hi and abs((0.5 - lo) - (hi - 0.5)) < 1e-9
    lo, hi = A.wilson_interval(0, 20)
    assert lo == 0.0 and 0.1 < hi < 0.2  # the rule of three's neighbourhood, never a zero width
    with pytest.raises(ValueError):
        A.wilson_interval(0, 0)


def test_chat_model_answers_held_out_topic_questions_better_than_chance():
    """The default chat model (from the course cache, else trained now: about 4 minutes)."""
    model, tok, info = A.load_or_train_chat(verbose=False)
    r = A.topic_accuracy(model, tok, A.instruction_pairs("test"))
    lo, _ = r["interval"]
    assert r["n"] >= 700
    assert lo > r["chance"], f"{r['correct']}/{r['n']} correct: the interval {r['interval']} includes chance"
    assert set(r["answers"]) & set(A.TOPICS)  # it answers with topic names


def test_base_model_writes_words():
    """The default base model's continuations of held-out article starts are mostly words of the
    course's text, not invented ones: more than half of the words it writes, beyond sampling noise
    (the 95% bootstrap interval over its continuations lies above one half). A vocabulary of 1,024
    pieces wrote about half words (issue 37), and a text in which every other word is invented reads
    as noise."""
    import random

    model, tok, _ = A.load_or_train_base(verbose=False)
    r = A.word_share(model, tok)
    assert r["words"] >= 300, r["samples"]
    assert (sum(k for k, _ in r["counts"]), sum(n for _, n in r["counts"])) == (r["known"], r["words"])
    # the words of one continuation are not independent draws: resample whole continuations
    rng, counts = random.Random(0), r["counts"]
    shares = sorted(sum(k for k, _ in c) / max(1, sum(n for _, n in c))
                    for c in ([rng.choice(counts) for _ in counts] for _ in range(2000)))
    lo, hi = shares[50], shares[1949]  # the 2.5th and 97.5th percentiles
    assert lo > 0.5, (f"{r['known']}/{r['words']} = {r['share']:.1%} known words, 95% interval {lo:.1%} to {hi:.1%}: "
                      f"{list(r['samples'].values())[:5]}")


def test_second_call_loads_from_the_cache(tiny):
    cache, (base, _, binfo), (chat, _, cinfo) = tiny
    again, tok, info = A.load_or_train_chat(verbose=False, base_settings=TINY_BASE, settings=TINY_CHAT,
                                            cache_dir=cache, **TINY)
    assert info["source"] == "cache" and info["key"] == cinfo["key"] and info["path"] == cinfo["path"]
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), chat.state_dict().values()))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<|user|> hi<|end|>\n"
    _, _, binfo2 = A.load_or_train_base(verbose=False, settings=TINY_BASE, cache_dir=cache, **TINY)
    assert binfo2["source"] == "cache"
    # other settings: another key, trained again
    other = A.BaseSettings(steps=4, batch_size=4, eval_every=4, eval_batches=1)
    _, _, binfo3 = A.load_or_train_base(verbose=False, settings=other, cache_dir=cache, **TINY)
    assert binfo3["source"] == "trained" and binfo3["key"] != binfo["key"]


def test_a_damaged_cache_entry_is_trained_again(tmp_path):
    _, _, info = A.load_or_train_base(verbose=False, settings=TINY_BASE, cache_dir=tmp_path, **TINY)
    (tmp_path / os.path.basename(info["path"]) / "model.safetensors").write_bytes(b"not a model")
    _, _, again = A.load_or_train_base(verbose=False, settings=TINY_BASE, cache_dir=tmp_path, **TINY)
    assert again["source"] == "trained"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap for a read-only mount")
def test_read_only_cache_still_gives_a_model(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    code = ("import os; from coursekit.gpt import assistant as A\n"
            "cfg = A.AssistantConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,"
            " num_key_value_heads=2, context=32)\n"
            "m, tok, info = A.load_or_train_chat(verbose=True, config=cfg, base_settings=A.BaseSettings(steps=2,"
            " batch_size=2, eval_every=2, eval_batches=1), settings=A.ChatSettings(steps=2, batch_size=2, n_train=8))\n"
            "print('SOURCE', info['source'], len(A.answer(m, tok, ['Write a headline about sports.'], 3)))\n")
    env = dict(os.environ, COURSE_CACHE_DIR=str(cache))
    proc = subprocess.run(["bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                           "--ro-bind", str(cache), str(cache), "--", sys.executable, "-c", code],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "SOURCE trained 1" in proc.stdout and "was not cached" in proc.stdout
    assert list(cache.iterdir()) == []


# ---------------------------------------------------------------- the LLM lab's offline chat backend

def test_load_llm_offline_gives_the_chat_model_when_asked_for_one(monkeypatch):
    from coursekit import llm

    monkeypatch.setenv("COURSE_MODEL_SOURCE", "offline")
    for name in ("COURSE_LLM_BACKEND", "COURSE_LLM_KIND", "COURSE_LLM_PINNED_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    chat = llm.load_llm(kind="chat", verbose=False)
    assert isinstance(chat, llm.LocalOfflineChat) and chat.kind == "chat" and chat.has_logits
    assert chat.description.startswith("offline: offline chat model")
    ids = chat.prompt_ids("Write a headline about sports.")
    assert chat.tokenizer.decode(ids[0]).endswith("<|assistant|>")
    logits = chat.next_logits(ids)
    assert logits.shape == (1, len(chat.tokenizer)) and logits.dtype == torch.float32
    # an answer ends at <|end|>: decode and the scores keep what comes before it
    end = chat.tokenizer.eos_token_id
    words = chat.tokenizer(" Sports", add_special_tokens=False)["input_ids"]
    assert chat.shown_length(words + [end, 5, 6]) == len(words) and chat.decode(words + [end, 5, 6]).strip() == "Sports"
    samples = chat.sample(["Yankees beat Red Sox. The Yankees won 5-3.\nWhat is the topic of this news?"], n_samples=2,
                          max_new_tokens=8, temperature=0)
    assert len(samples) == 2 and samples[0]["text"] == samples[1]["text"]
    # without kind="chat" the offline model is still the small GPT that continues text
    assert isinstance(llm.load_llm(verbose=False), llm.LocalSmallGPT)


def test_exported_chat_model_loads_with_the_auto_classes(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coursekit import llm

    folder = llm.export_offline_chat(tmp_path / "chat")
    model, tok, _ = A.load_or_train_chat(verbose=False)
    again = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok2 = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Write a headline about business."}]
    assert tok2.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok2.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        assert torch.allclose(again(ids).logits, model(ids).logits, atol=1e-5)
        out = again.generate(ids, max_new_tokens=40, do_sample=False)
    assert again.generation_config.eos_token_id == tok2.eos_token_id == tok2.convert_tokens_to_ids("<|end|>")
    # a server samples at the request's temperature only when sampling is the model's default
    g = again.generation_config
    assert g.do_sample is True and g.temperature == 1.0 and not g.top_k and g.top_p in (None, 1.0)
    new = out[0, ids.shape[1]:].tolist()
    assert tok2.eos_token_id in new, "generation stops at <|end|>"
    assert tok2.decode(new, skip_special_tokens=True).strip() == A.answer(model, tok, messages[0]["content"], 40)


def test_a_model_being_trained_elsewhere_is_waited_for(tmp_path, monkeypatch):
    """The base and chat models are cached like the small GPT: a second process needing the
    model while the first trains it waits, then reads the first one's copy."""
    import threading

    folder = tmp_path / "base-k"
    monkeypatch.setattr(A, "_load", lambda f, device: ("model", "tok", {"history": {"read": 1}})
                        if (f / "done").exists() else None)

    def save(model, tok, f, meta):
        f.mkdir()
        (f / "done").touch()

    monkeypatch.setattr(A, "_save", save)
    training, trained = threading.Event(), []

    class Model:
        def to(self, device):
            return self

    def train():
        trained.append(1)
        training.set()
        threading.Event().wait(1.0)  # the second caller arrives meanwhile
        return Model(), "tok", {"trained": 1}

    got = {}
    first = threading.Thread(target=lambda: got.setdefault("first", A._cached(folder, "k", "cpu", False, False,
                                                                              train, "model")[3]))
    first.start()
    assert training.wait(30)
    got["second"] = A._cached(folder, "k", "cpu", False, False, train, "model")[3]
    first.join()
    assert got == {"first": "trained", "second": "cache"} and trained == [1], (got, trained)
