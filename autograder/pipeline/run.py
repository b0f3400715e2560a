"""Grade a class: a sequence of stages, each handing a typed result to the next.

    collect   (an LMS zip -> a folder of <student>_<assignment>.ipynb, intake problems)
    release   (the assignment's cells, points and hidden tests in the gradebook)
    intake    (each file read, rebuilt, repaired and scanned -> Submission)
    sandbox   (bubblewrap works and runs Python; the GPU inside it, when there is one)
    models    (the offline models the assignment loads, built once)
    execute and judge (workers: student cells in sandboxed kernels, tests judged outside)
    scores    (from the gradebook -> Result)
    feedback  (pages for every student, with provenance)
    export    (grades.csv, LMS files, plots)

Each per-submission step runs under its own error boundary: a file that breaks one
gives that student a row with the cause, and the class goes on.
"""
from __future__ import annotations

import csv
import hashlib
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder import GRADING_DIR, ROOT, SOURCE_DIR
from autograder.isolation import sandbox
from . import tamper
from autograder.records import gradebook
from autograder.records.classbook import record_intake, save_roster
from autograder.course.model import CourseFileError, UnknownAssignment, load as load_course
from .intake import IntakeError, Submission, read_submission, student_id_from_name
from autograder.authoring.release import release
from .repair import repair
from .records import Report, Result
from autograder.course.settings import GradingSettings
from autograder.backends.local import execute_and_judge

__all__ = ["grade", "GradingError", "student_id_from_name", "Report", "Result"]


class GradingError(RuntimeError):
    """The run cannot grade anyone (unknown assignment, broken sandbox, ...); nothing was written."""


@dataclass
class Release:
    """The assignment as released into the grading folder's gradebook."""

    assignment: str
    notebook: str
    nb: nbformat.NotebookNode
    max_points: float


# ----------------------------------------------------------------------------- stages

def prepare_release(assignment: str, grading: Path, root: Path) -> Release:
    """Record the assignment in the gradebook, unless this grading folder already holds the
    release of exactly these sources (a second batch of the same class)."""
    source_nbs = sorted((root / SOURCE_DIR / assignment).glob("*.ipynb"))
    nb_name = source_nbs[0].name
    stamp = grading / "release" / f".{assignment}.sources"
    sources = _release_fingerprint(root, assignment)
    if not (stamp.exists() and stamp.read_text() == sources
            and gradebook.has_assignment(gradebook.db_url(grading), assignment)
            and (grading / "release" / assignment / nb_name).exists()):
        release([assignment], out_dir=grading / "release", grading_dir=grading, root=root,
                checks_dir=grading / "release" / ".checks")
        stamp.write_text(sources)
    released = nbformat.read(grading / "release" / assignment / nb_name, as_version=4)
    max_points = float(sum(c.metadata["nbgrader"].get("points", 0) for c in released.cells
                           if c.metadata.get("nbgrader", {}).get("grade")))
    return Release(assignment, nb_name, released, max_points)


def intake(folder: Path, rel: Release, late: set[str] | None = None) -> list[Submission]:
    """Read every file of ``folder`` into a Submission (an error for the ones that cannot be graded)."""
    subs: list[Submission] = []
    seen: dict[str, str] = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        try:
            sid = student_id_from_name(path, rel.assignment)
        except ValueError as exc:
            subs.append(Submission(f"? ({path.name})", path.name, error=str(exc)))
            continue
        if sid in seen:
            subs.append(Submission(f"{sid} (duplicate)", path.name,
                                   error=f"second file for student {sid} ({seen[sid]} was graded)"))
            continue
        seen[sid] = path.name
        sub = Submission(sid, path.name, late=sid in (late or set()))
        subs.append(sub)
        try:
            nb, notes = read_submission(path)
            notes += repair(nb, rel.nb)
            sub.nb, sub.notes = nb, notes
            sub.flags = tamper.scan(nb, rel.nb)
        except IntakeError as exc:
            sub.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - one file never stops the class
            sub.error = f"could not read {path.name}: {type(exc).__name__}: {exc}"[:300]
    return subs


