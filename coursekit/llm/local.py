"""The backends with full logits: models run in this process (``local``: transformers; ``llamacpp``:
a GGUF file in llama-cpp-python).

torch, transformers and llama_cpp are imported where a model is built or run, not at the top:
``coursekit.llm`` imports without them (a notebook that talks to a server needs neither), and
llama-cpp-python is optional."""
from __future__ import annotations

import os
import weakref
from pathlib import Path

from coursekit.llm.base import LanguageModel, LLMError, UnsupportedSetting

# Imports inside functions: torch, transformers, numpy, llama_cpp (optional) and coursekit.gpt are imported
# by the backend that uses them: a lab on an API backend loads none of them.

HUB_CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


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
