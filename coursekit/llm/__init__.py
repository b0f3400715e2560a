"""One small interface to a language model, whichever program runs it.

Start with ``interface.py``: ``load_llm`` and what it returns, the settings and the errors, all
the LLM lab uses. The rest is behind it:

===================  ==========================================================================
``interface.py``     ``load_llm``, ``Settings`` / ``llm_settings`` (the ``COURSE_LLM_*`` variables)
``base.py``          ``LanguageModel`` (what every backend offers), ``LLMError``
``local.py``         models in this process: ``LocalSmallGPT``, ``LocalHubChat``,
                     ``LocalOfflineChat``, ``LlamaCppModel``
``openai_client.py`` ``OpenAIModel``: any OpenAI-compatible server, behind a guarded transport
``keys.py``          which key goes to which server (``api_key``)
``export.py``        the course's models for other programs (``python -m coursekit.llm export``)
===================  ==========================================================================
"""
from coursekit.llm.base import LanguageModel, LLMError, UnsupportedSetting
from coursekit.llm.export import export_offline_chat, export_small_gpt
from coursekit.llm.interface import BACKENDS, KINDS, Settings, llm_settings, load_llm
from coursekit.llm.keys import KEY_NAME, OPENAI_HOST, SERVER_KEY_NAME, api_key, is_local_url, is_openai_url
from coursekit.llm.local import HUB_CHAT_MODEL, LlamaCppModel, LocalHubChat, LocalOfflineChat, LocalSmallGPT
from coursekit.llm.openai_client import DEFAULT_BASE_URL, MAX_REPLY_MB, OPENAI_PRICES, OpenAIModel

__all__ = ["BACKENDS", "LLMError", "UnsupportedSetting", "LanguageModel", "LocalSmallGPT",
           "LocalHubChat", "LocalOfflineChat", "export_offline_chat", "LlamaCppModel", "OpenAIModel", "load_llm",
           "llm_settings", "api_key", "export_small_gpt", "HUB_CHAT_MODEL", "KEY_NAME", "SERVER_KEY_NAME",
           "MAX_REPLY_MB", "KINDS", "Settings", "DEFAULT_BASE_URL", "OPENAI_HOST", "OPENAI_PRICES", "is_local_url",
           "is_openai_url"]
