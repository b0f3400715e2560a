"""Fine-tune the offline DistilBERT checkpoint on small AG News: a plain PyTorch loop
against the Hugging Face ``Trainer``, same model init, data, epochs and batch size.

    python benchmarks/finetune.py                     # cpu profile, both runs
    python benchmarks/finetune.py --skip-trainer      # only our loop
    python benchmarks/finetune.py --train-size 2000 --epochs 3 --max-length 128

Prints test accuracy (the full 800-row test split) against training wall time for each
run, and the ratio of the two times.  Our loop pads each batch only to its longest row
and groups rows of similar length (sort within chunks of a few batches, then shuffle the
batch order), so it spends less time on padding than a loop over random batches.
Evaluation is the same function for both runs and is not counted in the training time.

The model comes from ``coursekit.models`` with COURSE_MODEL_SOURCE=offline unless that
variable says otherwise: all-MiniLM-L6-v2 converted to DistilBERT layout (22.7M params).
This script prints figures; it asserts nothing (see docs/CONVENTIONS.md).
"""
from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("COURSE_MODEL_SOURCE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from coursekit import seed_everything  # noqa: E402
from coursekit.data import load_small_ag_news  # noqa: E402
from coursekit.models import load_classifier  # noqa: E402

# Settings per profile; every one can be overridden on the command line.
PROFILES = {
    # 2 CPU cores: aims at >= 0.88 test accuracy within 90 s of training, which needs
    # bfloat16 autocast (CPUs with AVX512-BF16 or AMX; see --precision). In float32 the same
    # settings take about three times as long.
    "cpu": dict(train_size=2000, epochs=2, max_length=48, batch_size=32, lr=2e-4, warmup=0.1),
}


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------

def tokenize(tokenizer, texts, max_length):
    """Token ids per text, truncated but not padded (padding happens per batch)."""
    return tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]


def bucketed_batches(lengths, batch_size, rng, chunk_batches=8):
    """Batches of row indices in which rows have similar lengths.

    Shuffle all rows, cut them into chunks of ``chunk_batches`` batches, sort each chunk by
    length and slice it into batches, then shuffle the order of all batches.  Each epoch
    still sees different batch mates, but a batch's rows need little padding.
    """
    order = rng.permutation(len(lengths))
    chunk = batch_size * chunk_batches
    batches = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: lengths[i])
        batches += [part[j:j + batch_size] for j in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(ids, rows, pad_id):
    """Pad the rows to the longest of them: (B, T) input ids and attention mask."""
    width = max(len(ids[i]) for i in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for r, i in enumerate(rows):
        input_ids[r, :len(ids[i])] = torch.tensor(ids[i])
        mask[r, :len(ids[i])] = 1
    return input_ids, mask


def autocast(bf16: bool):
    """bfloat16 autocast on the CPU (weights and optimizer stay float32)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


@torch.inference_mode()
def accuracy(model, ids, labels, pad_id, batch_size=64):
    """Share of rows whose arg-max logit is the label (batches sorted by length)."""
    model.eval()
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    correct = 0
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        input_ids, mask = collate(ids, rows, pad_id)
        logits = model(input_ids=input_ids, attention_mask=mask).logits  # (B, n_classes)
        correct += (logits.argmax(-1) == torch.tensor([labels[i] for i in rows])).sum().item()
    return correct / len(ids)


def linear_schedule(optimizer, total_steps, warmup_steps):
    """Linear warm-up to the base rate, then linear decay to 0 (the Trainer's default shape)."""
    def factor(step):
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------------------
# The two runs
# ---------------------------------------------------------------------------------------

def train_ours(model, ids, labels, cfg, pad_id, seed):
    """Our loop; returns (seconds, padded tokens seen, steps)."""
    rng = np.random.default_rng(seed)
    lengths = [len(x) for x in ids]
    steps_per_epoch = -(-len(ids) // cfg["batch_size"])
    total = steps_per_epoch * cfg["epochs"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0, fused=True)
    scheduler = linear_schedule(optimizer, total, int(np.ceil(cfg["warmup"] * total)))
    tokens = steps = 0
    model.train()
    start = time.perf_counter()
    for _ in range(cfg["epochs"]):
        for rows in bucketed_batches(lengths, cfg["batch_size"], rng):
            input_ids, mask = collate(ids, rows, pad_id)
            target = torch.tensor([labels[i] for i in rows])
            with autocast(cfg["bf16"]):
                loss = model(input_ids=input_ids, attention_mask=mask, labels=target).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            tokens += input_ids.numel()
            steps += 1
    return time.perf_counter() - start, tokens, steps


def train_hf(model, tokenizer, ids, labels, cfg, seed):
    """The Hugging Face Trainer: its default random batches with dynamic padding, fused
    AdamW and linear schedule; warm-up, precision and (no) gradient clipping set as in our
    loop.  Returns (seconds, padded tokens seen, steps)."""
    from datasets import Dataset
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    train = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids],
                               "labels": labels})
    pad = DataCollatorWithPadding(tokenizer, return_tensors="pt")
    seen = {"tokens": 0}

    def counting_collator(features):
        batch = pad(features)
        seen["tokens"] += batch["input_ids"].numel()
        return batch

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=cfg["batch_size"],
            num_train_epochs=cfg["epochs"], learning_rate=cfg["lr"], weight_decay=0.0,
            lr_scheduler_type="linear", warmup_steps=cfg["warmup"], optim="adamw_torch_fused",
            max_grad_norm=0.0,  # no clipping, like our loop
            save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none",
            disable_tqdm=True, use_cpu=True, bf16=cfg["bf16"], seed=seed, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=counting_collator)
        trainer.remove_callback(PrinterCallback)  # it would print the final metrics dict
        start = time.perf_counter()
        result = trainer.train()
        seconds = time.perf_counter() - start
    return seconds, seen["tokens"], result.global_step


