"""Byte-level BPE for the small GPT, learned from the course's AG News text.

Why BPE with a small vocabulary (1,024 tokens), and not words or characters: the training
split has about 470,000 characters and 75,000 words in some 19,000 distinct forms, more
than half of them seen only once.  A word-level vocabulary would need an "unknown" token
for much of the text and for most names in a prompt, and could learn little about rare
forms.  Characters need no unknown token, but half a minute of CPU training is not enough
for a model to learn spelling and words as well.  Byte-level BPE (the scheme of GPT-2) keeps
frequent words whole, spells rare ones from pieces, encodes any string, and learns its
merges from the text in a fraction of a second (cached on disk afterwards); a text becomes
about 2.5 characters per token.  The book's tokenisation chapter compares it with WordPiece
and Unigram.
"""
from __future__ import annotations

import hashlib

import torch

from ._cache import CODE_VERSION, cache_root, write_text_atomically

# Imports inside functions: tokenizers is imported when a tokenizer is trained or loaded, not when
# coursekit.gpt is imported.

__all__ = ["BPETokenizer"]


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
        path = cache_root(cache_dir, "bpe") / f"{digest.hexdigest()[:16]}.json"
        try:
            return cls.from_str(path.read_text())
        except Exception:  # noqa: BLE001 - missing, partial or damaged: train again
            pass
        tokenizer = cls.train(text, vocab_size)
        try:
            write_text_atomically(path, tokenizer.to_str())
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
