"""Generation with and without the key-value cache of ``coursekit.gpt.generate``.

    python benchmarks/kv_cache.py                         # 4 layers, width 256, 1 thread
    python benchmarks/kv_cache.py --new 512 --threads 2   # longer texts, two threads
    python benchmarks/kv_cache.py --kv-heads 8 4 2 1      # a ModernGPT with grouped-query attention

Builds a GPT with random weights (speed does not depend on what the weights learned), generates
``--new`` tokens greedily after a 16-token prompt with ``use_cache=True`` and ``use_cache=False``,
checks that both give the same tokens, and prints the wall time, tokens per second, the ratio,
and the bytes the cache held at the end. With ``--kv-heads`` the same for a ``ModernGPT`` with
8 query heads and the given numbers of key-value heads (cache on only).
This script prints figures; it asserts nothing about speed (see docs/CONVENTIONS.md).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from coursekit.gpt import GPT, GPTConfig, KVCache, ModernConfig, ModernGPT, generate  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new", type=int, default=256, help="tokens to generate (default 256)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kv-heads", type=int, nargs="*", default=[], help="also time a ModernGPT with these")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"python {platform.python_version()} | torch {torch.__version__} | {args.threads} thread(s)")
    block = 16 + args.new
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=1024, block_size=block, n_layer=args.layers, n_head=4, n_embd=args.width)).eval()
    prompt = torch.randint(1024, (1, 16), generator=torch.Generator().manual_seed(1))
    cached, t_cached = timed(lambda: generate(model, prompt, args.new))
    plain, t_plain = timed(lambda: generate(model, prompt, args.new, use_cache=False))
    cache = KVCache(args.layers)
    with torch.no_grad():
        model(cached[:, :-1], cache=cache)
    print(f"GPT, {args.layers} layers, width {args.width}, {args.new} new tokens: same tokens: {torch.equal(cached, plain)}")
    print(f"  with cache    {t_cached:7.2f} s  {args.new / t_cached:8.1f} tokens/s  (cache at the end: "
          f"{cache.nbytes() / 1e6:.1f} MB)")
    print(f"  without cache {t_plain:7.2f} s  {args.new / t_plain:8.1f} tokens/s  ratio {t_plain / t_cached:.1f}")
    for kv in args.kv_heads:
        torch.manual_seed(0)
        net = ModernGPT(ModernConfig(vocab_size=1024, block_size=block, n_layer=args.layers, n_head=8, n_kv_head=kv,
                                     n_embd=args.width)).eval()
        _, t = timed(lambda: generate(net, prompt, args.new))
        cache = KVCache(args.layers)
        with torch.no_grad():
            net(torch.zeros(1, block - 1, dtype=torch.long), cache=cache)
        print(f"ModernGPT, 8 query heads, {kv} key-value heads: {args.new / t:8.1f} tokens/s, "
              f"cache for {block - 1} positions {cache.nbytes() / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
