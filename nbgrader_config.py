# nbgrader reads this file from the course directory (the repository root).
# The settings live in the importable package so the command line and the tests share them.
from autograder.judge.nbconfig import configure

configure(get_config())  # noqa: F821  (get_config is injected by traitlets)