@dataclass
class SandboxInfo:
    bwrap: bool
    gpu: bool
    device: str


# what an unsandboxed kernel can do, said in every such warning (here and in cluster.check_workers)
UNSANDBOXED = "it can read files and reach the network; only the resource limits apply."


def check_sandbox(settings: GradingSettings) -> tuple[SandboxInfo, list[str]]:
    """Decide how kernels run and prove Python runs that way, before any student code."""
    warnings = []
    use_bwrap = settings.sandbox != "off" and sandbox.bwrap_works()
    if settings.sandbox == "on" and not use_bwrap:
        raise GradingError("the sandbox was required (--sandbox on) but bubblewrap does not work here; "
                           "install it with: apt-get install bubblewrap")
    if not use_bwrap:
        warnings.append(
            "WARNING: student code runs WITHOUT a sandbox (bubblewrap " +
            ("disabled" if settings.sandbox == "off" else "not available: apt-get install bubblewrap") +
            "): " + UNSANDBOXED)
    try:
        seen = sandbox.probe(settings.memory_mb, use_bwrap=use_bwrap)
    except Exception as exc:  # noqa: BLE001 - any failure of the self-test stops the run
        raise GradingError(f"the grading sandbox cannot run Python ({exc}); no submission was graded. "
                           "Check `python -m autograder.isolation.sandbox --probe` or grade with --sandbox off") from None
    if not seen.get("torch"):
        raise GradingError("the grading sandbox cannot import torch; no submission was graded")
    gpu = use_bwrap and sandbox.gpu_works_in_sandbox(settings.memory_mb)
    if use_bwrap and sandbox.gpu_nodes() and not gpu:
        warnings.append("NOTE: this machine has an NVIDIA GPU, but CUDA did not work inside the "
                        "sandbox: student code runs on the CPU (use --sandbox off to give it the GPU).")
    device = "cuda" if gpu else "cpu"
    if not use_bwrap and sandbox.gpu_nodes():
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return SandboxInfo(use_bwrap, gpu or device == "cuda", device), warnings


def warm_models(models, env: dict) -> str | None:
    """Build the offline models the assignment loads, once, before any student code runs:
    inside the sandbox the model cache is read-only and the hub out of reach.  Returns a
    warning line, or None."""
    from autograder.course.settings import environ

    try:
        with environ(env):
            if "distilbert" in models:
                from coursekit.models import offline_distilbert_dir

                offline_distilbert_dir()
            if "small_gpt" in models:
                from coursekit.gpt import load_or_train_small_gpt

                load_or_train_small_gpt(verbose=False)
    except Exception as exc:  # noqa: BLE001 - grading goes on; each kernel then builds what it needs
        return f"WARNING: could not prepare the offline models before grading ({type(exc).__name__}: {exc})"
    return None


def collect_scores(results: dict[str, Result], url: str, assignment: str) -> None:
    from autograder.backends.local import scores

    final = scores(url, assignment, list(results))
    for sid, result in results.items():
        if sid in final:
            result.score, result.max_score, result.tests = final[sid]
            result.status = "graded"


def feedback_pages(report: Report, subs: list[Submission], info: SandboxInfo) -> None:
    """A page for every named submission (a short one for those that could not be graded),
    each with the provenance footer."""
    by_id = report.by_student()
    for sub in subs:
        r = by_id.get(sub.student_id)
        page = report.feedback_dir / f"{sub.student_id}.html"
        if r is not None and r.status != "graded" and not sub.student_id.startswith("?") \
                and "(duplicate)" not in sub.student_id:
            _write_simple_feedback(page, sub.student_id, report.assignment, r.message)
    footer = _provenance(report.assignment, report.seconds, info)
    for page in report.feedback_dir.glob("*.html"):
        text = page.read_text(errors="replace")
        if "grading-provenance" not in text:
            page.write_text(text.replace("</body>", footer + "\n</body>", 1) if "</body>" in text else text + footer)


# ----------------------------------------------------------------------------- the run

