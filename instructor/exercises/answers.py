"""Worked answers to the book's *compute* exercises: instructors only, never published.

Each entry of ``EXERCISES`` names an exercise as the book numbers it (chapter.number), the
function that computes its answer (the worked solution, shown in the instructor build of the
book), the tolerance its self-check uses, a typical wrong answer (which the self-check must
reject) and the hint the page prints. ``python instructor/exercises/answers.py`` prints, for each
exercise, its answer and a fresh key for the page's ``check_answer`` cell, and writes the
answers to ``answers.json`` beside this file (``publish`` reads it to prove that no published file
holds an answer). tests/test_exercises.py runs every function here.
"""
from __future__ import annotations

import functools
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Compute:
    answer: Callable[[], float]
    tolerance: dict          # one of rel=, abs=, exact=True (coursekit.exercises.answer_key)
    wrong: Callable[[], float]   # a typical mistake, which the self-check must reject
    hint: str


# ---------------------------------------------------------------------------------------------
# Attention as soft retrieval: weights by hand
# ---------------------------------------------------------------------------------------------

COSTS_1 = [0.0, 1.0, 2.0, 3.0]   # the dissimilarities of exercise 1.3
LAMBDA_1 = 0.5


def soft_weights(costs, lam: float) -> list[float]:
    """softmax(-c / lambda), computed stably (the smallest cost first)."""
    low = min(costs)
    e = [math.exp(-(c - low) / lam) for c in costs]
    return [x / sum(e) for x in e]


def ex_1_3() -> float:
    """The weight of the cheapest key."""
    return soft_weights(COSTS_1, LAMBDA_1)[0]


def ex_1_3_wrong() -> float:
    """Multiplying by lambda instead of dividing: softmax(-lambda c)."""
    return soft_weights([LAMBDA_1 ** 2 * c for c in COSTS_1], LAMBDA_1)[0]


def ex_1_4() -> float:
    """The entropy of the weights, in nats."""
    return -sum(p * math.log(p) for p in soft_weights(COSTS_1, LAMBDA_1))


def ex_1_4_wrong() -> float:
    """The same entropy in bits."""
    return ex_1_4() / math.log(2)


# ---------------------------------------------------------------------------------------------
# Multi-head and masked attention: what a causal mask keeps
# ---------------------------------------------------------------------------------------------

T_2 = 1000


def ex_2_3() -> float:
    """Query t sees keys 0..t: 1 + 2 + ... + T = T (T + 1) / 2 pairs."""
    return T_2 * (T_2 + 1) // 2


def ex_2_3_wrong() -> float:
    """Half the square, forgetting the diagonal (each token sees itself)."""
    return T_2 * T_2 // 2


# ---------------------------------------------------------------------------------------------
# Positional encoding: the sinusoidal table of the original Transformer (d = 512)
# ---------------------------------------------------------------------------------------------

D_MODEL_3 = 512


def frequencies(d: int, base: float = 10000.0) -> np.ndarray:
    """omega_i = base^(-2i/d), one per pair of coordinates."""
    return base ** (-np.arange(0, d, 2) / d)


def ex_3_3() -> float:
    """The period, in positions, of the slowest pair."""
    return float(2 * math.pi / frequencies(D_MODEL_3)[-1])


def ex_3_3_wrong() -> float:
    """Taking i = d/2 (one pair too many): 2 pi times the base."""
    return 2 * math.pi * 10000.0


def ex_3_4() -> float:
    """p_t . p_(t+1) = sum_i cos(omega_i), whatever t."""
    return float(np.cos(frequencies(D_MODEL_3)).sum())


def ex_3_4_wrong() -> float:
    """The cosine similarity (divided by |p|^2 = d/2) instead of the dot product."""
    return ex_3_4() / (D_MODEL_3 / 2)


# ---------------------------------------------------------------------------------------------
# The Transformer block: layer normalisation by hand
# ---------------------------------------------------------------------------------------------

X_4 = [1.0, 2.0, 3.0, 4.0]


def layer_norm(x, unbiased: bool = False) -> list[float]:
    """(x - mean) / std over the vector, gain 1, bias 0, epsilon 0."""
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / (len(x) - 1 if unbiased else len(x))
    return [(v - mean) / math.sqrt(var) for v in x]


def ex_4_3() -> float:
    return layer_norm(X_4)[0]


def ex_4_3_wrong() -> float:
    """The unbiased variance (divide by n - 1), which LayerNorm does not use."""
    return layer_norm(X_4, unbiased=True)[0]


