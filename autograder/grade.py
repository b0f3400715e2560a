"""Autograde a folder of submitted notebooks: in parallel, sandboxed, and one bad
file never stops the others.

Pipeline: intake (parse, repair, tamper scan) -> N workers, each with its own
copy of the gradebook, run ``nbgrader autograde`` and ``generate_feedback`` on
their share of the students in one process each -> submissions a worker could
not grade are retried alone, to name the cause -> worker gradebooks are merged
into the course gradebook -> grades.csv, LMS exports, plots and a summary.
"""
from __future__ import annotations

import csv
import json
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import GRADING_DIR, ROOT, SOURCE_DIR, sandbox, tamper
from .release import release, tool_env
from .repair import repair

DEFAULT_NOTEBOOK_TIMEOUT = 1800


@dataclass
class Result:
    student_id: str
    file: str
    score: float = 0.0
    max_score: float = 0.0
    status: str = "error"  # "graded", "error" or "flagged"
    message: str = ""
    tests: dict = field(default_factory=dict)  # grade_id -> (score, max_score)

    @property
    def percent(self) -> float:
        return 100.0 * self.score / self.max_score if self.max_score else 0.0

    def note(self, text: str) -> None:
        self.message = f"{self.message}; {text}" if self.message else text


@dataclass
class Report:
    assignment: str
    results: list[Result] = field(default_factory=list)
    csv_path: Path | None = None
    feedback_dir: Path | None = None
    out_dir: Path | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def table(self) -> str:
        """A fixed-width summary, one line per submission."""
        rows = [("student", "score", "status", "note")]
        for r in sorted(self.results, key=lambda r: r.student_id):
            rows.append((r.student_id, f"{r.score:g}/{r.max_score:g}", r.status, r.message))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in rows]
        lines.insert(1, "-" * (sum(widths) + 10))
        graded = [r for r in self.results if r.status == "graded"]
        lines.append(f"{len(self.results)} submissions: {len(graded)} graded, "
                     f"{len(self.results) - len(graded)} with errors (scored 0)")
        return "\n".join(w for w in self.warnings) + ("\n" if self.warnings else "") + \
            "\n".join(line.rstrip() for line in lines)


# ----------------------------------------------------------------------------- intake

def student_id_from_name(path: Path, assignment: str) -> str:
    """``s123_attention.ipynb`` -> ``s123``; ``Copy of s123-attention (1).ipynb`` -> ``s123``.

    Raises ValueError when nothing identifies a student."""
    stem = Path(path.name).stem
    stem = re.sub(r"^copy of\s+", "", stem, flags=re.I)
    stem = re.sub(r"\s*\(\d+\)$", "", stem)
    rest = re.sub(rf"[_\-\s]*{re.escape(assignment)}$", "", stem, flags=re.I)
    sid = re.sub(r"[^A-Za-z0-9_.-]", "_", rest).strip("._-")
    if not sid or sid.lower() == assignment.lower():
        raise ValueError(f"cannot tell the student from the file name {path.name!r}: "
                         f"rename it <student id>_{assignment}.ipynb")
    return sid


def read_submission(path: Path) -> nbformat.NotebookNode:
    """Parse a submitted file as a notebook or raise ValueError with a one-line reason."""
    if path.suffix.lower() != ".ipynb":
        raise ValueError(f"not a notebook: {path.name} (expected a .ipynb file)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"corrupt notebook: {path.name} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"corrupt notebook: {path.name} is not valid JSON (line {exc.lineno})") from None
    if not isinstance(raw, dict) or ("cells" not in raw and "worksheets" not in raw):
        raise ValueError(f"corrupt notebook: {path.name} has no cells")
    try:
        nb = nbformat.reads(json.dumps(raw), as_version=4)  # also upgrades v3 notebooks
    except Exception as exc:  # nbformat raises several types for malformed files
        raise ValueError(f"corrupt notebook: {path.name} ({type(exc).__name__})") from None
    if nb.nbformat_minor < 5:  # e.g. saved by Colab: give every cell the id nbformat 4.5 wants
        nb.nbformat_minor = 5
    seen = set()
    for i, cell in enumerate(nb.cells):
        cid = str(cell.get("id") or cell.metadata.get("id") or f"cell-{i}")
        cid = re.sub(r"[^A-Za-z0-9_-]", "-", cid)[:64]
        cell["id"] = cid if cid not in seen else f"cell-{i}"
        seen.add(cell["id"])
    return nb


