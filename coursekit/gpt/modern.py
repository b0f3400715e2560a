"""A small decoder with the parts of today's open models (Llama, Mistral, Qwen, SmolLM2).

Against the GPT-2 design of ``coursekit.gpt.model`` it changes four things, each a switch of
``ModernConfig`` so that a page can change one at a time:

* positions: rotary (RoPE) by default; also ALiBi, T5's relative buckets, GPT-2's learned
  table, the sinusoids of the original Transformer, or none (``coursekit.gpt.positions``);
* grouped-query attention: ``n_kv_head`` key-value heads shared by ``n_head`` query heads
  (``n_kv_head == n_head`` is multi-head attention, 1 is multi-query attention), so that the
  key-value cache is ``n_head / n_kv_head`` times smaller;
* RMSNorm instead of LayerNorm (no mean, no bias);
* a SwiGLU feed-forward network instead of GELU, with a hidden width of about 8C/3 so that its
  three matrices hold about as many parameters as GELU's two of width 4C.

Training (``coursekit.gpt.train.train_small_gpt``) and generation with a key-value cache
(``coursekit.gpt.generate.generate``) work with it as with ``GPT``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from .model import init_weights
from .positions import RelativePositionBias, alibi_bias, alibi_slopes, apply_rotary, sinusoidal_table

__all__ = ["ModernConfig", "SwiGLU", "ModernAttention", "ModernBlock", "ModernGPT", "POSITIONS"]

POSITIONS = ("rope", "alibi", "t5", "learned", "sinusoidal", "none")


@dataclass
class ModernConfig:
    vocab_size: int = 1024
    block_size: int = 48        # longest context in tokens
    n_layer: int = 2
    n_head: int = 4             # query heads
    n_kv_head: int | None = None  # key-value heads (must divide n_head); None: n_head (multi-head attention)
    n_embd: int = 64            # model width C; head size hs = C // n_head
    position: str = "rope"      # one of POSITIONS
    norm: str = "rms"           # "rms" (RMSNorm) or "layer" (LayerNorm)
    mlp: str = "swiglu"         # "swiglu" or "gelu"
    rope_base: float = 10000.0  # RoPE's slowest pair turns once in about 2 pi * rope_base positions
    rope_scale: float = 1.0     # position interpolation: RoPE turns by position / rope_scale
    t5_buckets: int = 16        # T5: distance buckets (half of them exact) ...
    t5_max_distance: int = 64   # ... and the distance from which all share the last bucket
    dropout: float = 0.0
    bias: bool = False          # Llama-style models have no biases in their linear layers

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.position not in POSITIONS:
            raise ValueError(f"position must be one of {', '.join(POSITIONS)}, not {self.position!r}")
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}), "
                             f"and n_head by n_kv_head ({self.n_kv_head})")
        if self.norm not in ("rms", "layer") or self.mlp not in ("swiglu", "gelu"):
            raise ValueError(f"norm must be 'rms' or 'layer' and mlp 'swiglu' or 'gelu', not {self.norm!r}, {self.mlp!r}")

    @property
    def ffn_hidden(self) -> int:
        """Hidden width of the feed-forward network: 4C for GELU; for SwiGLU 8C/3 rounded up to
        a multiple of 8, so that its three matrices hold about the parameters of GELU's two."""
        return 4 * self.n_embd if self.mlp == "gelu" else 8 * math.ceil(8 * self.n_embd / 3 / 8)


def _norm(config: ModernConfig) -> nn.Module:
    if config.norm == "rms":
        return nn.RMSNorm(config.n_embd, eps=1e-6)                 # scale only: C parameters
    return nn.LayerNorm(config.n_embd, bias=config.bias)           # scale (and shift): C (or 2C)


class SwiGLU(nn.Module):
    """Feed-forward network with a gate: c_proj(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModernConfig):
        super().__init__()
        h = config.ffn_hidden
        self.gate = nn.Linear(config.n_embd, h, bias=config.bias)
        self.up = nn.Linear(config.n_embd, h, bias=config.bias)
        self.c_proj = nn.Linear(h, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):                                            # (B, T, C)
        # the gate decides, per hidden unit and token, how much of the up-projection passes
        return self.dropout(self.c_proj(F.silu(self.gate(x)) * self.up(x)))  # (B, T, C)


class GELUMLP(nn.Module):
    """GPT-2's feed-forward network: C -> 4C -> C with a GELU."""

    def __init__(self, config: ModernConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.ffn_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.ffn_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):                                            # (B, T, C)
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))       # (B, T, C)


