"""Command line: ``python -m autograder {release,collect,grade,handgrade,export,publish,instructor-book} ...``."""
from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import uuid
import zipfile
from pathlib import Path

from autograder import GRADING_DIR, ROOT

# Imports inside functions: each command imports the modules it needs when it runs: `python -m autograder
# --help` and the light commands start without loading the pipeline, nbgrader or the database layer.


class CliError(Exception):
    """A mistake on the command line: one line for the user, exit status 2."""


def _known(names: list[str]) -> list[str]:
    from autograder.course.model import CourseFileError, load

    try:
        known = load(ROOT).ids
    except CourseFileError as exc:
        raise CliError(str(exc)) from None
    for name in names:
        if name not in known:
            raise CliError(f"unknown assignment {name!r}; the assignments are: {', '.join(known)}")
    return names


def _grading_dir(args) -> Path:
    return Path(args.grading_dir) if args.grading_dir else ROOT / GRADING_DIR


def _cmd_release(args) -> int:
    from autograder.authoring.release import release

    for path in release(_known(args.assignments) or None, out_dir=args.out):
        print(f"released {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


def _cmd_collect(args) -> int:
    from autograder.pipeline.collect import RosterError, collect, lms_index, load_roster, summary

    _known([args.assignment])
    source = Path(args.source)
    if not source.exists():
        raise CliError(f"no such zip file or folder: {source}")
    for option in ("max_file_mb", "max_total_mb"):
        if getattr(args, option) <= 0:
            raise CliError(f"--{option.replace('_', '-')} must be a positive number of MiB")
    try:
        by_lms = {}
        if args.roster is not None:  # read once: its one line, then the files matched against it
            rows, table = load_roster(args.roster, args.assignment)
            print(table.describe(args.roster))
            by_lms = lms_index(rows.values())
        entries = collect(args.assignment, source, Path(args.out), by_lms=by_lms,
                          max_file_bytes=int(args.max_file_mb * (1 << 20)),
                          max_total_bytes=int(args.max_total_mb * (1 << 20)))
    except RosterError as exc:
        raise CliError(str(exc)) from None
    print(summary(entries))
    print(f"\nreport: {Path(args.out) / '.collect_report.csv'}")
    if not any(e.target for e in entries):
        print(f"WARNING: no notebook was collected from {source}", file=sys.stderr)
        return 1
    return 0


def _run_settings(args):
    """The run's GradingSettings: the assignment's in course.yml, with every flag given
    (the flags are the schema's: ``_setting_flags``)."""
    from autograder.course import schema
    from autograder.course.model import load
    from autograder.course.settings import GradingSettings

    given = {s.name: getattr(args, s.name) for s in schema.flags_of(args.command) if s.travels}
    return GradingSettings.for_assignment(load(ROOT).assignment(args.assignment), **given)


def _has_files(source: Path) -> bool:
    if source.is_file() and zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as zf:
            return any(not i.is_dir() for i in zf.infolist())
    return source.is_dir() and any(p.is_file() and not p.name.startswith(".") for p in source.iterdir())


def _cmd_grade(args) -> int:
    from autograder.authoring.release import ReleaseError
    from autograder.course.errors import GradingError, StoppedAfterCommit
    from autograder.pipeline.run import grade

    _known([args.assignment])
    source = Path(args.submissions)
    if not source.exists():
        raise CliError(f"no such zip file or folder: {source}")
    if not _has_files(source):
        print(f"WARNING: {source} holds no files: nothing to grade", file=sys.stderr)
        return 1
    from autograder.records.gradebook import replaced_url_note

    note = replaced_url_note(_grading_dir(args).resolve(), args.db_url)  # a recorded one reused: the run says so
    if note:
        print(note, file=sys.stderr)
    try:
        report = grade(args.assignment, source, out_dir=args.out, grading_dir=args.grading_dir,
                       settings=_run_settings(args), roster=args.roster, db_url=args.db_url,
                       add_students=args.add_students, missing=args.missing, wait=args.wait)
    except (ReleaseError, GradingError) as exc:
        raise CliError(str(exc)) from None
    except StoppedAfterCommit as stop:
        print(f"\nstopped after this run's grades reached the class record (run {stop.run_id[:8]} of the history; "
              f"python -m autograder undo {stop.assignment} takes it back); its exports may lag behind: "
              f"python -m autograder export {stop.assignment}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\nstopped: nothing of this run reached the class record", file=sys.stderr)
        return 130
    print(report.table())
    print(f"\ngrades for the class: {report.csv_path} (and canvas.csv, moodle.csv, histogram.png, pass_rates.png)"
          f"\nfeedback: {report.feedback_dir}\ngraded notebooks: {_grading_dir(args) / 'autograded'}/<student>/"
          f"{args.assignment}/\ntime: {report.seconds:.0f} s"
          + (f"\nthis run in the history: {report.run_id[:8]} (python -m autograder history {args.assignment})"
             if report.run_id else ""))
    graded = [r for r in report.results if r.status == "graded"]
    if any(r.pending for r in graded):
        print(f"\nwritten answers wait for a grader: python -m autograder handgrade {args.assignment}")
    if not graded:
        print("ERROR: no submission could be graded (see the reasons above)", file=sys.stderr)
        return 1
    causes = {r.message for r in graded}
    if len(graded) > 1 and len(causes) == 1 and next(iter(causes)) and all(r.score == 0 for r in graded):
        print(f"ERROR: every notebook failed the same way ({next(iter(causes))}): check the grading setup",
              file=sys.stderr)
        return 1
    return 0


class _Writer:
    """The assignment's writer lock for a command (``autograder.records.writer``): another
    command holding it is one line and exit status 2, or with --wait a wait."""

    def __init__(self, args, url: str, command: str):
        self.args, self.url, self.command = args, url, command

    def __enter__(self):
        from autograder.records.files import recover
        from autograder.records.gradebook import db_url, shown
        from autograder.records.writer import RecordBusy, using_database, writing

        grading = _grading_dir(self.args).resolve()
        self._stack = contextlib.ExitStack()
        try:
            # the folder's database stays this one until the command ends (a grade --db-url waits)
            if self._stack.enter_context(using_database(grading)) != self.url:
                raise CliError(f"the database of the grading folder {grading} changed as this command started "
                               f"(to {shown(db_url(grading))}); run it again")
            try:
                self._stack.enter_context(writing(self.url, self.args.assignment, f"{self.command} "
                                                  f"{self.args.assignment}", wait=getattr(self.args, "wait", False)))
            except RecordBusy as exc:
                raise CliError(str(exc)) from None
            # a command killed half way through a change of this record: completed or rolled back
            for line in recover(grading, self.url, self.args.assignment):
                print(line, file=sys.stderr)
        except BaseException:
            self._stack.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)


