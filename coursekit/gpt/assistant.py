"""The course's offline assistant: a small Llama-style model that writes news-like text and,
after supervised fine-tuning (SFT), answers two kinds of simple instruction.

Without the hub the course still needs a causal model that (a) continues text recognisably,
(b) has a chat template and special tokens like a real instruction model, and (c) learns to
follow an instruction from a few thousand examples, so that the instruction-tuning page and
the LLM lab can show what SFT changes.  Everything is trained here, on the course's AG News
subset, within a few minutes of one CPU core:

* ``load_or_train_base()``: a transformers ``LlamaForCausalLM`` (RMSNorm, rotary positions,
  SwiGLU, the modules peft's LoRA targets: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``)
  pre-trained on the articles, with a ``PreTrainedTokenizerFast`` (the byte-level BPE of
  ``coursekit.gpt.tokenizer`` plus the chat tokens) whose ``chat_template`` is Jinja;
* ``instruction_pairs(split)``: the instructions, built from AG News: "<the start of an
  article> What is the topic of this news?" -> "Sports", and "Write a headline about
  business." -> a headline;
* ``load_or_train_chat()``: the base model after SFT on ``instruction_pairs("train")`` with the
  loss on the answer tokens only (``encode_chat`` builds the labels).

Both models are cached like the small GPT (``$COURSE_CACHE_DIR/assistant/<key>``, the key made
from the configuration, the settings, the data and the code version); a cache that cannot be
written (the read-only cache of a grading sandbox) only means the model is not kept.
``benchmarks/offline_assistant.py`` prints the training time and what the models can do.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from coursekit.data import load_small_ag_news
from coursekit.models import _quiet

from ._cache import CODE_VERSION, cache_root, load_or_build
from .tokenizer import BPETokenizer
from .train import ag_news_corpus, cpu_threads, get_batch

# Imports inside functions: transformers is imported where the chat model is built or loaded: importing
# coursekit.gpt for the small GPT does not load it.

__all__ = ["AssistantConfig", "BaseSettings", "ChatSettings", "TOPICS", "TASKS", "CHAT_TEMPLATE",
           "SPECIAL_TOKENS", "make_tokenizer", "instruction_pairs", "encode_chat", "load_or_train_base",
           "load_or_train_chat", "answer", "continue_text", "headline_of", "heldout_perplexity", "topic_accuracy",
           "word_share", "wilson_interval"]

TOPICS = ["World", "Sports", "Business", "Sci/Tech"]  # AG News' classes, in label order
TASKS = ("topic", "headline")
SPECIAL_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>"]
# Every turn is <|role|>, a space, the content, <|end|> and a line break; a prompt for the model ends
# in <|assistant|>.  The space makes an answer's first word the same token as inside a sentence
# (" Sports", not "S" "p" "orts").
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role'] + ' (use system, user or assistant)') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + '<|end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# the question comes after the news (the last words before the answer say what is asked), and
# shows the start of the article: a headline alone is too little for a model this small
_TOPIC_QUESTION = "{news}\nWhat is the topic of this news?"
_NEWS_WORDS = 24
_HEADLINE_REQUEST = "Write a headline about {topic}."
# Bump when the template, the tokenizer or the pre-training change what a cached base model would
# be (ASSISTANT_VERSION), or the instructions or SFT change the chat model (INSTRUCTIONS_VERSION).
ASSISTANT_VERSION = 3
INSTRUCTIONS_VERSION = 3
_TOPIC_WORDS = {"World": "world news", "Sports": "sports", "Business": "business", "Sci/Tech": "science and technology"}


@dataclass
class AssistantConfig:
    """The Llama model's size (``transformers.LlamaConfig`` fields)."""
    vocab_size: int = 2048        # BPE tokens learned from the text; the chat tokens come on top
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    context: int = 128            # tokens the model is trained on (max_position_embeddings)


@dataclass
class _Schedule:
    """What both training runs share: AdamW with warm-up and a cosine decay to ``min_lr``."""
    steps: int = 500
    batch_size: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    num_threads: int | None = 1


