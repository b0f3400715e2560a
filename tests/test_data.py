"""The course datasets: balanced, disjoint, reproducible, and the written items are new."""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("datasets")

from coursekit import data, repo_root  # noqa: E402

ROOT = repo_root() or Path(__file__).resolve().parent.parent
POOL = Path(os.environ.get("COURSE_AG_NEWS_POOL", ROOT.parent / "shared" / "data" / "ag_news" / "ag_news_pool.csv"))
needs_pool = pytest.mark.skipif(not POOL.is_file(), reason=f"AG News pool not found at {POOL}")


@pytest.fixture(scope="module")
def ag():
    return data.load_small_ag_news()


def test_sizes_balance_and_labels(ag):
    assert set(ag) == {"train", "test"}
    for split, per_class in (("train", 500), ("test", 200)):
        ds = ag[split]
        assert ds.column_names == ["text", "label"]
        assert ds.features["label"].names == data.AG_NEWS_CLASSES == ["World", "Sports", "Business", "Sci/Tech"]
        assert Counter(ds["label"]) == {c: per_class for c in range(4)}, split
        assert all(isinstance(t, str) and len(t) > 20 for t in ds["text"])


def test_splits_are_disjoint(ag):
    assert not set(ag["train"]["text"]) & set(ag["test"]["text"])
    assert len(set(ag["train"]["text"])) == 2000 and len(set(ag["test"]["text"])) == 800


def test_text_is_clean(ag):
    texts = list(ag["train"]["text"]) + list(ag["test"]["text"])
    leftovers = [t for t in texts if re.search(r"#\d+;|&(lt|gt|amp|quot);|\\|<[a-zA-Z/]", t)]
    assert not leftovers, leftovers[:3]


def test_cleaning_examples():
    clean = data.clean_ag_news_text
    assert clean("Microsoft #39;s rival won #39;t wait") == "Microsoft's rival won't wait"
    assert clean("a record  \\$48 a barrel, up to  #36;50 million") == "a record $48 a barrel, up to $50 million"
    assert clean("for social\\network use") == "for social network use"
    assert clean("Staples Inc. &lt;A HREF=\"http://x.com/q?t=S\"&gt;SPLS.O&lt;/A&gt;, the top") == "Staples Inc. SPLS.O , the top"
    assert clean("the convention  #151; California") == "the convention \u2014 California"
    assert data.ag_news_example_text("Oil Eases", "Prices fell.") == "Oil Eases. Prices fell."
    assert data.ag_news_example_text("Is it over?", "Maybe.") == "Is it over? Maybe."


def test_balanced_seeded_subsample():
    a = data.load_small_ag_news(n_train=100, n_test=42, seed=3)
    b = data.load_small_ag_news(n_train=100, n_test=42, seed=3)
    c = data.load_small_ag_news(n_train=100, n_test=42, seed=4)
    assert Counter(a["train"]["label"]) == {c_: 25 for c_ in range(4)}
    assert sorted(Counter(a["test"]["label"]).values()) == [10, 10, 11, 11]
    assert list(a["train"]["text"]) == list(b["train"]["text"])
    assert list(a["train"]["text"]) != list(c["train"]["text"])
    with pytest.raises(ValueError):
        data.load_small_ag_news(n_train=2004)


@needs_pool
def test_script_regenerates_identical_files(tmp_path):
    script = ROOT / "scripts" / "make_ag_news_subsets.py"
    for out in (tmp_path / "a", tmp_path / "b"):
        subprocess.run([sys.executable, str(script), "--out", str(out), "--pool", str(POOL)],
                       check=True, capture_output=True, timeout=120)
    shipped = ROOT / "data" / "small_ag_news"
    for name in ("train.csv", "test.csv", "README.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
        assert (tmp_path / "a" / name).read_bytes() == (shipped / name).read_bytes(), name


def test_readme_keeps_attribution():
    readme = (ROOT / "data" / "small_ag_news" / "README.md").read_text()
    for needed in ("Zhang", "Zhao", "LeCun", "NIPS 2015", "Gulli", "non-commercial", "random.Random(0)"):
        assert needed in readme, needed


@pytest.fixture(scope="module")
def generated():
    return data.load_generated_news()


def test_generated_news_shape(generated):
    assert len(generated) >= 24
    assert generated.column_names == ["text", "label", "note"]
    assert generated.features["label"].names == data.AG_NEWS_CLASSES
    counts = Counter(generated["label"])
    assert all(counts[c] >= 6 for c in range(4)), counts
    ambiguous = [n for n in generated["note"] if n.startswith("ambiguous:")]
    assert 3 <= len(ambiguous) <= 6, ambiguous
    assert len(set(generated["text"])) == len(generated)


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def test_generated_news_not_in_ag_news(generated, ag):
    known = {_key(t) for t in list(ag["train"]["text"]) + list(ag["test"]["text"])}
    if POOL.is_file():
        with open(POOL, newline="", encoding="utf-8") as f:
            for _, title, description in csv.reader(f):
                known.add(_key(data.ag_news_example_text(title, description)))
                known.add(_key(data.clean_ag_news_text(title)))
                known.add(_key(data.clean_ag_news_text(description)))
    for text in generated["text"]:
        headline, _, body = text.partition(". ")
        for part in (text, headline, body):
            assert _key(part) not in known, part


def test_hub_fallback_when_no_files(monkeypatch, capsys, tmp_path):
    """Without a checkout or a download, rows come from the hub's ag_news test split."""
    import datasets

    import coursekit

    fake = datasets.Dataset.from_dict({
        "text": [f"Story {i} about topic {i % 4} #39;s news" for i in range(4000)],
        "label": [i % 4 for i in range(4000)]})
    monkeypatch.setattr(coursekit, "repo_root", lambda: None)
    monkeypatch.setattr(data, "_BESIDE_PACKAGE", tmp_path / "no-data")
    monkeypatch.setattr(data, "_download", lambda name: None)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: fake)
    ds = data.load_small_ag_news()
    assert "hub" in capsys.readouterr().out
    assert Counter(ds["train"]["label"]) == {c: 500 for c in range(4)}
    assert Counter(ds["test"]["label"]) == {c: 200 for c in range(4)}
    assert not set(ds["train"]["text"]) & set(ds["test"]["text"])
    assert "'s news" in ds["train"][0]["text"]

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(data.DataUnavailableError, match="small AG News not found"):
        data.load_small_ag_news()
    with pytest.raises(data.DataUnavailableError, match="generated_news.csv"):
        data.load_generated_news()
