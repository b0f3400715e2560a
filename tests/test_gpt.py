"""coursekit.gpt: the small GPT shared by the GPT and decoding chapters, the concepts assignment and the LLM lab,
its key-value cache, and the modern decoder of the chapters on positions and inference."""
from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from coursekit import gpt as G  # noqa: E402
from coursekit.gpt import positions as P  # noqa: E402
from coursekit.gpt import train as GT  # noqa: E402

TINY = G.GPTConfig(vocab_size=300, block_size=16, n_layer=2, n_head=4, n_embd=32)
TEXT = ("Stocks rose on Monday after the central bank held rates.\n"
        "The team won the final on Sunday, its coach said.\n"
        "Scientists found water on a small moon, NASA said on Friday.\n") * 30
CORPUS = {"train": TEXT, "val": TEXT[:2000]}


@pytest.fixture(autouse=True)
def private_cache_and_one_thread(tmp_path, monkeypatch):
    """Tokenizers and models trained here go to a temporary cache, not the user's; and
    the tiny models run on one thread (on a busy machine a second one only adds waiting)."""
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "course-cache"))
    with G.cpu_threads(1):
        yield


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return G.GPT(G.GPTConfig(**{**TINY.__dict__, **overrides})).eval()


def test_shapes_loss_and_context_limit():
    model = tiny_model()
    idx = torch.randint(300, (3, 16))
    logits, loss = model(idx)
    assert tuple(logits.shape) == (3, 16, 300) and loss is None
    logits, loss = model(idx, torch.randint(300, (3, 16)))
    assert loss.dim() == 0 and 4.0 < loss.item() < 8.0  # near ln(300) = 5.7 when untrained
    with pytest.raises(ValueError, match="block_size"):
        model(torch.randint(300, (1, 17)))


def test_parameter_count_formula_and_tied_embedding():
    model = tiny_model()
    d, L, V, n = TINY.n_embd, TINY.n_layer, TINY.vocab_size, TINY.block_size
    assert model.num_params() == L * (12 * d * d + 13 * d) + (V + n) * d + 2 * d
    assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.parametrize("keep_weights", [False, True])
def test_causal_outputs_do_not_see_the_future(keep_weights):
    model = tiny_model()
    for block in model.transformer.h:
        block.attn.keep_weights = keep_weights
    idx = torch.randint(300, (2, 16), generator=torch.Generator().manual_seed(1))
    t = 6
    changed = idx.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 7) % 300
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert float((a[:, : t + 1] - b[:, : t + 1]).abs().max()) < 1e-5
    assert float((a[:, t + 1:] - b[:, t + 1:]).abs().max()) > 1e-3  # the future does matter later


def test_explicit_attention_matches_fused_and_keeps_causal_weights():
    model = tiny_model()
    idx = torch.randint(300, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fused = model(idx)[0]
        for block in model.transformer.h:
            block.attn.keep_weights = True
        explicit = model(idx)[0]
    assert float((fused - explicit).abs().max()) < 1e-5
    w = model.transformer.h[0].attn.weights
    assert tuple(w.shape) == (2, 4, 12, 12)
    assert float((w.sum(-1) - 1).abs().max()) < 1e-5
    assert float(w.triu(diagonal=1).abs().max()) == 0.0  # nothing above the diagonal


def test_head_mask_switches_one_head_off_and_is_not_saved():
    model = tiny_model()
    idx = torch.randint(300, (2, 10), generator=torch.Generator().manual_seed(3))
    attn = model.transformer.h[1].attn
    assert "transformer.h.1.attn.head_mask" not in model.state_dict()
    with torch.no_grad():
        base = model(idx)[0]
        attn.head_mask[2] = 0.0
        off = model(idx)[0]
        # the same as zeroing that head's value projection
        attn.head_mask[2] = 1.0
        C, hs = TINY.n_embd, TINY.n_embd // TINY.n_head
        attn.c_attn.weight[2 * C + 2 * hs: 2 * C + 3 * hs] = 0
        attn.c_attn.bias[2 * C + 2 * hs: 2 * C + 3 * hs] = 0
        zero_values = model(idx)[0]
    assert float((base - off).abs().max()) > 1e-4
    assert float((off - zero_values).abs().max()) < 1e-5


def test_get_batch_targets_are_inputs_shifted_by_one():
    data = torch.arange(100)
    x, y = G.get_batch(data, 8, 5, torch.Generator().manual_seed(0))
    assert tuple(x.shape) == tuple(y.shape) == (5, 8)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)


