"""One writer at a time per assignment.

Every command that changes an assignment's class record or the files it names (``grade``,
``undo``, ``remove``, ``export``, a save of the hand-grading page) holds the assignment's writer
lock while it works; readers (``history``, the hand-grading pages) never wait for it.  A second
writer either refuses at once with one line naming who holds the lock (``RecordBusy``; the
command line exits with status 2) or, asked to (``--wait``), says once that it waits and waits.

The lock is released when its process ends, however it ends, on SQLite and PostgreSQL alike:

* SQLite: an exclusive ``flock`` on a file in the scratch folder beside the gradebook
  (``runs/.gradebook.db.<assignment>.lock``), which the kernel releases when the process dies.  The
  file holds who took it (pid, host, command, since when) and is removed when the lock is given
  back; a file left behind by a killed process is taken over with a line saying so.
* PostgreSQL: a session advisory lock (``pg_try_advisory_lock``) on a connection held open for
  the whole command, with the holder's pid, host and command in the connection's
  ``application_name`` (so another host sees who holds it).  The server releases it when the
  connection ends; a lock still held for a process of this host that is gone (its connection not
  yet noticed dead) is taken over (``pg_terminate_backend``) with a line saying so.

The lock is re-entrant within one thread (``undo`` rebuilds the exports under its own lock).

A grading folder has one database at a time (``gradebook.db``, or the one ``grade --db-url``
recorded in ``gradebook.url``): a ``grade`` run holds the folder's database (``using_database``: a
shared ``flock`` on ``runs/.database.lock``) from before it reads it until it ends, and a ``grade
--db-url`` that names another database changes it only while no other command holds it (an exclusive
``flock``): it refuses with one line (``DatabaseInUse``), or with ``--wait`` waits.  Otherwise a run
would commit to one database and export its files from the other.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import re
import socket
import sys
import threading
import time
import zlib
from pathlib import Path

from autograder.course.paths import GradingPaths, sqlite_path
from autograder.records.gradebook import shown

# Imports inside functions: SQLAlchemy is imported where a PostgreSQL lock is taken: a SQLite record (a lock
# file) never loads it.

POLL_S = 0.5
_PG_CLASS = 0x436F7572  # "Cour": the first key of every advisory lock of the course
_held = threading.local()


class RecordBusy(RuntimeError):
    """Another command holds the assignment's writer lock (one line naming it)."""

    def __init__(self, assignment: str, holder: str):
        super().__init__(f"the class record of {assignment} is being changed by another command: {holder}; "
                         f"run this one again when it has finished, or with --wait to wait for it")
        self.assignment, self.holder = assignment, holder


class DatabaseInUse(RuntimeError):
    """Another command works in the grading folder: its database cannot change now (one line)."""

    def __init__(self, root: Path, url: str):
        super().__init__(f"another command works in the grading folder {root} with its database "
                         f"{shown(GradingPaths(root).gradebook_url)}: --db-url {shown(url)} would change it under "
                         "that command; run this one again when it has finished, or with --wait to wait for it")


def _me(command: str) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
            "since": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z"),
            "thread": threading.get_ident()}


def describe(holder: dict | None) -> str:
    if not holder:
        return "a command that is starting"
    return (f"{holder.get('command') or 'a command'} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            f"since {holder.get('since', '?')})")


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True
    return True


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def writing(url: str, assignment: str, command: str, wait: bool = False, say=_say):
    """Hold ``assignment``'s writer lock of the gradebook at ``url`` while the block runs.
    Raises RecordBusy when another command holds it and ``wait`` is false; with ``wait``,
    says once (``say``) whom it waits for, and waits."""
    key = (url, assignment)
    depth = getattr(_held, "depth", None)
    if depth is None:
        depth = _held.depth = {}
    if depth.get(key):  # this thread holds it already
        depth[key] += 1
        try:
            yield
        finally:
            depth[key] -= 1
        return
    lock = _FileLock(url, assignment) if sqlite_path(url) is not None else _PgLock(url, assignment)
    waited = False
    while True:
        holder = lock.try_take(_me(command), say)
        if holder is None:
            break
        if not wait:
            lock.close()
            raise RecordBusy(assignment, describe(holder))
        if not waited:
            say(f"waiting for {describe(holder)} to finish with the class record of {assignment} "
                "(Ctrl-C stops waiting; nothing is written meanwhile)")
            waited = True
        time.sleep(POLL_S)
    depth[key] = 1
    try:
        yield
    finally:
        depth.pop(key, None)
        lock.give_back()


def holder(url: str, assignment: str) -> dict | None:
    """Who holds ``assignment``'s writer lock now (None: nobody), for messages and tests."""
    lock = _FileLock(url, assignment) if sqlite_path(url) is not None else _PgLock(url, assignment)
    try:
        return lock.holder()
    finally:
        lock.close()


@contextlib.contextmanager
def using_database(root: Path, url: str | None = None, wait: bool = False, say=_say):
    """Hold the database of the grading folder ``root`` while the block runs (other commands hold
    it beside this one); yields its URL.  With ``url`` naming another database than the folder's,
    first make that one the folder's database: only while no other command holds it (else
    DatabaseInUse; with ``wait``, says once that it waits, and waits)."""
    paths = GradingPaths(Path(root))
    lock = paths.runs / ".database.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = False
        # (asked again while waiting: a run started beside this one may make the same change first)
        while url and url.strip() != paths.gradebook_url:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while another command writes the folder's URL
                if url.strip() == paths.gradebook_url:
                    break  # that command made this very change
                if not wait:
                    raise DatabaseInUse(paths.root, url) from None
                fcntl.flock(fd, fcntl.LOCK_UN)
                if not waited:
                    say(f"waiting for the other commands in the grading folder {paths.root} to finish before "
                        "changing its database (Ctrl-C stops waiting; nothing is written meanwhile)")
                    waited = True
                time.sleep(POLL_S)
                continue
            paths.record_url(url)
        fcntl.flock(fd, fcntl.LOCK_SH)  # from exclusive to shared, or shared beside the others
        yield paths.gradebook_url
    finally:
        os.close(fd)  # gives the lock back (and so does the process's end, however it ends)


# ----------------------------------------------------------------------------- SQLite: a lock file

class _FileLock:
    def __init__(self, url: str, assignment: str):
        db = sqlite_path(url)
        # in runs/ (scratch, never part of the record) beside the gradebook
        self.path = db.parent / "runs" / f".{db.name}.{re.sub(r'[^A-Za-z0-9_.-]', '_', assignment)}.lock"
        self.fd: int | None = None

    def try_take(self, me: dict, say) -> dict | None:
        """None when taken; else who holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                return self.holder() or {}
            try:  # the file may have been given back (removed) between our open and our flock
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            left = _read_json(os.pread(fd, 1 << 16, 0))
            if left:  # its process ended without giving the lock back (killed)
                say(f"taking over the writer lock of {describe(left)}: that process has ended")
            data = json.dumps(me).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
            self.fd = fd
            return None

    def holder(self) -> dict | None:
        try:
            return _read_json(self.path.read_bytes())
        except FileNotFoundError:
            return None

    def give_back(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # still ours: nobody else can hold it while we do
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None

    close = give_back


def _read_json(data: bytes) -> dict | None:
    try:
        value = json.loads(data.decode("utf-8", "replace")) if data.strip() else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# ----------------------------------------------------------------------------- PostgreSQL: an advisory lock

class _PgLock:
    def __init__(self, url: str, assignment: str):
        import sqlalchemy as sa
        from sqlalchemy.pool import NullPool

        self.sa = sa
        self.engine = sa.create_engine(url, poolclass=NullPool, future=True)
        self.conn = None
        self.key = zlib.crc32(assignment.encode()) & 0x7FFFFFFF

    def _connect(self):
        if self.conn is None:
            self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self.conn

    def try_take(self, me: dict, say) -> dict | None:
        conn = self._connect()
        # PostgreSQL keeps 63 bytes of it: the command last, where a cut costs least
        name = f"ag|{me['pid']}|{int(time.time())}|{me['host'][:16]}|{me['command']}".encode()[:63]
        conn.execute(self.sa.text("SELECT set_config('application_name', :v, false)"),
                     {"v": name.decode("utf-8", "ignore")})
        if conn.execute(self.sa.text("SELECT pg_try_advisory_lock(:a, :b)"), {"a": _PG_CLASS, "b": self.key}).scalar():
            return None
        held, backend = self._holder()
        if held and held.get("host") == me["host"] and not _alive(held.get("pid")) and backend:
            say(f"taking over the writer lock of {describe(held)}: that process has ended")
            conn.execute(self.sa.text("SELECT pg_terminate_backend(:p)"), {"p": backend})
            for _ in range(20):
                if conn.execute(self.sa.text("SELECT pg_try_advisory_lock(:a, :b)"),
                                {"a": _PG_CLASS, "b": self.key}).scalar():
                    return None
                time.sleep(0.1)
        return held or {}

    def _holder(self) -> tuple[dict | None, int | None]:
        row = self._connect().execute(self.sa.text(
            "SELECT a.application_name, a.pid, a.backend_start FROM pg_locks l JOIN pg_stat_activity a "
            "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
            "AND l.classid::bigint = :a AND l.objid::bigint = :b"), {"a": _PG_CLASS, "b": self.key}).first()
        if row is None:
            return None, None
        try:
            tag, pid, since, host, command = (row[0] or "").split("|", 4)
            if tag != "ag":
                raise ValueError(row[0])
            since = int(since)
            return {"pid": pid, "host": host, "command": command,
                    "since": dt.datetime.fromtimestamp(since).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")}, row[1]
        except (ValueError, TypeError):
            return {"command": f"database session {row[1]}", "pid": "?", "host": "the database server",
                    "since": str(row[2])[:19]}, row[1]

    def holder(self) -> dict | None:
        return self._holder()[0]

    def give_back(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.execute(self.sa.text("SELECT pg_advisory_unlock(:a, :b)"), {"a": _PG_CLASS, "b": self.key})
        self.close()

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None
        self.engine.dispose()
