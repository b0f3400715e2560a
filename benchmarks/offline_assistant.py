"""The offline assistant (coursekit.gpt.assistant): how long the base and chat models take to
train with the defaults, and what they can do.

    python benchmarks/offline_assistant.py [--retrain] [--n-test N]

Prints the training time of each stage (from a fresh cache unless the models are cached:
``--retrain`` forces training), the held-out perplexity of both models on the AG News test
articles, the chat model's topic accuracy on the held-out topic questions against 25 %
chance with a 95 % Wilson interval, the share of real words the base model writes
(``word_share``), and three sample answers.
"""
from __future__ import annotations

import argparse
import time

import torch

from coursekit.gpt import assistant as A


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retrain", action="store_true", help="train both models even when cached")
    parser.add_argument("--n-test", type=int, default=None, help="topic questions to score (default: all)")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads available; training uses 1")

    start = time.perf_counter()
    base, tok, base_info = A.load_or_train_base(verbose=True, retrain=args.retrain)
    base_s = time.perf_counter() - start
    start = time.perf_counter()
    chat, tok, chat_info = A.load_or_train_chat(verbose=True, retrain=args.retrain)
    chat_s = time.perf_counter() - start
    print(f"base model: {base_info['source']} in {base_s:.1f} s "
          f"(training loop {base_info['history']['seconds']:.1f} s)")
    print(f"chat model: {chat_info['source']} in {chat_s:.1f} s "
          f"(SFT loop {chat_info['history']['seconds']:.1f} s)")
    print(f"together: {base_s + chat_s:.1f} s")

    with torch.no_grad():
        print(f"held-out perplexity (AG News test articles): base {A.heldout_perplexity(base, tok):.1f}, "
              f"chat {A.heldout_perplexity(chat, tok):.1f}")
    # the base model never learned to end an answer, so every one of its answers runs to the limit:
    # 200 questions are plenty to show it does not answer
    for name, model, n in (("base", base, 200), ("chat", chat, args.n_test)):
        r = A.topic_accuracy(model, tok, n=n)
        lo, hi = r["interval"]
        print(f"{name} model, topic of held-out headlines: {r['correct']}/{r['n']} = {r['accuracy']:.1%} "
              f"(95% interval {lo:.1%} to {hi:.1%}; chance {r['chance']:.0%})")
    prompts = ["Write a headline about sports.", "Write a headline about business.",
               next(p for p in A.instruction_pairs("test", seed=3) if p["task"] == "topic")["messages"][0]["content"]
]
    for prompt in prompts:
        print(f"chat> {prompt}\n   -> {A.answer(chat, tok, prompt, max_new_tokens=32)}")
    words = A.word_share(base, tok)
    print(f"base model writes words: {words['known']}/{words['words']} = {words['share']:.1%} of the words it writes "
          f"are words of the AG News text (continuations of {len(words['samples'])} held-out article starts)")
    for text in ("Oil prices", "The president said"):
        print(f"base continues {text!r}: {text + A.continue_text(base, tok, text, max_new_tokens=32, temperature=0.8)!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