@dataclass
class BaseSettings(_Schedule):
    eval_every: int = 100
    eval_batches: int = 4


@dataclass
class ChatSettings(_Schedule):
    steps: int = 350
    batch_size: int = 32
    lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 20
    weight_decay: float = 0.0
    n_train: int | None = None    # instruction pairs used (None: all)


# ---------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------

def make_tokenizer(text: str | None = None, vocab_size: int = 2048, context: int = 128):
    """The course BPE (learned from ``text``, default the AG News training articles) as a
    ``PreTrainedTokenizerFast`` with the chat tokens and ``CHAT_TEMPLATE``."""
    from transformers import PreTrainedTokenizerFast

    text = text if text is not None else ag_news_corpus()["train"]
    bpe = BPETokenizer.load_or_train(text, vocab_size)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe.backend, model_max_length=context)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[:3], "eos_token": "<|end|>",
                            "pad_token": "<|pad|>"})
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"  # batched prompts end where generation starts
    return tok


# ---------------------------------------------------------------------------------------
# The instructions
# ---------------------------------------------------------------------------------------

def headline_of(text: str) -> str:
    """The headline of a course AG News text ("Title. Description"): the text before the first
    sentence end, or the first words when no short title can be found."""
    for i, ch in enumerate(text[:140]):
        if ch in ".!?" and (i + 1 == len(text) or text[i + 1] == " ") and i >= 8:
            head = text[: i + (ch != ".")].strip()
            if not head.endswith((" Inc", " Co", " U.S", " Corp", " St")):  # abbreviations
                return head
    return " ".join(text.split()[:10])


def _rows(split: str) -> list[tuple[str, int]]:
    ds = load_small_ag_news()["train" if split == "train" else "test"]
    return list(zip(ds["text"], ds["label"]))


def instruction_pairs(split: str = "train", n: int | None = None, seed: int = 0) -> list[dict]:
    """Instructions a small model can learn, from AG News (``split``: "train" uses the
    training file, "test" the test file; a test headline that also occurs in the training
    file is left out, so the two never overlap).

    Two tasks, one pair of each per article: ``topic`` (the first words of the article, then
    "What is the topic of this news?" -> one of ``TOPICS``) and ``headline`` ("Write a headline
    about sports." -> the article's headline).  Each pair is ``{"messages": [user, assistant], "task", "label"}``,
    ``label`` the topic name.  Shuffled with ``seed``; ``n`` keeps the first n."""
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r}: use 'train' or 'test'")
    if n is not None and (not isinstance(n, int) or n < 0):
        raise ValueError(f"n={n!r}: a number of pairs >= 0, or None for all")
    seen = set()
    if split == "test":
        seen = {headline_of(t).lower() for t, _ in _rows("train")}
    pairs, used = [], set()
    for text, label in _rows(split):
        head = headline_of(text)
        if head.lower() in seen or head.lower() in used:
            continue
        used.add(head.lower())
        topic = TOPICS[label]
        words = text.split()
        news = " ".join(words[:_NEWS_WORDS]) + (" ..." if len(words) > _NEWS_WORDS else "")
        pairs.append({"messages": [{"role": "user", "content": _TOPIC_QUESTION.format(news=news)},
                                   {"role": "assistant", "content": topic}], "task": "topic", "label": topic})
        pairs.append({"messages": [{"role": "user", "content": _HEADLINE_REQUEST.format(topic=_TOPIC_WORDS[topic])},
                                   {"role": "assistant", "content": head}], "task": "headline", "label": topic})
    random.Random(seed).shuffle(pairs)
    return pairs if n is None else pairs[:n]


