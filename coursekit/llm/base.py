"""What every backend of ``coursekit.llm`` is (``LanguageModel``) and how any of them fails
(``LLMError``); the interface a notebook uses is ``coursekit/llm/interface.py``.

Kept apart from interface.py because every backend subclasses ``LanguageModel`` and
``load_llm`` (in interface.py) imports every backend: one module holding both would be an
import cycle."""
from __future__ import annotations


def _short(text, n=160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


class LLMError(RuntimeError):
    """What went wrong with a model or a server, in one line that says what to do.

    IPython calls ``_render_traceback_`` to display an exception: a notebook then shows this
    one line instead of a traceback through the client library."""

    def _render_traceback_(self):
        return [f"{type(self).__name__}: {self}"]


class UnsupportedSetting(LLMError):
    """The backend cannot apply a decoding setting (e.g. top-k through an API that has none)."""



class LanguageModel:
    """What every backend offers. ``kind`` is "chat" (answers questions) or "text"
    (continues text); ``has_logits`` says whether the token-level methods exist."""

    backend = "?"
    kind = "text"
    has_logits = False
    name = "?"
    description = "?"

    @property
    def exposes(self) -> str:
        """One sentence: what this backend lets a notebook see and change."""
        if self.has_logits:
            return ("full next-token logits: your own decoding functions (Q1 to Q5) choose every token, "
                    "and every sample is scored by the model itself")
        return ("text, and at most the log-probabilities of the tokens the server chose: the server samples "
                "with its own code at the settings sent (temperature, top-p, top-k only where the server "
                "takes it); your decoding functions and next_logits variants cannot be used")

    def sample(self, prompts, n_samples=1, max_new_tokens=32, seed=0, temperature=1.0, top_k=None,
               top_p=None, **options):
        """``n_samples`` continuations of every prompt, drawn by the backend's own sampler.

        Returns one dict per sample, prompt by prompt: ``prompt``, ``group`` (the prompt's
        index), ``text``, ``logprobs`` (the model's log-probability of each generated token,
        or None when the backend does not report them), and ``ids``/``start`` (None here).
        Prompt j draws with seed ``1000 * seed + j``, as the lab's ``run_setting`` does."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({self.description})"
