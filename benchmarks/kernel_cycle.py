"""What one judged kernel costs: start, round trips, stop.

Starts ``--kernels`` sandboxed kernels one after another through the zygote, as a grading worker
does, and in each makes ``--requests`` round trips of one kind: an empty cell (``exec``), a
judge request with an int (``req``) or with a small tensor (``tensor``, as most requests of a
test carry), then stops it.  Prints milliseconds of wall time per kernel start and stop and per
round trip, and the CPU seconds the kernels' processes and their launchers used (sampled from
/proc).  Pin it to one CPU, as a grading worker is: ``taskset -c 0 python benchmarks/kernel_cycle.py``.

    python benchmarks/kernel_cycle.py [--kernels 10] [--requests 100] [--kind exec|req|tensor]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from autograder.course.settings import GradingSettings  # noqa: E402
from autograder.isolation import sandbox  # noqa: E402
from autograder.judge import execute  # noqa: E402
from coursekit.remote.client import RemoteStudent  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


class CpuByKind:
    """CPU seconds of this process's descendants by kind, sampled from /proc every 20 ms."""

    def __init__(self):
        self.seen: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _kind(self, cmdline: str) -> str | None:
        if "course-zygote.py" in cmdline:
            return "zygote and kernels (forked from it)"
        if "autograder.isolation.sandbox" in cmdline:
            return "kernel launchers"
        return None

    def _run(self):
        while not self.stop.wait(0.02):
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                try:
                    stat = Path(f"/proc/{name}/stat").read_text()
                    cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                kind = self._kind(cmdline)
                if kind:
                    fields = stat[stat.rindex(")") + 2:].split()
                    self.seen[int(name)] = (kind, (int(fields[11]) + int(fields[12])) / HZ)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for kind, cpu in self.seen.values():
            out[kind] = out.get(kind, 0.0) + cpu
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=10)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--kind", choices=["exec", "req", "tensor"], default="tensor")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kernel-cycle-"))
    sandbox.install_kernelspec(tmp / "jupyter", GradingSettings(memory_mb=4096), threads=1)
    os.environ["JUPYTER_PATH"] = str(tmp / "jupyter")
    base = tmp / "base"
    base.mkdir()
    judged = execute.JudgedExecute()
    judged._ensure_zygote(base)
    arg = torch.ones(4, 8) if args.kind == "tensor" else 1
    phases = {"start": 0.0, "round trips": 0.0, "stop": 0.0}
    with CpuByKind() as cpu:
        time.sleep(3)  # the zygote's imports, before the clock
        before = cpu.totals()
        for i in range(args.kernels):
            scratch = base / f"s{i}"
            scratch.mkdir()
            (scratch / "submission.ipynb").write_text("{}")
            session = judged._session(scratch, scratch / "submission.ipynb")
            t = time.perf_counter()
            session.start()
            phases["start"] += time.perf_counter() - t
            student = RemoteStudent(session, 30, [])
            session.execute("def f(a):\n    return a", timeout=30, silent=True)
            t = time.perf_counter()
            for _ in range(args.requests):
                if args.kind == "exec":
                    session.execute("x = 1", timeout=30, silent=True, store_history=False)
                else:
                    student.f(arg)
            phases["round trips"] += time.perf_counter() - t
            t = time.perf_counter()
            session.stop()
            phases["stop"] += time.perf_counter() - t
        time.sleep(0.5)
    execute._stop_zygote()
    n = args.kernels
    print(f"{n} kernels, {args.requests} round trips ({args.kind}) each")
    print(f"  start {1000 * phases['start'] / n:7.1f} ms per kernel")
    print(f"  round trip {1000 * phases['round trips'] / n / max(1, args.requests):7.2f} ms")
    print(f"  stop {1000 * phases['stop'] / n:7.1f} ms per kernel")
    for kind, total in sorted(cpu.totals().items()):
        print(f"  CPU of {kind}: {1000 * (total - before.get(kind, 0.0)) / n:7.1f} ms per kernel")


if __name__ == "__main__":
    main()