def grade(assignment: str, submissions: Path, out_dir: Path | None = None,
          grading_dir: Path | None = None, cell_timeout: int | None = None,
          notebook_timeout: int | None = None, workers: int | None = None,
          use_sandbox: str = "auto", memory_mb: int | None = None,
          roster: Path | None = None, root: Path = ROOT, settings: GradingSettings | None = None,
          cluster: str | None = None, db_url: str | None = None) -> Report:
    """Autograde every file in ``submissions`` (a folder, or a Canvas/Moodle zip) and write
    grades, feedback and plots.  Raises GradingError when nobody can be graded."""
    t0 = time.monotonic()
    try:
        course = load_course(root)
        spec = course.assignment(assignment)
    except (CourseFileError, UnknownAssignment) as exc:
        raise GradingError(str(exc)) from None
    settings = settings or GradingSettings.for_assignment(
        spec, cell_timeout=cell_timeout, notebook_timeout=notebook_timeout, workers=workers,
        sandbox=use_sandbox, memory_mb=memory_mb, cluster=cluster)
    grading = (Path(grading_dir) if grading_dir else root / GRADING_DIR).resolve()
    try:
        gradebook.check_reachable(db_url or gradebook.db_url(grading))
    except gradebook.GradebookUnreachable as exc:
        raise GradingError(str(exc)) from None
    gradebook.use_db_url(grading, db_url)
    out_dir = (Path(out_dir) if out_dir else grading / "reports" / assignment).resolve()
    feedback_dir = out_dir / "feedback"
    report = Report(assignment, csv_path=out_dir / "grades.csv", feedback_dir=feedback_dir, out_dir=out_dir)

    submissions = Path(submissions)
    if submissions.is_file() and submissions.suffix.lower() == ".zip":
        from .collect import collect

        folder = grading / "collected" / assignment
        shutil.rmtree(folder, ignore_errors=True)
        collect(assignment, submissions, folder, roster)
        submissions = folder
    if not submissions.is_dir():
        raise GradingError(f"no such folder of submissions: {submissions}")

    if settings.cluster:  # checked where the kernels will run: on every Dask worker
        from autograder.backends.cluster import check_workers

        info, warnings = check_workers(settings, list(spec.models))
    else:
        info, warnings = check_sandbox(settings)
    report.warnings += warnings
    feedback_dir.mkdir(parents=True, exist_ok=True)
    rel = prepare_release(assignment, grading, root)
    save_roster(grading, roster)

    # ---- intake: every file, and every problem collect met, gets a row
    from .collect import read_report

    collected = read_report(submissions)
    late = {e.student_id for e in collected if e.late and e.target} | _late_students(submissions)
    subs = intake(submissions, rel, late)
    results = {}
    for sub in subs:
        r = Result(sub.student_id, sub.file, max_score=rel.max_points, flags=list(sub.flags), late=sub.late)
        if sub.error:
            r.message = sub.error
        elif sub.notes:
            r.note("repaired before grading: " + "; ".join(sub.notes))
        results[sub.student_id] = r
        report.results.append(r)
    for e in collected:
        if e.target:
            continue
        key = e.student_id or f"? ({Path(e.source).name})"
        if key in results:  # a duplicate beside a file that was graded: a note on that row
            results[key].note(f"{Path(e.source).name}: {e.status}")
            continue
        r = Result(key, Path(e.source).name, max_score=rel.max_points, message=e.status, late=e.late)
        results[key] = r
        report.results.append(r)

    queue = {s.student_id: s.nb for s in subs if s.nb is not None and not s.error}
    if queue:
        warning = None if settings.cluster else warm_models(spec.models, settings.env)
        if warning:
            report.warnings.append(warning)
        outcomes = execute_and_judge(assignment, queue, rel.notebook, grading, feedback_dir, root, settings,
                                     info.bwrap, info.gpu)
        for sid, outcome in outcomes.items():
            for note in outcome.notes:
                results[sid].note(note)
            if not outcome.graded:
                results[sid].note(outcome.cause)
        failed = sorted(sid for sid, outcome in outcomes.items() if not outcome.graded)
        gradebook.forget(gradebook.db_url(grading), assignment, failed)  # no stale grade for a new file
        for sid in failed:
            for step in ("autograded", "feedback"):
                shutil.rmtree(grading / step / sid / assignment, ignore_errors=True)
        collect_scores({sid: results[sid] for sid in queue}, gradebook.db_url(grading), assignment)
    for r in report.results:
        if r.late:
            r.note("submitted LATE")
    record_intake(grading, assignment, [_intake_row(r, submissions) for r in report.results])

    report.seconds = time.monotonic() - t0
    feedback_pages(report, subs, info)
    lms_ids = submissions / ".lms_ids.csv"  # written by `collect`
    if lms_ids.exists():
        shutil.copy(lms_ids, out_dir / "lms_ids.csv")

    # ---- export: grades.csv, the LMS files and the plots, for the whole class
    from autograder.records.export import export

    result = export(assignment, grading, out_dir, rel.nb, spec.lms_column, spec.canvas_id)
    rows = {row.student_id: row for row in result.rows}
    for r in report.results:
        row = rows.get(r.student_id)
        if row is not None and r.status == "graded":
            r.pending = row.pending
            if row.pending:  # e.g. "auto 22/22, 8 points await hand grading"
                r.note(row.summary(result.auto_max))
    return report