class ModernAttention(nn.Module):
    """Causal self-attention with n_head query heads and n_kv_head key-value heads.

    Query head h reads key-value head h // (n_head / n_kv_head): consecutive query heads share
    one key-value head.  Rotary positions turn queries and keys before the cache keeps them;
    the other position schemes arrive as an additive bias on the scores.
    """

    def __init__(self, config: ModernConfig, layer: int = 0):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.hs = config.n_embd // config.n_head
        self.layer = layer  # which entry of a KV cache holds this layer's keys and values
        self.rope = config.position == "rope"
        self.rope_base = config.rope_base
        self.q_proj = nn.Linear(config.n_embd, config.n_head * self.hs, bias=config.bias)
        # keys and values only for the n_kv_head shared heads: fewer parameters, a smaller cache
        self.k_proj = nn.Linear(config.n_embd, config.n_kv_head * self.hs, bias=config.bias)
        self.v_proj = nn.Linear(config.n_embd, config.n_kv_head * self.hs, bias=config.bias)
        self.c_proj = nn.Linear(config.n_head * self.hs, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, positions, bias=None, cache=None):
        """x (B, T, C) at ``positions`` (T,); bias: None or (nh, T, S) added to the scores."""
        B, T, C = x.size()
        q = self.q_proj(x).view(B, T, self.n_head, self.hs).transpose(1, 2)     # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.hs).transpose(1, 2)  # (B, nkv, T, hs)
        if self.rope:
            q = apply_rotary(q, positions, self.rope_base)
            k = apply_rotary(k, positions, self.rope_base)
        past = 0
        if cache is not None:
            past = cache.length(self.layer)
            k, v = cache.update(self.layer, k, v)                         # (B, nkv, S, hs), S = past + T
        S = k.size(2)
        # Each key-value head serves n_head / n_kv_head query heads. enable_gqa lets query head h
        # read key-value head h // (n_head / n_kv_head) without copying keys and values per query
        # head (the same as k.repeat_interleave(n_head // n_kv_head, dim=1), and likewise v).
        gqa = dict(enable_gqa=self.n_kv_head != self.n_head)
        drop = self.dropout if self.training else 0.0
        if bias is None and past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop, **gqa)
        else:
            # query t sits at position past + t and may see keys 0 .. past + t
            allowed = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=past)  # (T, S)
            mask = torch.zeros(T, S, device=x.device).masked_fill(~allowed, float("-inf"))
            if bias is not None:
                mask = mask + bias                                        # (nh, T, S)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=drop, **gqa)
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_head * self.hs)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))                         # (B, T, C)


class ModernBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModernConfig, layer: int = 0):
        super().__init__()
        self.norm_1 = _norm(config)
        self.attn = ModernAttention(config, layer)
        self.norm_2 = _norm(config)
        self.mlp = SwiGLU(config) if config.mlp == "swiglu" else GELUMLP(config)

    def forward(self, x, positions, bias=None, cache=None):               # (B, T, C)
        x = x + self.attn(self.norm_1(x), positions, bias, cache)
        x = x + self.mlp(self.norm_2(x))
        return x                                                          # (B, T, C)


class ModernGPT(nn.Module):
    """Token embedding, blocks, a final norm and the tied output layer; positions as configured."""

    def __init__(self, config: ModernConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        if config.position == "learned":
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
        if config.position == "t5":  # one table of biases, shared by all layers as in T5
            self.rel_bias = RelativePositionBias(config.n_head, config.t5_buckets, config.t5_max_distance)
        if config.position == "alibi":
            self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([ModernBlock(config, layer) for layer in range(config.n_layer)])
        self.norm_f = _norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # tied, as in GPT-2 (Llama unties them; small models tie)
        init_weights(self, config.n_layer)  # as GPT-2's (coursekit.gpt.model)

    def num_params(self) -> int:
        """Number of parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, cache=None):
        """Logits (B, T, V) and the mean cross-entropy against ``targets`` when given; with a
        ``cache`` holding P positions, ``idx`` holds the tokens at positions P, P + 1, ..."""
        B, T = idx.size()
        past = cache.length() if cache is not None else 0
        if past + T > self.config.block_size:
            what = f"sequence of length {T}" + (f" after {past} cached positions" if past else "")
            raise ValueError(f"{what} is longer than block_size {self.config.block_size}")
        positions = torch.arange(past, past + T, device=idx.device)       # (T,)
        x = self.wte(idx)                                                 # (B, T, C)
        kind = self.config.position
        if kind == "learned":
            x = x + self.wpe(positions)
        elif kind == "sinusoidal":
            # as in the original Transformer: embeddings scaled by sqrt(C), so that the fixed
            # table (entries of size about 1) does not drown the small initial embeddings
            x = x * math.sqrt(self.config.n_embd) + sinusoidal_table(positions, self.config.n_embd).to(x.dtype)
        bias = None
        keys = torch.arange(past + T, device=idx.device)                  # (S,) positions of all keys
        if kind == "t5":
            bias = self.rel_bias(positions, keys)                         # (nh, T, S)
        elif kind == "alibi":
            bias = alibi_bias(positions, keys, self.slopes)               # (nh, T, S)
        x = self.drop(x)
        # position interpolation (rope_scale > 1) squeezes longer texts into the angles of training
        rotary_positions = positions / self.config.rope_scale if self.config.rope_scale != 1 else positions
        for block in self.h:
            x = block(x, rotary_positions, bias, cache)                   # (B, T, C)
        logits = self.lm_head(self.norm_f(x))                             # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss
