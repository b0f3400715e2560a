"""One grading process: nbgrader's autograde and then its feedback, for the students of one
worker folder (a ``Job``), in one Python process.

    python -m autograder.judge.worker FOLDER/job.json

A backend (``autograder.backends``) prepares the folder (``Job.prepare``: a gradebook holding
the release, the submitted notebooks, the course's kernelspec) and runs the job, in a process
of its own (local workers) or in the process of a Dask worker.  Everything the job needs comes
with it, in ``job.json``: the run's ``GradingSettings``, serialised whole; nothing is read from
course.yml, the command line or the environment of the process that starts it.  Two
``python -m nbgrader`` commands would pay nbgrader's start-up (imports and configuration, a few
seconds) twice per worker.

Per student the job leaves one record (``Outcome``): graded or not, with the judge's notes, the
cause when not, and where its gradebook rows, graded notebook and feedback page are.  A student
counts as graded only when the grader recorded that its notebooks were judged, scored, written
and given their feedback page (``record_outcomes``): rows nbgrader creates up front prove
nothing, since a worker killed half way leaves them behind.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

from coursekit.models import course_cache_dir

from autograder import ROOT
from autograder.course.paths import GradingPaths, nbgrader_env
from autograder.course.settings import GradingSettings, environ
from autograder.isolation import sandbox
from autograder.isolation.sandbox import die_with_parent
from autograder.isolation.scratch import ENV, process_folder, remove_tree

from .status import read_status, record_status

# Imports inside functions: nbgrader, jsonschema, SQLAlchemy and torch are imported by the functions that
# grade: a backend imports this module for Job and Outcome without them; serve() imports them (and the
# runner) ahead of the first job, on purpose.

# (importing the package, autograder/__init__.py, keeps jsonschema from building its IRI
# grammar: 1.5 s of CPU per worker process)
JOB_FILE = "job.json"


def validate_metadata_once() -> None:
    """nbgrader checks the metadata of every cell of every notebook it reads with
    ``jsonschema.validate(metadata, schema)``, which first checks the *schema* against
    JSON Schema's meta-schema, each time (about 2.5 ms a cell, 0.15 s a submission).  Same
    check, with each schema checked once and its validator kept."""
    import jsonschema
    from nbgrader.nbgraderformat import common

    validators: dict = {}

    def validate(instance, schema):
        key = json.dumps(schema, sort_keys=True)
        if key not in validators:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            validators[key] = cls(schema)
        error = jsonschema.exceptions.best_match(validators[key].iter_errors(instance))
        if error is not None:
            raise error

    common.jsonschema = types.SimpleNamespace(validate=validate)


def scratch_gradebook_engines() -> None:
    """nbgrader opens its gradebook (``nbgrader.api.Gradebook``) about ten times a submission,
    each time with a new SQLAlchemy engine (every statement compiled again), the tables checked
    again, and every commit of a SQLite file synced to disk.  A job's gradebook is a scratch copy
    (a SQLite file beside its job file; the class record is written by the pipeline's commit, in a transaction of its own; a run
    that dies before it is discarded whole): here one engine per database serves them all, the
    tables are checked once, and a SQLite copy is written without syncing each commit."""
    import sqlalchemy
    from nbgrader import api

    if getattr(api.create_engine, "course_cached", False):
        return
    engines: dict = {}

    def create_engine(url, **kwargs):
        text = str(url)
        if not (text.startswith("sqlite:///") and (Path(text[len("sqlite:///"):]).parent / JOB_FILE).is_file()):
            return sqlalchemy.create_engine(url, **kwargs)  # not a job's scratch copy: as nbgrader does
        key = json.dumps([text, sorted(kwargs.items())], default=str)
        if key not in engines:
            for old in engines.values():  # the previous job's: one at a time
                old.dispose()
            engines.clear()
            engine = sqlalchemy.create_engine(url, **kwargs)

            @sqlalchemy.event.listens_for(engine, "connect")
            def _no_sync(connection, _record):
                connection.execute("PRAGMA synchronous=OFF")
            engines[key] = engine
        return engines[key]

    create_engine.course_cached = True
    checked: set = set()
    create_all = api.Base.metadata.create_all

    def create_all_once(bind=None, **kwargs):
        if bind is not None and id(bind) in checked and bind in engines.values():
            return
        create_all(bind=bind, **kwargs)
        if bind is not None:
            checked.add(id(bind))

    api.create_engine = create_engine
    api.Base.metadata.create_all = create_all_once


def record_outcomes() -> None:
    """Make nbgrader's autograde step leave, per student, the record the grader trusts: the
    reason nbgrader refused or failed a submission (its own message, not a later step's), and
    ``complete`` once every notebook of that student was judged, scored and written.  Rows
    nbgrader creates up front prove nothing: a worker killed half way leaves them behind."""
    from nbgrader.apps import autogradeapp, generatefeedbackapp
    from nbgrader.converters import Autograde, GenerateFeedback

    def status_dir(config) -> str:
        """The job's status folder (``JudgedExecute.job`` names its job file)."""
        job = str(config.get("JudgedExecute", {}).get("job", "") or "")
        return str(Path(job).parent / "status") if job else ""

    class RecordedAutograde(Autograde):
        def _status_dir(self) -> str:
            return status_dir(self.config)

        def init_assignment(self, assignment_id, student_id):
            self._course_student = student_id
            try:
                super().init_assignment(assignment_id, student_id)
            except BaseException as exc:
                self._record_failure(exc)
                raise

        def convert_single_notebook(self, notebook_filename):
            try:
                super().convert_single_notebook(notebook_filename)
            except BaseException as exc:
                self._record_failure(exc)
                raise

        def set_permissions(self, assignment_id, student_id):
            super().set_permissions(assignment_id, student_id)
            record_status(self._status_dir(), student_id, judged=True)  # every notebook written

        def _record_failure(self, exc: BaseException) -> None:
            student = getattr(self, "_course_student", None)
            if student and self._status_dir():
                text = " ".join(str(exc).split()) or "no reason given"
                record_status(self._status_dir(), student,
                              refused=f"nbgrader refused the notebook ({type(exc).__name__}: {text})"[:500])

    class RecordedFeedback(GenerateFeedback):
        def set_permissions(self, assignment_id, student_id):
            super().set_permissions(assignment_id, student_id)
            record_status(status_dir(self.config), student_id, complete=True)  # and its feedback page

    autogradeapp.Autograde = RecordedAutograde
    generatefeedbackapp.GenerateFeedback = RecordedFeedback


@dataclass(frozen=True)
class Outcome:
    """What one job learned about one submission: the record a backend hands on (frozen: a
    backend that learns more makes a changed copy, ``dataclasses.replace``)."""

    student_id: str
    graded: bool
    notes: tuple[str, ...] = ()
    cause: str = ""
    timings: dict = field(default_factory=dict)   # seconds: kernel_start, cells, tests, total
    gradebook: Path | None = None     # the job's gradebook, holding this student's rows
    autograded: Path | None = None    # the graded notebook
    feedback: Path | None = None      # the feedback page


@dataclass
class Job:
    """One worker folder and what its process is to do (``job.json`` in the folder)."""

    folder: Path
    assignment: str
    nb_name: str
    students: list[str]
    settings: GradingSettings
    threads: int = 1
    course: Path = ROOT
    scratch: Path | None = None   # where kernels' scratch folders go (default: the job's tmp/)
    late: list = field(default_factory=list)  # students whose file came late (their page says so)

    @property
    def scratch_dir(self) -> Path:
        return self.scratch or self.folder / "tmp"

    @classmethod
    def prepare(cls, folder: Path, assignment: str, nb_name: str, notebooks: dict[str, str], gradebook: Path,
                settings: GradingSettings, threads: int = 1, course: Path = ROOT,
                scratch: Path | None = None, late=()) -> "Job":
        """Make the worker folder: a copy of ``gradebook`` (the release), each notebook (student
        id -> notebook JSON) where nbgrader looks for it, the course's kernelspec, ``job.json``."""
        folder = Path(folder)
        remove_tree(folder)
        (folder / "tmp").mkdir(parents=True)
        shutil.copy(gradebook, folder / "gradebook.db")
        for sid, text in notebooks.items():
            target = folder / "submitted" / sid / assignment
            target.mkdir(parents=True)
            (target / nb_name).write_text(text)
        sandbox.install_kernelspec(folder / "jupyter", settings, threads=threads)
        job = cls(folder, assignment, nb_name, sorted(notebooks), settings, threads, Path(course), scratch,
                  sorted(late))
        (folder / JOB_FILE).write_text(json.dumps({
            "assignment": assignment, "nb_name": nb_name, "students": job.students, "threads": threads,
            "course": str(course), "scratch": str(scratch) if scratch else None, "late": job.late,
            # what the feedback pages say besides the grades (autograder.judge.feedback.FeedbackExporter)
            "provenance": settings.provenance, "settings": json.loads(settings.to_json())}))
        return job

    @classmethod
    def load(cls, path: Path) -> "Job":
        data = json.loads(Path(path).read_text())
        return cls(Path(path).parent, data["assignment"], data["nb_name"], list(data["students"]),
                   GradingSettings.from_json(json.dumps(data["settings"])), int(data["threads"]),
                   Path(data["course"]), Path(data["scratch"]) if data.get("scratch") else None,
                   list(data.get("late", [])))

    # what the process is given ---------------------------------------------------------
    def env(self) -> dict:
        """The grading process's environment: the job's kernelspec and scratch folder, the
        threads it may use, and the assignment's grading environment (for the judge too)."""
        env = nbgrader_env()
        env.pop("JPY_PARENT_PID", None)  # an outer Jupyter's (grade run from a notebook): not this process's parent
        env["JUPYTER_PATH"] = str(self.folder / "jupyter") + os.pathsep + env.get("JUPYTER_PATH", "")
        env["TMPDIR"] = str(self.folder / "tmp")
        env["OMP_NUM_THREADS"] = str(self.threads)
        env["PYTHONHASHSEED"] = "0"
        env.update(self.settings.env)
        # kernels read the instructor's model cache (read-only in the sandbox), filled beforehand
        env["COURSE_CACHE_DIR"] = str(course_cache_dir())
        env[ENV] = str(process_folder())  # the run's folder for sockets: removed when the run ends
        return env

    def nbgrader_args(self) -> list[str]:
        """nbgrader's command line for this job: its own gradebook and folders, and the job file,
        from which ``JudgedExecute`` takes every setting of the judge."""
        return [self.assignment, "--force", *GradingPaths(self.folder, self.course).nbgrader_flags(
            f"sqlite:///{self.folder / 'gradebook.db'}", steps=self.folder),
            f"--JudgedExecute.job={self.folder / JOB_FILE}", f"--FeedbackExporter.facts={self.folder / JOB_FILE}"]

    # running ---------------------------------------------------------------------------
    def run_here(self) -> int:
        """nbgrader's autograde, then its feedback, in this process (environment: ``env()``)."""
        validate_metadata_once()
        scratch_gradebook_engines()
        record_outcomes()
        from nbgrader.apps.autogradeapp import AutogradeApp
        from nbgrader.apps.generatefeedbackapp import GenerateFeedbackApp

        status = 0
        previous = os.getcwd()
        os.chdir(self.course)  # nbgrader reads the course's nbgrader_config.py from here
        try:
            for app_class in (AutogradeApp, GenerateFeedbackApp):
                app = app_class()
                try:
                    app.initialize(self.nbgrader_args())
                    app.start()
                except SystemExit as exc:  # nbgrader exits 1 when any notebook failed
                    code = exc.code if isinstance(exc.code, int) else 1
                    status = status or code
        finally:
            os.chdir(previous)
        return status

    # what it left ----------------------------------------------------------------------
    def status(self, sid: str) -> dict:
        """The note the grader left for a student (written by the grader, never the kernel)."""
        return read_status(self.folder / "status", sid)

    def outcome(self, sid: str, log: str = "", timed_out: bool = False) -> Outcome:
        """The record of one submission after the job ran (``log``: what its process printed)."""
        st = self.status(sid)
        autograded = self.folder / "autograded" / sid / self.assignment / self.nb_name
        feedback = self.folder / "feedback" / sid / self.assignment / self.nb_name.replace(".ipynb", ".html")
        graded = bool(st.get("complete")) and autograded.exists() and feedback.exists()
        notes, timings = tuple(st.get("notes", [])), dict(st.get("timings", {}))
        if graded:
            return Outcome(sid, True, notes, timings=timings, gradebook=self.folder / "gradebook.db",
                           autograded=autograded, feedback=feedback)
        return Outcome(sid, False, notes, cause=self._cause(st, log, timed_out), timings=timings)

    def _cause(self, st: dict, log: str, timed_out: bool) -> str:
        """Why a submission was not graded: the grader's own note (the judge's error, or
        nbgrader's reason for refusing the notebook) before anything read from the log."""
        if st.get("error"):
            return "grading failed: " + str(st["error"])[:300]
        if st.get("refused"):
            return "not graded: " + str(st["refused"])[:300]
        if timed_out:
            return f"the notebook ran longer than {self.settings.notebook_timeout:g} s and was stopped"
        lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
        for ln in reversed(lines):  # the exception line of the last traceback
            if ln.split(":")[0].endswith(("Error", "Exception")) and " " not in ln.split(":")[0]:
                return "autograde failed: " + ln[:200]
        return "autograde failed: " + (lines[-1][:200] if lines else "the grading process stopped")


SERVE = "--serve"


def serve(requests, replies) -> int:
    """A grading process that runs one job after another, as a Dask worker does: started
    ahead of the work (its imports, nbgrader's and torch's, are paid once, while the grader
    reads the submissions), then given jobs one line at a time on ``requests``
    (``{"job": FOLDER/job.json, "env": {...}}``) and answering each on ``replies``
    (``{"job": ..., "status": ...}``) once the job's records are written.  What a job prints
    goes to its folder's ``log.txt``.  The kernel zygote and the spare kernel of one job serve
    the next ones (``JudgedExecute``); each submission still gets a fresh sandboxed kernel.
    Ends at the end of ``requests``."""
    validate_metadata_once()
    from nbgrader.apps import autogradeapp, generatefeedbackapp  # noqa: F401 - imported ahead

    from .runner import judge_namespace  # noqa: F401 - with the kernel's client
    import torch  # noqa: F401 - the judge's namespace imports it

    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        job = Job.load(Path(request["job"]))
        (job.folder / "worker.pid").write_text(str(os.getpid()))  # which process holds the job
        log = os.open(job.folder / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(log, 1)
        os.dup2(log, 2)
        status = 1
        try:
            with environ(dict(request["env"])):
                tempfile.tempdir = None  # TMPDIR changed
                torch.set_num_threads(job.threads)
                try:
                    status = job.run_here()
                except Exception:  # noqa: BLE001 - the job's records say what became of each student
                    traceback.print_exc()
                finally:
                    tempfile.tempdir = None
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (*saved, log):
                os.close(fd)
        replies.write(json.dumps({"job": request["job"], "status": status}) + "\n")
        replies.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        raise SystemExit(f"usage: python -m autograder.judge.worker FOLDER/job.json | {SERVE}")
    die_with_parent("COURSE_GRADER_PID")  # a grade that is killed takes its workers with it
    if argv[0] == SERVE:
        # replies on the stdout it was given; everything printed goes elsewhere (the job's log)
        replies = os.fdopen(os.dup(1), "w")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        status = serve(sys.stdin, replies)
        # every job's records are written and answered; what is left is the exit handlers (the
        # spare kernel, the zygote, the scratch folder: they run now) and the interpreter's own
        # teardown of torch, nbgrader and the rest of ~2,200 modules, 0.7-1.4 s that the run
        # waits for (Worker.stop) and that nothing needs: skipped
        replies.close()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(status)
    job = Job.load(Path(argv[0]))
    with environ(job.settings.env):  # the assignment's environment, for the judge in this process
        return job.run_here()


if __name__ == "__main__":
    sys.exit(main())
