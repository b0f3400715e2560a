"""Ways to tell attention where the tokens are, each in a few lines.

* absolute, added to the token embeddings: a learned table (GPT-2, an ``nn.Embedding``) or
  the fixed sinusoids of the original Transformer (``sinusoidal_table``);
* relative, added to the attention scores: a learned scalar per head and distance bucket
  (T5, ``t5_bucket`` and ``RelativePositionBias``) or a fixed penalty proportional to the
  distance (ALiBi, ``alibi_slopes`` and ``alibi_bias``);
* rotary (RoPE, ``apply_rotary``): queries and keys are rotated by an angle proportional to
  their position, so that their dot product depends on the distance only.

Positions are given explicitly (a tensor of ints), so that a model with a key-value cache can
ask for positions P, P + 1, ... of the tokens that follow the P cached ones.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

__all__ = ["sinusoidal_table", "rotary_cos_sin", "apply_rotary", "t5_bucket", "RelativePositionBias",
           "alibi_slopes", "alibi_bias"]


def sinusoidal_table(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(T, dim): sin on the even channels, cos on the odd ones, at frequencies base^(-2i/dim)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)  # (dim/2,)
    angles = positions.float()[:, None] * inv_freq[None, :]              # (T, dim/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1)            # (T, dim/2, 2): pairs (sin, cos)
    return table.flatten(1)                                              # (T, dim)


def rotary_cos_sin(positions: torch.Tensor, head_size: int, base: float = 10000.0):
    """cos and sin of the rotation angles, (T, hs/2) each: position t turns pair i by t * base^(-2i/hs)."""
    inv_freq = base ** (-torch.arange(0, head_size, 2, dtype=torch.float32, device=positions.device) / head_size)
    angles = positions.float()[:, None] * inv_freq[None, :]              # (T, hs/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate queries or keys ``x`` (B, nh, T, hs) by their positions (T,).

    Channel i is paired with channel i + hs/2 (the "rotate-half" layout of GPT-NeoX and of the
    Llama models in Hugging Face ``transformers``); the original RoFormer pairs 2i with 2i + 1.
    The two differ by a fixed permutation of the channels, which the learned projections absorb.
    """
    cos, sin = rotary_cos_sin(positions, x.size(-1), base)              # (T, hs/2) each
    x1, x2 = x.float().chunk(2, dim=-1)                                 # (B, nh, T, hs/2) each
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, nh, T, hs)
    return rotated.type_as(x)


def t5_bucket(distance: torch.Tensor, n_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket of each distance (query position minus key position, >= 0 for a decoder):
    one bucket per distance below n_buckets/2, then logarithmically wider buckets up to
    max_distance, and everything further in the last bucket."""
    distance = distance.clamp(min=0)
    exact = n_buckets // 2
    # distances exact .. max_distance spread over the remaining buckets on a log scale
    log_ratio = torch.log(distance.float().clamp(min=exact) / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (n_buckets - exact)).long()
    return torch.where(distance < exact, distance, far.clamp(max=n_buckets - 1))


class RelativePositionBias(nn.Module):
    """A learned bias per head and distance bucket, added to the attention scores (T5)."""

    def __init__(self, n_head: int, n_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        self.n_buckets, self.max_distance = n_buckets, max_distance
        self.bias = nn.Embedding(n_buckets, n_head)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        buckets = t5_bucket(q_pos[:, None] - k_pos[None, :], self.n_buckets, self.max_distance)  # (T, S)
        return self.bias(buckets).permute(2, 0, 1)                      # (nh, T, S)


def alibi_slopes(n_head: int) -> torch.Tensor:
    """ALiBi's slope per head: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8) for n a
    power of two; otherwise those of the nearest smaller power of two, then every other
    slope of the next power of two."""
    p = 2 ** math.floor(math.log2(n_head))
    slopes = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / p) for i in range(n_head - p)]  # the odd ones of 2p heads
    return torch.tensor(slopes)


def alibi_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """(nh, T, S): minus slope times the distance from each query back to each key."""
    distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()  # (T, S); future keys are masked anyway
    return -slopes.to(distance.device)[:, None, None] * distance[None]  # (nh, T, S)