# ----------------------------------------------------------------------------- helpers

def _intake_row(r: Result, folder: Path) -> dict:
    """What the class record keeps of one file of this batch."""
    lms = {}
    path = folder / ".lms_ids.csv"
    if path.exists():
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("student_id") == r.student_id:
                    lms = {k: row.get(k, "") for k in ("lms_id", "name", "email", "login", "section")}
    named = not r.student_id.startswith("?") and "(duplicate)" not in r.student_id
    return {"key": r.student_id if named else f"file:{r.file}", "student_id": r.student_id if named else "",
            "file": r.file, "reason": "" if r.status == "graded" else r.message, "late": r.late,
            "notes": r.message if r.status == "graded" else "", "lms": lms}


def _late_students(folder: Path) -> set[str]:
    path = folder / ".lms_ids.csv"
    if not path.exists():
        return set()
    with open(path, newline="") as fh:
        return {row["student_id"] for row in csv.DictReader(fh) if row.get("late")}


def _release_fingerprint(root: Path, assignment: str) -> str:
    """sha256 of what a release depends on: the source notebooks and the nbgrader configuration."""
    h = hashlib.sha256()
    files = sorted((root / SOURCE_DIR / assignment).rglob("*")) + [root / "nbgrader_config.py",
                                                                  Path(__file__).parents[1] / "judge" / "nbconfig.py"]
    for f in files:
        if f.is_file():
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _provenance(assignment: str, seconds: float, info: SandboxInfo) -> str:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in ("nbgrader", "torch", "transformers", "nbformat"):
        try:  # read from the installed metadata: importing torch here would cost seconds
            versions[dist] = version(dist)
        except PackageNotFoundError:
            pass
    parts = [f"assignment {assignment}", f"python {platform.python_version()}",
             *[f"{k} {v}" for k, v in versions.items()], f"device {info.device}", "seed 0",
             f"graded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"batch time {seconds:.0f} s", "sandbox " + ("bubblewrap" if info.bwrap else "off"),
             "tests judged outside the student's kernel"]
    return ("<footer style='margin:2em 0;color:#666;font-size:small' class='grading-provenance'>"
            "Graded by the course autograder: " + " &middot; ".join(parts) + "</footer>")


def _write_simple_feedback(path: Path, student: str, assignment: str, message: str) -> None:
    from html import escape

    from autograder.text.htmlsafe import CSP_META

    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'>{CSP_META}<title>{escape(assignment)} "
                    f"feedback for {escape(student)}</title></head><body><h1>{escape(assignment)}: "
                    f"{escape(student)}</h1><p>This submission was not graded automatically: "
                    f"{escape(message)}</p><p>Score: 0</p></body></html>")
