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

from dataclasses import dataclass

from coursekit.llm.base import LanguageModel, LLMError, UnsupportedSetting, _short
from coursekit.llm.local import HUB_CHAT_MODEL, LlamaCppModel, LocalHubChat, LocalOfflineChat, LocalSmallGPT
from coursekit.llm.openai_client import DEFAULT_BASE_URL, MAX_REPLY_MB, OpenAIModel
from coursekit import envvars
from coursekit.models import model_source

__all__ = ["BACKENDS", "KINDS", "LLMError", "UnsupportedSetting", "LanguageModel", "Settings", "llm_settings",
           "load_llm"]

BACKENDS = ("local", "openai", "llamacpp")
KINDS = ("chat", "text")


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
    return (envvars.get(name) or "").strip() or default


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
    if model_source() == "hub":
        try:
            return LocalHubChat(model or HUB_CHAT_MODEL, device)
        except Exception as err:  # noqa: BLE001 - any failure: say why, use the offline model
            print(f"could not load {model or HUB_CHAT_MODEL} ({type(err).__name__}: {_short(err, 200)}); "
                  f"using the {'offline chat model' if kind == 'chat' else 'small GPT'}")
    if kind == "chat":  # asked for an instruction model: the offline one
        return LocalOfflineChat(device)
    return LocalSmallGPT(device)
