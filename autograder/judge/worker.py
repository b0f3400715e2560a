"""One grading worker: ``nbgrader autograde`` and then ``nbgrader generate_feedback``
for the students of one worker folder, in one Python process.

    python -m autograder.judge.worker <autograde arguments> --then <generate_feedback arguments>

(the arguments of each step as on nbgrader's command line after the step's name).

Run by ``grade`` once per worker.  Two ``python -m nbgrader`` commands would pay
nbgrader's start-up (imports and configuration, a few seconds) twice per worker.
The exit status is the first non-zero status of the two steps; feedback is
generated even when autograding failed for some students.
"""
from __future__ import annotations

import sys

# (importing the package, autograder/__init__.py, keeps jsonschema from building its IRI
# grammar: 1.5 s of CPU per worker process)


def validate_metadata_once() -> None:
    """nbgrader checks the metadata of every cell of every notebook it reads with
    ``jsonschema.validate(metadata, schema)``, which first checks the *schema* against
    JSON Schema's meta-schema, each time (about 2.5 ms a cell, 0.15 s a submission).  Same
    check, with each schema checked once and its validator kept."""
    import json
    import types

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


def record_outcomes() -> None:
    """Make nbgrader's autograde step leave, per student, the record the grader trusts: the
    reason nbgrader refused or failed a submission (its own message, not a later step's), and
    ``complete`` once every notebook of that student was judged, scored and written.  Rows
    nbgrader creates up front prove nothing: a worker killed half way leaves them behind."""
    from nbgrader.apps import autogradeapp
    from nbgrader.converters import Autograde

    from .execute import record_status

    class RecordedAutograde(Autograde):
        def _status_dir(self) -> str:
            return str(self.config.get("JudgedExecute", {}).get("status_dir", "") or "")

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
            record_status(self._status_dir(), student_id, complete=True)  # every notebook written

        def _record_failure(self, exc: BaseException) -> None:
            student = getattr(self, "_course_student", None)
            if student and self._status_dir():
                text = " ".join(str(exc).split()) or "no reason given"
                record_status(self._status_dir(), student,
                              refused=f"nbgrader refused the notebook ({type(exc).__name__}: {text})"[:500])

    autogradeapp.Autograde = RecordedAutograde


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--then" not in argv:
        raise SystemExit("usage: python -m autograder.judge.worker <autograde args> --then <generate_feedback args>")
    cut = argv.index("--then")
    validate_metadata_once()
    record_outcomes()
    from nbgrader.apps.autogradeapp import AutogradeApp
    from nbgrader.apps.generatefeedbackapp import GenerateFeedbackApp

    status = 0
    for app_class, args in ((AutogradeApp, argv[:cut]), (GenerateFeedbackApp, argv[cut + 1:])):
        app = app_class()
        try:
            app.initialize(args)
            app.start()
        except SystemExit as exc:  # nbgrader exits 1 when any notebook failed
            code = exc.code if isinstance(exc.code, int) else 1
            status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
