"""Grade N generated submissions of `attention` twice, in one run, and print the figures.

1. plain sequential nbgrader: every submission in ``submitted/``, one
   ``nbgrader autograde attention`` call with nbgrader's own preprocessors (the tests
   run inside the student's kernel; no sandbox, no feedback);
2. ``autograder.pipeline.run.grade(..., workers=W)``: intake, repair, scan, sandbox self-test,
   W parallel workers (sandboxed kernels, tests judged in the grader), feedback, merged
   gradebook and reports.

Prints seconds per submission for each, the speed-up, and whether the scores
agree.  Targets with --workers 2 on the 2-core machine: >= 2x (issue "Grades you can
trust"), >= 3x (issue "Grading beyond one machine").
``--cluster`` also grades them on a local Dask scheduler with ``--workers`` worker
processes of one thread each (started before the clock, as an instructor's cluster would
be running already, with the course's Dask settings ``autograder/backends/dask-grading.yaml``, or
Dask's defaults with ``--dask-defaults``); target: within 10 % of ``--workers`` (issue
"Grading beyond one machine").
Also prints the floor (``grading_profile.floor``: the same submissions' cells and every test
cell, visible and hidden, run in one warm process, no kernel, no sandbox, no nbgrader) and each
run's ratio to it, and where one submission's time goes (``grading_profile.breakdown``: a
``grade`` of ``--stages`` submissions, every stage timed, the judge profiled in-process).
``--breakdown`` also grades the same submissions with ``--workers 1``, to tell the
gain of running in parallel from the gain per submission (one process per worker
for autograde and feedback, kernels killed once their notebook has run, cheaper
feedback pages).

    python benchmarks/autograde.py --n 40 --workers 2 [--cluster [--dask-defaults]] [--breakdown] [--stages 8]
"""
from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from autograder.pipeline.run import grade  # noqa: E402
from autograder.authoring.release import release  # noqa: E402
from autograder.records.gradebook import scores  # noqa: E402
from conftest import read_nb, set_solution  # noqa: E402
from grading_profile import breakdown, floor, print_breakdown  # noqa: E402

WRONG = {
    "calculate_multihead_attention": "hs = q.size(-1)\nscores = q @ k.transpose(-2, -1) / math.sqrt(hs)\n"
                                     "weights = torch.softmax(scores, dim=-2)\nreturn weights @ v, weights",
    "positional_encoding": "position = torch.arange(max_len)[:, None]\n"
                           "self.register_buffer('pe', torch.sin(position * torch.ones(d_model)))",
}


def make_submissions(folder: Path, n: int, seed: int = 0) -> None:
    """A mix: 50% correct, 30% one wrong function, 10% untouched, 10% broken (raises)."""
    rng = random.Random(seed)
    source = ROOT / "solutions" / "attention" / "attention.ipynb"
    exercise = ROOT / "exercises" / "attention" / "attention.ipynb"
    for i in range(n):
        kind = rng.choices(["ok", "wrong", "blank", "broken"], [5, 3, 1, 1])[0]
        if kind == "ok":
            nb = read_nb(source)
        elif kind == "wrong":
            gid = rng.choice(sorted(WRONG))
            nb = set_solution(read_nb(source), gid, WRONG[gid])
        elif kind == "blank":
            nb = read_nb(exercise)
        else:
            nb = set_solution(read_nb(source), "get_multihead_qkv", "raise RuntimeError('boom')")
        nbformat.write(nb, folder / f"s{i:03d}_attention.ipynb")


