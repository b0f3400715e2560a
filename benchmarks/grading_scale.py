"""Grading as the class grows: seconds per submission and the largest process's memory.

For each class size n, ``n`` generated ``attention`` submissions (the mix of ``autograde.py``:
half correct, some wrong, untouched, broken) are graded by one ``grade(..., workers=W)`` into a
gradebook that already holds the release; a thread samples, every 0.2 s, the resident memory of
this process and of every process below it (grading workers, zygotes, kernels).  Prints, per n:
seconds per submission, the grader's own peak RSS, the largest RSS of any other process, and
the largest sum over all of them at one moment.  Flat cost and flat memory are the goal
(issue "Grading near its floor").

    python benchmarks/grading_scale.py [--n 40 200 1000] [--quick] [--workers 2] [--repeat 2] [--fake]

``--quick``: n = 20 and 60.  ``--fake``: the grader alone, every size in a fresh process, the
judge replaced by the tests' kernel-free fake (tests/fakebackend.py): whether the grader's own
time and memory per submission stay flat as the class grows, in minutes instead of hours (the
kernels' side is per submission by design: a fresh kernel each).  Figures depend on the machine's
load: run ``uptime`` beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from autograde import make_submissions  # noqa: E402
from autograder.pipeline.run import grade  # noqa: E402


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root: int) -> list[int]:
    children: dict = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


class MemorySampler:
    """Peak RSS of this process, of its largest descendant, and of all of them together."""

    def __init__(self, every: float = 0.2):
        self.every, self.grader, self.largest, self.total = every, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            mine = _rss_kb(me)
            others = [_rss_kb(p) for p in _descendants(me)]
            self.grader = max(self.grader, mine)
            self.largest = max([self.largest, *others])
            self.total = max(self.total, mine + sum(others))
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measure(n: int, workers: int, sandbox: str) -> tuple[float, MemorySampler, bool]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        tmp = Path(tmp)
        subs = tmp / "subs"
        subs.mkdir()
        make_submissions(subs, n)
        (tmp / "empty").mkdir()
        grade("attention", tmp / "empty", out_dir=tmp / "out0", grading_dir=tmp / "g", workers=1,
              use_sandbox=sandbox)  # the release, once for the class
        with MemorySampler() as mem:
            t = time.perf_counter()
            report = grade("attention", subs, out_dir=tmp / "out", grading_dir=tmp / "g", workers=workers,
                           use_sandbox=sandbox)
            seconds = time.perf_counter() - t
        graded = sum(r.status == "graded" for r in report.results)
        return seconds / n, mem, graded == n


def measure_fake(n: int, workers: int) -> dict:
    """``n`` submissions judged by the fake backend in a fresh process (this script with
    ``--fake-child``): s/submission and that process's peak RSS, which an earlier size's heap
    does not inflate."""
    env = {**os.environ, "COURSE_TEST_RELEASES": os.environ.get("COURSE_TEST_RELEASES") or tempfile.mkdtemp()}
    out = subprocess.run([sys.executable, "-W", "ignore", __file__, "--fake-child", str(n), "--workers", str(workers)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fake_child(n: int, workers: int) -> None:
    import fakebackend

    class Forgetful(fakebackend.FakeBackend):
        """The tests' fake keeps every batch for its assertions; a grader does not."""

        def judge(self, batch):
            out = super().judge(batch)
            self.batches.clear()
            return out

    fakebackend.install(None, Forgetful())
    per, _, ok = measure(n, workers, "off")
    print(json.dumps({"per": per, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ok": ok}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[40, 200, 1000])
    ap.add_argument("--quick", action="store_true", help="n = 20 and 60")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="measurements per n")
    ap.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--fake", action="store_true", help="the grader alone: a kernel-free fake judge")
    ap.add_argument("--fake-child", type=int, metavar="N", help=argparse.SUPPRESS)  # one size, in measure_fake's process
    args = ap.parse_args()
    if args.fake_child:
        return _fake_child(args.fake_child, args.workers)
    sizes = [20, 60] if args.quick else args.n
    if args.fake:
        print(f"the grader alone (fake judge), each size in a fresh process; workers: {args.workers}")
        print(f"{'n':>6}{'run':>5}{'s/submission':>14}{'grader peak RSS MB':>20}{'all graded':>12}{'load':>7}")
        for n in sizes:
            for k in range(args.repeat):
                r = measure_fake(n, args.workers)
                print(f"{n:>6}{k + 1:>5}{r['per']:14.4f}{r['rss'] / 1024:20.0f}{str(r['ok']):>12}"
                      f"{os.getloadavg()[0]:7.2f}", flush=True)
        return
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"(1, 5, 15 min); cpus: {os.cpu_count()}; workers: {args.workers}")
    print(f"{'n':>6}{'run':>5}{'s/submission':>14}{'grader MB':>11}{'largest other MB':>18}{'all MB':>9}"
          f"{'all graded':>12}{'load':>7}")
    for n in sizes:
        for k in range(args.repeat):
            per, mem, ok = measure(n, args.workers, args.sandbox)
            print(f"{n:>6}{k + 1:>5}{per:14.3f}{mem.grader / 1024:11.0f}{mem.largest / 1024:18.0f}"
                  f"{mem.total / 1024:9.0f}{str(ok):>12}{os.getloadavg()[0]:7.2f}", flush=True)
    print(f"grader's peak RSS over the whole script (ru_maxrss): "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
