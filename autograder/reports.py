"""Grade exports for LMSs and two plots an instructor looks at first."""
from __future__ import annotations

import csv
from pathlib import Path


def _roster_ids(out_dir: Path) -> dict:
    """student id -> LMS fields, when ``collect`` left a roster map beside the reports."""
    path = out_dir / "lms_ids.csv"
    if not path.exists():
        return {}
    with open(path, newline="") as fh:
        return {row["student_id"]: row for row in csv.DictReader(fh)}


def write_reports(report, max_points: float, released_nb) -> dict[str, Path]:
    """Write grades.csv, canvas.csv, moodle.csv, histogram.png and pass_rates.png."""
    out = report.out_dir
    results = sorted(report.results, key=lambda r: r.student_id)
    paths = {"grades": out / "grades.csv", "canvas": out / "canvas.csv", "moodle": out / "moodle.csv",
             "histogram": out / "histogram.png", "pass_rates": out / "pass_rates.png"}

    with open(paths["grades"], "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["student_id", "file", "score", "max_score", "percent", "status", "message"])
        for r in results:
            w.writerow([r.student_id, r.file, f"{r.score:g}", f"{r.max_score:g}", f"{r.percent:.1f}",
                        r.status, r.message])

    lms = _roster_ids(out)
    real = [r for r in results if not r.student_id.startswith("?") and "(duplicate)" not in r.student_id]
    # Canvas gradebook import: Student, ID, SIS User ID, SIS Login ID, Section, then one
    # column per assignment; the second row holds the points possible.
    column = f"{report.assignment}"
    with open(paths["canvas"], "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", column])
        w.writerow(["    Points Possible", "", "", "", "", f"{max_points:g}"])
        for r in real:
            row = lms.get(r.student_id, {})
            w.writerow([row.get("name", r.student_id), row.get("lms_id", ""), r.student_id,
                        row.get("login", ""), row.get("section", ""), f"{r.score:g}"])
    # Moodle gradebook import (Grades > Import > CSV): map "ID number" to the user field
    # and the grade and feedback columns to the assignment's grade item.
    with open(paths["moodle"], "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["ID number", "Email address", column, f"{column} feedback"])
        for r in real:
            row = lms.get(r.student_id, {})
            w.writerow([r.student_id, row.get("email", ""), f"{r.score:g}",
                        r.message or "graded automatically"])

    _plots(report, max_points, released_nb, paths)
    return paths


def _plots(report, max_points, released_nb, paths) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = [r.score for r in report.results]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bins = min(30, int(max_points) + 1) if max_points else 10
    ax.hist(scores, bins=bins, range=(0, max_points or 1), color="#4c72b0", edgecolor="white")
    ax.set_xlabel(f"score (points, out of {max_points:g})")
    ax.set_ylabel("submissions")
    ax.set_title(f"{report.assignment}: score distribution (n = {len(scores)})")
    fig.tight_layout()
    fig.savefig(paths["histogram"], dpi=110)
    plt.close(fig)

    tests = [c.metadata["nbgrader"]["grade_id"] for c in released_nb.cells
             if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
    graded = [r for r in report.results if r.status == "graded"]
    rates = []
    for gid in tests:
        got = [r.tests.get(gid) for r in graded if gid in r.tests]
        rates.append(sum(1 for s, m in got if m and s >= m) / len(got) if got else 0.0)
    fig, ax = plt.subplots(figsize=(7, 0.4 * max(len(tests), 3) + 1.2))
    ax.barh(tests[::-1], [100 * x for x in rates[::-1]], color="#55a868")
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"students with full points on the test (%, n = {len(graded)} graded)")
    ax.set_title(f"{report.assignment}: pass rate per test")
    fig.tight_layout()
    fig.savefig(paths["pass_rates"], dpi=110)
    plt.close(fig)
