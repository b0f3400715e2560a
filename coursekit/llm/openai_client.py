"""Any server that speaks the OpenAI API, through the ``openai`` client package, behind a
transport that bounds what a server can do to a notebook (one deadline, a capped reply, the key
for that host only).

openai and httpx2 are imported where a client is built or an error explained: the package
imports without them (they are needed by the ``openai`` backend only)."""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import time
import zlib
from urllib.parse import urlparse

from coursekit.llm.base import LanguageModel, LLMError, UnsupportedSetting, _short
from coursekit.llm.keys import KEY_NAME, OPENAI_HOST, SERVER_KEY_NAME, _Secret, api_key, is_local_url, is_openai_url

# Imports inside functions: openai, httpx2 and httpcore2 are optional: they are imported where a request is
# made, so that the interface imports without them.

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
                "httpcore2's connection pool changed: update coursekit.llm.openai_client._guarded_transport"
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