# ---------------------------------------------------------------------------------------------
# The encoder-decoder Transformer: label smoothing and the learning-rate schedule
# ---------------------------------------------------------------------------------------------

EPS_5, K_5 = 0.1, 32_000
D_5, WARMUP_5 = 512, 4000


def smoothing_floor(eps: float, k: int) -> float:
    """The entropy of the smoothed target: 1 - eps + eps/K on the target, eps/K on the others."""
    top, rest = 1 - eps + eps / k, eps / k
    return -(top * math.log(top) + (k - 1) * rest * math.log(rest))


def ex_5_3() -> float:
    return smoothing_floor(EPS_5, K_5)


def ex_5_3_wrong() -> float:
    """The same entropy in bits."""
    return ex_5_3() / math.log(2)


def noam_lr(step: int, d: int, warmup: int, c: float = 1.0) -> float:
    return c * d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def ex_5_4() -> float:
    """The peak of the schedule is at step = warmup: (d * warmup) ** -0.5."""
    return noam_lr(WARMUP_5, D_5, WARMUP_5)


def ex_5_4_wrong() -> float:
    """Forgetting the factor d ** -0.5."""
    return WARMUP_5 ** -0.5


# ---------------------------------------------------------------------------------------------
# BERT: how often a token is never a target
# ---------------------------------------------------------------------------------------------

P_CHOOSE_6, EPOCHS_6 = 0.15, 40


def ex_6_3() -> float:
    """Chosen independently with probability 0.15 in each of 40 passes: never chosen with 0.85^40."""
    return (1 - P_CHOOSE_6) ** EPOCHS_6


def ex_6_3_wrong() -> float:
    """0.15^40: the probability of being chosen every time, not never."""
    return P_CHOOSE_6 ** EPOCHS_6


# ---------------------------------------------------------------------------------------------
# GPT: losses in nats, perplexities
# ---------------------------------------------------------------------------------------------

LOSS_7 = 3.2           # nats per token
GPT2_VOCAB = 50_257


def ex_7_3() -> float:
    """Perplexity is e to the loss in nats."""
    return math.exp(LOSS_7)


def ex_7_3_wrong() -> float:
    """2 to the loss: as if it were in bits."""
    return 2 ** LOSS_7


def ex_7_4() -> float:
    """A uniform guess over V tokens costs ln V nats per token."""
    return math.log(GPT2_VOCAB)


def ex_7_4_wrong() -> float:
    """log2 V: bits, not nats."""
    return math.log2(GPT2_VOCAB)


# ---------------------------------------------------------------------------------------------
# Decoding: temperature and top-k by hand
# ---------------------------------------------------------------------------------------------

LOGITS_8 = [2.0, 1.0, 0.1]
TAU_8 = 0.7


def ex_8_3() -> float:
    """softmax(z / tau)[0]: soft_weights with costs -z."""
    return soft_weights([-z for z in LOGITS_8], TAU_8)[0]


def ex_8_3_wrong() -> float:
    """Multiplying the logits by the temperature instead of dividing."""
    return soft_weights([-z * TAU_8 for z in LOGITS_8], 1.0)[0]


def ex_8_4() -> float:
    """Top-2 at temperature 1: KL(truncated || original) = -ln(mass kept)."""
    p = soft_weights([-z for z in LOGITS_8], 1.0)
    return -math.log(p[0] + p[1])


def ex_8_4_wrong() -> float:
    """The mass dropped, instead of the divergence."""
    p = soft_weights([-z for z in LOGITS_8], 1.0)
    return p[2]


# ---------------------------------------------------------------------------------------------
# LoRA: folding an update back in, by hand
# ---------------------------------------------------------------------------------------------

W_9, B_ROW_9, A_COL_9, ALPHA_9, R_9 = 0.913, [0.42, -1.37], [0.58, 0.31], 16, 2


def ex_9_3() -> float:
    """W_ij + (alpha / r) * sum_k B_ik A_kj."""
    return W_9 + ALPHA_9 / R_9 * sum(b * a for b, a in zip(B_ROW_9, A_COL_9))


def ex_9_3_wrong() -> float:
    """Scaling by alpha instead of alpha / r."""
    return W_9 + ALPHA_9 * sum(b * a for b, a in zip(B_ROW_9, A_COL_9))


# ---------------------------------------------------------------------------------------------
# Scale arithmetic: when the key-value cache outweighs the model
# ---------------------------------------------------------------------------------------------

D_10, HEADS_10, KV_HEADS_10 = 8192, 64, 8


def ex_10_3() -> float:
    """Weights 12 L d^2, cache 2 L (d * n_kv / n_head) per token: equal at T B = 6 d n_head / n_kv."""
    return 6 * D_10 * HEADS_10 // KV_HEADS_10


def ex_10_3_wrong() -> float:
    """As if every query head kept its own keys and values."""
    return 6 * D_10


# ---------------------------------------------------------------------------------------------
# Positions beyond sinusoids: RoPE's longest wavelength
# ---------------------------------------------------------------------------------------------

def ex_11_3() -> float:
    """Head size 128, base 500,000: the wavelength, in tokens, of the slowest pair."""
    return float(2 * math.pi / frequencies(128, 500_000.0)[-1])


def ex_11_3_wrong() -> float:
    """The base of the original RoPE (10,000) instead of 500,000."""
    return float(2 * math.pi / frequencies(128, 10_000.0)[-1])


# ---------------------------------------------------------------------------------------------
# Inference: a SwiGLU network as large as a GELU network of width 4C
# ---------------------------------------------------------------------------------------------

WIDTH_12 = 5120


def ex_12_3() -> float:
    """SwiGLU has three C x h matrices (gate, up, down), the GELU network two C x 4C: 3 C h = 8 C^2."""
    return 8 * WIDTH_12 / 3


def ex_12_3_wrong() -> float:
    """Counting two matrices for SwiGLU, as for GELU: h = 4C."""
    return 4 * WIDTH_12


# ---------------------------------------------------------------------------------------------
# Tokenisation: a byte-level BPE trainer of our own (in the spirit of minbpe)
# ---------------------------------------------------------------------------------------------

BPE_TRAIN_ARTICLES, BPE_VAL_ARTICLES, BPE_MERGES = 100, 50, 150


@functools.cache
def bpe_texts() -> tuple[str, str]:
    """The training text (the first 100 training articles) and the held-out text (the first 50
    validation articles), each joined with newlines, as exercise 13.2 defines them."""
    from coursekit.gpt import ag_news_corpus

    corpus = ag_news_corpus()
    train = [a for a in corpus["train"].split("\n") if a][:BPE_TRAIN_ARTICLES]
    val = [a for a in corpus["val"].split("\n") if a][:BPE_VAL_ARTICLES]
    return "\n".join(train), "\n".join(val)


def neighbour_counts(ids: list[int]) -> Counter:
    """How often each pair of neighbouring ids occurs (overlapping pairs counted); the Counter
    keeps pairs in the order they are first seen."""
    return Counter(zip(ids, ids[1:]))


def replace_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def bpe_train(text: str, n_merges: int) -> dict[tuple[int, int], int]:
    """Merges learned on the UTF-8 bytes of ``text``: the most frequent pair each time (on a tie
    the pair seen first in the text, which is what max() over the Counter gives), new ids from 256."""
    ids = list(text.encode("utf-8"))
    merges: dict[tuple[int, int], int] = {}
    for step in range(n_merges):
        counts = neighbour_counts(ids)
        if not counts:
            break
        best = max(counts, key=counts.get)
        merges[best] = 256 + step
        ids = replace_pair(ids, best, 256 + step)
    return merges


def bpe_encode(text: str, merges: dict[tuple[int, int], int]) -> list[int]:
    """Apply the merges in the order they were learned: repeatedly merge the present pair with
    the lowest new id."""
    ids = list(text.encode("utf-8"))
    while len(ids) > 1:
        present = set(zip(ids, ids[1:]))
        pair = min(present, key=lambda p: merges.get(p, math.inf))
        if pair not in merges:
            break
        ids = replace_pair(ids, pair, merges[pair])
    return ids


def bpe_decode(ids: list[int], merges: dict[tuple[int, int], int]) -> str:
    pieces = {i: bytes([i]) for i in range(256)}
    for (a, b), new in sorted(merges.items(), key=lambda kv: kv[1]):
        pieces[new] = pieces[a] + pieces[b]
    return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


@functools.cache
def trained_merges() -> dict[tuple[int, int], int]:
    return bpe_train(bpe_texts()[0], BPE_MERGES)


def ex_13_2() -> float:
    """Tokens of the held-out text under 150 merges learned on the training text."""
    _, val = bpe_texts()
    merges = trained_merges()
    ids = bpe_encode(val, merges)
    assert bpe_decode(ids, merges) == val  # the round trip
    return len(ids)


