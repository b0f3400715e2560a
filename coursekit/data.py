"""The course's small datasets, loaded the same way offline, in a checkout and on Colab.

* ``load_small_ag_news()``: a balanced 2,000/800 train/test subset of AG News
  (Zhang, Zhao & LeCun, NIPS 2015), four topics: World, Sports, Business, Sci/Tech.
* ``load_generated_news()``: a few dozen short news items written for the course, some of
  them deliberately ambiguous, to probe a trained classifier.

Files are looked for in the checkout's ``data/`` folder, then downloaded from the course
repository into the cache folder (Colab, or a pip install without a checkout), and as a
last resort AG News is rebuilt from the hub's ``ag_news`` test split (different rows).
"""
from __future__ import annotations

import csv
import html
import os
import random
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import coursekit
from coursekit.models import course_cache_dir

# Imports inside functions: datasets is imported by the functions that build a Dataset: reading the course's
# CSV files needs only the standard library.

__all__ = ["AG_NEWS_CLASSES", "DataUnavailableError", "load_small_ag_news",
           "load_generated_news", "clean_ag_news_text", "ag_news_example_text", "data_file"]

AG_NEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]

_RAW_URL = "https://raw.githubusercontent.com/{repo}/{branch}/data/{name}"
_AG_NEWS_FILES = {"train": "small_ag_news/train.csv", "test": "small_ag_news/test.csv"}
_GENERATED = "generated_news.csv"


class DataUnavailableError(RuntimeError):
    """A course dataset could be found neither locally, nor online; the message says how to fix it."""


# ---------------------------------------------------------------------------------------
# Cleaning AG News text (shared with scripts/make_ag_news_subsets.py)
# ---------------------------------------------------------------------------------------

# The published CSV lost its "&" before numeric entities (" #39;s" for "'s") and marks line
# breaks with a bare backslash ("social\network"); a backslash before "$" escapes the dollar.
# An apostrophe joins the word before it when a contraction ("won #39;t") or a word end
# ("players #39; union") follows; otherwise (" #39;quits") it opens a quotation.
_APOSTROPHE = re.compile(r"(?:(?<=\bO)|\s*)#(?:39|146);(?=(?:s|t|re|ll|ve|d|m)\b|[\s.,;:!?)]|$)|"
                         r"(?<=\bO)\s+#(?:39|146);", re.IGNORECASE)
_NUMERIC_ENTITY = re.compile(r"(?<!&)#(\d{2,4});")
_TAG = re.compile(r"<[^<>]{0,400}>")
_SPACES = re.compile(r"\s+")
_TYPOGRAPHIC = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def clean_ag_news_text(text: str) -> str:
    """One line of plain text from an AG News field: entities decoded, HTML tags and
    line-break backslashes removed, curly quotes made straight, spaces collapsed."""
    text = text.replace("\\$", "$")
    text = re.sub(r"\\+", " ", text)  # a bare backslash stood for a line break
    text = _APOSTROPHE.sub("'", text)  # "world #39;s" -> "world's"
    text = _NUMERIC_ENTITY.sub(lambda m: html.unescape(f"&#{m.group(1)};"), text)
    text = html.unescape(text)  # &lt; &gt; &amp; ...
    text = _TAG.sub(" ", text)  # the Reuters/Washington Post markup that &lt;...&gt; hid
    text = text.translate(_TYPOGRAPHIC)
    return _SPACES.sub(" ", text).strip()


def ag_news_example_text(title: str, description: str) -> str:
    """The text a course example shows: ``title. description`` (both cleaned)."""
    title, description = clean_ag_news_text(title), clean_ag_news_text(description)
    if not title:
        return description
    if not description:
        return title
    sep = " " if title[-1] in ".!?" else ". "
    return title + sep + description


# ---------------------------------------------------------------------------------------
# Finding the files
# ---------------------------------------------------------------------------------------

# data/ next to the installed package: a checkout, or the grading sandbox
_BESIDE_PACKAGE = Path(__file__).resolve().parent.parent / "data"


def _download(name: str) -> Path | None:
    """Fetch ``data/<name>`` of the course repository into the cache (None on failure)."""
    target = course_cache_dir() / "data" / name
    if target.is_file() and target.stat().st_size > 0:
        return target
    url = _RAW_URL.format(repo=coursekit.REPO, branch=coursekit.BRANCH, name=name)
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            payload = response.read()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    os.replace(tmp, target)
    return target


