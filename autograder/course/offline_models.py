"""The offline models an assignment loads (course.yml ``models``), built before any student
code runs: inside the sandbox the model cache is read-only and the hub out of reach."""
from __future__ import annotations

from coursekit.models import offline_distilbert_dir

from .settings import environ

# Imports inside functions: coursekit.gpt is imported when a model is built: it loads torch, which the
# course settings that import this module never need.


def warm_models(models, env: dict) -> str | None:
    """Build (or find in the cache) each of ``models``.  Returns a warning line, or None."""
    try:
        with environ(env):
            if "distilbert" in models:
                offline_distilbert_dir()
            if "small_gpt" in models:
                from coursekit.gpt import load_or_train_small_gpt

                load_or_train_small_gpt(verbose=False)
            if "offline_chat" in models:  # the offline assistant (and its base model)
                from coursekit.gpt.assistant import load_or_train_chat

                load_or_train_chat(verbose=False)
    except Exception as exc:  # noqa: BLE001 - grading goes on; each kernel then builds what it needs
        return f"WARNING: could not prepare the offline models before grading ({type(exc).__name__}: {exc})"
    return None