def ex_13_2_wrong() -> float:
    """Counting characters instead of tokens: the text with no merges at all."""
    return len(bpe_texts()[1])


def ex_13_3() -> float:
    """The mean length, in bytes, of the symbols the 150 merges made."""
    merges = trained_merges()
    return sum(len(bpe_decode([new], merges).encode("utf-8")) for new in merges.values()) / len(merges)


def ex_13_3_wrong() -> float:
    """The mean over the whole vocabulary, the 256 single bytes included."""
    total = ex_13_3() * BPE_MERGES + 256
    return total / (256 + BPE_MERGES)


# ---------------------------------------------------------------------------------------------
# Scaling
# ---------------------------------------------------------------------------------------------

BUDGET = 1e21          # FLOPs
TOKENS_PER_PARAM = 20
IRREDUCIBLE = 1.69     # nats, the constant E of exercise 14.3
# exercise 14.3's measurements, as the page lists them: parameters, validation loss (nats)
SIZES = [2e6, 6e6, 2e7, 6e7, 2e8, 6e8]
LOSSES = [2.457, 2.253, 2.097, 1.994, 1.909, 1.855]


def ex_14_2() -> float:
    """Compute-optimal parameters for the budget: C = 6 N D with D = 20 N, so N = sqrt(C / 120)."""
    return math.sqrt(BUDGET / (6 * TOKENS_PER_PARAM))


def ex_14_2_wrong() -> float:
    """Forgetting the 20 tokens per parameter: N = sqrt(C / 6)."""
    return math.sqrt(BUDGET / 6)


def fit_power_law(sizes, losses, irreducible: float) -> tuple[float, float]:
    """Least squares on log(L - E) = log A - alpha log N; returns (A, alpha)."""
    slope, intercept = np.polyfit(np.log(sizes), np.log(np.asarray(losses) - irreducible), 1)
    return float(np.exp(intercept)), float(-slope)


def ex_14_3() -> float:
    """The fitted law's loss at the compute-optimal size for the budget."""
    a, alpha = fit_power_law(SIZES, LOSSES, IRREDUCIBLE)
    return IRREDUCIBLE + a * ex_14_2() ** -alpha


def ex_14_3_wrong() -> float:
    """A plain power law on L (no irreducible term) extrapolates too low."""
    a, alpha = fit_power_law(SIZES, LOSSES, 0.0)
    return a * ex_14_2() ** -alpha


# ---------------------------------------------------------------------------------------------
# Beyond text: patches and preferences
# ---------------------------------------------------------------------------------------------

IMAGE_15, PATCH_15 = (768, 1024), 16
MARGIN_15 = 0.85