# ----------------------------------------------------------------------------- nbgrader runs

def _nbgrader_args(gdir: Path) -> list[str]:
    return [f"--CourseDirectory.db_url=sqlite:///{gdir / 'gradebook.db'}",
            f"--CourseDirectory.submitted_directory={gdir / 'submitted'}",
            f"--CourseDirectory.autograded_directory={gdir / 'autograded'}",
            f"--CourseDirectory.feedback_directory={gdir / 'feedback'}"]


@dataclass
class Worker:
    gdir: Path
    students: list[str]
    log: str = ""
    timed_out: bool = False


def _run_worker(w: Worker, assignment: str, root: Path, extra: list[str], env: dict,
                timeout: float) -> Worker:
    """One process autogrades all of this worker's students, then writes their feedback."""
    if "--KernelManager.transport=ipc" in extra:
        # IPC socket paths must be absolute: nbgrader and the kernel run in different folders
        extra = [*extra, f"--KernelManager.ip={w.gdir / 'tmp' / 'kernel'}"]
    cmd = [sys.executable, "-m", "autograder.worker",  # autograde, --then generate_feedback
           assignment, "--force", *_nbgrader_args(w.gdir), *extra, "--then",
           assignment, "--force", *_nbgrader_args(w.gdir)]
    # feedback takes well under a second per notebook; the budget keeps a minute spare
    timeout += 60 + 5 * len(w.students)
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
        w.log += proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        w.timed_out = True
        w.log += str(exc.stdout or "") + str(exc.stderr or "")
    return w


def _worker_env(gdir: Path, threads: int) -> dict:
    env = tool_env()
    env["JUPYTER_PATH"] = str(gdir / "jupyter") + os.pathsep + env.get("JUPYTER_PATH", "")
    env["TMPDIR"] = str(gdir / "tmp")  # the kernel's connection file and IPC sockets live here
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONHASHSEED"] = "0"
    # Kernels read the instructor's model cache (read-only in the sandbox), filled beforehand
    # by _warm_caches; the sandbox's HOME is an empty folder, so say where it is.
    from coursekit.models import course_cache_dir

    env["COURSE_CACHE_DIR"] = str(course_cache_dir())
    return env


def _warm_caches(source_nb: Path) -> str | None:
    """Build the offline models that the assignment's notebook loads, once, before any
    student code runs. Inside the sandbox the course's model cache is read-only and the hub
    is out of reach, so without this every submission would convert the checkpoint or train
    the small GPT again by itself. Returns a warning line, or None."""
    text = source_nb.read_text(encoding="utf-8", errors="replace")
    try:
        if any(name in text for name in ("load_classifier", "load_tokenizer", "load_encoder", "load_masked_lm")):
            from coursekit.models import offline_distilbert_dir

            offline_distilbert_dir()
        if "load_or_train_small_gpt" in text:
            from coursekit.gpt import load_or_train_small_gpt

            load_or_train_small_gpt(verbose=False)
    except Exception as exc:  # grading goes on; each kernel then builds what it needs
        return f"WARNING: could not prepare the offline models before grading ({type(exc).__name__}: {exc})"
    return None


def _prepare_worker(gdir: Path, main_db: Path, hide: list[Path], use_bwrap: bool,
                    memory_mb: int, threads: int, gpu: bool = False) -> None:
    shutil.rmtree(gdir, ignore_errors=True)
    (gdir / "tmp").mkdir(parents=True)
    shutil.copy(main_db, gdir / "gradebook.db")
    sandbox.install_kernelspec(gdir / "jupyter", hide=hide, memory_mb=memory_mb,
                               use_bwrap=use_bwrap, threads=threads, gpu=gpu)


