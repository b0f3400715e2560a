"""Stress check of issue 34.1: two ``grade`` runs of attention started together on one fresh
grading folder, repeated; every repetition must end with both runs done (exit 0, --wait) and
both grades in place, each the student's own (s1 30, s2 24).

    python benchmarks/concurrent_grades.py --repeat 20
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main() -> int:
    from test_record_writer import two_grades_at_once

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    bad = 0
    for i in range(args.repeat):
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="concurrent-grades-") as tmp:
            rows, done = two_grades_at_once(Path(tmp))
        ok = all(p.returncode == 0 for p in done) and rows == {"s1": ("graded", "30"), "s2": ("graded", "24")}
        bad += not ok
        waited = sum("waiting for grade attention" in p.stderr for p in done)
        print(f"{i + 1:>3}  {'ok  ' if ok else 'LOST'}  {time.monotonic() - start:5.0f} s  exit {[p.returncode for p in done]}"
              f"  grades {rows}  (one waited: {bool(waited)})", flush=True)
        if not ok:
            for p in done:
                print(p.stderr[-1500:], flush=True)
    print(f"{args.repeat - bad} of {args.repeat} repetitions kept every grade")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