def sequential_nbgrader(subs: Path, work: Path) -> tuple[float, dict]:
    grading = work / "seq"
    release(["attention"], out_dir=grading / "release", grading_dir=grading,
            checks_dir=grading / "release" / ".checks")
    for f in sorted(subs.glob("*.ipynb")):
        sid = f.name.split("_")[0]
        d = grading / "submitted" / sid / "attention"
        d.mkdir(parents=True)
        shutil.copy(f, d / "attention.ipynb")
    # nbgrader's own pipeline: the tests run inside the student's kernel (no sandbox, no feedback)
    stock = ["nbgrader.preprocessors.Execute", "nbgrader.preprocessors.IgnorePattern",
             "nbconvert.preprocessors.ClearMetadataPreprocessor", "nbgrader.preprocessors.LimitOutput",
             "nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.AssignLatePenalties",
             "nbgrader.preprocessors.CheckCellMetadata"]
    cmd = [sys.executable, "-m", "nbgrader", "autograde", "attention", "--force",
           f"--CourseDirectory.db_url=sqlite:///{grading / 'gradebook.db'}",
           f"--CourseDirectory.submitted_directory={grading / 'submitted'}",
           f"--CourseDirectory.autograded_directory={grading / 'autograded'}",
           *[f"--Autograde.autograde_preprocessors={p}" for p in stock]]
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    students = sorted(p.name for p in (grading / "submitted").iterdir())
    return seconds, {s: v[0] for s, v in scores(grading / "gradebook.db", "attention", students).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--breakdown", action="store_true", help="also grade with --workers 1")
    ap.add_argument("--cluster", action="store_true", help="also grade on a local Dask cluster with --workers workers")
    ap.add_argument("--dask-defaults", action="store_true",
                    help="start that cluster with Dask's default settings, not autograder/backends/dask-grading.yaml")
    ap.add_argument("--stages", type=int, default=8,
                    help="submissions in the profiled stage breakdown (0: no breakdown)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        tmp = Path(tmp)
        subs = tmp / "subs"
        subs.mkdir()
        make_submissions(subs, args.n)
        t_seq, seq = sequential_nbgrader(subs, tmp)
        # the same starting point as the sequential run: the assignment is already released
        # into the gradebook (the first batch of a class pays for that once, a few seconds)
        (tmp / "empty").mkdir()
        grade("attention", tmp / "empty", out_dir=tmp / "out0", grading_dir=tmp / "ours", workers=1,
              use_sandbox=args.sandbox)  # no submissions: only records the release in the gradebook
        runs = {}
        for workers in [args.workers] + ([1] if args.breakdown and args.workers != 1 else []):
            t = time.perf_counter()
            report = grade("attention", subs, out_dir=tmp / f"out{workers}", grading_dir=tmp / "ours",
                           workers=workers, use_sandbox=args.sandbox)
            scores = {r.student_id: r.score for r in report.results if r.status == "graded"}
            runs[f"autograder grade --workers {workers} (+feedback)"] = (time.perf_counter() - t, scores)
        if args.cluster:
            import dask
            from distributed import LocalCluster

            from autograder.backends.cluster import grading_dask_config

            settings = {} if args.dask_defaults else grading_dask_config()
            with dask.config.set(settings), LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                                         processes=True, dashboard_address=None,
                                                         silence_logs=40) as cluster:
                t = time.perf_counter()
                report = grade("attention", subs, out_dir=tmp / "outc", grading_dir=tmp / "ours",
                               use_sandbox=args.sandbox, cluster=cluster.scheduler_address)
                scores = {r.student_id: r.score for r in report.results if r.status == "graded"}
                label = "Dask defaults" if args.dask_defaults else "dask-grading.yaml"
                runs[f"grade --cluster ({args.workers} workers, {label})"] = (time.perf_counter() - t, scores)
        floor_s, _ = floor(sorted(subs.glob("*.ipynb")))
        rows = breakdown(subs, tmp, args.stages, args.sandbox) if args.stages > 0 else []
        print(f"{'run':<48}{'total s':>9}{'s/submission':>14}{'speed-up':>10}{'x floor':>9}  identical scores")
        print(f"{'floor: cells + tests, one warm process, 1 core':<48}{floor_s * args.n:9.1f}{floor_s:14.3f}"
              f"{t_seq / (floor_s * args.n):9.2f}x{1:9.2f}")
        print(f"{'sequential nbgrader autograde':<48}{t_seq:9.1f}{t_seq / args.n:14.2f}{1:9.2f}x"
              f"{t_seq / args.n / floor_s:9.2f}")
        for label, (seconds, ours) in runs.items():
            same = all(abs(seq.get(s, 0.0) - ours.get(s, 0.0)) < 1e-9 for s in set(seq) | set(ours))
            print(f"{label:<48}{seconds:9.1f}{seconds / args.n:14.2f}{t_seq / seconds:9.2f}x"
                  f"{seconds / args.n / floor_s:9.2f}  {same}")
        main_run = runs[f"autograder grade --workers {args.workers} (+feedback)"][0]
        print(f"speed-up with --workers {args.workers}: {t_seq / main_run:.2f}x (targets: >= 2x, issue 16: >= 3x); "
              f"submissions: {args.n}; sandbox: {'on' if 'WITHOUT' not in report.table() else 'off'}")
        cluster_runs = [v[0] for k, v in runs.items() if "--cluster" in k]
        if cluster_runs:
            print(f"--cluster vs --workers {args.workers}: {cluster_runs[0] / main_run - 1:+.1%} time (target: within 10%)")
        if rows:
            print(f"\nwhere one submission's time goes ({args.stages} submissions after a warm-up one):")
            print_breakdown(rows, floor_s)


if __name__ == "__main__":
    main()