def test_bpe_tokenizer_round_trip_and_determinism():
    tok = G.BPETokenizer.train(TEXT, vocab_size=300)
    assert tok.vocab_size == 300
    for s in ["Stocks rose on Monday.", "Café — 5% \u00fcber\nnew line", ""]:
        assert tok.decode(tok.encode(s)) == s  # byte-level: nothing is unknown
    assert len(tok.encode(TEXT)) < 0.7 * len(TEXT.encode())  # merges: fewer tokens than bytes
    again = G.BPETokenizer.train(TEXT, vocab_size=300)
    assert again.to_str() == tok.to_str()
    assert G.BPETokenizer.from_str(tok.to_str()).encode(TEXT[:200]) == tok.encode(TEXT[:200])


def test_bpe_tokenizer_cache_reads_back_and_survives_damage(tmp_path, monkeypatch):
    first = G.BPETokenizer.load_or_train(TEXT, 300, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    calls = []
    real_train = G.BPETokenizer.train.__func__
    monkeypatch.setattr(G.BPETokenizer, "train",
                        classmethod(lambda cls, *a: calls.append(a) or real_train(cls, *a)))
    again = G.BPETokenizer.load_or_train(TEXT, 300, cache_dir=tmp_path)
    assert calls == [] and again.to_str() == first.to_str()  # read back, not trained
    G.BPETokenizer.load_or_train(TEXT, 280, cache_dir=tmp_path)  # another vocabulary: another entry
    G.BPETokenizer.load_or_train(TEXT + "x", 300, cache_dir=tmp_path)  # other text: another entry
    assert len(calls) == 2 and len(list(tmp_path.glob("*.json"))) == 3
    files[0].write_text("{ not a tokenizer")
    repaired = G.BPETokenizer.load_or_train(TEXT, 300, cache_dir=tmp_path)
    assert len(calls) == 3 and repaired.to_str() == first.to_str()
    assert G.BPETokenizer.from_str(files[0].read_text()).encode(TEXT[:100]) == first.encode(TEXT[:100])


def test_generate_appends_with_pick_next_and_crops_context():
    model = tiny_model()
    seen = []

    def pick(logits):
        seen.append(tuple(logits.shape))
        return logits.argmax(-1)

    start = torch.randint(300, (2, 5), generator=torch.Generator().manual_seed(4))
    out = G.generate(model, start, 20, pick)  # 25 tokens > block_size 16: must crop
    assert tuple(out.shape) == (2, 25) and torch.equal(out[:, :5], start)
    assert seen == [(2, 300)] * 20
    assert torch.equal(out, G.generate(model, start, 20))  # greedy is the default
    assert G.greedy(torch.tensor([[0.0, 2.0, 2.0, -1.0], [5.0, 1.0, 0.0, 5.0]])).tolist() == [1, 0]

    def sampler(seed):
        gen = torch.Generator().manual_seed(seed)
        return lambda logits: torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
    a, b = (G.generate(model, start, 12, sampler(7)) for _ in range(2))
    assert torch.equal(a, b)  # the draws come from the caller's generator only
    assert not torch.equal(a, G.generate(model, start, 12, sampler(8)))
    model.train()
    G.generate(model, start, 1)
    assert model.training, "generate restores the previous mode"


def test_a_few_training_steps_lower_the_loss():
    settings = G.TrainSettings(steps=40, batch_size=8, lr=3e-3, warmup=5, eval_every=20, eval_batches=2)
    res = G.train_small_gpt(TINY, settings, CORPUS, log=None)
    h = res.history
    assert len(h["train_loss"]) == 40 and h["val_step"] == [19, 39]
    first, last = sum(h["train_loss"][:5]) / 5, sum(h["train_loss"][-5:]) / 5
    assert last < first - 1.0, (first, last)
    assert h["val_loss"][-1] < h["val_loss"][0]
    assert not res.model.training


def test_training_is_deterministic_and_restores_the_thread_setting():
    settings = G.TrainSettings(steps=8, batch_size=4, warmup=2, eval_every=4, eval_batches=1)
    with G.cpu_threads(2):
        a = G.train_small_gpt(TINY, settings, CORPUS, log=None)  # trains on 1 thread
        assert torch.get_num_threads() == 2
    b = G.train_small_gpt(TINY, settings, CORPUS, log=None)
    assert a.history["train_loss"] == b.history["train_loss"]
    assert a.history["val_loss"] == b.history["val_loss"]
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = G.train_small_gpt(TINY, G.TrainSettings(**{**settings.__dict__, "seed": 1}), CORPUS, log=None)
    assert c.history["train_loss"] != a.history["train_loss"]


def test_models_trained_on_one_corpus_encode_it_once(monkeypatch):
    """A page that trains many models on one corpus (the positions chapter trains 18) pays for its
    encoding once; another text, or another tokenizer, is encoded afresh."""
    calls = []
    encode = G.BPETokenizer.encode
    monkeypatch.setattr(G.BPETokenizer, "encode", lambda self, text: calls.append(len(text)) or encode(self, text))
    monkeypatch.setattr(GT, "_ENCODED", {})
    settings = G.TrainSettings(steps=2, batch_size=4, warmup=1, eval_every=2, eval_batches=1)
    first = G.train_small_gpt(TINY, settings, CORPUS, log=None)
    assert sorted(calls) == sorted([len(CORPUS["train"]), len(CORPUS["val"])])
    second = G.train_small_gpt(TINY, G.TrainSettings(**{**settings.__dict__, "seed": 1}), CORPUS, log=None)
    assert len(calls) == 2 and second.history["train_loss"] != first.history["train_loss"]
    tokenizer = first.tokenizer
    assert GT.encoded(tokenizer, CORPUS["val"]).tolist() == encode(tokenizer, CORPUS["val"])
    assert GT.encoded(tokenizer, "Stocks fell.").tolist() == encode(tokenizer, "Stocks fell.") and len(calls) == 3
    smaller = G.BPETokenizer.train(TEXT, 280)
    assert GT.encoded(smaller, CORPUS["val"]).tolist() == encode(smaller, CORPUS["val"]) and len(calls) == 4


def test_cpu_threads_sets_and_restores():
    before = torch.get_num_threads()
    with G.cpu_threads(before + 1):
        assert torch.get_num_threads() == before + 1
        with G.cpu_threads(None):  # None: no change
            assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with G.cpu_threads(before + 1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(GT, "ag_news_corpus", lambda: CORPUS)
    settings = G.TrainSettings(steps=6, batch_size=4, warmup=2, eval_every=3, eval_batches=1)
    m1, t1, info1 = G.load_or_train_small_gpt(TINY, settings, cache_dir=tmp_path, verbose=False)
    assert info1["source"] == "trained"
    folder = tmp_path / info1["key"]
    assert (folder / "model.pt").is_file() and json.loads((folder / "meta.json").read_text())["key"] == info1["key"]
    m2, t2, info2 = G.load_or_train_small_gpt(TINY, settings, cache_dir=tmp_path, verbose=False)
    assert info2["source"] == "cache" and info2["key"] == info1["key"]
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
    assert t2.encode(TEXT[:300]) == t1.encode(TEXT[:300])
    assert info2["history"] == json.loads(json.dumps(info1["history"]))
    # another configuration, other settings or other data: another key
    other = G.load_or_train_small_gpt(TINY, G.TrainSettings(**{**settings.__dict__, "seed": 1}),
                                      cache_dir=tmp_path, verbose=False)[2]
    assert other["key"] != info1["key"] and other["source"] == "trained"
    assert G.cache_key(TINY, settings, {"train": TEXT + "x", "val": ""}) != info1["key"]
    # a damaged cache entry is trained again instead of crashing
    (folder / "model.pt").write_bytes(b"not a checkpoint")
    assert G.load_or_train_small_gpt(TINY, settings, cache_dir=tmp_path, verbose=False)[2]["source"] == "trained"
    # retrain=True replaces an existing entry
    again = G.load_or_train_small_gpt(TINY, settings, cache_dir=tmp_path, verbose=False, retrain=True)[2]
    assert again["source"] == "trained" and (folder / "model.pt").stat().st_size > 1000


def test_a_model_being_trained_is_waited_for_not_trained_twice(tmp_path, monkeypatch):
    """Two notebooks (or test workers) that need the same uncached model at once: the second
    waits for the first one's training and reads its copy."""
    import threading

    monkeypatch.setattr(GT, "ag_news_corpus", lambda: CORPUS)
    settings = G.TrainSettings(steps=4, batch_size=4, warmup=1, eval_every=2, eval_batches=1)
    real, training, calls = GT.train_small_gpt, threading.Event(), []

    def slow_training(*args, **kwargs):
        calls.append(1)
        training.set()
        threading.Event().wait(1.5)  # the second caller arrives while this one trains
        return real(*args, **kwargs)

    monkeypatch.setattr(GT, "train_small_gpt", slow_training)
    sources = {}

    def need(name):
        sources[name] = G.load_or_train_small_gpt(TINY, settings, cache_dir=tmp_path, verbose=False)[2]["source"]

    first = threading.Thread(target=need, args=("first",))
    first.start()
    assert training.wait(60)
    need("second")
    first.join()
    assert sources == {"first": "trained", "second": "cache"} and len(calls) == 1, (sources, calls)


def test_a_cache_whose_file_system_has_no_locks_still_trains_and_caches(tmp_path, monkeypatch):
    """flock can fail on some network mounts (ENOLCK): the model is trained and cached unlocked."""
    import errno

    from coursekit.gpt import _cache

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_cache.fcntl, "flock", no_locks)
    monkeypatch.setattr(GT, "ag_news_corpus", lambda: CORPUS)
    settings = G.TrainSettings(steps=2, batch_size=4, warmup=1, eval_every=2, eval_batches=1)
    assert G.load_or_train_small_gpt(TINY, settings, cache_dir=tmp_path, verbose=False)[2]["source"] == "trained"
    assert G.load_or_train_small_gpt(TINY, settings, cache_dir=tmp_path, verbose=False)[2]["source"] == "cache"


def test_default_cache_dir_follows_course_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path))
    assert GT._cache_root() == tmp_path / "small-gpt"