def _cause(log: str, timed_out: bool, limit: float) -> str:
    if timed_out:
        return f"the notebook ran longer than {limit:g} s and was stopped"
    low = log.lower()
    if "deadkernelerror" in low or "kernel died" in low or "kernel crashed" in low:
        return "the kernel crashed while running the notebook"
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln and "nbgrader" not in ln.lower():
            return "autograde failed: " + ln[:200]
    return "autograde failed: " + (lines[-1][:200] if lines else "unknown error")


# ----------------------------------------------------------------------------- gradebook merge

_MERGE = [
    ("student", "id IN ({sids})"),
    ("submitted_assignment", "student_id IN ({sids}) AND assignment_id = :aid"),
    ("submitted_notebook", "assignment_id IN (SELECT id FROM w.submitted_assignment "
                           "WHERE student_id IN ({sids}) AND assignment_id = :aid)"),
    ("grade", "notebook_id IN (SELECT sn.id FROM w.submitted_notebook sn JOIN w.submitted_assignment sa "
              "ON sn.assignment_id = sa.id WHERE sa.student_id IN ({sids}) AND sa.assignment_id = :aid)"),
    ("comment", "notebook_id IN (SELECT sn.id FROM w.submitted_notebook sn JOIN w.submitted_assignment sa "
                "ON sn.assignment_id = sa.id WHERE sa.student_id IN ({sids}) AND sa.assignment_id = :aid)"),
]


def merge_gradebook(main_db: Path, worker_db: Path, assignment: str, students: list[str]) -> None:
    """Copy ``students``' submissions of ``assignment`` from a worker's gradebook (a
    copy of the main one, so assignment and cell ids agree) into the main one,
    replacing earlier submissions of the same students."""
    if not students:
        return
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{main_db}") as gb:
        for sid in students:
            try:
                gb.remove_submission(assignment, sid)
            except MissingEntry:
                pass
    con = sqlite3.connect(main_db, timeout=60)
    try:
        con.execute("ATTACH DATABASE ? AS w", (str(worker_db),))
        aid = con.execute("SELECT id FROM assignment WHERE name = ?", (assignment,)).fetchone()[0]
        params = {f"s{i}": sid for i, sid in enumerate(students)}
        params["aid"] = aid
        names = ",".join(f":s{i}" for i in range(len(students)))
        with con:
            for table, where in _MERGE:
                verb = "INSERT OR IGNORE" if table == "student" else "INSERT"
                con.execute(f"{verb} INTO main.{table} SELECT * FROM w.{table} WHERE "
                            + where.format(sids=names), params)
        con.execute("DETACH DATABASE w")
    finally:
        con.close()


def _scores(db: Path, assignment: str, students: list[str]) -> dict:
    """student -> (score, max_score, {grade_id: (score, max_score)})."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    with Gradebook(f"sqlite:///{db}") as gb:
        for sid in students:
            try:
                sub = gb.find_submission(assignment, sid)
            except MissingEntry:
                continue
            tests = {}
            for nb in sub.notebooks:
                for g in nb.grades:
                    tests[g.name] = (float(g.score), float(g.max_score))
            out[sid] = (float(sub.score), float(sub.max_score), tests)
    return out


# ----------------------------------------------------------------------------- feedback

def _provenance(assignment: str, seconds: float, sandboxed: bool, sandbox_gpu: bool = False) -> str:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in ("nbgrader", "torch", "transformers", "nbformat"):
        try:  # read from the installed metadata: importing torch here would cost seconds
            versions[dist] = version(dist)
        except PackageNotFoundError:  # a missing package is simply not listed
            pass
    # the kernels pick their device themselves; the sandbox shows them the GPU only when
    # gpu_works_in_sandbox said CUDA works inside it
    device = "cuda" if Path("/dev/nvidia0").exists() and (sandbox_gpu or not sandboxed) else "cpu"
    parts = [f"assignment {assignment}", f"python {platform.python_version()}",
             *[f"{k} {v}" for k, v in versions.items()], f"device {device}", "seed 0",
             f"graded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"batch time {seconds:.0f} s", "sandbox " + ("bubblewrap" if sandboxed else "off")]
    return ("<footer style='margin:2em 0;color:#666;font-size:small' class='grading-provenance'>"
            "Graded by the course autograder: " + " &middot; ".join(parts) + "</footer>")


def _release_fingerprint(root: Path, assignment: str) -> str:
    """sha256 of what a release depends on: the source notebooks and the nbgrader configuration."""
    import hashlib

    h = hashlib.sha256()
    files = sorted((root / SOURCE_DIR / assignment).rglob("*")) + [root / "nbgrader_config.py",
                                                                  Path(__file__).with_name("config.py")]
    for f in files:
        if f.is_file():
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _write_simple_feedback(path: Path, student: str, assignment: str, message: str) -> None:
    from html import escape

    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(assignment)} "
                    f"feedback for {escape(student)}</title></head><body><h1>{escape(assignment)}: "
                    f"{escape(student)}</h1><p>This submission was not graded automatically: "
                    f"{escape(message)}</p><p>Score: 0</p></body></html>")


# ----------------------------------------------------------------------------- main entry

def grade(assignment: str, submissions: Path, out_dir: Path | None = None,
          grading_dir: Path | None = None, cell_timeout: int | None = None,
          notebook_timeout: int | None = None, workers: int | None = None,
          use_sandbox: str = "auto", memory_mb: int = sandbox.DEFAULT_MEMORY_MB,
          roster: Path | None = None, root: Path = ROOT) -> Report:
    """Autograde every file in ``submissions`` and write grades, feedback and plots.

    ``use_sandbox``: "auto" (bubblewrap when it works here, else a warning),
    "on" (refuse to grade without it) or "off"."""
    t0 = time.monotonic()
    submissions = Path(submissions)
    if submissions.is_file() and submissions.suffix.lower() == ".zip":
        from .lms import collect

        folder = (Path(grading_dir) if grading_dir else root / GRADING_DIR) / "collected" / assignment
        shutil.rmtree(folder, ignore_errors=True)
        collect(assignment, submissions, folder, roster)
        submissions = folder
    if not submissions.is_dir():
        raise SystemExit(f"no such folder of submissions: {submissions}")
    source_nbs = sorted((root / SOURCE_DIR / assignment).glob("*.ipynb"))
    if not source_nbs:
        raise SystemExit(f"unknown assignment {assignment!r}: no notebook in {SOURCE_DIR}/{assignment}/")
    nb_name = source_nbs[0].name
    grading = (Path(grading_dir) if grading_dir else root / GRADING_DIR).resolve()
    out_dir = (Path(out_dir) if out_dir else grading / "reports" / assignment).resolve()
    feedback_dir = out_dir / "feedback"
    feedback_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, workers or os.cpu_count() or 1)
    limit = float(notebook_timeout or DEFAULT_NOTEBOOK_TIMEOUT)
    report = Report(assignment, csv_path=out_dir / "grades.csv", feedback_dir=feedback_dir, out_dir=out_dir)

    use_bwrap = use_sandbox != "off" and sandbox.bwrap_works()
    if use_sandbox == "on" and not use_bwrap:
        raise SystemExit("the sandbox was required (--sandbox on) but bubblewrap does not work here; "
                         "install it with: apt-get install bubblewrap")
    if not use_bwrap:
        report.warnings.append(
            "WARNING: student code runs WITHOUT a sandbox (bubblewrap " +
            ("disabled" if use_sandbox == "off" else "not available: apt-get install bubblewrap") +
            "): it can read files and reach the network; only the memory limit applies.")
    gpu = use_bwrap and sandbox.gpu_works_in_sandbox(memory_mb)
    if use_bwrap and sandbox.gpu_nodes() and not gpu:
        report.warnings.append("NOTE: this machine has an NVIDIA GPU, but CUDA did not work inside the "
                               "sandbox: student code runs on the CPU (use --sandbox off to give it the GPU).")

    # Record the assignment (cells, points, hidden tests) in the gradebook, unless this grading
    # folder already holds the release of exactly these sources (a second batch of the class).
    stamp = grading / "release" / f".{assignment}.sources"
    sources = _release_fingerprint(root, assignment)
    if not (stamp.exists() and stamp.read_text() == sources and (grading / "gradebook.db").exists()
            and (grading / "release" / assignment / nb_name).exists()):
        release([assignment], out_dir=grading / "release", grading_dir=grading, root=root,
                checks_dir=grading / "release" / ".checks")
        stamp.write_text(sources)
    released = nbformat.read(grading / "release" / assignment / nb_name, as_version=4)
    main_db = grading / "gradebook.db"
    max_points = float(sum(c.metadata["nbgrader"].get("points", 0) for c in released.cells
                           if c.metadata.get("nbgrader", {}).get("grade")))

    # ---- intake
    queue: dict[str, tuple[Result, nbformat.NotebookNode]] = {}
    seen: dict[str, str] = {}
    for path in sorted(p for p in submissions.iterdir() if p.is_file() and not p.name.startswith(".")):
        result = Result("?", path.name, max_score=max_points)
        report.results.append(result)
        try:
            result.student_id = sid = student_id_from_name(path, assignment)
        except ValueError as exc:
            result.student_id = f"? ({path.name})"
            result.message = str(exc)
            continue
        if sid in seen:
            result.student_id = f"{sid} (duplicate)"
            result.message = f"second file for student {sid} ({seen[sid]} was graded)"
            continue
        seen[sid] = path.name
        try:
            nb = read_submission(path)
        except ValueError as exc:
            result.message = str(exc)
            _write_simple_feedback(feedback_dir / f"{sid}.html", sid, assignment, result.message)
            continue
        notes = repair(nb, released)
        if notes:
            result.note("repaired before grading: " + "; ".join(notes))
        findings = tamper.scan(nb, released)
        if findings:
            result.status = "flagged"
            result.message = "tampering, scored 0 (check by hand): " + "; ".join(findings)
            _write_simple_feedback(feedback_dir / f"{sid}.html", sid, assignment, result.message)
            continue
        queue[sid] = (result, nb)

    if queue:
        warning = _warm_caches(source_nbs[0])
        if warning:
            report.warnings.append(warning)

    # ---- parallel autograde, one nbgrader process per worker
    hide = [root / SOURCE_DIR, root / ".git", grading, submissions.resolve(), out_dir]
    threads = max(1, (os.cpu_count() or 1) // workers)
    # Kill each kernel once its notebook has run instead of asking it to shut down: every
    # output is already recorded by then, and a graceful shutdown waits about a second per
    # submission for the kernel (torch loaded) to wind down.  SIGKILL goes to the kernel's
    # process group, which takes the whole sandbox with it.
    extra = ["--Execute.kernel_name=" + sandbox.KERNEL_NAME, "--Execute.shutdown_kernel=immediate"]
    if use_bwrap:
        extra.append("--KernelManager.transport=ipc")  # no network inside the sandbox, not even loopback
    if cell_timeout:
        extra.append(f"--Execute.timeout={cell_timeout}")
    sids = sorted(queue)
    shares = [sids[i::workers] for i in range(workers) if sids[i::workers]]
    pool = []
    for k, share in enumerate(shares):
        gdir = grading / "workers" / f"w{k}"
        _prepare_worker(gdir, main_db, hide, use_bwrap, memory_mb, threads, gpu)
        for sid in share:
            target = gdir / "submitted" / sid / assignment
            target.mkdir(parents=True)
            nbformat.write(queue[sid][1], target / nb_name)
        pool.append(Worker(gdir, share))

    def run_all(ws: list[Worker], budget) -> list[Worker]:
        with ThreadPoolExecutor(max_workers=max(1, len(ws))) as ex:
            futs = [ex.submit(_run_worker, w, assignment, root, extra, _worker_env(w.gdir, threads),
                              budget(w)) for w in ws]
            return [f.result() for f in futs]

    done = run_all(pool, lambda w: limit * len(w.students))
    retry = []
    for w in done:
        got = _scores(w.gdir / "gradebook.db", assignment, w.students)
        ok = [s for s in w.students if s in got and (w.gdir / "autograded" / s / assignment / nb_name).exists()]
        merge_gradebook(main_db, w.gdir / "gradebook.db", assignment, ok)
        _collect(w.gdir, grading, assignment, ok, feedback_dir, nb_name)
        for s in w.students:
            if s not in ok:
                retry.append(s)
    # ---- anything a batch could not grade is retried alone, to tell its cause
    singles = []
    for k, sid in enumerate(retry):
        gdir = grading / "workers" / f"retry{k}"
        _prepare_worker(gdir, main_db, hide, use_bwrap, memory_mb, threads, gpu)
        target = gdir / "submitted" / sid / assignment
        target.mkdir(parents=True)
        nbformat.write(queue[sid][1], target / nb_name)
        singles.append(Worker(gdir, [sid]))
    for w in run_all(singles, lambda w: limit) if singles else []:
        sid = w.students[0]
        got = _scores(w.gdir / "gradebook.db", assignment, [sid])
        if sid in got and (w.gdir / "autograded" / sid / assignment / nb_name).exists():
            merge_gradebook(main_db, w.gdir / "gradebook.db", assignment, [sid])
            _collect(w.gdir, grading, assignment, [sid], feedback_dir, nb_name)
        else:
            queue[sid][0].note(_cause(w.log, w.timed_out, limit))
            _write_simple_feedback(feedback_dir / f"{sid}.html", sid, assignment, queue[sid][0].message)

    # ---- scores from the merged gradebook
    final = _scores(main_db, assignment, sids)
    for sid, (result, _) in queue.items():
        if sid in final:
            result.score, result.max_score, result.tests = final[sid]
            result.status = "graded"
            auto = grading / "autograded" / sid / assignment / nb_name
            if auto.exists() and "CellTimeoutError" in auto.read_text(errors="replace"):
                result.note("a cell hit the time limit and was stopped")
    report.seconds = time.monotonic() - t0
    footer = _provenance(assignment, report.seconds, use_bwrap, gpu)
    for page in feedback_dir.glob("*.html"):
        text = page.read_text(errors="replace")
        if "grading-provenance" not in text:
            page.write_text(text.replace("</body>", footer + "\n</body>", 1) if "</body>" in text else text + footer)
    if not os.environ.get("COURSE_KEEP_WORKERS"):  # keep them to debug a grading run
        shutil.rmtree(grading / "workers", ignore_errors=True)

    lms_ids = submissions / ".lms_ids.csv"  # written by `collect`
    if lms_ids.exists():
        shutil.copy(lms_ids, out_dir / "lms_ids.csv")
        with open(lms_ids, newline="") as fh:
            late = {row["student_id"] for row in csv.DictReader(fh) if row.get("late")}
        for r in report.results:
            if r.student_id in late:
                r.note("submitted LATE")

    from .reports import write_reports

    write_reports(report, max_points, released)
    return report


def _collect(gdir: Path, grading: Path, assignment: str, students: list[str], feedback_dir: Path,
             nb_name: str) -> None:
    """Move a worker's autograded notebooks and feedback into the course's folders."""
    for sid in students:
        for step in ("submitted", "autograded", "feedback"):
            src = gdir / step / sid / assignment
            if src.exists():
                dst = grading / step / sid / assignment
                shutil.rmtree(dst, ignore_errors=True)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(src), str(dst))
        html = grading / "feedback" / sid / assignment / nb_name.replace(".ipynb", ".html")
        if html.exists():
            shutil.copy(html, feedback_dir / f"{sid}.html")
