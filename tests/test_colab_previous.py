"""The Colab tier on the previous runtime (the one before today's in tests/colab_runtimes/, which
Colab lets a student pin: Python 3.12, numpy 2.0): the same checks as tests/test_colab.py for the
setup cell, the solved exercises and the pages that import peft (both clashes of issue 33 live in
this runtime too; the other pages meet the same packages as today, numpy aside, and each takes
minutes). A module of its own, so that the suite's two workers share the tier."""
from __future__ import annotations

import pytest

from colab_runtime import snapshots
from colab_tier import close_kernel, course_in, pages_meeting_colab_packages, publish_course
from test_colab import pytest_generate_tests, test_a_book_page_runs  # noqa: F401
from test_colab import test_a_solved_exercise_is_ready_to_hand_in  # noqa: F401
from test_colab import test_the_setup_cell_changes_none_of_colabs_packages  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.colab]

PREVIOUS = snapshots()[1]
PAGES = pages_meeting_colab_packages(libraries=("peft",), loaders=False)


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    install = course_in(PREVIOUS, publish_course(tmp_path_factory.mktemp("colab-previous") / "course"))
    yield install
    close_kernel(install)