def test_an_unwritable_cache_only_costs_the_caching(tmp_path, monkeypatch, capsys):
    """In a grading sandbox the cache is read-only: the model is trained and used, not cached."""
    monkeypatch.setattr(GT, "ag_news_corpus", lambda: CORPUS)

    def read_only(*args, **kwargs):
        raise PermissionError(30, "Read-only file system", str(tmp_path))

    monkeypatch.setattr(GT.tempfile, "mkdtemp", read_only)
    settings = G.TrainSettings(steps=4, batch_size=4, warmup=1, eval_every=2, eval_batches=1)
    model, _, info = G.load_or_train_small_gpt(TINY, settings, cache_dir=tmp_path / "ro", verbose=True)
    assert info["source"] == "trained" and isinstance(model, G.GPT)
    assert "not cached" in capsys.readouterr().out
    assert not (tmp_path / "ro" / info["key"]).exists()


# --------------------------------------------------------------------------- the key-value cache


def count_positions(model):
    """A list that gets the number of token positions of every forward pass of ``model``."""
    seen = []
    embedding = model.transformer.wte if isinstance(model, G.GPT) else model.wte
    embedding.register_forward_hook(lambda mod, args, out: seen.append(args[0].size(1)))
    return seen


@pytest.mark.parametrize("prompt_len,new", [(5, 9), (3, 30), (16, 4)])
def test_cached_generation_gives_the_tokens_of_uncached_generation(prompt_len, new):
    """Greedy and sampled, inside the context and past it (where both keep the last block_size tokens)."""
    model = tiny_model(seed=5)
    start = torch.randint(300, (3, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    assert torch.equal(G.generate(model, start, new), G.generate(model, start, new, use_cache=False))

    def sampler():
        gen = torch.Generator().manual_seed(3)
        return lambda logits: torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
    assert torch.equal(G.generate(model, start, new, sampler()),
                       G.generate(model, start, new, sampler(), use_cache=False))


def test_cached_generation_runs_one_position_per_new_token():
    model = tiny_model()
    seen = count_positions(model)
    start = torch.randint(300, (2, 4), generator=torch.Generator().manual_seed(6))
    G.generate(model, start, 12)  # 4 + 12 = 16 = block_size: all inside the context
    assert seen == [4] + [1] * 11
    seen.clear()
    G.generate(model, start, 12, use_cache=False)
    assert seen == list(range(4, 16))  # the whole text again at every step: quadratic in the length


def test_the_model_with_a_cache_computes_what_it_computes_without():
    model = tiny_model(seed=2)
    idx = torch.randint(300, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = model(idx)[0]
        for capacity in (None, 16):
            cache = G.KVCache(TINY.n_layer, capacity=capacity)
            parts = [model(idx[:, a:b], cache=cache)[0] for a, b in [(0, 5), (5, 6), (6, 13), (13, 16)]]
            assert float((torch.cat(parts, 1) - full).abs().max()) < 1e-5
            assert cache.length() == 16
            # keys and values of every layer: 2 x n_layer x B x T x C floats
            assert cache.nbytes() == 2 * TINY.n_layer * 2 * 16 * TINY.n_embd * 4
        for block in model.transformer.h:  # the explicit path with the offset mask
            block.attn.keep_weights = True
        cache = G.KVCache(TINY.n_layer)
        parts = [model(idx[:, :9], cache=cache)[0], model(idx[:, 9:], cache=cache)[0]]
    assert float((torch.cat(parts, 1) - full).abs().max()) < 1e-5
    w = model.transformer.h[0].attn.weights  # the last 7 queries against all 16 keys
    assert tuple(w.shape) == (2, 4, 7, 16) and float(w[..., 0, 10:].abs().max()) == 0.0
    with pytest.raises(ValueError, match="after 16 cached positions"):
        model(idx[:, :1], cache=cache)
    with pytest.raises(ValueError, match="at most 4 positions"):
        G.KVCache(1, capacity=4).update(0, torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))


# ------------------------------------------------------------------- positions and the modern decoder


def test_rotary_scores_depend_on_the_distance_only():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    score = lambda t, s: float((P.apply_rotary(q, torch.tensor([t])) * P.apply_rotary(k, torch.tensor([s]))).sum())
    assert abs(score(7, 3) - score(104, 100)) < 1e-4 and abs(score(7, 3) - score(3, 7)) > 1e-3
    rotated = P.apply_rotary(q.expand(1, 1, 5, 16), torch.arange(5))
    assert torch.allclose(rotated.norm(dim=-1), q.norm(), atol=1e-5)  # a rotation keeps lengths
    assert torch.allclose(rotated[..., 0, :], q[..., 0, :])            # position 0 is not turned


def test_alibi_slopes_and_t5_buckets():
    assert P.alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    assert P.alibi_slopes(4).tolist() == [2.0 ** (-2 * i) for i in range(1, 5)]
    six = P.alibi_slopes(6).tolist()  # 4 of the 4-head sequence, then two of the 8-head one
    assert six[:4] == P.alibi_slopes(4).tolist() and six[4:] == [2.0 ** -1, 2.0 ** -3]
    bias = P.alibi_bias(torch.arange(3), torch.arange(3), torch.tensor([0.5]))
    assert bias[0].tolist() == [[0.0, 0.0, 0.0], [-0.5, 0.0, 0.0], [-1.0, -0.5, 0.0]]
    b = P.t5_bucket(torch.arange(200), n_buckets=16, max_distance=64)
    assert b[:8].tolist() == list(range(8))                         # exact below n_buckets / 2
    assert bool((b[1:] >= b[:-1]).all()) and [int(b[i]) for i in (8, 16, 32)] == [8, 10, 13] and int(b[64:].min()) == 15
    table = P.sinusoidal_table(torch.arange(4), 6)
    assert torch.allclose(table[1, :2], torch.tensor([math.sin(1.0), math.cos(1.0)]))


@pytest.mark.parametrize("position", G.modern.POSITIONS)
def test_modern_decoder_runs_trains_and_caches_with_every_position_scheme(position):
    config = G.ModernConfig(vocab_size=300, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                            position=position)
    torch.manual_seed(0)
    model = G.ModernGPT(config).eval()
    idx = torch.randint(300, (2, 10), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 300
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert float((a[:, :6] - b[:, :6]).abs().max()) < 1e-5  # causal
    start = idx[:, :3]
    assert torch.equal(G.generate(model, start, 20), G.generate(model, start, 20, use_cache=False))


def test_modern_decoder_parameters_and_cache_size():
    base = dict(vocab_size=300, block_size=16, n_layer=2, n_head=4, n_embd=32)
    mha = G.ModernGPT(G.ModernConfig(**base, n_kv_head=4))
    mqa = G.ModernGPT(G.ModernConfig(**base, n_kv_head=1))
    hs = 32 // 4
    # grouped keys and values: k_proj and v_proj shrink from C x C to C x (n_kv_head * hs) in every layer
    assert mha.num_params() - mqa.num_params() == 2 * 2 * 32 * (4 - 1) * hs
    config = G.ModernConfig(**base)
    swiglu, gelu = config.ffn_hidden, G.ModernConfig(**base, mlp="gelu").ffn_hidden
    assert gelu == 128 and swiglu % 8 == 0 and abs(3 * swiglu - 2 * gelu) <= 3 * 8
    idx = torch.randint(300, (1, 12))
    sizes = {}
    for kv in (4, 2, 1):
        model = G.ModernGPT(G.ModernConfig(**base, n_kv_head=kv)).eval()
        cache = G.KVCache(2)
        with torch.no_grad():
            model(idx, cache=cache)
        sizes[kv] = cache.nbytes()
    assert sizes == {kv: 2 * 2 * 12 * kv * hs * 4 for kv in (4, 2, 1)}
    with pytest.raises(ValueError, match="position must be one of"):
        G.ModernConfig(position="xpos")
    with pytest.raises(ValueError, match="n_kv_head"):
        G.ModernConfig(n_head=4, n_kv_head=3)


def test_training_a_modern_decoder_on_short_windows_and_caching_it(tmp_path, monkeypatch):
    monkeypatch.setattr(GT, "ag_news_corpus", lambda: CORPUS)
    config = G.ModernConfig(vocab_size=300, block_size=32, n_layer=1, n_head=2, n_embd=16, position="alibi")
    settings = G.TrainSettings(steps=6, batch_size=4, warmup=2, eval_every=3, eval_batches=1, seq_len=8)
    model, _, info = G.load_or_train_small_gpt(config, settings, cache_dir=tmp_path, verbose=False)
    assert isinstance(model, G.ModernGPT) and info["source"] == "trained"
    again, _, info2 = G.load_or_train_small_gpt(config, settings, cache_dir=tmp_path, verbose=False)
    assert info2["source"] == "cache" and isinstance(again, G.ModernGPT)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    with pytest.raises(ValueError, match="seq_len 40"):
        G.train_small_gpt(config, G.TrainSettings(steps=1, seq_len=40), CORPUS, log=None)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_grouped_query_attention_matches_repeated_key_value_heads(n_kv_head):
    """Query head h reads key-value head h // (n_head / n_kv_head): the same as repeating each
    key-value head for its group and running multi-head attention."""
    config = G.ModernConfig(vocab_size=300, block_size=16, n_head=4, n_kv_head=n_kv_head, n_embd=32, position="none")
    torch.manual_seed(3)
    attn = G.modern.ModernAttention(config).eval()
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = attn(x, torch.arange(7))
        q = attn.q_proj(x).view(2, 7, 4, 8).transpose(1, 2)
        k, v = (p(x).view(2, 7, n_kv_head, 8).transpose(1, 2).repeat_interleave(4 // n_kv_head, dim=1)
                for p in (attn.k_proj, attn.v_proj))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
        ref = attn.c_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, 32))
    assert float((out - ref).abs().max()) < 1e-5
