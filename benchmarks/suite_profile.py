"""Where the test suite's time goes: CPU, not waiting, per tier, module and test.

Run the suite with ``--cpu-log FILE`` (tests/conftest.py: each test appends its wall seconds and
the CPU seconds of its worker's own CPU), then sum it up:

    bash scripts/test.sh --cpu-log /tmp/cpu.tsv
    python benchmarks/suite_profile.py /tmp/cpu.tsv [--top 25]

Prints the totals (wall and CPU summed over the tests, and the share of the time a worker's CPU
idled while a test waited: sleeps, timeouts, another process's answer), then CPU by tier
(README: "Test tiers"), the modules and the tests that use the most CPU, and those that idle the
most.  On the 2-core machine with two pinned workers, the suite's wall clock is about the summed
CPU over two plus the idle: only less CPU, or less idling, makes it shorter (issue 36).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import tier_of  # noqa: E402


@dataclass(frozen=True)
class TestTime:
    nodeid: str
    wall: float
    cpu: float
    worker: str

    @property
    def idle(self) -> float:
        return max(0.0, self.wall - self.cpu)


def read_log(path: Path) -> list[TestTime]:
    """The lines of a ``--cpu-log`` file; a line that is not one (a run killed while writing) is skipped."""
    rows = []
    for line in Path(path).read_text().splitlines():
        parts = line.split("\t")
        try:
            rows.append(TestTime(parts[0], float(parts[1]), float(parts[2]), parts[3]))
        except (IndexError, ValueError):
            continue
    return rows


def summary(rows: list[TestTime], top: int = 25) -> str:
    if not rows:
        return "no test in the log"
    wall, cpu = sum(r.wall for r in rows), sum(r.cpu for r in rows)
    idle = sum(r.idle for r in rows)
    workers = sorted({r.worker for r in rows})
    lines = [f"{len(rows)} tests on {len(workers)} worker(s): wall {wall:,.0f} s summed, CPU {cpu:,.0f} s, "
             f"idle {idle:,.0f} s ({idle / wall:.1%} of the wall time)"]
    for w in workers:
        mine = [r for r in rows if r.worker == w]
        lines.append(f"  worker {w}: wall {sum(r.wall for r in mine):,.0f} s, CPU {sum(r.cpu for r in mine):,.0f} s")
    by_tier, by_module = defaultdict(float), defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        by_tier[tier_of(r.nodeid)] += r.cpu
        module = by_module[r.nodeid.split("::", 1)[0]]
        module[0] += r.cpu
        module[1] += r.idle
    lines.append("CPU by tier: " + ", ".join(f"{t} {s:,.0f} s" for t, s in sorted(by_tier.items(), key=lambda kv: -kv[1])))
    lines.append(f"modules by CPU (top {top}):  CPU s  idle s")
    for name, (c, i) in sorted(by_module.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {c:8.0f} {i:7.0f}  {name}")
    lines.append(f"tests by CPU (top {top}):  CPU s  wall s")
    for r in sorted(rows, key=lambda r: -r.cpu)[:top]:
        lines.append(f"  {r.cpu:8.1f} {r.wall:7.1f}  {r.nodeid}")
    lines.append(f"tests by idle (top {top}):  idle s  wall s")
    for r in sorted(rows, key=lambda r: -r.idle)[:top]:
        lines.append(f"  {r.idle:8.1f} {r.wall:7.1f}  {r.nodeid}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="the file given to --cpu-log")
    ap.add_argument("--top", type=int, default=25, help="lines per table")
    args = ap.parse_args(argv)
    if not args.log.is_file():
        print(f"suite_profile: no such file: {args.log} (run the suite with --cpu-log {args.log})", file=sys.stderr)
        return 2
    print(summary(read_log(args.log), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
