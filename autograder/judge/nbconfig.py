"""nbgrader configuration for this course (loaded by the root nbgrader_config.py).

The course layout and nbgrader's preprocessor chains.  The grader's workers take their limits
from the run's settings (``JudgedExecute.job``); a plain ``nbgrader autograde`` takes the
assignment's from course.yml (``JudgedExecute._configure``), and ``nbgrader validate`` runs each
cell under course.yml's ``cell_timeout`` (that of the assignments whose notebooks it is given, else
the course-wide one)."""
from __future__ import annotations

import sys
from pathlib import Path

from autograder import RELEASE_DIR, ROOT, SOURCE_DIR
from autograder.course.model import CourseFileError, Grading, load
from autograder.course.paths import GradingPaths, read_alembic_head_in_process


def cell_timeout(root: Path = ROOT, argv: list[str] | None = None) -> int:
    """The cell limit of a plain ``nbgrader validate``: course.yml's, for the assignments whose
    notebooks ``argv`` names (the longest of theirs), else the course-wide one.  A course file
    that cannot be read is one line on stderr, and the built-in limit."""
    try:
        course = load(root)
    except CourseFileError as exc:
        print(f"nbgrader_config.py: {exc} (nbgrader runs with the built-in limits)", file=sys.stderr)
        return Grading().cell_timeout
    named = {Path(arg).stem for arg in (sys.argv if argv is None else argv)[1:] if arg.endswith(".ipynb")}
    limits = [a.grading.cell_timeout for a in course.assignments if a.id in named]
    return max(limits) if limits else course.grading.cell_timeout


def configure(c, root: Path = ROOT, grading_dir: Path | None = None, argv: list[str] | None = None) -> None:
    """Fill a traitlets Config ``c`` with the course layout and grading policy (``argv``: the
    nbgrader command's, for the notebooks it is given)."""
    read_alembic_head_in_process()  # a new gradebook without a 3-4 s `alembic heads` subprocess
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
    c.Execute.timeout = cell_timeout(root, argv)
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
