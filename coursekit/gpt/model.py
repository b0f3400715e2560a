"""The course's small GPT: a config dataclass and four small modules, as in nanoGPT.

``CausalSelfAttention``, ``MLP``, ``Block`` and ``GPT`` follow GPT-2: learned position
embeddings, pre-norm blocks with LayerNorm, a GELU feed-forward network, tied input and output
embeddings.  The book's GPT chapter (book/07_gpt.ipynb) trains it; ``coursekit.gpt.modern`` holds the variants of
today's open decoders (rotary positions, RMSNorm, SwiGLU, grouped-query attention).

Every forward pass can take a key-value cache (``coursekit.gpt.generate.KVCache``): the keys
and values of the positions already processed, so that generating one more token runs the
model on that token only (see ``coursekit.gpt.generate.generate``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

__all__ = ["GPTConfig", "CausalSelfAttention", "MLP", "Block", "GPT", "SMALL_GPT_CONFIG"]


@dataclass
class GPTConfig:
    vocab_size: int = 1024    # token ids: the BPE tokenizer learns this many from the training text
    block_size: int = 48      # longest context in tokens (about 120 characters of news text)
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64          # model width C; head size hs = C // n_head
    dropout: float = 0.0      # off by default; worth trying (0.1) for runs much longer than the default
    bias: bool = True         # biases in the linear layers and LayerNorms, as in GPT-2


# The default model of the course: with the default TrainSettings it trains in about 40
# seconds on one CPU core (1,000 steps of 32 x 48 tokens, 0.17M parameters).
SMALL_GPT_CONFIG = GPTConfig()


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t only sees positions 0..t."""

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.layer = layer  # which entry of a KV cache holds this layer's keys and values
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

    def forward(self, x, cache=None):
        B, T, C = x.size()                                                # (B, T, C)
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)                # 3 x (B, T, C)
        # split the channels into heads: head i owns channels i*hs .. (i+1)*hs - 1
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)                 # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)                 # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)                 # (B, nh, T, hs)
        past = 0
        if cache is not None:
            # the keys and values of earlier positions were kept: attend to them and the new ones
            past = cache.length(self.layer)
            k, v = cache.update(self.layer, k, v)                         # (B, nh, past + T, hs)
        S = past + T
        # query t (at position past + t) sees keys 0 .. past + t: rows past .. S - 1 of the mask
        mask = self.causal[:, :, past:S, :S]                              # (1, 1, T, S)
        if self.keep_weights:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))       # (B, nh, T, S)
            # a future key gets -inf, so its weight after the softmax is exactly 0
            att = att.masked_fill(~mask, float("-inf"))
            att = F.softmax(att, dim=-1)                                  # (B, nh, T, S)
            self.weights = att.detach()
            y = self.attn_dropout(att) @ v                                # (B, nh, T, hs)
        else:
            # the same computation in one fused call that never stores the (T, S) weights;
            # is_causal aligns the mask top-left, right only when there are no earlier keys
            drop = self.dropout if self.training else 0.0
            if past == 0:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
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

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):                                     # (B, T, C)
        x = x + self.attn(self.ln_1(x), cache)
        x = x + self.mlp(self.ln_2(x))
        return x                                                          # (B, T, C)


def _init_module(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def init_weights(model: nn.Module, n_layer: int) -> None:
    """GPT-2's initialisation: normal(0, 0.02) weights, zero biases; and since each block adds
    two residual branches, their output projections (``c_proj``) scaled by 1/sqrt(2 * n_layer),
    which keeps the variance of the residual stream from growing with depth."""
    model.apply(_init_module)  # children first, then their parents (the order draws are made in)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))


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
            h=nn.ModuleList([Block(config, layer) for layer in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: the same matrix embeds a token and scores it as the next token
        # (fewer parameters, and rare tokens get gradient from both uses).
        self.transformer.wte.weight = self.lm_head.weight
        init_weights(self, config.n_layer)

    def num_params(self) -> int:
        """Number of parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, cache=None):
        """Logits for the next token at every position, and the mean cross-entropy
        against ``targets`` when given (``targets[b, t]`` is the token after ``idx[b, t]``).

        With a ``cache`` (``coursekit.gpt.generate.KVCache``) that already holds P positions,
        ``idx`` holds the tokens at positions P, P + 1, ...: they attend to the cached keys
        and values too, and their own keys and values are added to the cache.
        """
        B, T = idx.size()                                                 # (B, T) token ids
        past = cache.length() if cache is not None else 0
        if past + T > self.config.block_size:
            what = f"sequence of length {T}" + (f" after {past} cached positions" if past else "")
            raise ValueError(f"{what} is longer than block_size {self.config.block_size}")
        pos = torch.arange(past, past + T, device=idx.device)             # (T,) positions of the new tokens
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)         # (B, T, C)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, cache)                                           # (B, T, C)
        logits = self.lm_head(self.transformer.ln_f(x))                   # (B, T, V)
        loss = None
        if targets is not None:
            # flatten (B, T, V) -> (B*T, V): one classification problem per position
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss
