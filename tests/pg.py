"""A throwaway PostgreSQL server for the tests of the class record, and the ``db`` fixture that
runs a test on SQLite and on PostgreSQL.

One server per test process (``postgres_server``, started on first use, on a Unix socket in a
short folder under /tmp, stopped at the end); every module or test that asks gets a database of
its own on it (``postgres``: one per module; ``Db.fresh``: one per call).  Without the
PostgreSQL binaries (``initdb``, ``pg_ctl``, ``createdb``) the PostgreSQL cases skip, saying why.

A test module takes the fixtures by importing them::

    from pg import db, postgres, postgres_server  # noqa: F401 - fixtures

``db`` is SQLite unless a test is marked ``ON_BOTH`` (parametrised ``sqlite`` / ``postgresql``); a
test whose id names ``postgresql`` is in the ``scale`` tier whatever its module's tier
(``conftest.tier_of``), as PostgreSQL is.
"""
from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest


def postgres_bin() -> Path | None:
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    return Path(found).resolve().parent if found else None  # createdb and pg_ctl sit beside it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    bindir: Path
    base: Path          # the socket's folder and the data folder's parent
    port: int
    as_user: list
    _names = itertools.count(1)

    def url(self, name: str) -> str:
        return f"postgresql://grader@/{name}?host={self.base}&port={self.port}"

    def createdb(self, template: str | None = None) -> str:
        """A new, empty database (or a copy of the database ``template``): its URL."""
        name = f"gb{os.getpid()}_{next(self._names)}"
        subprocess.run([*self.as_user, str(self.bindir / "createdb"), "-h", str(self.base), "-p", str(self.port),
                        "-U", "grader", *(["-T", template] if template else []), name], check=True,
                       capture_output=True)
        return self.url(name)


@pytest.fixture(scope="session")
def postgres_server():
    """The test process's PostgreSQL server (skips when PostgreSQL is not installed)."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (scripts/env.sh installs it when run as root with apt)")
    base = Path(tempfile.mkdtemp(prefix="pg", dir="/tmp"))  # a short path: Unix sockets allow ~100 bytes
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        try:
            shutil.chown(base, "postgres")
        except LookupError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(base / "data"), "-A", "trust", "-U", "grader"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-w", "-l", str(base / "log"),
                    "-o", f"-k {base} -p {port} -c listen_addresses=''", "start"], check=True, capture_output=True)
    try:
        yield Server(bindir, base, port, as_user)
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres(postgres_server):
    """A fresh database of the throwaway server, for one test module: its URL."""
    return postgres_server.createdb()


def dump(url: str) -> dict:
    """Every row of every table of the database at ``url``, in a fixed order."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            meta = sa.MetaData()
            meta.reflect(conn)
            return {name: sorted(map(repr, conn.execute(sa.select(table)).all()))
                    for name, table in sorted(meta.tables.items())}
    finally:
        engine.dispose()


def recorded_url(grading: Path) -> str | None:
    """The PostgreSQL URL a grading folder's record lives in (``gradebook.url``), or None (SQLite)."""
    path = Path(grading) / "gradebook.url"
    return path.read_text().strip() if path.exists() else None


@dataclass
class Db:
    """Where a test's class record lives: SQLite (the grading folder's gradebook.db) or a
    database of the throwaway PostgreSQL server."""
    kind: str
    server: Server | None = None

    def __str__(self) -> str:
        return self.kind

    @property
    def postgresql(self) -> bool:
        return self.kind == "postgresql"

    def args(self) -> list[str]:
        """The command line's words that put a new grading folder's record here."""
        return ["--db-url", self.server.createdb()] if self.postgresql else []

    def url(self, grading: Path) -> str:
        """The URL of the record of ``grading`` (after a first command on it)."""
        return recorded_url(grading) or f"sqlite:///{Path(grading) / 'gradebook.db'}"

    def copy(self, source: Path, target: Path) -> Path:
        """A copy of the grading folder ``source`` in ``target``; on PostgreSQL its database is
        copied too (``CREATE DATABASE ... TEMPLATE``) and the copy's gradebook.url names the copy."""
        shutil.copytree(source, target)
        old = recorded_url(source)
        if old is not None:
            template = old.split("/", 3)[3].split("?", 1)[0]
            (Path(target) / "gradebook.url").write_text(self.server.createdb(template) + "\n")
        return Path(target)


@pytest.fixture(scope="module")
def db(request) -> Db:
    """Where the class record of a test's grading folder lives: SQLite, unless the test is
    marked ``ON_BOTH`` (then SQLite, and a database of the throwaway PostgreSQL server).
    Module-scoped, so that a module's graded class is graded once per database."""
    if getattr(request, "param", "sqlite") == "sqlite":
        return Db("sqlite")
    return Db("postgresql", request.getfixturevalue("postgres_server"))


# a test (or a class of tests) run on SQLite and on PostgreSQL: ``@ON_BOTH`` with ``db`` among its fixtures
# (directly or through a fixture of its module that takes it)
ON_BOTH = pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)


def state_of_database(grading: Path) -> dict:
    """A PostgreSQL record's rows, as one entry of a grading folder's state (``{}`` on SQLite,
    where the record is the file gradebook.db that the state hashes anyway)."""
    import hashlib

    url = recorded_url(grading)
    return {"<postgresql>": hashlib.sha256(repr(dump(url)).encode()).hexdigest()} if url else {}