def encode_chat(tokenizer, messages: list[dict], max_length: int | None = None) -> dict:
    """``input_ids`` of a whole conversation and ``labels`` for SFT: -100 (ignored by the loss)
    everywhere but the assistant's answers and the ``<|end|>`` that closes each of them, so
    the model learns to answer, not to ask.  Truncated to ``max_length`` tokens."""
    ids, labels = [], []
    for i, message in enumerate(messages):
        # the text of the conversation up to and including turn i, minus what came before
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False) if i else ""
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        part = upto[len(before):]
        if message["role"] == "assistant":
            opener = "<|assistant|>"
            head = tokenizer(opener, add_special_tokens=False)["input_ids"]
            body = tokenizer(part[len(opener):], add_special_tokens=False)["input_ids"]
            ids += head + body
            # learn the answer and the <|end|> that stops it; the line break after it is layout
            tail = len(body) - (body[-1:] == tokenizer("\n", add_special_tokens=False)["input_ids"])
            labels += [-100] * len(head) + body[:tail] + [-100] * (len(body) - tail)
        else:
            piece = tokenizer(part, add_special_tokens=False)["input_ids"]
            ids += piece
            labels += [-100] * len(piece)
    if max_length is not None:
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "labels": labels}


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------

def _lr(step, s) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def _optimizer(model, s):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.99))


def _build(config: AssistantConfig, tokenizer):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=config.hidden_size,
                      intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
                      num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                      max_position_embeddings=config.context, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, max_new_tokens=48,
                                               do_sample=False)
    return model


@torch.no_grad()
def _val_loss(model, data, context, s, generator) -> float:
    model.eval()
    losses = [model(input_ids=x, labels=x).loss.item()
              for x, _ in (get_batch(data, context, s.batch_size, generator) for _ in range(s.eval_batches))]
    model.train()
    return sum(losses) / len(losses)


def _ids(tokenizer, text: str) -> list[int]:
    """The ids of a long text (the whole corpus: no warning about the model's context)."""
    return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


def _train_base(config, s, corpus, tokenizer, log):
    train = torch.tensor(_ids(tokenizer, corpus["train"]))
    val = torch.tensor(_ids(tokenizer, corpus["val"]))
    torch.manual_seed(s.seed)
    model = _build(config, tokenizer)
    opt = _optimizer(model, s)
    batches = torch.Generator().manual_seed(s.seed + 1)
    evals = torch.Generator().manual_seed(s.seed + 2)
    history = {"step": [], "train_loss": [], "val_step": [], "val_loss": [], "seconds": 0.0}
    start = time.perf_counter()
    model.train()
    with cpu_threads(s.num_threads):
        for step in range(s.steps):
            for group in opt.param_groups:
                group["lr"] = _lr(step, s)
            x, _ = get_batch(train, config.context, s.batch_size, batches)  # the model shifts the labels itself
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            opt.step()
            history["step"].append(step)
            history["train_loss"].append(loss.item())
            if (step + 1) % s.eval_every == 0 or step == s.steps - 1:
                history["val_step"].append(step)
                history["val_loss"].append(_val_loss(model, val, config.context, s, evals))
                if log:
                    log(f"base step {step + 1}/{s.steps}: train loss {loss.item():.3f}, "
                        f"val loss {history['val_loss'][-1]:.3f} ({time.perf_counter() - start:.0f} s)")
    history["seconds"] = time.perf_counter() - start
    return model.eval(), history


def _pad_batch(examples, pad_id):
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id)
    labels = torch.full((len(examples), width), -100)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):  # right padding: positions start at 0 in every row
        n = len(e["input_ids"])
        ids[i, :n] = torch.tensor(e["input_ids"])
        labels[i, :n] = torch.tensor(e["labels"])
        mask[i, :n] = 1
    return ids, labels, mask


def _answer_loss(logits, labels):
    """Cross-entropy on the answer tokens only (labels -100 elsewhere), averaged per example and
    then over the batch: a one-word answer (a topic) weighs as much as a fifteen-token headline."""
    logits, labels = logits[:, :-1].float(), labels[:, 1:]  # position t predicts token t + 1
    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100,
                                                  reduction="none")  # (B, T - 1), 0 where ignored
    counted = (labels != -100).sum(1).clamp(min=1)
    return (per_token.sum(1) / counted).mean()


