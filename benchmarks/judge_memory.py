"""The grading process's data segment, and torch under the judge's memory limit.

Prints (1) the data segment (``VmData``, what ``RLIMIT_DATA`` counts) of a process that has loaded
what a grading worker loads (torch, nbgrader's autograde app, jupyter_client, pyzmq) and, with
``--assignment``, that assignment's judge context (the cells the judge runs before the tests);
(2) whether torch computes under the limit a test runs with (``autograder.judge.budget``: the data
segment at its start plus ``test_memory_mb``): a matmul, and the allocation a hostile value asks
for (``torch.bincount`` of a huge id), which must fail in the test and leave the process as it was.  On a GPU machine, ``--device cuda`` also
starts CUDA under the limit.  (docs/GRADING.md, "What one test may take".)

    python benchmarks/judge_memory.py [--assignment attention] [--limit-mb 2048] [--device cuda]
"""
from __future__ import annotations

import argparse
import resource
import time


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assignment", default="", help="also run this assignment's judge context")
    ap.add_argument("--limit-mb", type=int, default=0, help="what a test may add (default: the course's)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    import jupyter_client  # noqa: F401
    import torch
    import zmq  # noqa: F401
    from nbgrader.apps.autogradeapp import AutogradeApp  # noqa: F401

    from autograder.course.model import Grading, load
    from autograder.judge.budget import data_segment, is_memory_error

    print(f"data segment after the grading worker's imports: {mib(data_segment())}")
    if args.assignment:
        import nbformat

        from autograder import ROOT, SOURCE_DIR
        from autograder.judge.runner import context_sources, judge_namespace

        spec = load().assignment(args.assignment)
        nb = nbformat.read(ROOT / SOURCE_DIR / spec.id / spec.notebook, as_version=4)
        judge_namespace(context_sources(nb, list(spec.judge_context)), args.device)
        print(f"data segment with {args.assignment}'s judge context: {mib(data_segment())}")
    limit = data_segment() + ((args.limit_mb or Grading().test_memory_mb) << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        t0 = time.perf_counter()
        a = torch.randn(1024, 1024, device=args.device)
        b = (a @ a).sum().item()
        print(f"under a limit of {mib(limit)}: a 1024 x 1024 matmul on {args.device} ran "
              f"({time.perf_counter() - t0:.2f} s, result finite: {b == b})")
        try:
            torch.bincount(torch.tensor([10**9]))
            print("torch.bincount of the id 10**9 (8 GB): allocated (the limit did not hold)")
        except Exception as exc:  # noqa: BLE001 - what the test would see
            print(f"torch.bincount of the id 10**9 (8 GB): refused, a memory error: {is_memory_error(exc)}")
        print(f"data segment under the limit, afterwards: {mib(data_segment())}")
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


if __name__ == "__main__":
    main()
