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

stamp="$VENV/.course-requirements"
want="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== installing requirements.txt into $VENV (first run takes a few minutes)"
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet -r requirements.txt
  echo "$want" > "$stamp"
fi

# bubblewrap sandboxes student code during grading; install it where we can (root + apt)
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing bubblewrap (the sandbox for grading student code)"
  { apt-get install -y -q bubblewrap || { apt-get update -q && apt-get install -y -q bubblewrap; }; } \
    >/dev/null 2>&1 || echo "   could not install bubblewrap: grading will warn and run without a sandbox"
fi

# Offline by default here: the hub is reached only where a notebook asks for it.
export MPLBACKEND="${MPLBACKEND:-Agg}"
export PYTHONHASHSEED=0
