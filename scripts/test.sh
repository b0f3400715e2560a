#!/usr/bin/env bash
# Set up what is needed, then run the whole test suite (pytest + nbval + nbgrader checks).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python -m pytest -ra --durations=15 "$@"