def native_bf16() -> bool:
    """True when this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); elsewhere
    bf16 autocast is emulated and slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def load_average() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    parser.add_argument("--train-size", type=int, help="balanced training rows (max 2000)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--max-length", type=int, help="truncate texts to this many tokens")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--warmup", type=float, help="share of steps spent warming up")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                        help="bf16 = bfloat16 autocast for both runs; auto: bf16 where the CPU "
                             "has native bf16 instructions")
    parser.add_argument("--repeats", type=int, default=1,
                        help="alternate the runs this many times and keep each one's fastest")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-trainer", action="store_true", help="only run our loop")
    args = parser.parse_args(argv)
    cfg = dict(PROFILES[args.profile])
    for key in cfg:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    cfg["bf16"] = args.precision == "bf16" or (args.precision == "auto" and native_bf16())

    torch.set_num_threads(os.cpu_count() or 1)
    seed_everything(args.seed)
    model, tokenizer, description = load_classifier(num_labels=4)
    init = copy.deepcopy(model.state_dict())  # every run starts from these exact weights
    data = load_small_ag_news(n_train=cfg["train_size"], seed=args.seed)
    train_ids = tokenize(tokenizer, data["train"]["text"], cfg["max_length"])
    test_ids = tokenize(tokenizer, data["test"]["text"], cfg["max_length"])
    train_y, test_y = list(data["train"]["label"]), list(data["test"]["label"])
    pad_id = tokenizer.pad_token_id

    print(f"model: {description}")
    print(f"host: {platform.node() or '?'} | {platform.processor() or platform.machine()} | "
          f"torch {torch.__version__} | threads {torch.get_num_threads()} (cpu_count "
          f"{os.cpu_count()}) | load average {load_average()}")
    print(f"profile {args.profile}: " + ", ".join(f"{k}={v}" for k, v in cfg.items())
          + f", seed={args.seed}, test rows={len(test_ids)}")

    # Warm up the kernels once so that neither run pays for it.
    with torch.inference_mode(), autocast(cfg["bf16"]):
        model.eval()
        model(*collate(train_ids, list(range(min(8, len(train_ids)))), pad_id))

    runs = {"ours": "ours (bucketed, dynamic padding)"}
    if not args.skip_trainer:
        runs["hf"] = "HF Trainer (random batches, dyn. padding)"
    results = {kind: [] for kind in runs}
    for _ in range(max(1, args.repeats)):
        for kind, label in runs.items():
            # The Trainer gets its own copy: accelerate wraps the forward of the model it
            # prepares (autocast under bf16), and that wrapper would stay on ours.
            run_model = model if kind == "ours" else copy.deepcopy(model)
            run_model.load_state_dict(init)
            seed_everything(args.seed)
            cpu0 = time.process_time()
            if kind == "ours":
                seconds, tokens, steps = train_ours(run_model, train_ids, train_y, cfg, pad_id, args.seed)
            else:
                seconds, tokens, steps = train_hf(run_model, tokenizer, train_ids, train_y, cfg, args.seed)
            cpu = time.process_time() - cpu0
            acc = accuracy(run_model, test_ids, test_y, pad_id)
            del run_model
            results[kind].append((seconds, cpu, acc, tokens, steps))
            print(f"  {label}: {seconds:.1f} s wall, {cpu:.1f} s cpu, test accuracy {acc:.3f} "
                  f"(load average {load_average()})", flush=True)

    real = sum(len(x) for x in train_ids) * cfg["epochs"]
    head = (f"{'run':<40} {'train s':>8} {'cpu s':>7} {'ex/s':>6} {'steps':>6} "
            f"{'pad eff':>8} {'test acc':>9}")
    print("\n" + head + "\n" + "-" * len(head))
    best = {}
    for kind, label in runs.items():
        seconds, cpu, acc, tokens, steps = best[kind] = min(results[kind])
        ex_s = cfg["train_size"] * cfg["epochs"] / seconds
        print(f"{label:<40} {seconds:>8.1f} {cpu:>7.1f} {ex_s:>6.1f} {steps:>6d} "
              f"{real / tokens:>8.2f} {acc:>9.3f}")
    if len(best) == 2:
        print(f"\nratio ours / Trainer wall time: {best['ours'][0] / best['hf'][0]:.2f}")
    note = f"fastest of {args.repeats} alternating runs; " if args.repeats > 1 else ""
    print(f"{note}train s = training wall time (evaluation excluded); pad eff = real tokens / "
          f"tokens fed to the model; test acc on the {len(test_ids)}-row test split")


if __name__ == "__main__":
    main()
