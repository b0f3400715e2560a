"""A grading job's scratch gradebook: one SQLAlchemy engine for all of nbgrader's openings of
it, commits not synced to disk; every other database opened exactly as nbgrader opens it."""
from __future__ import annotations

import json

from nbgrader import api

from autograder.judge.worker import JOB_FILE, scratch_gradebook_engines


def _patched(monkeypatch) -> None:
    # restored after the test: the patch is meant for a grading process, not this one
    monkeypatch.setattr(api, "create_engine", api.create_engine)
    monkeypatch.setattr(api.Base.metadata, "create_all", api.Base.metadata.create_all)
    scratch_gradebook_engines()


def _synchronous(gb: api.Gradebook) -> int:
    with gb.engine.connect() as con:
        return con.exec_driver_sql("PRAGMA synchronous").scalar()


def test_a_jobs_gradebook_shares_one_engine_and_skips_the_sync(tmp_path, monkeypatch):
    _patched(monkeypatch)
    job = tmp_path / "job"
    job.mkdir()
    (job / JOB_FILE).write_text(json.dumps({}))
    url = f"sqlite:///{job / 'gradebook.db'}"
    with api.Gradebook(url) as first:
        first.add_student("s1")
        engine, synchronous = first.engine, _synchronous(first)
    with api.Gradebook(url) as second:
        assert second.engine is engine
        assert [s.id for s in second.students] == ["s1"]  # the rows are there for the next opening
        assert _synchronous(second) == 0 == synchronous


def test_any_other_database_is_opened_as_nbgrader_opens_it(tmp_path, monkeypatch):
    _patched(monkeypatch)
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"  # no job file beside it: the class record, say
    with api.Gradebook(url) as first:
        first.add_student("s1")
        engine, synchronous = first.engine, _synchronous(first)
    with api.Gradebook(url) as second:
        assert second.engine is not engine
        assert [s.id for s in second.students] == ["s1"]
    assert synchronous != 0  # SQLite's default (FULL): each commit synced


def test_a_new_gradebook_is_stamped_with_alembics_head_without_asking_a_subprocess(tmp_path, monkeypatch):
    """nbgrader stamps each new gradebook with its schema's head revision, found by a subprocess
    (`alembic heads`, 3-4 s); the course's nbgrader configuration reads it from the migration
    scripts instead: the same revision as alembic's, and no `alembic` on PATH is needed."""
    import subprocess

    from nbgrader.dbutil import _temp_alembic_ini
    from traitlets.config import Config

    from autograder.course.paths import alembic_head, nbgrader_env
    from autograder.judge.nbconfig import configure

    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'unused.db'}") as ini:
        said = subprocess.run(["alembic", "-c", ini, "heads"], capture_output=True, text=True, check=True,
                              env=nbgrader_env()).stdout
    assert said.split()[0] == alembic_head()
    monkeypatch.setattr(api, "get_alembic_version", api.get_alembic_version)  # restored after the test
    configure(Config())  # what the course's nbgrader_config.py does in every nbgrader process
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-folder"))
    with api.Gradebook(f"sqlite:///{tmp_path / 'new.db'}") as gb:
        with gb.engine.connect() as con:
            assert con.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == alembic_head()
