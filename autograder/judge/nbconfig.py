"""nbgrader configuration for this course (loaded by the root nbgrader_config.py).

The course layout and nbgrader's preprocessor chains.  Limits are not set here: the grader's
workers take them from the run's settings (``JudgedExecute.job``), and a plain ``nbgrader``
command takes the course's own (``autograder.course.model.Grading``)."""
from __future__ import annotations

from pathlib import Path

from autograder import RELEASE_DIR, ROOT, SOURCE_DIR
from autograder.course.model import Grading
from autograder.course.paths import GradingPaths


def configure(c, root: Path = ROOT, grading_dir: Path | None = None) -> None:
    """Fill a traitlets Config ``c`` with the course layout and grading policy."""
    paths = GradingPaths.at(grading_dir, root)
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = "transformers-course"
    c.CourseDirectory.source_directory = SOURCE_DIR
    c.CourseDirectory.release_directory = RELEASE_DIR
    # absolute paths: os.path.join(root, absolute) is the absolute path itself
    c.CourseDirectory.submitted_directory = str(paths.step("submitted"))
    c.CourseDirectory.autograded_directory = str(paths.step("autograded"))
    c.CourseDirectory.feedback_directory = str(paths.step("feedback"))
    c.CourseDirectory.db_url = paths.gradebook_url  # SQLite beside it, or the database grade --db-url recorded
    # only notebooks travel with an assignment; no checkpoints, caches or data dumps
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*"]

    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

    # nbgrader's own Execute (nbgrader validate): its 30 s default is too short for cells that
    # train a model on a CPU (jupyter/nbgrader#915)
    c.Execute.timeout = Grading().cell_timeout
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
