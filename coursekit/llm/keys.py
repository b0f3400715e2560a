"""Which key goes to which server: ``OPENAI_API_KEY`` to OpenAI's API only, any other server
the key named for it (``COURSE_LLM_API_KEY``), and a key that never shows itself (``_Secret``)."""
from __future__ import annotations

import getpass
import ipaddress
import os
from urllib.parse import urlparse

from coursekit.llm.base import LLMError

# Imports inside functions: google.colab exists only on Colab: it is imported where a Colab secret is read.

KEY_NAME = "OPENAI_API_KEY"  # environment variable and Colab secret: sent to OPENAI_HOST only
SERVER_KEY_NAME = "COURSE_LLM_API_KEY"  # the key for any other server (the grader drops names with KEY)
OPENAI_HOST = "api.openai.com"


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
        key = getpass.getpass(f"API key for {OPENAI_HOST} (typed input is hidden; or add the Colab secret "
                              f"{KEY_NAME}): ").strip()
    except Exception:  # noqa: BLE001 - no way to ask here (a script without a terminal)
        key = ""
    if not key:
        raise LLMError(f"no API key for {OPENAI_HOST}: add the Colab secret {KEY_NAME} (key icon, left bar) or set "
                       f"the environment variable {KEY_NAME}; never paste a key into a cell")
    return key