def _reachable_gradebook(grading: Path) -> str:
    """The URL of the folder's gradebook, once a connection to it has worked (else one line)."""
    from autograder.records.gradebook import GradebookUnreachable, check_reachable, db_url, reused_url_note

    url = db_url(grading)
    try:
        check_reachable(url)
    except GradebookUnreachable as exc:
        raise CliError(str(exc)) from None
    note = reused_url_note(grading)
    if note:
        print(note, file=sys.stderr)
    return url


def _cmd_export(args) -> int:
    from autograder.course.model import load
    from autograder.pipeline.stages import prepare_release
    from autograder.records.export import export

    _known([args.assignment])
    from autograder.records.gradebook import has_assignment

    grading = _grading_dir(args).resolve()
    url = _reachable_gradebook(grading)
    if not has_assignment(url, args.assignment):
        raise CliError(f"nothing graded yet: {args.assignment} is not in the gradebook of {grading}")
    spec = load(ROOT).assignment(args.assignment)
    with _Writer(args, url, "export"):
        rel = prepare_release(args.assignment, grading, ROOT)
        out = Path(args.out) if args.out else grading / "reports" / args.assignment
        try:
            result = export(args.assignment, grading, out, rel.nb, spec.lms_column, spec.canvas_id,
                            feedback=not args.no_feedback, root=ROOT, missing=args.missing)
        except OSError as exc:  # a full disk: the files of before stay, whole
            raise _disk_error(exc, out, "the exports are as they were") from None
    graded = [r for r in result.rows if r.status == "graded"]
    pending = sum(1 for r in graded if r.pending)
    print(f"{len(result.rows)} students: {len(graded)} graded ({pending} with written answers awaiting a grader), "
          f"{len(result.rows) - len(graded)} without a graded submission (canvas.csv and moodle.csv give them "
          + ("0, --missing zero)" if result.missing == "zero" else "an empty cell, --missing blank)"))
    print(f"written: {', '.join(str(p) for p in result.paths.values())}"
          + ("" if args.no_feedback else f", {out / 'feedback'}/<student>.html"))
    return 0


