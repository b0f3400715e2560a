# Sourced by build.sh and test.sh: create .venv and install requirements.txt if
# they changed since the last install.  Works from a clean clone on any Linux
# machine with Python >= 3.11 and access to the Python package index.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "error: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi

VENV="${COURSE_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
# Python's default: a module's bytecode is kept in __pycache__ (git ignores it) and reused. Some
# images set PYTHONDONTWRITEBYTECODE, and then every process (each `python -m autograder`, grading
# process, kernel and page) compiles the course's own modules from source again.
unset PYTHONDONTWRITEBYTECODE

stamp="$VENV/.course-requirements"
want="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== installing requirements.txt into $VENV (first run takes a few minutes)"
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet -r requirements.txt
  # jsonschema imports rfc3987-syntax when it is there (jupyter-events asks for it through an
  # extra), and that compiles 39 Lark grammars on import: 1.6 s of CPU in every process that
  # imports nbformat (each grading worker, each `python -m autograder`, each test subprocess).
  # Nothing here validates the "iri" formats it checks; without it jsonschema skips them.
  python -m pip uninstall --quiet --yes rfc3987-syntax >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi

# Optional: llama-cpp-python, for the LLM lab's llamacpp backend and its tests (skipped without it).
# pip compiles llama.cpp from source: about 11 minutes on two shared cores (docs/LLM_BACKENDS.md).
LLAMACPP_VERSION=0.3.36
if [ "${COURSE_LLAMACPP:-0}" = 1 ] && ! python -c "import llama_cpp" >/dev/null 2>&1; then
  echo "== building llama-cpp-python $LLAMACPP_VERSION (compiles llama.cpp: several minutes)"
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" python -m pip install --quiet "llama-cpp-python==$LLAMACPP_VERSION" ||
    echo "   could not build llama-cpp-python: the llamacpp tests will be skipped"
fi

# >>> instructor only (python -m autograder publish leaves this out of the student course)
# bubblewrap sandboxes student code during grading; install it where we can (root + apt)
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing bubblewrap (the sandbox for grading student code)"
  { apt-get install -y -q bubblewrap || { apt-get update -q && apt-get install -y -q bubblewrap; }; } \
    >/dev/null 2>&1 || echo "   could not install bubblewrap: grading will warn and run without a sandbox"
fi
# PostgreSQL: the tests grade into a real server they start themselves (tests/test_scale.py),
# as departments keep nbgrader's gradebook there; installed where we can, else skipped
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing postgresql (the gradebook server the scale-out tests start)"
  { apt-get install -y -q --no-install-recommends postgresql || \
    { apt-get update -q && apt-get install -y -q --no-install-recommends postgresql; }; } \
    >/dev/null 2>&1 || echo "   could not install postgresql: the PostgreSQL tests will be skipped"
fi
# <<< instructor only

# Debian's chromium opens the built pages in the browser test (tests/test_book_browser.py);
# installed where we can (root + apt), else that test is skipped with a message.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing chromium (the browser test of the built book)"
  { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } \
    >/dev/null 2>&1 || echo "   could not install chromium: the browser test will be skipped"
fi

# MathJax is served from the built book itself, so that math is typeset with no network
# (coursekit/sphinx_book.py copies it into _build/html/_static). It comes from the npm
# registry, pinned, into the virtual environment: nothing fetched lands in the repository.
MATHJAX_VERSION=3.2.2
MATHJAX_PREFIX="$VENV/share/mathjax"
if ! grep -qs "\"version\": \"$MATHJAX_VERSION\"" "$MATHJAX_PREFIX/node_modules/mathjax/package.json"; then
  if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing npm (to fetch MathJax for the book)"
    { apt-get install -y -q npm || { apt-get update -q && apt-get install -y -q npm; }; } >/dev/null 2>&1 || true
  fi
  echo "== installing MathJax $MATHJAX_VERSION into $MATHJAX_PREFIX"
  if ! { command -v npm >/dev/null 2>&1 &&
         npm install --prefix "$MATHJAX_PREFIX" --no-audit --no-fund --silent "mathjax@$MATHJAX_VERSION" >/dev/null 2>&1; }; then
    echo "   could not install MathJax with npm: the book will load it from a CDN (no math offline)"
  fi
fi

# axe-core checks every built page for WCAG 2.1 A/AA violations in the browser test
# (tests/test_book_browser.py injects it into Chromium). Same route as MathJax: pinned, from the
# npm registry, into the virtual environment, never into the repository.
AXE_VERSION=4.14.1
AXE_PREFIX="$VENV/share/axe"
if ! grep -qs "\"version\": \"$AXE_VERSION\"" "$AXE_PREFIX/node_modules/axe-core/package.json"; then
  echo "== installing axe-core $AXE_VERSION into $AXE_PREFIX"
  if ! { command -v npm >/dev/null 2>&1 &&
         npm install --prefix "$AXE_PREFIX" --no-audit --no-fund --silent "axe-core@$AXE_VERSION" >/dev/null 2>&1; }; then
    echo "   could not install axe-core with npm: the accessibility check of the browser test will fail"
  fi
fi

# Book pages draw their figures inline. A kernel that inherits a non-interactive backend
# (MPLBACKEND=Agg) runs plt.show() without showing anything, and the built book then has no
# figure at all; the processes that need Agg choose it themselves (autograder/records/export.py,
# tests/test_book_pages.py), and without a display matplotlib falls back to it anyway.
unset MPLBACKEND
export PYTHONHASHSEED=0
