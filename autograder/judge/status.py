"""The grader's note on each submission of a worker: ``<status_dir>/<student>.json``.

Written only by the grader (``JudgedExecute`` and the worker's nbgrader steps), never by a
kernel: the judge's notes and timings, an error, nbgrader's reason for refusing the notebook,
``judged`` once its notebooks were graded and written, ``complete`` once its feedback page was.
"""
from __future__ import annotations

import json
from pathlib import Path


def record_status(status_dir: str | Path, student: str, fresh: bool = False, **fields) -> None:
    """Add ``fields`` to the grader's note on ``student`` (``<status_dir>/<student>.json``),
    or start a new note (``fresh``).  Written only by the grader, never by a kernel."""
    if not status_dir:
        return
    path = Path(status_dir) / f"{student}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {}
    if not fresh:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
    data = data if isinstance(data, dict) else {}
    data.update(fields)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # a reader never sees half a note


def read_status(status_dir: str | Path, student: str) -> dict:
    """The note on ``student`` (empty when there is none or it cannot be read)."""
    try:
        data = json.loads((Path(status_dir) / f"{student}.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