def _recorded(args) -> str:
    """The gradebook of the grading folder, which must know the assignment (else one line)."""
    from autograder.records.gradebook import has_assignment

    _known([args.assignment])
    url = _reachable_gradebook(_grading_dir(args).resolve())
    if not has_assignment(url, args.assignment):
        raise CliError(f"nothing graded yet: {args.assignment} is not in the gradebook of {_grading_dir(args)}")
    return url


def _cmd_history(args) -> int:
    from autograder.records.classrecord import RecordError, history

    try:
        runs = history(_recorded(args), args.assignment)
    except RecordError as exc:  # a damaged row: which one
        raise CliError(str(exc)) from None
    if not runs:
        print(f"{args.assignment}: no run recorded yet")
        return 0
    for r in runs:
        state = f"  (undone by {r.data['undone_by'][:8]})" if r.data.get("undone_by") else ""
        what = {"grade": f"graded {len(r.data.get('files', []))} files from {r.data.get('source', '?')}",
                "undo": "undid run(s) " + ", ".join(str(n) for n in r.data.get("undid_seq", [])),
                "remove": f"removed {', '.join(r.data.get('removed', []))}"}.get(r.kind, r.kind)
        print(f"{r.seq:>3}  {r.id[:8]}  {r.at}  {what}{state}")
        settings = r.data.get("settings")
        if settings:
            print("      settings: " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items()) if v not in (None, {}, "")))
        changes = r.changes
        if changes:
            print(f"      {len(changes)} grade{'s' if len(changes) != 1 else ''} changed: "
                  + ", ".join(str(c) for c in changes[:30]) + (", ..." if len(changes) > 30 else ""))
        elif r.kind == "grade" and any(e.kind == "grade" for e in runs if e.seq < r.seq):
            same = [e.seq for e in runs if e.seq < r.seq and e.kind == "grade" and r.data.get("fingerprint")
                    and e.data.get("fingerprint") == r.data["fingerprint"]]
            print("      no grade changed" + (f": the same files as run {same[-1]} were graded again" if same else ""))
    return 0


def _rebuild(args):
    """Every export of the assignment again, from the class record (feedback pages included)."""
    from autograder.course.model import load
    from autograder.pipeline.stages import prepare_release
    from autograder.records.export import export

    grading = _grading_dir(args).resolve()
    spec = load(ROOT).assignment(args.assignment)
    rel = prepare_release(args.assignment, grading, ROOT)
    return export(args.assignment, grading, grading / "reports" / args.assignment, rel.nb, spec.lms_column,
                  spec.canvas_id)


def _rebuilt(args, what: str) -> None:
    """``_rebuild`` after a change reached the record; a full disk is one line saying so."""
    try:
        _rebuild(args)
    except OSError as exc:
        raise _disk_error(exc, _grading_dir(args).resolve() / "reports" / args.assignment,
                          f"{what} is in the class record, with its files; the exports are as they were: "
                          f"python -m autograder export {args.assignment} writes them") from None


