"""Measure what one submission of an assignment costs to grade, and project a whole class.

Grades N copies of the assignment's filled-in solution (the expensive case: every cell
runs to the end) with ``autograder.pipeline.run.grade(..., workers=W)``, sandbox on, and prints:

* the wall time of the batch and per submission;
* the CPU time the machine spent meanwhile (``/proc/stat``, all processes: nbgrader, the
  sandboxed kernels, feedback), per submission;
* the cost of one submission on one core: with W workers on W cores each kernel gets one
  thread (``autograder.backends.local`` divides the usable CPUs among the workers), so one worker takes
  ``W * wall / N`` seconds per submission;
* a table projecting a class of ``--class-size`` students onto machines with one worker per
  core: the batch runs in waves of ``cores`` submissions, each wave as long as one submission
  on one core.  Starting the machines (a SLURM queue, a worker preparing its models) is not
  counted: it is printed separately where it was measured.

    python benchmarks/class_projection.py                      # finetune, 4 copies, 2 workers
    python benchmarks/class_projection.py --assignment attention --n 20 --class-size 1000

Prints figures; asserts nothing (see docs/CONVENTIONS.md).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from autograder.pipeline.run import grade  # noqa: E402
from autograder.course.settings import usable_cpus  # noqa: E402
from conftest import filled_exercise  # noqa: E402

# machines to project onto: (label, cores in all, workers each with one core)
MACHINES = [("this kind of machine, 2 cores", 2), ("one 32-core server", 32), ("10 SLURM nodes x 32 cores", 320)]


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (every core, every process)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--assignment", default="finetune")
    ap.add_argument("--n", type=int, default=4, help="copies to grade (a multiple of --workers)")
    ap.add_argument("--workers", type=int, default=usable_cpus())
    ap.add_argument("--class-size", type=int, default=500)
    args = ap.parse_args()
    nb = filled_exercise(args.assignment)
    with tempfile.TemporaryDirectory(prefix="bench-class-") as tmp:
        tmp = Path(tmp)
        (tmp / "subs").mkdir()
        (tmp / "empty").mkdir()
        # record the release first (a class pays for that once), and build the models if needed
        grade(args.assignment, tmp / "empty", out_dir=tmp / "out0", grading_dir=tmp / "grading", workers=1)
        for i in range(args.n):
            nbformat.write(nb, tmp / "subs" / f"s{i:03d}_{args.assignment}.ipynb")
        cpu0, t0 = busy_seconds(), time.perf_counter()
        report = grade(args.assignment, tmp / "subs", out_dir=tmp / "out", grading_dir=tmp / "grading",
                       workers=args.workers)
        wall, cpu = time.perf_counter() - t0, busy_seconds() - cpu0
    graded = [r for r in report.results if r.status == "graded"]
    one = args.workers * wall / args.n  # one submission on one worker with one core
    print(f"{args.assignment}: {args.n} submissions, {args.workers} workers on {os.cpu_count()} CPUs, "
          f"{len(graded)} graded, scores {sorted({r.score for r in graded})}")
    print(f"wall {wall:.1f} s ({wall / args.n:.1f} s per submission); machine CPU {cpu:.1f} s "
          f"({cpu / args.n:.1f} s per submission); one submission on one core: {one:.1f} s")
    print(f"\nprojection for {args.class_size} submissions, one worker per core "
          f"(waves of `cores` submissions, {one:.0f} s each):")
    print(f"{'machines':<30}{'cores':>7}{'waves':>7}{'grading time':>14}")
    for label, cores in MACHINES:
        waves = math.ceil(args.class_size / cores)
        print(f"{label:<30}{cores:>7}{waves:>7}{hours(waves * one):>14}")


if __name__ == "__main__":
    main()
