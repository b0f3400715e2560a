"""A small GPT that the book (chapter 7) and the assignments share.

nanoGPT-style: a config dataclass and four small modules (``CausalSelfAttention``,
``MLP``, ``Block``, ``GPT``), a byte-level BPE tokenizer learned from the course's AG News
text, a training loop, and a cache so that a model trained once (by the book page, say) is
reused by every notebook that asks for the same configuration.

Why BPE with a small vocabulary (1,024 tokens), and not words or characters: the training
split has about 470,000 characters and 75,000 words in some 19,000 distinct forms, more
than half of them seen only once.  A word-level vocabulary would need an "unknown" token
for much of the text and for most names in a prompt, and could learn little about rare
forms.  Characters need no unknown token, but half a minute of CPU training is not enough
for a model to learn spelling and words as well.  Byte-level BPE (the scheme of GPT-2) keeps
frequent words whole, spells rare ones from pieces, encodes any string, and learns its
merges from the text in a fraction of a second (cached on disk afterwards); a text becomes
about 2.5 characters per token.

Sizes and steps are chosen for the time budget of a book page, about 40 seconds of training
on one CPU core.  At that budget many steps of a small model beat fewer steps of a larger
one: 1,000 steps of a 2-layer, width-64 model reach a lower validation loss per character
than 350 steps of a 3-layer, width-96 model with 2,048 tokens, at about the same cost.

Generation takes a callable ``pick_next(logits) -> ids`` so that the decoding rules
(temperature, top-k, top-p) can be written elsewhere: the LLM lab asks students to
write them, and reference solutions of graded functions never live in coursekit.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
from torch.nn import functional as F

__all__ = ["GPTConfig", "TrainSettings", "BPETokenizer", "CausalSelfAttention", "MLP", "Block",
           "GPT", "greedy", "generate", "ag_news_corpus", "get_batch", "train_small_gpt",
           "load_or_train_small_gpt", "cache_key", "cpu_threads", "SMALL_GPT_CONFIG"]

# Bump when the model code, the tokenizer or the training loop changes in a way that
# changes the trained weights: cached models made by another version are not reused.
CODE_VERSION = 2


# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------

@dataclass
class GPTConfig:
    vocab_size: int = 1024    # token ids: the BPE tokenizer learns this many from the training text
    block_size: int = 48      # longest context in tokens (about 120 characters of news text)
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64          # model width C; head size hs = C // n_head
    dropout: float = 0.0      # off by default; worth trying (0.1) for runs much longer than the default
    bias: bool = True         # biases in the linear layers and LayerNorms, as in GPT-2


@dataclass
class TrainSettings:
    steps: int = 1000         # optimiser steps
    batch_size: int = 32      # windows per step, each block_size tokens long
    lr: float = 3e-3          # peak learning rate (small models tolerate a large one)
    min_lr: float = 3e-4      # the cosine schedule ends here
    warmup: int = 30          # linear warm-up steps
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100     # validation loss every this many steps (and at the end)
    eval_batches: int = 4


# The default model of the course: with the default TrainSettings it trains in about 40
# seconds on one CPU core (1,000 steps of 32 x 48 tokens, 0.17M parameters).
SMALL_GPT_CONFIG = GPTConfig()


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------

class BPETokenizer:
    """Byte-level BPE (the algorithm of GPT-2) with a small vocabulary learned from the
    training text.  Every string can be encoded: unknown characters fall back to bytes."""

    def __init__(self, backend):
        self.backend = backend  # a tokenizers.Tokenizer

    @classmethod
    def train(cls, text: str, vocab_size: int = 1024) -> "BPETokenizer":
        """Learn ``vocab_size - 256`` merges from ``text``, one article per line (deterministic)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        backend = Tokenizer(models.BPE())
        # GPT-2's pre-tokenizer: split before spaces and punctuation, map bytes to printable symbols
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        # keep the line breaks that separate articles: train on lines that end in "\n"
        backend.train_from_iterator((line + "\n" for line in text.split("\n")), trainer)
        return cls(backend)

    @classmethod
    def load_or_train(cls, text: str, vocab_size: int = 1024, cache_dir=None) -> "BPETokenizer":
        """``train``, cached on disk: the merges learned from the same text with the same
        vocabulary size (and the same ``tokenizers`` and code versions) are read back
        instead of learned again.  The cache lives in ``$COURSE_CACHE_DIR/bpe`` unless
        ``cache_dir`` is given; a missing or damaged entry is simply trained again."""
        import tokenizers

        digest = hashlib.sha256(f"{vocab_size}\0{tokenizers.__version__}\0{CODE_VERSION}\0".encode())
        digest.update(text.encode())
        path = _cache_root(cache_dir, "bpe") / f"{digest.hexdigest()[:16]}.json"
        try:
            return cls.from_str(path.read_text())
        except Exception:  # noqa: BLE001 - missing, partial or damaged: train again
            pass
        tokenizer = cls.train(text, vocab_size)
        try:  # write beside the target and rename, so a reader never sees half a file
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".json", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                f.write(tokenizer.to_str())
            os.replace(tmp, path)
        except OSError:  # a read-only or full disk only costs the time to train again
            pass
        return tokenizer

    @classmethod
    def from_str(cls, data: str) -> "BPETokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(data))

    def to_str(self) -> str:
        return self.backend.to_str()

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.backend.decode(list(ids))

    def tokens(self, text: str) -> list[str]:
        """The pieces ``text`` is split into, as readable strings."""
        return [self.decode([i]) for i in self.encode(text)]

    def __repr__(self) -> str:
        return f"BPETokenizer({self.vocab_size} tokens)"


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t only sees positions 0..t."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        # queries, keys and values of all heads in one matrix product
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # True on and below the diagonal: the keys each query may look at
        causal = torch.ones(config.block_size, config.block_size, dtype=torch.bool).tril()
        self.register_buffer("causal", causal.view(1, 1, config.block_size, config.block_size),
                             persistent=False)
        # One multiplier per head on its output; 0 switches a head off (head ablation).
        # Not saved with the weights: it is an experiment knob, not part of the model.
        self.register_buffer("head_mask", torch.ones(config.n_head), persistent=False)
        # True: compute the attention weights explicitly and keep the last ones in .weights
        # (for plots and analysis); False: torch's fused kernel, same result and faster
        self.keep_weights = False
        self.weights = None

    def forward(self, x):
        B, T, C = x.size()                                                # (B, T, C)
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)                # 3 x (B, T, C)
        # split the channels into heads: head i owns channels i*hs .. (i+1)*hs - 1
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)                 # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)                 # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)                 # (B, nh, T, hs)
        if self.keep_weights:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))       # (B, nh, T, T)
            # a future key gets -inf, so its weight after the softmax is exactly 0
            att = att.masked_fill(~self.causal[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)                                  # (B, nh, T, T)
            self.weights = att.detach()
            y = self.attn_dropout(att) @ v                                # (B, nh, T, hs)
        else:
            # the same computation in one fused call that never stores the (T, T) weights
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        y = y * self.head_mask.view(1, self.n_head, 1, 1)                 # ablated heads give 0
        y = y.transpose(1, 2).contiguous().view(B, T, C)                  # heads side by side: (B, T, C)
        return self.resid_dropout(self.c_proj(y))                         # (B, T, C)


class MLP(nn.Module):
    """The position-wise feed-forward network: C -> 4C -> C with a GELU."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):                                                 # (B, T, C)
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))         # (B, T, C)


class Block(nn.Module):
    """A pre-norm Transformer block: x + attn(LN(x)), then x + mlp(LN(x)).

    Normalising the input of each sublayer (GPT-2's arrangement) leaves the residual
    path untouched from the embeddings to the output, which keeps training stable
    without a long warm-up.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):                                                 # (B, T, C)
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x                                                          # (B, T, C)


class GPT(nn.Module):
    """Token and position embeddings, a stack of blocks, a final LayerNorm and a
    linear map back to the vocabulary (sharing its weights with the token embedding)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),   # token embedding
            wpe=nn.Embedding(config.block_size, config.n_embd),   # learned position embedding
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: the same matrix embeds a token and scores it as the next token
        # (fewer parameters, and rare tokens get gradient from both uses).
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # Each block adds two residual branches; scaling their output projections by
        # 1/sqrt(2 * n_layer) keeps the variance of the residual stream from growing with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Number of parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None):
        """Logits for the next token at every position, and the mean cross-entropy
        against ``targets`` when given (``targets[b, t]`` is the token after ``idx[b, t]``)."""
        B, T = idx.size()                                                 # (B, T) token ids
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)                          # (T,)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)         # (B, T, C)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)                                                  # (B, T, C)
        logits = self.lm_head(self.transformer.ln_f(x))                   # (B, T, V)
        loss = None
        if targets is not None:
            # flatten (B, T, V) -> (B*T, V): one classification problem per position
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss


# ---------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------

def greedy(logits):
    """The default ``pick_next``: the most likely token of each row (lowest id on ties)."""
    return logits.argmax(dim=-1)


@torch.no_grad()
def generate(model: GPT, idx, max_new_tokens: int, pick_next: Callable = greedy):
    """Append ``max_new_tokens`` tokens to each row of ``idx`` (B, T) and return (B, T + max_new_tokens).

    ``pick_next(logits)`` gets the (B, V) logits for the next position and returns (B,)
    token ids; sampling rules live in that callable, not here.  The model runs in eval
    mode (no dropout) and is put back in its previous mode afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            # the model has learned positions only up to block_size: keep the most recent tokens
            context = idx[:, -model.config.block_size:]                    # (B, <= block_size)
            logits, _ = model(context)                                    # (B, T, V)
            nxt = pick_next(logits[:, -1, :])                             # (B,) or (B, 1)
            nxt = torch.as_tensor(nxt, device=idx.device).reshape(idx.size(0), 1).to(idx.dtype)
            idx = torch.cat([idx, nxt], dim=1)                            # (B, T + 1)
    finally:
        model.train(was_training)
    return idx


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------

def ag_news_corpus() -> dict[str, str]:
    """The small AG News subset as two long strings, one article per line:
    ``{"train": ..., "val": ...}`` (the dataset's train and test splits)."""
    from coursekit.data import load_small_ag_news

    ds = load_small_ag_news()
    return {"train": "\n".join(ds["train"]["text"]) + "\n",
            "val": "\n".join(ds["test"]["text"]) + "\n"}


def get_batch(data, block_size: int, batch_size: int, generator: torch.Generator | None = None):
    """Random windows of a 1-D tensor of ids: inputs x and next-token targets y, both (B, T).

    ``y`` is ``x`` shifted left by one position: the target at position t is the token
    that follows position t in the text.
    """
    starts = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([data[s: s + block_size] for s in starts.tolist()])          # (B, T)
    y = torch.stack([data[s + 1: s + 1 + block_size] for s in starts.tolist()])  # (B, T)
    return x, y


# ---------------------------------------------------------------------------------------
# Training and the cache
# ---------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    model: GPT
    tokenizer: BPETokenizer
    history: dict = field(default_factory=dict)  # step, train_loss, val_step, val_loss, seconds


def _lr_at(step: int, s: TrainSettings) -> float:
    """Linear warm-up, then cosine decay from lr to min_lr."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def _estimate_loss(model, data, config, settings, generator, device) -> float:
    model.eval()
    losses = []
    for _ in range(settings.eval_batches):
        x, y = get_batch(data, config.block_size, settings.batch_size, generator)
        losses.append(model(x.to(device), y.to(device))[1].item())
    model.train()
    return sum(losses) / len(losses)


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run the block with ``n`` intra-op CPU threads (None: leave torch's setting alone)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_small_gpt(config: GPTConfig | None = None, settings: TrainSettings | None = None,
                    corpus: dict[str, str] | None = None, device=None, log: Callable | None = print,
                    log_every: int = 100, num_threads: int | None = 1) -> TrainResult:
    """Train a GPT from scratch on AG News text (or ``corpus``: {"train": str, "val": str}).

    A BPE tokenizer with ``config.vocab_size`` tokens is learned from the training text
    first (or read from the cache, see ``BPETokenizer.load_or_train``; the model is sized to
    what it learned).  Returns the trained model (in eval mode), the tokenizer and the loss
    history.  The same arguments give the same model: the seed fixes the initial weights,
    the training windows and the evaluation windows.

    ``num_threads``: CPU threads for the training (None: torch's setting).  The matrices of
    a model this small are too small to gain much from several threads, and on a busy
    machine threads that wait for each other can make every step several times slower.
    """
    settings = settings or TrainSettings()
    corpus = corpus or ag_news_corpus()
    device = torch.device(device) if device is not None else torch.device("cpu")
    config = config or SMALL_GPT_CONFIG
    tokenizer = BPETokenizer.load_or_train(corpus["train"], config.vocab_size)
    # a small text can support fewer merges than asked for: size the model to what was learned
    config = GPTConfig(**{**asdict(config), "vocab_size": tokenizer.vocab_size})
    train_data = torch.tensor(tokenizer.encode(corpus["train"]), dtype=torch.long)
    val_data = torch.tensor(tokenizer.encode(corpus["val"]), dtype=torch.long)

    torch.manual_seed(settings.seed)  # the initial weights
    model = GPT(config).to(device)
    batches = torch.Generator().manual_seed(settings.seed + 1)   # which windows are trained on
    evals = torch.Generator().manual_seed(settings.seed + 2)     # which windows are evaluated
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]  # biases and LayerNorm gains
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=settings.lr, betas=(0.9, 0.99))
    history = {"step": [], "train_loss": [], "val_step": [], "val_loss": [], "seconds": 0.0}
    start = time.perf_counter()
    model.train()
    with cpu_threads(num_threads if device.type == "cpu" else None):
        for step in range(settings.steps):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, settings)
            x, y = get_batch(train_data, config.block_size, settings.batch_size, batches)
            _, loss = model(x.to(device), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            opt.step()
            history["step"].append(step)
            history["train_loss"].append(loss.item())
            last = step == settings.steps - 1
            if (step + 1) % settings.eval_every == 0 or last:
                history["val_step"].append(step)
                history["val_loss"].append(_estimate_loss(model, val_data, config, settings, evals, device))
            if log and ((step + 1) % log_every == 0 or last):
                val = f", val loss {history['val_loss'][-1]:.3f}" if history["val_step"] and \
                    history["val_step"][-1] == step else ""
                log(f"step {step + 1:5d}/{settings.steps}: train loss {loss.item():.3f}{val} "
                    f"({time.perf_counter() - start:.0f} s)")
    history["seconds"] = time.perf_counter() - start
    model.eval()
    return TrainResult(model, tokenizer, history)


def _corpus_hash(corpus: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(corpus):
        digest.update(name.encode() + b"\0" + corpus[name].encode() + b"\0")
    return digest.hexdigest()


def cache_key(config: GPTConfig, settings: TrainSettings, corpus: dict[str, str]) -> str:
    """What a cached model depends on: model and training settings, the data, this code."""
    payload = json.dumps({"config": asdict(config), "train": asdict(settings), "data": _corpus_hash(corpus),
                          "version": CODE_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _cache_root(cache_dir=None, kind: str = "small-gpt") -> Path:
    from coursekit.models import course_cache_dir

    return Path(cache_dir) if cache_dir is not None else course_cache_dir() / kind


def _save(result: TrainResult, folder: Path, meta: dict) -> None:
    """Write weights and metadata beside ``folder`` and swap them in, so that an
    interrupted run (or two notebooks training at once) never leaves half a model."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        torch.save(result.model.state_dict(), tmp / "model.pt")
        (tmp / "meta.json").write_text(json.dumps({
            **meta, "config": asdict(result.model.config), "tokenizer": result.tokenizer.to_str(),
            "history": result.history}, indent=1) + "\n")
        old = None
        if folder.exists():  # a damaged entry, or retrain=True: move it out of the way first
            old = folder.parent / f".{folder.name}-old-{os.getpid()}"
            try:
                os.replace(folder, old)
            except OSError:
                old = None
        try:
            os.replace(tmp, folder)
        except OSError:  # another process saved the same key in between; keep its copy
            pass
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _load(folder: Path, device) -> TrainResult | None:
    try:
        meta = json.loads((folder / "meta.json").read_text())
        model = GPT(GPTConfig(**meta["config"]))
        state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception:  # noqa: BLE001 - missing, partial or damaged: train again
        return None
    return TrainResult(model.to(device).eval(), BPETokenizer.from_str(meta["tokenizer"]), meta["history"])


def load_or_train_small_gpt(config: GPTConfig | None = None, settings: TrainSettings | None = None,
                            device=None, cache_dir=None, retrain: bool = False,
                            verbose: bool = True, log_every: int = 100):
    """The course's small GPT: loaded from the cache when a model with the same
    configuration, training settings and data was trained before, else trained now
    (about 40 seconds on a CPU with the defaults) and cached.

    The cache lives in ``$COURSE_CACHE_DIR/small-gpt`` (default
    ``~/.cache/transformers-course/small-gpt``).  ``retrain=True`` trains even when a
    cached copy exists and replaces it.  Returns ``(model, tokenizer, info)``; ``info``
    holds ``history`` (the losses), ``source`` ("cache" or "trained"), ``path``, ``key``
    and a one-line ``description``.
    """
    config = config or SMALL_GPT_CONFIG
    settings = settings or TrainSettings()
    device = torch.device(device) if device is not None else torch.device("cpu")
    corpus = ag_news_corpus()
    key = cache_key(config, settings, corpus)
    folder = _cache_root(cache_dir) / key
    result = None if retrain else _load(folder, device)
    source = "cache"
    if result is None:
        source = "trained"
        if verbose:
            print(f"training the small GPT ({settings.steps} steps; cached afterwards in {folder})")
        result = train_small_gpt(config, settings, corpus, device=device,
                                 log=print if verbose else None, log_every=log_every)
        try:
            _save(result, folder, {"key": key, "version": CODE_VERSION})
        except OSError as err:  # e.g. the read-only cache of a grading sandbox: use it uncached
            if verbose:
                print(f"(the trained model was not cached: {err})")
    model = result.model
    c = model.config
    description = (f"small GPT from coursekit.gpt ({source}): {c.n_layer} layers, {c.n_head} heads, "
                   f"width {c.n_embd}, context {c.block_size} tokens, {model.num_params():,d} "
                   f"parameters, final validation loss {result.history['val_loss'][-1]:.3f}")
    if verbose:
        print(description)
    info = {"history": result.history, "source": source, "path": str(folder), "key": key,
            "description": description}
    return model, result.tokenizer, info