def _train_chat(model, tokenizer, context, s, log):
    pairs = instruction_pairs("train", n=s.n_train, seed=s.seed)
    examples = [encode_chat(tokenizer, p["messages"], context) for p in pairs]
    opt = _optimizer(model, s)
    order = random.Random(s.seed + 1)
    history = {"step": [], "train_loss": [], "seconds": 0.0, "pairs": len(examples)}
    start = time.perf_counter()
    model.train()
    with cpu_threads(s.num_threads):
        for step in range(s.steps):
            for group in opt.param_groups:
                group["lr"] = _lr(step, s)
            ids, labels, mask = _pad_batch(order.sample(examples, min(s.batch_size, len(examples))),
                                           tokenizer.pad_token_id)
            loss = _answer_loss(model(input_ids=ids, attention_mask=mask).logits, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            opt.step()
            history["step"].append(step)
            history["train_loss"].append(loss.item())
            if log and ((step + 1) % 100 == 0 or step == s.steps - 1):
                log(f"chat step {step + 1}/{s.steps}: answer loss {loss.item():.3f} "
                    f"({time.perf_counter() - start:.0f} s)")
    history["seconds"] = time.perf_counter() - start
    return model.eval(), history


# ---------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------

def _key(kind: str, payload: dict, corpus: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(corpus):
        digest.update(name.encode() + b"\0" + corpus[name].encode() + b"\0")
    import transformers

    text = json.dumps({"kind": kind, **payload, "data": digest.hexdigest(), "version": CODE_VERSION,
                       "assistant": ASSISTANT_VERSION,
                       "transformers": transformers.__version__.split(".")[0]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _load(folder: Path, device):
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    try:
        meta = json.loads((folder / "course-meta.json").read_text())
        with _quiet():
            model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
            tok = PreTrainedTokenizerFast.from_pretrained(folder)
    except Exception:  # noqa: BLE001 - missing, partial or damaged: train again
        return None
    tok.padding_side = "left"
    return model.to(device).eval(), tok, meta


def _save(model, tokenizer, folder: Path, meta: dict) -> None:
    """Write beside ``folder`` and rename, so that nobody reads half a model."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        with _quiet():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        (tmp / "course-meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if folder.exists():  # damaged, or retrain=True
            old = folder.parent / f".{folder.name}-old-{os.getpid()}"
            os.replace(folder, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process saved the same key meanwhile: keep its copy
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _describe(what, model, config, history, source) -> str:
    n = sum(p.numel() for p in model.parameters())
    loss = history.get("val_loss", [None])[-1]
    tail = f", validation loss {loss:.3f}" if loss is not None else ""
    return (f"{what} ({source}): Llama-style, {config.num_hidden_layers} layers, width {config.hidden_size}, "
            f"context {config.context} tokens, {n:,d} parameters{tail}")


def _cached(folder: Path, key: str, device, retrain: bool, verbose: bool, train, what: str):
    """``(model, tokenizer, history, source)``: from ``folder`` when a model was cached there
    (unless ``retrain``), else from ``train()``, then cached; a read-only cache leaves it uncached."""
    def build():
        model, tok, history = train()
        try:
            _save(model, tok, folder, {"key": key, "history": history})
        except OSError as err:  # e.g. the read-only cache of a grading sandbox
            if verbose:
                print(f"(the {what} was not cached: {err})")
        return model.to(device), tok, {"history": history}

    (model, tok, meta), source = load_or_build(folder, lambda: _load(folder, device), build, retrain)
    return model, tok, meta["history"], source


def load_or_train_base(device=None, verbose=True, retrain=False, config: AssistantConfig | None = None,
                       settings: BaseSettings | None = None, cache_dir=None):
    """The pre-trained base model: ``(model, tokenizer, info)``, loaded from the cache when the
    same configuration, settings and data were trained before, else trained now (about two
    minutes of one CPU core with the defaults) and cached.  ``info``: ``description`` (one
    line), ``history`` (losses), ``key``, ``path``, ``source`` ("cache" or "trained")."""
    config, settings = config or AssistantConfig(), settings or BaseSettings()
    device = torch.device(device) if device is not None else torch.device("cpu")
    corpus = ag_news_corpus()
    key = _key("base", {"config": asdict(config), "train": asdict(settings)}, corpus)
    folder = cache_root(cache_dir, "assistant") / f"base-{key}"

    def train():
        if verbose:
            print(f"training the offline base model ({settings.steps} steps; cached afterwards in {folder})")
        tok = make_tokenizer(corpus["train"], config.vocab_size, config.context)
        model, history = _train_base(config, settings, corpus, tok, print if verbose else None)
        return model, tok, history

    model, tok, history, source = _cached(folder, key, device, retrain, verbose, train, "trained model")
    description = _describe("offline base model", model, config, history, source)
    if verbose:
        print(description)
    return model, tok, {"description": description, "history": history, "key": key, "path": str(folder),
                        "source": source}


def load_or_train_chat(device=None, verbose=True, retrain=False, config: AssistantConfig | None = None,
                       base_settings: BaseSettings | None = None, settings: ChatSettings | None = None,
                       cache_dir=None):
    """The base model after supervised fine-tuning on ``instruction_pairs("train")`` (loss on
    the answers only): ``(model, tokenizer, info)`` like ``load_or_train_base``, cached too.
    ``info["history"]`` holds the base model's losses under "base" and the SFT losses."""
    config, base_settings, settings = config or AssistantConfig(), base_settings or BaseSettings(), \
        settings or ChatSettings()
    device = torch.device(device) if device is not None else torch.device("cpu")
    corpus = ag_news_corpus()
    key = _key("chat", {"config": asdict(config), "base": asdict(base_settings), "train": asdict(settings),
                        "instructions": INSTRUCTIONS_VERSION}, corpus)
    folder = cache_root(cache_dir, "assistant") / f"chat-{key}"

    def train():
        model, tok, base = load_or_train_base("cpu", verbose, False, config, base_settings, cache_dir)
        if verbose:
            print(f"fine-tuning it on instructions ({settings.steps} steps; cached afterwards in {folder})")
        model, history = _train_chat(model, tok, config.context, settings, print if verbose else None)
        return model, tok, {**history, "base": base["history"], "val_loss": base["history"]["val_loss"]}

    model, tok, history, source = _cached(folder, key, device, retrain, verbose, train, "fine-tuned model")
    description = _describe("offline chat model", model, config, history, source) + \
        f", fine-tuned on {history['pairs']:,d} instructions"
    if verbose:
        print(description)
    return model, tok, {"description": description, "history": history, "key": key, "path": str(folder),
                        "source": source}


@torch.no_grad()
def _continue(model, ids, max_new_tokens, stop, temperature, generator) -> list[int]:
    """New token ids after ``ids`` (1, T), with the key-value cache, up to ``stop`` (excluded)."""
    new, past, step_ids = [], None, ids.to(model.device)
    for _ in range(max_new_tokens):
        result = model(input_ids=step_ids, past_key_values=past, use_cache=True)
        past = result.past_key_values
        logits = result.logits[0, -1].float().cpu()
        if temperature and temperature > 0:
            nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator))
        else:
            nxt = int(logits.argmax())
        if nxt == stop:
            break
        new.append(nxt)
        step_ids = torch.tensor([[nxt]], device=model.device)
    return new


def answer(model, tokenizer, prompts, max_new_tokens: int = 24, temperature: float = 0.0, seed: int = 0):
    """The model's answers to user messages ``prompts`` (a str gives a str, a list a list), one
    at a time, greedy when ``temperature`` is 0, each ending where the model writes ``<|end|>``."""
    single = isinstance(prompts, str)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for prompt in [prompts] if single else prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        new = _continue(model, ids, max_new_tokens, tokenizer.eos_token_id, temperature, gen)
        out.append(tokenizer.decode(new, skip_special_tokens=True).strip())
    return out[0] if single else out


def continue_text(model, tokenizer, text: str, max_new_tokens: int = 24, temperature: float = 0.0,
                  seed: int = 0) -> str:
    """What the model writes after ``text`` as plain text (no chat turns), up to a line break
    (the end of an article) or ``max_new_tokens``."""
    ids = torch.tensor([_ids(tokenizer, "\n" + text)])
    newline = _ids(tokenizer, "\n")[0]
    new = _continue(model, ids, max_new_tokens, newline, temperature, torch.Generator().manual_seed(seed))
    return tokenizer.decode(new, skip_special_tokens=True)


@torch.no_grad()
def heldout_perplexity(model, tokenizer, text: str | None = None, context: int = 128, max_windows: int | None = None) -> float:
    """exp(mean next-token loss) on ``text`` (default: the AG News test articles, never trained
    on), cut into consecutive windows of ``context`` tokens."""
    text = text if text is not None else ag_news_corpus()["val"]
    ids = torch.tensor(_ids(tokenizer, text))
    windows = ids[: len(ids) // context * context].view(-1, context)[:max_windows]
    total, count = 0.0, 0
    for batch in windows.split(32):
        loss = model(input_ids=batch.to(model.device), labels=batch.to(model.device)).loss.item()
        total += loss * batch.numel()
        count += batch.numel()
    return math.exp(total / count)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % with z = 1.96)."""
    if n <= 0:
        raise ValueError(f"n={n}: an interval needs at least one trial")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def topic_accuracy(model, tokenizer, pairs: list[dict] | None = None, n: int | None = None) -> dict:
    """How often the model's greedy answer to a held-out topic question is exactly the right
    topic: ``{"correct", "n", "accuracy", "interval" (95 % Wilson), "chance": 0.25, "answers"}``."""
    pairs = pairs if pairs is not None else instruction_pairs("test")
    pairs = [p for p in pairs if p["task"] == "topic"][:n]
    got = answer(model, tokenizer, [p["messages"][0]["content"] for p in pairs], max_new_tokens=12)
    correct = sum(a == p["label"] for a, p in zip(got, pairs))
    return {"correct": correct, "n": len(pairs), "accuracy": correct / len(pairs),
            "interval": wilson_interval(correct, len(pairs)), "chance": 1 / len(TOPICS), "answers": got}


def word_share(model, tokenizer, n_prompts: int = 40, max_new_tokens: int = 24, temperature: float = 0.8) -> dict:
    """Whether the model writes words: the share of the words (runs of letters) in its
    continuations of held-out article starts (the first three words of the first ``n_prompts``
    AG News test articles, sampled at ``temperature``, seeds 0, 1, ...) that occur somewhere in
    the course's AG News text.  An invented word ("Crension") counts against it, a real word the
    articles never use too, so it is a floor on how much of the text a reader recognises:
    ``{"share", "words", "known", "samples", "counts"}`` (``samples``: prompt -> continuation;
    ``counts``: (known, words) of each continuation, in the prompts' order, for an interval that
    resamples whole continuations)."""
    corpus = ag_news_corpus()
    vocabulary = set(re.findall(r"[a-z]+", (corpus["train"] + corpus["val"]).lower()))
    starts = [" ".join(line.split()[:3]) for line in corpus["val"].splitlines()[:n_prompts]]
    samples, counts = {}, []
    for seed, start in enumerate(starts):
        text = continue_text(model, tokenizer, start, max_new_tokens, temperature, seed)
        words = re.findall(r"[a-z]+", text.lower())
        counts.append((sum(w in vocabulary for w in words), len(words)))
        samples[start] = text
    known, total = sum(k for k, _ in counts), sum(n for _, n in counts)
    return {"share": known / max(1, total), "words": total, "known": known, "samples": samples, "counts": counts}