def data_file(name: str, download: bool = True) -> Path | None:
    """Path of ``data/<name>``: next to the installed package (a checkout, or the grading
    sandbox, which shows ``coursekit/`` and ``data/`` only), else downloaded into the course
    cache; None when neither works."""
    beside = _BESIDE_PACKAGE / name
    if beside.is_file():
        return beside
    root = coursekit.repo_root()
    if root is not None and (root / "data" / name).is_file():
        return root / "data" / name
    return _download(name) if download else None


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------

def _balanced_indices(labels: list[int], n: int, seed: int, n_classes: int) -> list[int]:
    """``n`` row indices, as even across classes as possible, chosen and ordered by ``seed``."""
    rng = random.Random(seed)
    by_class = [[i for i, y in enumerate(labels) if y == c] for c in range(n_classes)]
    wanted = [n // n_classes + (1 if c < n % n_classes else 0) for c in range(n_classes)]
    short = [AG_NEWS_CLASSES[c] if n_classes == 4 else str(c)
             for c in range(n_classes) if wanted[c] > len(by_class[c])]
    if short:
        raise ValueError(f"asked for {n} rows, but classes {short} have too few "
                         f"(have {[len(b) for b in by_class]})")
    picked = [i for c in range(n_classes) for i in rng.sample(by_class[c], wanted[c])]
    rng.shuffle(picked)
    return picked


def _features(extra: tuple[str, ...] = ()):
    from datasets import ClassLabel, Features, Value

    cols = {"text": Value("string"), "label": ClassLabel(names=AG_NEWS_CLASSES)}
    cols.update({name: Value("string") for name in extra})
    return Features(cols)


def _from_rows(rows: list[dict], extra: tuple[str, ...] = ()):
    from datasets import Dataset

    columns = {"text": [r["text"] for r in rows], "label": [int(r["label"]) for r in rows]}
    for name in extra:
        columns[name] = [r.get(name) or "" for r in rows]
    return Dataset.from_dict(columns, features=_features(extra))


def _ag_news_from_hub(seed: int):
    """Rebuild a 2,000/800 balanced subset from the hub's ``ag_news`` test split."""
    from datasets import load_dataset

    hub = load_dataset("fancyzhx/ag_news", split="test")  # the hub's "ag_news"
    labels = list(hub["label"])
    chosen = _balanced_indices(labels, 2800, seed, len(AG_NEWS_CLASSES))
    # Per class, the first 500 picks go to train and the next 200 to test: disjoint.
    seen = [0] * len(AG_NEWS_CLASSES)
    splits = {"train": [], "test": []}
    for i in chosen:
        y = labels[i]
        splits["train" if seen[y] < 500 else "test"].append(i)
        seen[y] += 1
    texts = list(hub["text"])
    return {name: [{"text": clean_ag_news_text(texts[i]), "label": labels[i]} for i in idx]
            for name, idx in splits.items()}


def load_small_ag_news(n_train: int | None = None, n_test: int | None = None, seed: int = 0):
    """The course's AG News subset as a ``DatasetDict`` with splits "train" and "test".

    Columns: ``text`` (str) and ``label`` (ClassLabel: World, Sports, Business, Sci/Tech).
    ``n_train`` / ``n_test`` take a class-balanced subsample chosen with ``seed``
    (None keeps the whole split: 2,000 and 800 rows).
    """
    from datasets import DatasetDict

    paths = {split: data_file(name) for split, name in _AG_NEWS_FILES.items()}
    if all(paths.values()):
        rows = {split: _read_csv(path) for split, path in paths.items()}
    else:
        try:
            rows = _ag_news_from_hub(seed=0)
        except Exception as err:  # noqa: BLE001 - any failure here means "no source left"
            raise DataUnavailableError(
                "small AG News not found (no data/small_ag_news in a checkout, no download from "
                f"{_RAW_URL.split('/{repo}')[0]}, hub ag_news failed: {type(err).__name__}): "
                "run from the course checkout or connect to the internet") from None
        print("note: course AG News files unavailable; using a balanced selection from the hub's "
              "ag_news test split (different rows from the course's subset)")
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        part = rows[split]
        if n is not None:
            part = [part[i] for i in _balanced_indices([int(r["label"]) for r in part], n, seed,
                                                       len(AG_NEWS_CLASSES))]
        out[split] = _from_rows(part)
    return DatasetDict(out)


def load_generated_news():
    """Short news items written for the course (``text``, ``label``, ``note``).

    ``note`` is empty, or says why an item is ambiguous (e.g. "ambiguous: business/sci-tech").
    """
    path = data_file(_GENERATED)
    if path is None:
        raise DataUnavailableError(
            f"data/{_GENERATED} not found in a checkout and the download failed: "
            "run from the course checkout or connect to the internet")
    return _from_rows(_read_csv(path), extra=("note",))
