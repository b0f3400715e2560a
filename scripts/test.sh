#!/usr/bin/env bash
# Set up what is needed, then run the whole test suite (pytest + nbval + nbgrader checks).
# Two pytest-xdist workers (COURSE_TEST_WORKERS to change it; 0 runs in this process): most
# tests wait on one kernel at a time, so two keep a 2-core machine busy.  The book's pages and
# the tests that need them stay together on one worker (tests/conftest.py).
# `--fast` runs only the tier that needs no kernel, sandbox, book, model or Colab runtime (README:
# "Test tiers"); other arguments go to pytest, e.g. -m "sandbox or assignments" picks other tiers.
fast=()
if [ "${1:-}" = "--fast" ]; then
  shift
  fast=(-m fast tests)
fi
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python -m pytest -n "${COURSE_TEST_WORKERS:-2}" -ra --durations=15 "${fast[@]}" "$@"
