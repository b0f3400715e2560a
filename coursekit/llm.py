"""One small interface to a language model, whichever program runs it.

The LLM lab (and any page that wants text from a model) asks for a model with
``load_llm(device)`` and gets an object with the same few methods whatever the backend,
chosen by one setting, the environment variable ``COURSE_LLM_BACKEND``:

* ``local`` (the default, and the only backend grading uses): a transformers model in this
  process, today's behaviour: SmolLM2-135M-Instruct from the hub when the hub answers, else
  the course's small GPT (``coursekit.gpt``), which continues news text.
* ``openai``: any server that speaks the OpenAI API, through the ``openai`` client package:
  llama.cpp's ``llama-server``, Ollama, vLLM, LM Studio, ``transformers serve`` or a paid API.
* ``llamacpp``: a GGUF file run in this process by ``llama-cpp-python``, where installed.

What each backend exposes differs, and the lab says so plainly:

* ``local`` and ``llamacpp`` give the full logits of the next token (``has_logits`` is True):
  ``prompt_ids``, ``next_logits``, ``decode`` and ``token_logprobs``, so decoding rules written
  in a notebook drive the model directly;
* an API returns text, and at most the log-probabilities of the chosen tokens (and of a few
  alternatives, 20 at most with OpenAI): the *server* samples, so ``sample`` sends the
  settings (temperature, top-p, top-k where the server takes it) and a seed, and returns what
  the server wrote. Every backend has ``sample``; with logits it runs the sampling of
  transformers' logits processors here.

Settings (environment variables; the arguments of ``load_llm`` win over them):

===========================  ================================================================
``COURSE_LLM_BACKEND``       ``local`` (default), ``openai`` or ``llamacpp``
``COURSE_LLM_BASE_URL``      openai: the server's address, default ``https://api.openai.com/v1``
                             (``http://localhost:8080/v1`` for llama-server,
                             ``http://localhost:11434/v1`` for Ollama)
``COURSE_LLM_MODEL``         openai: the model's name on that server; llamacpp: the .gguf file
``COURSE_LLM_KIND``          ``chat`` (default: prompts are questions, sent as chat messages) or
                             ``text`` (a base model that continues text, sent as a completion)
``COURSE_LLM_TIMEOUT``       seconds for one whole answer (default 60): connecting, sending, every
                             byte of the reply and any retries, together; not per read
``COURSE_LLM_MAX_REPLY_MB``  the largest reply read from a server, in MiB (default 8); reading
                             stops there with an ``LLMError``
``COURSE_LLM_PRICE``         ``"0.15,0.60"``: USD per million input and output tokens, for the
                             cost estimate of a server whose prices are not known here
``COURSE_LLM_API_KEY``       the key for a server other than OpenAI's (a class server, another
                             provider), if it needs one; also a Colab secret of that name
===========================  ================================================================

**API keys go only to the host they belong to.** ``OPENAI_API_KEY`` (the environment
variable, else the Colab secret of that name, else typed in with ``getpass``) is sent to
OpenAI's API (``https://api.openai.com``) and to no other server. Any other server, on this
machine or not, gets the key named for it: ``load_llm(api_key=...)``, else
``COURSE_LLM_API_KEY`` (variable or Colab secret), else no key at all (no ``Authorization``
header). A key is never printed, never stored in the notebook, and left out of every
message. The grader passes ``COURSE_*`` variables into students' kernels, but never one
whose name contains ``KEY`` (``autograder/isolation/policy.py``), so neither key gets there.

**Replies are bounded.** A reply larger than ``COURSE_LLM_MAX_REPLY_MB`` (compressed or not),
one that does not arrive whole within ``COURSE_LLM_TIMEOUT``, one that is not UTF-8 JSON or
lacks the fields of a completion, and any HTTP error raise ``LLMError`` with one line that
names the server and what to change.

**Grading** sets ``COURSE_LLM_PINNED_BACKEND=local`` in the kernels (``course.yml``): the
notebook then runs the local model whatever else it asks for, so every student is judged
on the same model.

Every request to an API prints one line when a call of ``sample`` ends: the requests made,
the tokens used, and for a paid API an estimate of the cost. A timeout, a refused key, a
rate limit, a missing model or a bad reply raises ``LLMError`` with one line that says what
to do (a notebook shows that line alone, without a traceback).

``export_small_gpt`` writes the course's small GPT as a transformers checkpoint (GPT-2
layout: the model is GPT-2's architecture at a small size, so any tool that reads GPT-2
can serve it) or as a GGUF file for llama.cpp; ``python -m coursekit.llm export`` does the
same from a shell, e.g. for a lecturer who serves the course model to a class.
"""
from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import json
import os
import re
import sys
import time
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["BACKENDS", "LLMError", "UnsupportedSetting", "LanguageModel", "LocalSmallGPT",
           "LocalHubChat", "LocalOfflineChat", "export_offline_chat", "LlamaCppModel", "OpenAIModel", "load_llm", "llm_settings", "api_key",
           "export_small_gpt", "HUB_CHAT_MODEL", "KEY_NAME", "SERVER_KEY_NAME", "MAX_REPLY_MB"]

BACKENDS = ("local", "openai", "llamacpp")
KINDS = ("chat", "text")
HUB_CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
KEY_NAME = "OPENAI_API_KEY"  # environment variable and Colab secret: sent to OPENAI_HOST only
SERVER_KEY_NAME = "COURSE_LLM_API_KEY"  # the key for any other server (the grader drops names with KEY)
OPENAI_HOST = "api.openai.com"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_REPLY_MB = 8.0  # default cap on one reply from a server (COURSE_LLM_MAX_REPLY_MB)

# List prices of a few OpenAI models, USD per million input and output tokens (standard tier,
# as published by OpenAI in 2025). Only for the estimate that the lab prints; prices change, so
# COURSE_LLM_PRICE overrides them and the printed line says where the figure came from.
OPENAI_PRICES = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
}