def _disk_error(exc: BaseException, where: Path, what: str) -> CliError | None:
    """The one line for a write that failed in ``where`` (a full disk, above all: a file's
    OSError, or the database's "disk is full"), saying ``what`` stayed as it was; None for
    any other error."""
    from autograder.records.files import disk_line

    if isinstance(exc, OSError):
        return CliError(disk_line(exc, where, what))
    if "disk is full" in str(exc):
        return CliError(f"the gradebook could not be written ({str(exc).splitlines()[0]}): {what}")
    return None


def _cmd_undo(args) -> int:
    from autograder.records.classrecord import RecordError, undo
    from autograder.records.files import FileChanges, held_interrupt, stage_restore

    url = _recorded(args)
    grading = _grading_dir(args).resolve()
    undo_id, staged = uuid.uuid4().hex, []
    with _Writer(args, url, "undo"):
        with held_interrupt():  # the record and the files it names change together
            try:  # the files staged (a journal written) inside the transaction, before it commits
                entry, undone, changes = undo(url, args.assignment, args.run, run_id=undo_id, before_commit=lambda runs:
                                              staged.append(stage_restore(grading, args.assignment, undo_id, runs)))
            except Exception as exc:  # noqa: BLE001 - nothing reached the record: nothing staged stays
                FileChanges(grading, args.assignment, undo_id, "undo").discard()
                if isinstance(exc, RecordError):
                    raise CliError(str(exc)) from None
                raise _disk_error(exc, grading, "nothing of the class record changed") or exc
            staged[0].apply()
        _rebuilt(args, f"the undo (run {undo_id[:8]})")
    print(f"undid run(s) {', '.join(str(r.seq) for r in undone)} of {args.assignment}: the class record is as it was "
          f"before run {min(r.seq for r in undone)}; exports rebuilt")
    if changes:
        print(f"{len(changes)} grade{'s' if len(changes) != 1 else ''} changed: " + ", ".join(str(c) for c in changes))
    return 0


def _cmd_remove(args) -> int:
    url = _recorded(args)
    with _Writer(args, url, "remove"):
        return _remove(args, url)


def _remove(args, url: str) -> int:
    from autograder.records.classrecord import Commit, commit, read_roster, with_submission
    from autograder.records.files import FileChanges, held_interrupt, stage_removal

    roster = read_roster(url)
    change = Commit(args.assignment, kind="remove", data={"removed": list(args.students)})
    if not args.from_roster:  # nothing to remove is a mistake (a typo in the id?), and no run of the history
        having = with_submission(url, args.assignment, args.students)
        nothing = [sid for sid in args.students if sid not in having]
        if nothing:
            raise CliError(f"{', '.join(nothing)} {'has' if len(nothing) == 1 else 'have'} no submission of "
                           f"{args.assignment}: nothing was removed (to take a student off the class roster: "
                           "--from-roster)")
    for sid in args.students:
        if args.from_roster and sid not in roster:
            raise CliError(f"{sid} is not on the class roster")
        change.submissions[sid] = None
        change.intake[sid] = None
    if args.from_roster:
        change.roster = {k: v for k, v in roster.items() if k not in args.students}
    grading, run_id = _grading_dir(args).resolve(), uuid.uuid4().hex
    with held_interrupt():  # the record and the files it names change together
        try:  # the files staged (undo's copies made, a journal written) before the transaction
            staged = stage_removal(grading, args.assignment, args.students, run_id)
            run_id, changes = commit(url, change, run_id=run_id)
        except Exception as exc:  # noqa: BLE001 - nothing reached the record: nothing staged stays
            FileChanges(grading, args.assignment, run_id, "remove").discard()
            raise _disk_error(exc, grading, "nothing of the class record changed") or exc
        staged.apply()
    _rebuilt(args, f"the removal (run {run_id[:8]})")
    what = "students (from the roster and their submissions)" if args.from_roster else "submissions"
    print(f"removed the {what} of {', '.join(args.students)} from {args.assignment} (run {run_id[:8]}; "
          f"python -m autograder undo {args.assignment} takes it back); exports rebuilt")
    return 0