def ex_15_3() -> float:
    """(768/16) * (1024/16) patches plus [CLS], squared: one score per query-key pair."""
    n = (IMAGE_15[0] // PATCH_15) * (IMAGE_15[1] // PATCH_15) + 1
    return n * n


def ex_15_3_wrong() -> float:
    """Forgetting the [CLS] token."""
    n = (IMAGE_15[0] // PATCH_15) * (IMAGE_15[1] // PATCH_15)
    return n * n


def ex_15_4() -> float:
    """Bradley-Terry: P(preferred) = sigmoid(r_w - r_l)."""
    return 1 / (1 + math.exp(-MARGIN_15))


def ex_15_4_wrong() -> float:
    """The sign flipped: the probability that the other answer wins."""
    return 1 / (1 + math.exp(MARGIN_15))


# ---------------------------------------------------------------------------------------------
# Instruction tuning: LoRA on SmolLM2-135M, and how sure a held-out accuracy is
# ---------------------------------------------------------------------------------------------

SMOL_16 = dict(d=576, ffn=1536, layers=30, heads=9, kv_heads=3, head_dim=64)
RANK_16 = 16
RIGHT_16, N_16, Z_16 = 27, 100, 1.96


def ex_16_3() -> float:
    """r (d_in + d_out) for q, k, v, o and the three SwiGLU matrices of every layer."""
    s, r = SMOL_16, RANK_16
    q = o = r * (s["d"] + s["heads"] * s["head_dim"])
    k = v = r * (s["d"] + s["kv_heads"] * s["head_dim"])
    gate = up = down = r * (s["d"] + s["ffn"])
    return s["layers"] * (q + k + v + o + gate + up + down)


def ex_16_3_wrong() -> float:
    """Key and value projections taken as square (d -> d), as without grouped-query attention."""
    s, r = SMOL_16, RANK_16
    return s["layers"] * (4 * r * 2 * s["d"] + 3 * r * (s["d"] + s["ffn"]))


def ex_16_4() -> float:
    """The upper end of the Wilson score interval."""
    p, n, z = RIGHT_16 / N_16, N_16, Z_16
    shrink = 1 + z ** 2 / n  # the interval is centred between p and 1/2, and narrowed by this
    middle = p + z ** 2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + (z / (2 * n)) ** 2)
    return (middle + spread) / shrink


def ex_16_4_wrong() -> float:
    """The normal-approximation (Wald) interval p + 1.96 sqrt(p(1 - p)/n)."""
    p = RIGHT_16 / N_16
    return p + Z_16 * math.sqrt(p * (1 - p) / N_16)

# ---------------------------------------------------------------------------------------------
# Preference tuning: DPO
# ---------------------------------------------------------------------------------------------

PAIR_17 = dict(policy_w=-4.37, policy_l=-6.12, ref_w=-4.90, ref_l=-5.48, beta=0.2)


def ex_17_3() -> float:
    """-log sigmoid(beta [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))]), in nats."""
    p = PAIR_17
    margin = p["beta"] * ((p["policy_w"] - p["ref_w"]) - (p["policy_l"] - p["ref_l"]))
    return math.log1p(math.exp(-margin))  # -log sigmoid(m) = log(1 + e^(-m))


def ex_17_3_wrong() -> float:
    """Leaving beta out of the margin."""
    p = PAIR_17
    margin = (p["policy_w"] - p["ref_w"]) - (p["policy_l"] - p["ref_l"])
    return math.log1p(math.exp(-margin))


# ---------------------------------------------------------------------------------------------
# Smaller and cheaper: quantisation
# ---------------------------------------------------------------------------------------------

def ex_18_2() -> float:
    """Bytes of a 4096 x 4096 int4 matrix in groups of 128, one 16-bit scale per group."""
    n = 4096 * 4096
    return n * 4 / 8 + (n // 128) * 2


def ex_18_2_wrong() -> float:
    """The integers alone, without the scales."""
    return 4096 * 4096 * 4 / 8


def ex_18_3() -> float:
    """Bits per weight: 4, an 8-bit constant per 128 weights, a 32-bit one per 256 constants."""
    return 4 + 8 / 128 + 32 / (128 * 256)


def ex_18_3_wrong() -> float:
    """Forgetting the second level of constants."""
    return 4 + 8 / 128



# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------

def ex_19_2() -> float:
    """Items for a 95% half-width of one point at accuracy 0.8: n = (1.96 / 0.01)^2 p (1 - p)."""
    return math.ceil(1.96 ** 2 * 0.8 * 0.2 / 0.01 ** 2)


def ex_19_2_wrong() -> float:
    """The rule of thumb 2 sigma instead of 1.96 sigma."""
    return math.ceil(2 ** 2 * 0.8 * 0.2 / 0.01 ** 2)


def ex_19_3() -> float:
    """Pairs judged the same in both orders: one A and one B verdict each, so as many as the B verdicts."""
    verdicts = 2 * 600
    return verdicts - round(0.71 * verdicts)


def ex_19_3_wrong() -> float:
    """Counting the pairs with two equal letters (A, A) as consistent."""
    return 600 - ex_19_3()


EXERCISES: dict[str, Compute] = {
    "1.3": Compute(ex_1_3, {"rel": 0.005}, ex_1_3_wrong, "the weights are softmax(-c / lambda): divide by lambda"),
    "1.4": Compute(ex_1_4, {"rel": 0.005}, ex_1_4_wrong, "use the natural logarithm (nats, not bits)"),
    "2.3": Compute(ex_2_3, {"exact": True}, ex_2_3_wrong, "count row by row: query t sees keys 0 to t, itself included"),
    "3.3": Compute(ex_3_3, {"rel": 0.005}, ex_3_3_wrong, "the slowest pair is i = d/2 - 1; its period is 2 pi / omega"),
    "3.4": Compute(ex_3_4, {"rel": 0.005}, ex_3_4_wrong, "a dot product of two table rows, not their cosine"),
    "4.3": Compute(ex_4_3, {"rel": 0.002}, ex_4_3_wrong, "LayerNorm divides by the standard deviation over n, not n - 1"),
    "5.3": Compute(ex_5_3, {"rel": 0.005}, ex_5_3_wrong, "the entropy of the smoothed target, in nats; the target keeps its share eps/K too"),
    "5.4": Compute(ex_5_4, {"rel": 0.005}, ex_5_4_wrong, "the two branches of min() meet at step = warmup; keep the factor d^(-1/2)"),
    "6.3": Compute(ex_6_3, {"rel": 0.005}, ex_6_3_wrong, "in each pass a token escapes with probability 1 - 0.15"),
    "7.3": Compute(ex_7_3, {"rel": 0.005}, ex_7_3_wrong, "the loss is in nats: perplexity = exp(loss)"),
    "7.4": Compute(ex_7_4, {"rel": 0.002}, ex_7_4_wrong, "cross-entropy of a uniform guess, with the natural logarithm"),
    "8.3": Compute(ex_8_3, {"rel": 0.002}, ex_8_3_wrong, "divide the logits by the temperature, then softmax"),
    "8.4": Compute(ex_8_4, {"rel": 0.005}, ex_8_4_wrong, "the truncated distribution is p / (mass kept) on the kept tokens"),
    "9.3": Compute(ex_9_3, {"rel": 0.002}, ex_9_3_wrong, "the update is scaled by alpha / r"),
    "10.3": Compute(ex_10_3, {"exact": True}, ex_10_3_wrong, "the cache stores keys and values of the key-value heads only"),
    "11.3": Compute(ex_11_3, {"rel": 0.005}, ex_11_3_wrong, "theta_i = base^(-2i/d_h) with the model's base"),
    "12.3": Compute(ex_12_3, {"rel": 0.002}, ex_12_3_wrong, "count the matrices of each network: SwiGLU has a gate"),
    "15.3": Compute(ex_15_3, {"exact": True}, ex_15_3_wrong, "count the patches, add the [CLS] token, then one score per pair"),
    "15.4": Compute(ex_15_4, {"rel": 0.002}, ex_15_4_wrong, "sigmoid of the preferred answer's reward minus the other's"),
    "13.2": Compute(ex_13_2, {"rel": 0.005}, ex_13_2_wrong,
                    "encode the held-out text with your merges, applied in the order they were learned"),
    "13.3": Compute(ex_13_3, {"rel": 0.005}, ex_13_3_wrong, "average over the merged symbols only, not the 256 bytes"),
    "14.2": Compute(ex_14_2, {"rel": 0.01}, ex_14_2_wrong, "C = 6ND and D = 20N: solve for N"),
    "14.3": Compute(ex_14_3, {"rel": 0.005}, ex_14_3_wrong,
                    "fit a straight line to log(L - E) against log N, then evaluate the law at N"),
    "16.3": Compute(ex_16_3, {"exact": True}, ex_16_3_wrong,
                    "r (d_in + d_out) for each of the seven matrices of a layer; k and v map 576 to 192"),
    "16.4": Compute(ex_16_4, {"rel": 0.002}, ex_16_4_wrong,
                    "the Wilson centre (p + z²/2n)/(1 + z²/n) plus its half-width, not p ± 1.96 sqrt(p(1-p)/n)"),
    "17.3": Compute(ex_17_3, {"rel": 0.002}, ex_17_3_wrong,
                    "beta times the difference of the two log-ratios, then -log sigmoid of it"),
    "18.2": Compute(ex_18_2, {"exact": True}, ex_18_2_wrong, "half a byte per weight, plus one scale for every group"),
    "18.3": Compute(ex_18_3, {"abs": 0.0002}, ex_18_3_wrong,
                    "4 bits, plus a share of an 8-bit constant, plus a share of a 32-bit one"),
    "19.2": Compute(ex_19_2, {"exact": True}, ex_19_2_wrong, "solve 1.96 * sqrt(p (1 - p) / n) = 0.01 for n, then round up"),
    "19.3": Compute(ex_19_3, {"exact": True}, ex_19_3_wrong,
                    "the same answer in both orders means slot A once and slot B once"),
}

ANSWERS_FILE = HERE / "answers.json"


def answers() -> dict[str, float]:
    return {name: float(ex.answer()) for name, ex in EXERCISES.items()}


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(HERE.parents[1]))
    from coursekit.exercises import answer_key

    found = answers()
    for name, value in found.items():
        print(f"{name}: {value!r}  key={answer_key(name, value, **EXERCISES[name].tolerance)}")
    ANSWERS_FILE.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"wrote {ANSWERS_FILE.name}")
