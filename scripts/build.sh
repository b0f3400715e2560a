#!/usr/bin/env bash
# Install everything, regenerate the student notebooks, build the book with executed pages.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
echo "== regenerating exercises/ from solutions/"
python -m autograder release
echo "== building the book (executed pages, cached in .jupyter_cache) into _build/html"
jupyter-book build . --warningiserror --keep-going
echo "== done: open _build/html/index.html"
