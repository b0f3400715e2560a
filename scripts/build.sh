#!/usr/bin/env bash
# Install everything, regenerate the student notebooks, build the book with executed pages.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
if [ -d solutions ]; then  # the instructor's course; the published student course has no solutions/
  echo "== regenerating exercises/ from solutions/ (and every link from course.yml)"
  python -m autograder release
fi
echo "== building the book (executed pages, cached in .jupyter_cache) into _build/html"
jupyter-book build . --warningiserror --keep-going
echo "== done: open _build/html/index.html"