class _Secret:
    """A key that does not show itself: repr() and vars() of an object holding it print <hidden>."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self):
        return "<hidden>"

    __str__ = __repr__


class LLMError(RuntimeError):
    """What went wrong with a model or a server, in one line that says what to do.

    IPython calls ``_render_traceback_`` to display an exception: a notebook then shows this
    one line instead of a traceback through the client library."""

    def _render_traceback_(self):
        return [f"{type(self).__name__}: {self}"]


class UnsupportedSetting(LLMError):
    """The backend cannot apply a decoding setting (e.g. top-k through an API that has none)."""


# ---------------------------------------------------------------------------------------
# Settings and keys
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    backend: str
    base_url: str
    model: str
    kind: str | None
    timeout: float
    price: tuple[float, float] | None
    pinned: bool  # the grader fixed the backend
    max_reply_mb: float = MAX_REPLY_MB

    def __repr__(self):  # nothing secret is held here, but keep the repr short
        return (f"Settings(backend={self.backend!r}, base_url={self.base_url!r}, model={self.model!r}, "
                f"kind={self.kind!r})")


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, "").strip() or default


def llm_settings(backend: str | None = None, model: str | None = None, base_url: str | None = None,
                 kind: str | None = None) -> Settings:
    """The settings in force: arguments, else ``COURSE_LLM_*`` variables, else defaults.
    A bad value raises ``LLMError`` naming the variable."""
    pinned = _env("COURSE_LLM_PINNED_BACKEND").lower()
    chosen = (pinned or backend or _env("COURSE_LLM_BACKEND", "local")).strip().lower()
    if chosen not in BACKENDS:
        raise LLMError(f"COURSE_LLM_BACKEND={chosen!r} is not a backend: use one of {', '.join(BACKENDS)}")
    kind = (kind or _env("COURSE_LLM_KIND")).lower() or None
    if kind is not None and kind not in KINDS:
        raise LLMError(f"COURSE_LLM_KIND={kind!r}: use chat (questions to a chat model) or text "
                       "(a base model that continues text)")
    timeout_text = _env("COURSE_LLM_TIMEOUT", "60")
    try:
        timeout = float(timeout_text)
        assert timeout > 0
    except (ValueError, AssertionError):
        raise LLMError(f"COURSE_LLM_TIMEOUT={timeout_text!r}: give a number of seconds > 0") from None
    cap_text = _env("COURSE_LLM_MAX_REPLY_MB", str(MAX_REPLY_MB))
    try:
        max_reply_mb = float(cap_text)
        assert max_reply_mb > 0
    except (ValueError, AssertionError):
        raise LLMError(f"COURSE_LLM_MAX_REPLY_MB={cap_text!r}: give a size in MiB > 0, e.g. 8") from None
    price = None
    if _env("COURSE_LLM_PRICE"):
        try:
            price = tuple(float(x) for x in _env("COURSE_LLM_PRICE").split(","))
            assert len(price) == 2 and min(price) >= 0
        except (ValueError, AssertionError):
            raise LLMError(f"COURSE_LLM_PRICE={_env('COURSE_LLM_PRICE')!r}: give two numbers, USD per "
                           "million input and output tokens, e.g. 0.15,0.60") from None
    return Settings(backend=chosen, base_url=(base_url or _env("COURSE_LLM_BASE_URL", DEFAULT_BASE_URL)).rstrip("/"),
                    model=model or _env("COURSE_LLM_MODEL"), kind=kind, timeout=timeout, price=price,
                    pinned=bool(pinned), max_reply_mb=max_reply_mb)


def is_local_url(url: str) -> bool:
    """True for a server on this machine (loopback), which needs no key and costs nothing."""
    host = (urlparse(url).hostname or "").lower()
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _colab_secret(name: str) -> str | None:
    try:
        from google.colab import userdata  # only on Colab
    except ImportError:
        return None
    try:
        return userdata.get(name) or None
    except Exception:  # noqa: BLE001 - not defined, or the notebook has no access to it
        return None


def is_openai_url(url: str) -> bool:
    """True for OpenAI's own API (https, host api.openai.com): the one place OPENAI_API_KEY goes."""
    u = urlparse(url)
    return u.scheme == "https" and (u.hostname or "").lower() == OPENAI_HOST and u.port in (None, 443)


def api_key(base_url: str, key: str | None = None) -> str | None:
    """The key to send to ``base_url``, or None for no key.

    ``key`` (given by the student for this server) wins. OpenAI's API gets ``$OPENAI_API_KEY``,
    the Colab secret ``OPENAI_API_KEY``, or a key typed in (hidden). Any other server gets
    ``$COURSE_LLM_API_KEY`` or the Colab secret of that name, else nothing: ``OPENAI_API_KEY`` is
    never sent anywhere but OpenAI."""
    if key:
        return str(key).strip()
    if not is_openai_url(base_url):
        return os.environ.get(SERVER_KEY_NAME, "").strip() or _colab_secret(SERVER_KEY_NAME) or None
    key = os.environ.get(KEY_NAME, "").strip() or _colab_secret(KEY_NAME)
    if key:
        return key
    try:
        import getpass

        key = getpass.getpass(f"API key for {OPENAI_HOST} (typed input is hidden; or add the Colab secret "
                              f"{KEY_NAME}): ").strip()
    except Exception:  # noqa: BLE001 - no way to ask here (a script without a terminal)
        key = ""
    if not key:
        raise LLMError(f"no API key for {OPENAI_HOST}: add the Colab secret {KEY_NAME} (key icon, left bar) or set "
                       f"the environment variable {KEY_NAME}; never paste a key into a cell")
    return key


# ---------------------------------------------------------------------------------------
# The interface
# ---------------------------------------------------------------------------------------

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


def _processors(temperature, top_k, top_p):
    """transformers' own logits processors for the settings (the library's sampler)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    steps = LogitsProcessorList()
    if temperature != 1.0:
        steps.append(TemperatureLogitsWarper(float(temperature)))
    if top_k is not None:
        steps.append(TopKLogitsWarper(int(top_k)))
    if top_p is not None and top_p < 1.0:
        steps.append(TopPLogitsWarper(float(top_p)))
    return steps


class _LogitsModel(LanguageModel):
    """A backend with full logits: ``sample`` runs transformers' logits processors here."""

    has_logits = True
    end_of_turn = None  # a chat model's end-of-turn token id: its answer ends there

    def shown_length(self, ids) -> int:
        """How many of the generated tokens ``ids`` (1-D) ``decode`` keeps: all of them for a model
        that continues text, those before the first end-of-turn token for a chat model. Scores of
        generated text count these tokens only: what comes after the end of the answer is never
        shown, so it must not change the score either."""
        ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
        if self.kind == "chat" and self.end_of_turn is not None and self.end_of_turn in ids:
            return ids.index(self.end_of_turn)
        return len(ids)

    def sample(self, prompts, n_samples=1, max_new_tokens=32, seed=0, temperature=1.0, top_k=None,
               top_p=None, **options):
        import torch
        import torch.nn.functional as F

        if options:
            raise UnsupportedSetting(f"{', '.join(options)}: server options, for the openai backend; with logits, "
                                     "change next_logits instead")
        if temperature is not None and temperature < 0:
            raise LLMError(f"temperature must be >= 0, got {temperature}")
        steps = None if temperature == 0 else _processors(temperature, top_k, top_p)
        out = []
        for j, prompt in enumerate(prompts):
            ids = self.prompt_ids(prompt).repeat(n_samples, 1)  # (n, T0)
            start = ids.size(1)
            gen = torch.Generator().manual_seed(1000 * seed + j)
            logps = []
            for _ in range(max_new_tokens):
                logits = self.next_logits(ids)  # (n, V)
                if steps is None:
                    nxt = logits.argmax(-1)  # (n,)
                else:
                    probs = F.softmax(steps(ids, logits), dim=-1)
                    nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)  # (n,)
                logps.append(F.log_softmax(logits, -1).gather(-1, nxt[:, None]).squeeze(1))  # (n,)
                ids = torch.cat([ids, nxt[:, None]], 1)  # (n, T + 1)
            logp = torch.stack(logps, 1) if logps else torch.zeros(n_samples, 0)  # (n, max_new_tokens)
            for row in range(n_samples):
                shown = self.shown_length(ids[row, start:])  # the log-probs of the tokens the text holds
                out.append({"prompt": prompt, "group": j, "text": self.decode(ids[row, start:]),
                            "logprobs": logp[row, :shown].tolist(), "ids": None, "start": None})
        return out