def _cmd_handgrade(args) -> int:
    from autograder.records.handgrade import HandGrading, make_server

    _known([args.assignment])
    _reachable_gradebook(_grading_dir(args).resolve())
    try:
        hg = HandGrading(args.assignment, _grading_dir(args).resolve(), ROOT)
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    try:
        server = make_server(hg, port=args.port)
    except OSError as exc:  # most often: another handgrade (or any program) holds the port
        raise CliError(f"cannot listen on 127.0.0.1:{args.port} ({exc.strerror or exc}); is another handgrade "
                       "running? Choose another port with --port") from None
    print(f"hand grading {args.assignment}: open {server.url} (Ctrl-C to stop);"
          f" then run: python -m autograder export {args.assignment}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _cmd_publish(args) -> int:
    from autograder.authoring.publish import PublishError, publish

    try:
        files = publish(Path(args.dest))
    except PublishError as exc:
        raise CliError(str(exc)) from None
    print(f"published the student course into {args.dest}: {len(files)} files, no solution or hidden test in "
          f"them.\nPush that folder to the student repository; keep this one private.")
    return 0


def _cmd_instructor_book(args) -> int:
    from autograder import ROOT
    from autograder.authoring.instructor_book import InstructorBookError, build

    try:
        html = build(ROOT, ["--keep-going"] + (["--warningiserror"] if args.strict else []))
    except InstructorBookError as exc:
        raise CliError(str(exc)) from None
    print(f"the instructor book, with every exercise's worked solution, is in {html}; it is for instructors "
          "only: never publish it")
    return 0


def _grading_dir_option(p) -> None:
    p.add_argument("--grading-dir", type=Path, default=None, help="gradebook and nbgrader folders (default: grading/)")


def _wait_option(p) -> None:
    p.add_argument("--wait", action="store_true",
                   help="when another command is changing this assignment's class record, wait for it "
                        "(default: stop with one line naming it, exit status 2)")


class _Help(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (unless its help already says it) and keeps the examples' layout."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, argparse.SUPPRESS, False) and "default" not in text \
                and action.option_strings:
            text += f" (default: {action.default})"
        return text


def _positive(kind: type):
    """An argparse type: a number above zero (a limit of 0 or -3 workers would grade nobody)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"must be a number above 0, not {text!r}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _at_least(minimum: int):
    """An argparse type: a whole number of at least ``minimum`` (above zero: ``_positive``)."""
    if minimum >= 1:
        return _positive(int)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of {minimum} or more, not {text!r}")
        return value
    parse.__name__ = "int"
    return parse


def _setting_flags(p, command: str, limits) -> None:
    """The flags of ``command`` that set grading settings, made from their declaration
    (``autograder.course.schema``): name, type, choices and help.  Each defaults to None: not
    given, the setting is course.yml's (or the schema's default)."""
    from autograder.course import schema

    for s in schema.flags_of(command):
        if s.source == schema.COURSE:
            default = limits(s.name)
        else:
            default = s.shown_default or s.default
        kind = {"choices": list(s.choices)} if s.choices else \
            {"type": _at_least(s.minimum if s.minimum is not None else 1)} if s.type is int else {}
        p.add_argument(s.flag, dest=s.name, default=None, help=f"{s.help} (default: {default})", **kind)


def _course_limits():
    """``limits(key)``: where a grading limit comes from, for the help: course.yml's course-wide value,
    or the built-in one while the course file cannot be read (the help still shows)."""
    from autograder.course.model import CourseFileError, Grading, load as load_course

    try:
        course, where = load_course(), "course.yml"
    except CourseFileError:
        course, where = None, "built in"
    base = course.grading if course is not None else Grading()
    return lambda key: f"{where}, {getattr(base, key)}; an assignment may set its own"


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, every command with its flags."""
    from autograder.pipeline.collect import MAX_FILE_BYTES, MAX_TOTAL_BYTES

    limits = _course_limits()

    parser = argparse.ArgumentParser(
        prog="python -m autograder", formatter_class=_Help,
        description="Release, grade, hand-grade and export the course's nbgrader assignments.",
        epilog="A class, from the LMS zip back to the LMS gradebook:\n"
               "  python -m autograder grade attention canvas.zip --roster roster.csv\n"
               "  python -m autograder handgrade attention      # written answers, question by question\n"
               "  python -m autograder export attention         # grades.csv, canvas.csv, moodle.csv, feedback")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", formatter_class=_Help, help="regenerate exercises/ from solutions/ (deterministic)",
                       epilog="example: python -m autograder release attention")
    p.add_argument("assignments", nargs="*", help="assignment ids (default: all of course.yml)")
    p.add_argument("--out", type=Path, default=None, help="release folder (default: exercises/)")
    p.set_defaults(func=_cmd_release)

    p = sub.add_parser("collect", formatter_class=_Help,
                       help="Canvas/Moodle bulk download (zip or folder) -> a folder for grade",
                       epilog="example: python -m autograder collect attention canvas.zip subs/ --roster roster.csv")
    p.add_argument("assignment")
    p.add_argument("source", help="the LMS zip, or a folder")
    p.add_argument("out", help="folder to write <student id>_<assignment>.ipynb files into")
    p.add_argument("--roster", type=Path, default=None,
                   help="CSV with student_id,lms_id[,name,email,login,section], or Canvas's gradebook export, "
                        "or Moodle's participants or grades export")
    p.add_argument("--max-file-mb", type=_positive(float), default=MAX_FILE_BYTES >> 20,
                   help="largest notebook taken from the zip, in MiB (counted as it inflates)")
    p.add_argument("--max-total-mb", type=_positive(float), default=MAX_TOTAL_BYTES >> 20,
                   help="most MiB of notebooks taken from one zip")
    p.set_defaults(func=_cmd_collect)

    p = sub.add_parser("grade", formatter_class=_Help, help="autograde a folder (or an LMS zip) of notebooks",
                       epilog="examples:\n  python -m autograder grade attention subs/\n"
                              "  python -m autograder grade finetune moodle.zip --roster roster.csv --workers 1\n"
                              "limits not given here come from course.yml (per assignment)")
    p.add_argument("assignment", help="assignment id, e.g. attention")
    p.add_argument("submissions", help="folder with one .ipynb per student (the student id is the file "
                                       "name), or a Canvas/Moodle zip (then see --roster)")
    p.add_argument("--roster", type=Path, default=None,
                   help="CSV of the class (student_id, lms_id, ...), or Canvas's gradebook export, or Moodle's "
                        "participants or grades export: every student on it gets a row; kept for later runs "
                        "(default: the roster given before)")
    p.add_argument("--add-students", action="store_true",
                   help="add students who are not on the roster (by default their files are reported, not graded)")
    p.add_argument("--out", type=Path, default=None, help="reports folder (default: grading/reports/ASSIGNMENT)")
    _grading_dir_option(p)
    _setting_flags(p, "grade", limits)
    _wait_option(p)
    p.set_defaults(func=_cmd_grade)

    p = sub.add_parser("handgrade", formatter_class=_Help,
                       help="grade written answers question by question, in the browser",
                       epilog="example: python -m autograder handgrade concepts --port 8765")
    p.add_argument("assignment")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1")
    _grading_dir_option(p)
    p.set_defaults(func=_cmd_handgrade)

    p = sub.add_parser("export", formatter_class=_Help,
                       help="rebuild grades.csv, canvas.csv, moodle.csv, plots and feedback from the gradebook",
                       epilog="example: python -m autograder export attention")
    p.add_argument("assignment")
    _grading_dir_option(p)
    p.add_argument("--out", type=Path, default=None, help="reports folder (default: grading/reports/ASSIGNMENT)")
    p.add_argument("--no-feedback", action="store_true", help="do not regenerate the feedback pages")
    _setting_flags(p, "export", limits)
    _wait_option(p)
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("history", formatter_class=_Help,
                       help="every run of an assignment: when, which files, which settings, which grades changed",
                       epilog="example: python -m autograder history attention")
    p.add_argument("assignment")
    _grading_dir_option(p)
    p.set_defaults(func=_cmd_history)

    p = sub.add_parser("undo", formatter_class=_Help,
                       help="restore the class record to before a run (default: the last) and rebuild the exports",
                       epilog="examples:\n  python -m autograder undo attention       # the last run\n"
                              "  python -m autograder undo attention 3     # run 3 of the history, and every later one")
    p.add_argument("assignment")
    p.add_argument("run", nargs="?", default=None, help="a run's number or id, as history lists it")
    _grading_dir_option(p)
    _wait_option(p)
    p.set_defaults(func=_cmd_undo)

    p = sub.add_parser("remove", formatter_class=_Help,
                       help="remove students' submissions (or, with --from-roster, the students) from an assignment",
                       epilog="example: python -m autograder remove attention s7   (undo takes it back)")
    p.add_argument("assignment")
    p.add_argument("students", nargs="+", help="student ids")
    p.add_argument("--from-roster", action="store_true", help="remove the students from the class roster too")
    _grading_dir_option(p)
    _wait_option(p)
    p.set_defaults(func=_cmd_remove)

    p = sub.add_parser("publish", formatter_class=_Help,
                       help="write the student course (book, exercises, coursekit, data; no solutions) into DEST",
                       epilog="example: python -m autograder publish ../course-student && "
                              "cd ../course-student && bash scripts/build.sh")
    p.add_argument("dest", help="an empty folder (or a fresh clone of the student repository)")
    p.set_defaults(func=_cmd_publish)

    p = sub.add_parser("instructor-book", formatter_class=_Help,
                       help="build the book with the exercises' worked solutions (instructors only) into "
                            "_build/instructor/_build/html",
                       epilog="example: python -m autograder instructor-book")
    p.add_argument("--strict", action="store_true", help="stop at any warning, as scripts/build.sh does")
    p.set_defaults(func=_cmd_instructor_book)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from autograder.text.visible import visible_output

    with visible_output():  # every line printed shows bidi controls (a name's U+202E) as <U+202E>
        try:
            return args.func(args)
        except CliError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # noqa: BLE001 - a damaged gradebook found half way: one line, no traceback
            line = _damaged(args, exc)
            if line is None:
                raise
            print(f"error: {line}", file=sys.stderr)
            return 2


def _damaged(args, exc: Exception) -> str | None:
    """The one line for an error of the gradebook's database (a damaged file, a row that cannot be
    read) that reached the command line; None for any other error."""
    from autograder.records.gradebook import GradebookUnreachable, damaged, db_url

    if isinstance(exc, GradebookUnreachable):
        return str(exc)
    try:
        from sqlalchemy.exc import DatabaseError
    except ImportError:  # pragma: no cover - sqlalchemy is a dependency of nbgrader
        DatabaseError = sqlite3.DatabaseError
    if not isinstance(exc, (DatabaseError, sqlite3.DatabaseError)):
        return None
    url = getattr(args, "db_url", None) or (db_url(_grading_dir(args).resolve()) if hasattr(args, "grading_dir") else "")
    return str(damaged(url, exc)) if url else (f"the gradebook's database failed: {exc}".splitlines() or [""])[0]
