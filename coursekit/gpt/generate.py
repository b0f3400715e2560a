"""Generation with a key-value cache.

A decoder's output at position t depends on the keys and values of positions 0..t, and those
of the earlier positions do not change when a token is appended (the mask keeps every position
from seeing later ones).  So the keys and values computed once can be kept, and each new
token needs one pass of the model over that token alone: ``generate`` processes the prompt
once, then one position per new token, instead of the whole text again at every step.

Generation takes a callable ``pick_next(logits) -> ids`` so that the decoding rules
(temperature, top-k, top-p) can be written elsewhere: the LLM lab asks students to
write them, and reference solutions of graded functions never live in coursekit.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["KVCache", "greedy", "generate"]


class KVCache:
    """The keys and values of every layer for the positions a model has processed.

    The model's attention layers call ``update(layer, k, v)`` with the keys and values of the
    new positions, ``(B, n_kv_head, T, hs)``, and attend to what it returns: all positions so
    far.  With ``capacity`` (positions), each layer's tensors are allocated once at that size and
    filled in place, as inference servers do; without, they grow by concatenation.
    """

    def __init__(self, n_layer: int, capacity: int | None = None):
        self.capacity = capacity
        self.keys: list[torch.Tensor | None] = [None] * n_layer    # (B, n_kv_head, capacity or length, hs)
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.lengths = [0] * n_layer                                 # positions held, per layer

    def length(self, layer: int = 0) -> int:
        """Positions held for ``layer`` (before its update in the current forward pass)."""
        return self.lengths[layer]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append the new positions' keys and values; return those of all positions so far."""
        n, T = self.lengths[layer], k.size(2)
        if self.capacity is None:
            if self.keys[layer] is None:
                self.keys[layer], self.values[layer] = k, v
            else:
                self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)      # (B, nkv, n + T, hs)
                self.values[layer] = torch.cat([self.values[layer], v], dim=2)  # (B, nkv, n + T, hs)
        else:
            if n + T > self.capacity:
                raise ValueError(f"the cache holds at most {self.capacity} positions; {n} + {T} asked")
            if self.keys[layer] is None:
                B, nkv, _, hs = k.shape
                self.keys[layer] = k.new_empty(B, nkv, self.capacity, hs)       # (B, nkv, capacity, hs)
                self.values[layer] = v.new_empty(B, nkv, self.capacity, hs)
            self.keys[layer][:, :, n:n + T] = k
            self.values[layer][:, :, n:n + T] = v
        self.lengths[layer] = n + T
        return self.keys[layer][:, :, :n + T], self.values[layer][:, :, :n + T]

    def nbytes(self) -> int:
        """Bytes of the keys and values held (positions filled so far, every layer)."""
        total = 0
        for k, v, n in zip(self.keys, self.values, self.lengths):
            if k is not None:
                total += (k[:, :, :n].numel() * k.element_size()) + (v[:, :, :n].numel() * v.element_size())
        return total


def greedy(logits):
    """The default ``pick_next``: the most likely token of each row (lowest id on ties)."""
    return logits.argmax(dim=-1)


@torch.no_grad()
def generate(model, idx, max_new_tokens: int, pick_next: Callable = greedy, use_cache: bool = True):
    """Append ``max_new_tokens`` tokens to each row of ``idx`` (B, T) and return (B, T + max_new_tokens).

    ``pick_next(logits)`` gets the (B, V) logits for the next position and returns (B,)
    token ids; sampling rules live in that callable, not here.  The model runs in eval
    mode (no dropout) and is put back in its previous mode afterwards.

    With ``use_cache`` (the default) the prompt is processed once and each new token then
    costs one position, with the keys and values of the earlier ones read from a ``KVCache``.
    The tokens are those of ``use_cache=False``, which runs the model on the whole text at
    every step.  The model knows positions up to ``block_size`` only: once the text is
    longer, both keep its last ``block_size`` tokens, which then sit at new positions, so
    nothing computed before can be reused and every step runs on the whole window.
    """
    block = model.config.block_size
    was_training = model.training
    model.eval()
    cache = None
    try:
        for _ in range(max_new_tokens):
            if cache is not None and idx.size(1) <= block:
                logits, _ = model(idx[:, -1:], cache=cache)               # (B, 1, V): the newest token only
            else:
                # the first step (the prompt), or a text longer than the model's context
                context = idx[:, -block:]                                 # (B, <= block_size)
                cache = KVCache(model.config.n_layer, capacity=block) \
                    if use_cache and idx.size(1) < block else None
                logits, _ = model(context, cache=cache)                   # (B, T, V)
            nxt = pick_next(logits[:, -1, :])                             # (B,) or (B, 1)
            nxt = torch.as_tensor(nxt, device=idx.device).reshape(idx.size(0), 1).to(idx.dtype)
            idx = torch.cat([idx, nxt], dim=1)                            # (B, T + 1)
    finally:
        model.train(was_training)
    return idx