class LocalSmallGPT(_LogitsModel):
    """The small GPT of the book's GPT chapter (``coursekit.gpt``): it continues news text."""

    backend = "local"
    kind = "text"

    def __init__(self, device=None):
        import torch

        from coursekit.gpt import load_or_train_small_gpt

        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.model, self.tokenizer, info = load_or_train_small_gpt(device=self.device, verbose=False)
        self.block_size = self.model.config.block_size
        self.name = "small GPT (coursekit.gpt, trained on AG News)"
        self.description = info["description"]

    def prompt_ids(self, text):
        import torch

        return torch.tensor([self.tokenizer.encode("\n" + text)])  # a new article starts after a line break

    def next_logits(self, ids):
        import torch

        with torch.no_grad():
            context = ids[:, -self.block_size:].to(self.device)  # learned positions end at block_size
            return self.model(context)[0][:, -1, :].float().cpu()

    def decode(self, ids):
        return self.tokenizer.decode(ids)

    def token_logprobs(self, ids, start):
        """log p(ids[:, t] | ids[:, :t]) for t = start .. T-1, shape (B, T - start)."""
        import torch
        import torch.nn.functional as F

        with torch.no_grad():
            if ids.size(1) <= self.block_size:
                logp = F.log_softmax(self.model(ids.to(self.device))[0].float(), dim=-1).cpu()  # (B, T, V)
                return logp[:, start - 1:-1].gather(-1, ids[:, start:, None]).squeeze(-1)
            return torch.stack([F.log_softmax(self.next_logits(ids[:, :t]), -1).gather(-1, ids[:, t:t + 1]).squeeze(-1)
                                for t in range(start, ids.size(1))], dim=1)


class LocalHubChat(_LogitsModel):
    """A small instruction-tuned model from the Hugging Face hub: it answers questions."""

    backend = "local"
    kind = "chat"

    def __init__(self, name=HUB_CHAT_MODEL, device=None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(name)
        self.model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32).to(self.device).eval()
        self.name = name
        self.end_of_turn = self.tokenizer.eos_token_id
        n = sum(p.numel() for p in self.model.parameters())
        self.description = f"hub: {name} ({n / 1e6:.0f}M parameters)"

    def prompt_ids(self, text):
        import torch

        chat = [{"role": "user", "content": text}]
        prompt = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return torch.tensor([self.tokenizer(prompt, add_special_tokens=False)["input_ids"]])

    def next_logits(self, ids):
        import torch

        with torch.no_grad():
            return self.model(ids.to(self.device)).logits[:, -1, :].float().cpu()

    def decode(self, ids):
        ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
        return self.tokenizer.decode(ids[: self.shown_length(ids)], skip_special_tokens=True)  # ends at end of turn

    def token_logprobs(self, ids, start):
        import torch
        import torch.nn.functional as F

        with torch.no_grad():
            logp = F.log_softmax(self.model(ids.to(self.device)).logits.float(), dim=-1).cpu()
        return logp[:, start - 1:-1].gather(-1, ids[:, start:, None]).squeeze(-1)


class LocalOfflineChat(LocalHubChat):
    """The course's offline chat model (``coursekit.gpt.assistant.load_or_train_chat``): a small
    Llama pre-trained on AG News and fine-tuned on two instructions, the topic of a headline
    and a headline about a topic. It knows nothing else: other questions get news-like text."""

    PROMPTS = ("Write a headline about sports.", "Write a headline about business.",
               "Oil prices climb as supplies tighten. Crude futures rose on Monday after producers said "
               "they would pump less.\nWhat is the topic of this news?")

    def __init__(self, device=None):
        import torch

        from coursekit.gpt.assistant import load_or_train_chat

        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.model, self.tokenizer, info = load_or_train_chat(device=self.device, verbose=False)
        self.name = "offline chat model (coursekit.gpt.assistant, AG News instructions)"
        self.end_of_turn = self.tokenizer.eos_token_id
        self.description = f"offline: {info['description']}"


def export_offline_chat(folder=None):
    """Write the offline chat model as a transformers checkpoint (``LlamaForCausalLM``, its
    tokenizer with the chat template, a generation config that stops at ``<|end|>``) for
    ``transformers serve FOLDER`` or vLLM, and return the folder. Default:
    ``$COURSE_CACHE_DIR/assistant-export/<key>``; ``python -m coursekit.llm export --chat``."""
    from transformers import GenerationConfig

    from coursekit.gpt.assistant import load_or_train_chat
    from coursekit.models import _quiet, course_cache_dir

    model, tokenizer, info = load_or_train_chat(verbose=False)
    folder = Path(folder) if folder is not None else course_cache_dir() / "assistant-export" / info["key"]
    folder.mkdir(parents=True, exist_ok=True)
    # a server samples at the request's settings only when the model's default is to sample (a
    # greedy default makes every temperature give the same text), and adds no hidden top-k
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=None, top_p=None,
                                               max_new_tokens=48, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    with _quiet():
        model.save_pretrained(folder)  # with its generation_config.json
        tokenizer.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------
# llama.cpp in this process
# ---------------------------------------------------------------------------------------

