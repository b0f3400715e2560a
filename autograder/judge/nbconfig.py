"""nbgrader configuration for this course (loaded by the root nbgrader_config.py)."""
from __future__ import annotations

from pathlib import Path

from autograder import GRADING_DIR, RELEASE_DIR, ROOT, SOURCE_DIR

# Per-cell limit for student code during autograding.  nbgrader's default of 30 s
# is too short for cells that train a model on a CPU (jupyter/nbgrader#915).
DEFAULT_CELL_TIMEOUT = 300


def configure(c, root: Path = ROOT, grading_dir: Path | None = None,
              cell_timeout: int = DEFAULT_CELL_TIMEOUT) -> None:
    """Fill a traitlets Config ``c`` with the course layout and grading policy."""
    grading = Path(grading_dir) if grading_dir else root / GRADING_DIR
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = "transformers-course"
    c.CourseDirectory.source_directory = SOURCE_DIR
    c.CourseDirectory.release_directory = RELEASE_DIR
    # absolute paths: os.path.join(root, absolute) is the absolute path itself
    c.CourseDirectory.submitted_directory = str(grading / "submitted")
    c.CourseDirectory.autograded_directory = str(grading / "autograded")
    c.CourseDirectory.feedback_directory = str(grading / "feedback")
    from autograder.records.gradebook import db_url

    c.CourseDirectory.db_url = db_url(grading)  # SQLite beside it, or the database grade --db-url recorded
    # only notebooks travel with an assignment; no checkpoints, caches or data dumps
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*"]

    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

    c.Execute.timeout = cell_timeout
    c.Execute.interrupt_on_timeout = True
    c.Execute.extra_arguments = ["--HistoryManager.hist_file=:memory:"]

    # Autograding: the student's cells run in the sandboxed kernel, the test cells run here,
    # in the grader's process (autograder/execute.py, autograder/judge.py); everything else is nbgrader's chain.
    c.Autograde.autograde_preprocessors = [
        "autograder.judge.execute.JudgedExecute",
        "nbgrader.preprocessors.IgnorePattern",
        "nbconvert.preprocessors.ClearMetadataPreprocessor",
        "nbgrader.preprocessors.LimitOutput",
        "nbgrader.preprocessors.SaveAutoGrades",
        "nbgrader.preprocessors.AssignLatePenalties",
        "nbgrader.preprocessors.CheckCellMetadata",
    ]
    c.JudgedExecute.timeout = cell_timeout
    try:
        from autograder.course.model import load

        course = load(root)
        c.JudgedExecute.judge_context = {a.id: list(a.judge_context) for a in course.assignments}
    except Exception:  # noqa: BLE001 - plain nbgrader commands still work; grading then reports it
        pass

    # Feedback shows which tests passed and why others failed, never hidden-test source.
    c.GenerateFeedback.preprocessors = [
        "nbgrader.preprocessors.GetGrades",
        "autograder.judge.feedback.FeedbackLabels",
        "autograder.judge.feedback.HideHiddenTests",
        "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    ]
    c.GenerateFeedback.exporter_class = "autograder.judge.feedback.FeedbackExporter"
    # the course's own page (autograder/judge/templates/course_feedback): tests named in words,
    # written answers that wait for a grader marked as such
    c.FeedbackExporter.template_name = "course_feedback"
    c.FeedbackExporter.extra_template_basedirs = [str(Path(__file__).with_name("templates"))]
