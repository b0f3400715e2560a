"""A small GPT that the book and the assignments share, in the layout of nanoGPT.

* ``coursekit.gpt.model``: the configuration dataclass and the modules (``CausalSelfAttention``,
  ``MLP``, ``Block``, ``GPT``), GPT-2's design;
* ``coursekit.gpt.modern``: the same with the parts of today's open decoders (rotary positions,
  grouped-query attention, RMSNorm, SwiGLU), each a switch of ``ModernConfig``;
* ``coursekit.gpt.positions``: position schemes (sinusoidal, T5 buckets, ALiBi, RoPE);
* ``coursekit.gpt.tokenizer``: byte-level BPE learned from the course's AG News text;
* ``coursekit.gpt.generate``: generation with a key-value cache;
* ``coursekit.gpt.train``: batches, the training loop and the cache of trained models, so that
  a model trained once (by the book page, say) is reused by every notebook that asks for the
  same configuration.

Every name is importable from ``coursekit.gpt`` itself (``from coursekit.gpt import GPT``).
"""
from .generate import KVCache, generate, greedy
from .model import GPT, MLP, SMALL_GPT_CONFIG, Block, CausalSelfAttention, GPTConfig
from .modern import ModernConfig, ModernGPT
from .tokenizer import BPETokenizer
from .train import (TrainResult, TrainSettings, ag_news_corpus, build_model, cache_key, cpu_threads, get_batch,
                    load_or_train_small_gpt, train_small_gpt)

__all__ = ["GPTConfig", "TrainSettings", "BPETokenizer", "CausalSelfAttention", "MLP", "Block",
           "GPT", "greedy", "generate", "KVCache", "ag_news_corpus", "get_batch", "train_small_gpt",
           "load_or_train_small_gpt", "cache_key", "cpu_threads", "SMALL_GPT_CONFIG", "TrainResult",
           "build_model", "ModernConfig", "ModernGPT"]