class LlamaCppModel(_LogitsModel):
    """A GGUF file run by llama-cpp-python in this process, with full logits.

    ``kind`` "chat" wraps a prompt in the chat template stored in the file; "text" (the
    course GPT) starts it after a line break, like the local small GPT. The context is at
    most ``max_context`` tokens (the logits of every position are kept, so memory grows with
    context times vocabulary); longer inputs keep their most recent tokens."""

    backend = "llamacpp"

    def __init__(self, path, kind=None, max_context=512, threads=None):
        try:
            import llama_cpp
        except ImportError:
            raise LLMError("COURSE_LLM_BACKEND=llamacpp needs llama-cpp-python: pip install llama-cpp-python "
                           "(it compiles llama.cpp, several minutes), or use COURSE_LLM_BACKEND=openai with "
                           "llama.cpp's llama-server") from None
        path = Path(path or "").expanduser()
        if not path.is_file():
            raise LLMError(f"COURSE_LLM_MODEL={str(path)!r} is not a GGUF file (llamacpp reads the model "
                           "from a .gguf file; python -m coursekit.llm export --format gguf writes the course GPT)")
        threads = threads or max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                        else (os.cpu_count() or 1)))
        probe = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)  # reads the metadata only
        meta = dict(probe.metadata)
        probe.close()
        trained = int(meta.get(f"{meta.get('general.architecture')}.context_length", max_context))
        self.n_ctx = min(trained, max_context)
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=self.n_ctx, logits_all=True, n_threads=threads,
                                   n_batch=self.n_ctx, verbose=False)
        # close llama.cpp's handles while Python is still whole (at exit, its own __del__ comes too late)
        weakref.finalize(self, self.llm.close)
        self.template = meta.get("tokenizer.chat_template")
        self.kind = kind or ("chat" if self.template else "text")
        if self.kind == "chat" and not self.template:
            raise LLMError(f"{path.name} has no chat template: set COURSE_LLM_KIND=text for a base model")
        self.add_bos = meta.get("tokenizer.ggml.add_bos_token", "false") == "true"
        self.eos = self.end_of_turn = self.llm.token_eos()
        self.name = meta.get("general.name") or path.stem
        self.description = (f"llama.cpp (llama-cpp-python {llama_cpp.__version__}): {path.name}, "
                            f"{meta.get('general.architecture', '?')} architecture, context {self.n_ctx} tokens, "
                            f"{self.llm.n_vocab()} tokens in the vocabulary")
        self._evaluated: list[int] = []

    def prompt_ids(self, text):
        import torch

        if self.kind == "chat":  # the file's chat template, rendered as llama-cpp-python renders it
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            piece = lambda token: self.llm.detokenize([token], special=True).decode("utf-8", "replace")  # noqa: E731
            formatter = Jinja2ChatFormatter(self.template, eos_token=piece(self.eos),
                                            bos_token=piece(self.llm.token_bos()))
            prompt = formatter(messages=[{"role": "user", "content": text}]).prompt
            ids = self.llm.tokenize(prompt.encode(), add_bos=self.add_bos, special=True)
        else:
            ids = self.llm.tokenize(("\n" + text).encode(), add_bos=self.add_bos, special=False)
        return torch.tensor([ids])

    def _logits_of(self, tokens):
        """The (len(tokens), V) logits of a sequence, reusing what llama.cpp already holds
        for the longest common prefix with the sequence evaluated last."""
        import numpy as np

        keep = 0
        limit = min(len(self._evaluated), len(tokens) - 1)  # evaluate at least one token
        while keep < limit and self._evaluated[keep] == tokens[keep]:
            keep += 1
        if keep < self.llm.n_tokens:
            self.llm._ctx.memory_seq_rm(-1, keep, -1) if hasattr(self.llm._ctx, "memory_seq_rm") \
                else self.llm._ctx.kv_cache_seq_rm(-1, keep, -1)
            self.llm.n_tokens = keep
        self.llm.eval(tokens[keep:])
        self._evaluated = list(tokens)
        return np.array(self.llm.scores[: len(tokens)])  # a copy: the next eval overwrites llama's buffer

    def next_logits(self, ids):
        import torch

        import numpy as np

        rows = [self._logits_of(row[-self.n_ctx:].tolist())[-1] for row in ids]
        return torch.from_numpy(np.stack(rows)).float()  # (B, V)

    def decode(self, ids):
        ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
        return self.llm.detokenize(ids[: self.shown_length(ids)]).decode("utf-8", errors="replace")

    def token_logprobs(self, ids, start):
        import torch
        import torch.nn.functional as F

        out = []
        for row in ids:
            row = row.tolist()
            if len(row) <= self.n_ctx:
                logits = torch.tensor(self._logits_of(row), dtype=torch.float32)  # (T, V)
                logp = F.log_softmax(logits, -1)[start - 1:-1]
                out.append(logp.gather(-1, torch.tensor(row[start:])[:, None]).squeeze(-1))
            else:
                out.append(torch.stack([F.log_softmax(torch.tensor(self._logits_of(row[max(0, t - self.n_ctx):t])[-1]), -1)[row[t]]
                                        for t in range(start, len(row))]))
        return torch.stack(out)  # (B, T - start)


# ---------------------------------------------------------------------------------------
# Any OpenAI-compatible server
# ---------------------------------------------------------------------------------------

def _short(text, n=160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _server_says(err) -> str:
    """What the server said about an error: the body's message or detail, else the client's text."""
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        for key in ("message", "detail", "error"):
            if inner.get(key):
                return str(inner[key])
    return str(getattr(err, "message", "") or err)


# -- the connection to a server: one deadline, a bounded reply, the key for that host only --
#
# The openai client's own timeout is per operation (each read waits up to the timeout
# again, so a server that trickles bytes holds it for ever) and it reads a reply whole,
# however large. Both limits therefore live in the HTTP transport handed to the client:
# every socket operation waits at most until the request's deadline, and the reply's
# bytes are counted (after decompression) and stop at the cap.

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("coursekit_llm_deadline", default=None)


@contextlib.contextmanager
def _deadline(seconds: float):
    """Everything sent and read through a guarded transport in this block ends by now + seconds."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _time_left() -> float | None:
    end = _DEADLINE.get()
    return None if end is None else end - time.monotonic()


_api_key_for = api_key  # OpenAIModel's argument api_key hides the function's name


class _ReplyError(LLMError):
    """Raised inside the transport; it passes through httpx and the openai client unchanged."""


class _TooSlow(_ReplyError):
    pass


class _TooLarge(_ReplyError):
    pass


def _too_slow(server: str, total: float) -> str:
    return (f"no answer from {server} within {total:g} s (COURSE_LLM_TIMEOUT, for the whole reply): the server is "
            "busy, slow or stalled; run the cell again, ask for fewer samples or tokens, or raise COURSE_LLM_TIMEOUT")


def _clamp(timeout: float | None, server: str, total: float) -> float:
    """The wait allowed for one socket operation: what is left of the deadline, at most ``timeout``."""
    left = _time_left()
    if left is None:
        return timeout
    if left <= 0:
        raise _TooSlow(_too_slow(server, total))
    return left if timeout is None else min(timeout, left)


def _guarded_transport(base_url: str, key: _Secret, max_bytes: int, total: float):
    """An ``httpx2`` transport (the HTTP library of the openai client) bound to one server."""
    import httpcore2
    import httpx2

    server = urlparse(base_url).netloc or base_url
    origin = httpx2.URL(base_url)
    origin = (origin.scheme, origin.host, origin.port)
    openai_host = is_openai_url(base_url)

    class Stream(httpcore2.NetworkStream):
        def __init__(self, inner):
            self._inner = inner

        def read(self, max_bytes, timeout=None):
            return self._inner.read(max_bytes, _clamp(timeout, server, total))

        def write(self, buffer, timeout=None):
            self._inner.write(buffer, _clamp(timeout, server, total))

        def close(self):
            self._inner.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            return Stream(self._inner.start_tls(ssl_context, server_hostname, _clamp(timeout, server, total)))

        def get_extra_info(self, info):
            return self._inner.get_extra_info(info)

    class Backend(httpcore2.NetworkBackend):
        def __init__(self, inner):
            self._inner = inner

        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            return Stream(self._inner.connect_tcp(host, port, _clamp(timeout, server, total), local_address,
                                                  socket_options))

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            return Stream(self._inner.connect_unix_socket(path, _clamp(timeout, server, total), socket_options))

        def sleep(self, seconds):
            self._inner.sleep(seconds)

    def too_large(what):
        cap = f"{max_bytes / 2**20:g} MiB" if max_bytes >= 2**20 // 10 else f"{max_bytes:,d} bytes"
        return _TooLarge(f"{server} sent {what}, more than the {cap} a reply may have "
                         "(COURSE_LLM_MAX_REPLY_MB); reading stopped. Is COURSE_LLM_BASE_URL the server's API "
                         "address? For long answers, raise COURSE_LLM_MAX_REPLY_MB")

    class Body(httpx2.SyncByteStream):
        """The reply's bytes, decompressed here (gzip, deflate) and counted: at most max_bytes."""

        def __init__(self, inner, encoding):
            self._inner = inner
            self._zlib = zlib.decompressobj(47) if encoding in ("gzip", "deflate") else None  # 47: either header

        def __iter__(self):
            n = 0
            for chunk in self._inner:
                if self._zlib is not None:
                    try:
                        chunk = self._zlib.decompress(chunk, max_bytes + 1 - n)  # never more than the cap
                    except zlib.error:
                        raise _ReplyError(f"{server} sent a compressed reply that does not decompress") from None
                n += len(chunk)
                if n > max_bytes:
                    raise too_large("a longer reply")
                if chunk:
                    yield chunk
            if self._zlib is not None and self._zlib.flush():
                raise _ReplyError(f"{server} sent a compressed reply that does not end")

        def close(self):
            self._inner.close()

    class Transport(httpx2.HTTPTransport):
        def __init__(self):
            super().__init__()
            pool = self._pool
            # the one private attribute used: httpx2 has no argument for httpcore2's network
            # backend; test_llm_client.py's trickling server fails if this stops working
            assert isinstance(getattr(pool, "_network_backend", None), httpcore2.NetworkBackend), \
                "httpcore2's connection pool changed: update coursekit.llm._guarded_transport"
            pool._network_backend = Backend(pool._network_backend)

        def handle_request(self, request):
            if (request.url.scheme, request.url.host, request.url.port) != origin:
                raise _ReplyError(f"refused to send a request for {server} to {request.url.host} "
                                  "(a redirect?): set COURSE_LLM_BASE_URL to the address that answers")
            # the key goes to this server only, and only the key named for it: the openai client
            # holds a placeholder, and whatever it (or its environment) put here is replaced
            for name in ("authorization", "openai-organization", "openai-project"):
                if name == "authorization" or not openai_host:
                    request.headers.pop(name, None)
            if key.reveal():
                request.headers["Authorization"] = f"Bearer {key.reveal()}"
            request.headers["Accept-Encoding"] = "gzip, deflate"  # what Body decompresses, counted
            _clamp(None, server, total)  # the deadline may have passed already (a retry's wait)
            response = super().handle_request(request)
            length = response.headers.get("content-length", "")
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if length.isdigit() and int(length) > max_bytes:
                response.close()
                raise too_large(f"a reply of {int(length):,d} bytes (its Content-Length)")
            if encoding not in ("identity", "", "gzip", "deflate"):
                response.close()
                raise _ReplyError(f"{server} compressed its reply with {encoding!r}, which this client does not "
                                  "read (it asks for gzip or none)")
            headers = [(k, v) for k, v in response.headers.raw
                       if k.lower() not in (b"content-encoding", b"content-length")]
            return httpx2.Response(status_code=response.status_code, headers=headers,
                                   stream=Body(response.stream, encoding), extensions=response.extensions)

    return Transport()


class OpenAIModel(LanguageModel):
    """A model behind an OpenAI-compatible API, through the ``openai`` client package.

    ``kind`` "chat" sends each prompt as one user message (``chat.completions``); "text"
    sends it as a plain completion (``completions``), for base models such as the course
    GPT, after a line break as the local small GPT does. The server samples; settings it
    does not take are reported (top-k) or left out with a note (log-probabilities, several
    samples per request).

    Every request goes through a transport bound to ``base_url`` (``_guarded_transport``):
    one deadline of ``timeout`` seconds for a whole answer (retries included), replies of at
    most ``max_reply_mb`` MiB, and the key for this server only (see ``api_key``)."""

    backend = "openai"
    max_retries = 2  # for a refused connection, HTTP 408, 409, 429 and 5xx, within the deadline

    def __init__(self, model, base_url=DEFAULT_BASE_URL, kind=None, timeout=60.0, price=None, verbose=True,
                 api_key=None, max_reply_mb=MAX_REPLY_MB):
        try:
            import httpx2
            import openai
        except ImportError:
            raise LLMError("COURSE_LLM_BACKEND=openai needs the openai package: pip install openai") from None
        if not model:
            raise LLMError("COURSE_LLM_BACKEND=openai needs a model name: set COURSE_LLM_MODEL "
                           "(e.g. gpt-4o-mini, or the name your llama-server / Ollama / vLLM serves)")
        self._openai = openai
        self.base_url = base_url.rstrip("/")
        self.host = urlparse(self.base_url).netloc or self.base_url
        self.local = is_local_url(self.base_url)
        self.kind = kind or "chat"
        self.name = model
        self.timeout = float(timeout)
        self.max_reply_bytes = int(float(max_reply_mb) * 2**20)
        self.verbose = verbose
        self._key = _Secret(_api_key_for(self.base_url, api_key) or "")
        transport = _guarded_transport(self.base_url, self._key, self.max_reply_bytes, self.timeout)
        # The client holds a placeholder, never the key: the transport sets the Authorization
        # header (to this server's key, or none). Retries are ours, within the deadline.
        self.client = openai.OpenAI(api_key="set-by-the-transport",
                                    base_url=self.base_url, timeout=self.timeout, max_retries=0,
                                    http_client=httpx2.Client(transport=transport, follow_redirects=False,
                                                              timeout=self.timeout))
        if price is not None:
            self.price, self.price_source = tuple(price), "COURSE_LLM_PRICE"
        elif self.host == "api.openai.com" and model in OPENAI_PRICES:
            self.price, self.price_source = OPENAI_PRICES[model], "OpenAI list price of 2025"
        else:
            self.price, self.price_source = None, None
        self.unsupported: set[str] = set()  # optional request fields this server refused
        self.total = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        endpoint = "chat.completions" if self.kind == "chat" else "completions"
        self.description = f"{model} at {self.base_url} (OpenAI-compatible API, {endpoint})"

    def __repr__(self):
        return f"OpenAIModel(model={self.name!r}, base_url={self.base_url!r}, kind={self.kind!r})"

    # -- errors --------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """``text`` without any key this process knows (this server's, and both variables')."""
        text = str(text)
        for key in (self._key.reveal(), os.environ.get(KEY_NAME, ""), os.environ.get(SERVER_KEY_NAME, "")):
            key = key.strip()
            if len(key) >= 4:
                text = text.replace(key, "***")
        return text

    def _key_advice(self) -> str:
        if is_openai_url(self.base_url):
            return f"check the Colab secret or environment variable {KEY_NAME}"
        sent = "the key you named for it" if self._key.reveal() else "no key"
        return (f"this client sent {sent}; give this server's key as the Colab secret or environment variable "
                f"{SERVER_KEY_NAME}, or load_llm(api_key=...) ({KEY_NAME} goes to {OPENAI_HOST} only)")

    def _explain(self, err) -> LLMError:
        """One line for an error of the openai client."""
        import httpx2

        o = self._openai
        status = getattr(err, "status_code", None)
        detail = self._scrub(_short(_server_says(err)))
        cause = err.__cause__ or err.__context__
        if isinstance(err, LLMError):
            return err
        if isinstance(err, (o.APITimeoutError, httpx2.TimeoutException)):
            msg = _too_slow(self.host, self.timeout)
        elif isinstance(err, httpx2.RemoteProtocolError) or isinstance(cause, httpx2.RemoteProtocolError):
            msg = (f"{self.host} broke off or sent what is not valid HTTP ({_short(cause or err, 80)}): is "
                   "COURSE_LLM_BASE_URL the address and port of the server's API?")
        elif isinstance(err, (o.APIConnectionError, httpx2.HTTPError)):
            msg = (f"cannot reach {self.base_url}: is the server running, and is COURSE_LLM_BASE_URL right?")
        elif isinstance(err, o.RateLimitError):
            msg = (f"{self.host} refused the request: rate limit or quota reached (HTTP 429). Wait a minute and "
                   f"run the cell again, or use fewer samples; a quota error needs credit on your account. "
                   f"Server: {detail}")
        elif isinstance(err, o.AuthenticationError) or status == 401:
            msg = f"{self.host} did not accept the API key (HTTP 401): {self._key_advice()}"
        elif isinstance(err, o.PermissionDeniedError):
            msg = f"{self.host} refused access (HTTP 403): your key may not be allowed to use {self.name!r}"
        elif isinstance(err, o.NotFoundError):
            msg = (f"{self.host} has no model {self.name!r} or no such endpoint (HTTP 404): check COURSE_LLM_MODEL "
                   f"(the server lists its models at {self.base_url}/models) and COURSE_LLM_KIND")
        elif isinstance(err, o.APIStatusError) and status is not None and status >= 500:
            msg = f"{self.host} failed (HTTP {status}, a server error): {detail}; run the cell again later"
            if getattr(self, "kind", None) == "chat":  # transformers serve answers a base model's chat so
                msg += (f"; if {self.name!r} is a base model that continues text (no chat template), "
                        "set COURSE_LLM_KIND=text")
        elif isinstance(err, o.APIStatusError):
            msg = f"{self.host} rejected the request (HTTP {status}): {detail}"
        else:
            msg = f"{type(err).__name__} from {self.host}: {detail}"
        return LLMError(self._scrub(msg))

    # -- requests ------------------------------------------------------------------------

    def _request(self, prompt, n, max_new_tokens, seed, temperature, top_k, top_p, options):
        """One request; returns (list of (text, logprobs or None), usage or None)."""
        o = self._openai
        args = {**options, "model": self.name, "max_tokens": int(max_new_tokens), "temperature": float(temperature)}
        if top_p is not None:
            args["top_p"] = float(top_p)
        optional = {"seed": int(seed), "n": int(n), "logprobs": True if self.kind == "chat" else 1}
        extra = {}
        if top_k is not None:
            extra["top_k"] = int(top_k)  # not in the OpenAI API: vLLM and llama-server take it
        for name, value in optional.items():
            if name not in self.unsupported and not (name == "n" and n == 1):
                args[name] = value
        with _deadline(self.timeout):  # one deadline for this answer: every try, wait and byte
            while True:
                try:
                    body = self._send(prompt, args, extra)
                    break
                except (o.BadRequestError, o.UnprocessableEntityError) as err:
                    text = _server_says(err)
                    if "top_k" in extra and "top_k" in text:
                        raise UnsupportedSetting(f"{self.host} does not take top_k (it is not part of the OpenAI "
                                                 "API; vLLM and llama.cpp's server take it)") from None
                    if "max_tokens" in args and "max_completion_tokens" in text and self.kind == "chat":
                        args["max_completion_tokens"] = args.pop("max_tokens")  # newer OpenAI models want this
                        continue
                    refused = [k for k in ("logprobs", "seed", "n") if k in args
                               and re.search(rf"(?<![A-Za-z_]){k}(?![A-Za-z_])", text)]
                    if not refused:
                        raise self._explain(err) from None
                    for k in refused:  # optional: leave it out from now on, and say so once
                        self.unsupported.add(k)
                        args.pop(k)
                    if self.verbose:
                        print(f"note: {self.host} does not take {', '.join(refused)}; sent without it")
        return self._parse(body)

    def _send(self, prompt, args, extra) -> bytes:
        """The body of the reply to one request, retried (refused connection, HTTP 408, 409,
        429, 5xx) while the deadline leaves time; any other failure becomes an LLMError
        (bad requests are left to the caller, which may drop optional fields)."""
        import httpx2

        o = self._openai
        for attempt in range(self.max_retries + 1):
            try:
                if self.kind == "chat":
                    raw = self.client.chat.completions.with_raw_response.create(
                        messages=[{"role": "user", "content": prompt}], extra_body=extra or None, **args)
                else:
                    raw = self.client.completions.with_raw_response.create(
                        prompt="\n" + prompt, extra_body=extra or None, **args)
                return raw.http_response.content  # read whole by now, at most max_reply_bytes
            except (o.BadRequestError, o.UnprocessableEntityError):
                raise
            except _ReplyError as err:  # from the transport: too slow, too large, not decompressible
                raise LLMError(self._scrub(err)) from None  # shown as "LLMError: ...", one line
            except (o.OpenAIError, httpx2.HTTPError) as err:
                status = getattr(err, "status_code", None)
                again = (status in (408, 409, 429) or (status or 0) >= 500
                         or (isinstance(err, o.APIConnectionError) and not isinstance(err, o.APITimeoutError)))
                wait = 0.5 * 2 ** attempt
                retry_after = getattr(getattr(err, "response", None), "headers", {}).get("retry-after", "")
                if retry_after.replace(".", "", 1).isdigit():
                    wait = max(wait, float(retry_after))
                left = _time_left()
                if not again or attempt == self.max_retries or left is None or wait >= left:
                    raise self._explain(err) from None
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _bad_reply(self, what: str) -> LLMError:
        return LLMError(self._scrub(f"{self.host} sent {what}: is COURSE_LLM_BASE_URL ({self.base_url}) the "
                                    "server's OpenAI-compatible API (it usually ends in /v1), and COURSE_LLM_KIND "
                                    "right for it?"))

    def _parse(self, body: bytes):
        """(list of (text, logprobs or None), usage dict or None) from a reply's bytes; a reply
        that is not a completion raises LLMError. Log-probabilities and usage are optional."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self._bad_reply(f"a reply that is not UTF-8 text (byte {err.start} of {len(body):,d})") from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise self._bad_reply(f"a reply that is not JSON ({_short(repr(text), 60)})") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list):
            raise self._bad_reply(f"JSON without a list of 'choices' ({_short(repr(data), 60)})")
        out = []
        for choice in choices:
            if self.kind == "chat":
                message = choice.get("message") if isinstance(choice, dict) else None
                content = message.get("content", "") if isinstance(message, dict) else 0
                if not (content is None or isinstance(content, str)):
                    raise self._bad_reply(f"a choice without a message's text ({_short(repr(choice), 60)})")
                lp = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) \
                    else None
                logprobs = [t.get("logprob") for t in lp] if isinstance(lp, list) and \
                    all(isinstance(t, dict) for t in lp) else None
            else:
                content = choice.get("text", 0) if isinstance(choice, dict) else 0
                if not (content is None or isinstance(content, str)):
                    raise self._bad_reply(f"a choice without a 'text' ({_short(repr(choice), 60)})")
                lp = (choice.get("logprobs") or {}).get("token_logprobs") \
                    if isinstance(choice.get("logprobs"), dict) else None
                logprobs = [x for x in lp if x is not None] if isinstance(lp, list) else None
            if logprobs is not None and not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                for x in logprobs):
                logprobs = None  # not numbers: reported as none
            out.append((content or "", logprobs or None))
        usage = data.get("usage")
        if isinstance(usage, dict):
            usage = {k: usage[k] if isinstance(usage.get(k), int) else 0 for k in ("prompt_tokens", "completion_tokens")}
        else:
            usage = None
        return out, usage

    def sample(self, prompts, n_samples=1, max_new_tokens=32, seed=0, temperature=1.0, top_k=None,
               top_p=None, **options):
        """As ``LanguageModel.sample``; ``options`` are further request fields the server
        takes, e.g. ``frequency_penalty`` (a repetition penalty), ``presence_penalty``, ``stop``."""
        used = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        samples = []
        try:
            for j, prompt in enumerate(prompts):
                got = []
                base = 1000 * seed + j
                while len(got) < n_samples:  # a server may return fewer samples than asked for
                    more, usage = self._request(prompt, n_samples - len(got), max_new_tokens, base + len(got),
                                                temperature, top_k, top_p, options)
                    used["requests"] += 1
                    if usage is not None:
                        used["prompt_tokens"] += usage["prompt_tokens"]
                        used["completion_tokens"] += usage["completion_tokens"]
                    if not more:
                        raise LLMError(f"{self.host} answered with no text for {prompt[:40]!r}")
                    got += more[: n_samples - len(got)]
                samples += [{"prompt": prompt, "group": j, "text": text, "logprobs": logprobs, "ids": None,
                             "start": None} for text, logprobs in got]
        finally:
            self._account(used)
        return samples

    def _cost(self, prompt_tokens, completion_tokens) -> float | None:
        if self.price is None:
            return None
        return (prompt_tokens * self.price[0] + completion_tokens * self.price[1]) / 1e6

    def _account(self, used):
        for k in self.total:
            self.total[k] += used[k]
        if not self.verbose or not used["requests"]:
            return
        tokens = used["prompt_tokens"] + used["completion_tokens"]
        total = self.total["prompt_tokens"] + self.total["completion_tokens"]
        requests = f"{used['requests']} request" + ("s" if used["requests"] != 1 else "")
        line = (f"[{self.name} at {self.host}] {requests}, {used['prompt_tokens']:,d} prompt + "
                f"{used['completion_tokens']:,d} generated = {tokens:,d} tokens (this session: {total:,d})")
        cost, total_cost = self._cost(used["prompt_tokens"], used["completion_tokens"]), \
            self._cost(self.total["prompt_tokens"], self.total["completion_tokens"])
        if cost is not None:
            line += f"; estimated cost ${cost:.4f} (this session ${total_cost:.4f}; {self.price_source})"
        elif self.local:
            line += "; a server on this machine: no cost"
        else:
            line += "; cost unknown: set COURSE_LLM_PRICE=in,out (USD per million tokens) for an estimate"
        print(line)


# ---------------------------------------------------------------------------------------
# Choosing a backend
# ---------------------------------------------------------------------------------------

def load_llm(device=None, backend=None, model=None, base_url=None, kind=None, verbose=True,
             api_key=None) -> LanguageModel:
    """The language model the settings ask for (see the module docstring).

    ``local``: SmolLM2-135M-Instruct when ``coursekit.models.model_source()`` is "hub" (it
    falls back to the offline model, saying why, if the download fails), else the offline
    model: the small GPT, or with ``kind="chat"`` the offline chat model (``LocalOfflineChat``).
    ``openai``: ``model`` at ``base_url``, sent ``api_key`` if given (else the key for that
    server, see ``api_key``). ``llamacpp``: ``model`` is the .gguf file."""
    s = llm_settings(backend, model, base_url, kind)
    if s.pinned and verbose and (backend or _env("COURSE_LLM_BACKEND", "local")).lower() != s.backend:
        print(f"note: this run uses the {s.backend} model (COURSE_LLM_PINNED_BACKEND, set for grading)")
    if s.backend == "openai":
        return OpenAIModel(s.model, s.base_url, kind=s.kind, timeout=s.timeout, price=s.price, verbose=verbose,
                           api_key=api_key, max_reply_mb=s.max_reply_mb)
    if s.backend == "llamacpp":
        return LlamaCppModel(s.model, kind=s.kind)
    from coursekit.models import model_source

    if model_source() == "hub":
        try:
            return LocalHubChat(model or HUB_CHAT_MODEL, device)
        except Exception as err:  # noqa: BLE001 - any failure: say why, use the offline model
            print(f"could not load {model or HUB_CHAT_MODEL} ({type(err).__name__}: {_short(err, 200)}); "
                  f"using the {'offline chat model' if kind == 'chat' else 'small GPT'}")
    if kind == "chat":  # asked for an instruction model: the offline one
        return LocalOfflineChat(device)
    return LocalSmallGPT(device)


# ---------------------------------------------------------------------------------------
# The course GPT for other programs: a transformers checkpoint or a GGUF file
# ---------------------------------------------------------------------------------------

def _gpt2_state(model):
    """The small GPT's weights under GPT-2's names in transformers. The modules are GPT-2's
    (pre-norm blocks, learned positions, tied embeddings); transformers' GPT-2 keeps its
    linear maps as Conv1D, whose weight is the transpose of nn.Linear's."""
    state = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("lm_head"):
            continue  # tied to transformer.wte.weight
        t = tensor.detach().cpu().float()
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            t = t.t()
        state[name] = t.contiguous()
    return state


def _merges(tokenizer) -> list[str]:
    model = json.loads(tokenizer.to_str())["model"]
    return [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]


def export_small_gpt(folder=None, fmt="hf", model=None, tokenizer=None, chat_template=None):
    """Write the course's small GPT (``load_or_train_small_gpt()`` unless ``model`` and
    ``tokenizer`` are given) for other programs, and return the path written.

    ``fmt="hf"``: a transformers checkpoint folder (``GPT2LMHeadModel``, exact GELU, the BPE
    tokenizer, a generation config that samples with no hidden top-k), which ``transformers
    serve FOLDER`` or vLLM can serve. ``fmt="gguf"``: one GGUF file (float32, llama.cpp's
    ``gpt2`` architecture) for llama.cpp, llama-cpp-python or Ollama; llama.cpp computes GELU
    with the tanh approximation, so its logits differ from the original in the fourth
    decimal or so. Its end-of-text token is the line break (articles are one per line), as
    llama.cpp needs one. ``chat_template`` (a Jinja template) is stored in the file, for
    programs that only speak chat. Default folder: ``$COURSE_CACHE_DIR/small-gpt-export/<key>``."""
    import torch

    if model is None or tokenizer is None:
        from coursekit.gpt import load_or_train_small_gpt

        model, tokenizer, info = load_or_train_small_gpt(verbose=False)
        key = info["key"]
    else:
        key = "custom"
    if fmt not in ("hf", "gguf"):
        raise ValueError(f"fmt={fmt!r}: use 'hf' or 'gguf'")
    if folder is None:
        from coursekit.models import course_cache_dir

        folder = course_cache_dir() / "small-gpt-export" / key
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    backend = getattr(tokenizer, "backend", tokenizer)  # coursekit.gpt.BPETokenizer wraps a tokenizers.Tokenizer
    if fmt == "hf":
        from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

        config = GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
                            n_head=c.n_head, n_inner=4 * c.n_embd, activation_function="gelu",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                            bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=True)
        hf = GPT2LMHeadModel(config)
        missing, unexpected = hf.load_state_dict(_gpt2_state(model), strict=False)
        if unexpected or any(not k.startswith("lm_head") for k in missing):
            raise RuntimeError(f"weights do not match GPT-2's layout: missing {missing}, unexpected {unexpected}")
        hf.tie_weights()
        hf.eval()
        # sample by default, with nothing but the request's settings (no hidden top-k)
        hf.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=None, top_p=None,
                                                max_new_tokens=c.block_size)
        from coursekit.models import _quiet

        with _quiet():  # no progress bars
            hf.save_pretrained(folder)
            PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=c.block_size).save_pretrained(folder)
        return folder
    import gguf

    path = folder / "small-gpt-f32.gguf"
    vocab = backend.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "token ids must be 0..V-1"
    newline = backend.token_to_id("Ċ")  # "\n" in byte-level BPE's printable alphabet
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_name("course small GPT (AG News)")
    w.add_context_length(c.block_size)
    w.add_embedding_length(c.n_embd)
    w.add_feed_forward_length(4 * c.n_embd)
    w.add_block_count(c.n_layer)
    w.add_head_count(c.n_head)
    w.add_layer_norm_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_token_merges(_merges(backend))
    w.add_bos_token_id(newline)
    w.add_eos_token_id(newline)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    names = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
             "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias",
             "lm_head.weight": "output.weight"}
    parts = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for name, tensor in model.state_dict().items():
        if name.startswith("transformer.h."):
            _, _, i, rest = name.split(".", 3)
            module, leaf = rest.rsplit(".", 1)
            target = f"blk.{i}.{parts[module]}.{leaf}"
        else:
            target = names[name]
        # nn.Linear keeps (out, in), the order llama.cpp expects from a PyTorch checkpoint
        w.add_tensor(target, tensor.detach().cpu().to(torch.float32).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m coursekit.llm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write the course's small GPT for transformers serve / vLLM (hf) "
                                       "or llama.cpp / Ollama (gguf)")
    ex.add_argument("--format", choices=("hf", "gguf"), default="hf")
    ex.add_argument("--chat", action="store_true", help="the offline chat model instead (hf only)")
    ex.add_argument("folder", nargs="?", help="where to write (default: the course cache)")
    args = parser.parse_args(argv)
    if args.chat and args.format != "hf":
        parser.error("--chat writes a transformers checkpoint: leave out --format gguf")
    print(export_offline_chat(args.folder) if args.chat else export_small_gpt(args.folder, fmt=args.format))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
