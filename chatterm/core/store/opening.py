"""Opening the session database: connection, version check, WAL, migrations.

Contract:
- `connect` opens with explicit transactions (nothing stays open between
  calls) and a busy timeout of BUSY_TIMEOUT_S; read-only opens never create
  or write the file (`immutable`: nor its -shm, for a folder that cannot be
  written).
- `prepare` checks the version before anything writes (a refused file stays
  byte for byte as it was): a newer schema, or an SQLite file that is not a
  chatterm database, is a ChattermError naming the file. A writable database
  is then switched to WAL (retried while another process is opening it) and
  migrated one version per transaction, re-reading the version under the
  write lock, so processes opening it together migrate it once. A current
  database takes no write lock to open: another process's long write does not
  hold up a reader or a turn that can wait for its own write.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from chatterm.core.store.schema import MIGRATIONS, SCHEMA_VERSION
from chatterm.errors import ChattermError

BUSY_TIMEOUT_S = 10.0
"""How long a write waits for another process's write to finish."""


def connect(path: Path, readonly: bool, immutable: bool = False) -> sqlite3.Connection:
    """A connection with explicit transactions and the busy timeout;
    `immutable` (read-only only): SQLite takes no locks and makes no -shm
    file, for a database in a folder that cannot be written and with no
    -wal file (nothing uncommitted: no writer can be there)."""
    if readonly:
        target, uri = path.resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro"), True
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        target, uri = str(path), False
    # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE), so
    # nothing stays open between calls behind the caller's back.
    conn = sqlite3.connect(
        target, uri=uri, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return conn


def prepare(conn: sqlite3.Connection, path: Path, readonly: bool) -> None:
    """Check the version; writable: switch to WAL, enforce foreign keys, migrate."""
    # Check the version before anything that writes (journal_mode=WAL writes
    # the header): a refused file must stay byte for byte as it was. One
    # read transaction, so another process's first migration cannot land
    # between reading the version and counting the tables.
    conn.execute("BEGIN")
    try:
        check_version(conn, path, conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
    if not readonly:
        switch_to_wal(conn)
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn, path)


def switch_to_wal(conn: sqlite3.Connection) -> None:
    # Switching a new file to WAL needs an exclusive lock and SQLite reports
    # "database is locked" at once, without its busy handler, while another
    # process is opening the same file: retry for the busy timeout.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    if str(mode).lower() != "wal":
        raise sqlite3.OperationalError(f"cannot switch to WAL mode (got {mode})")


def check_version(conn: sqlite3.Connection, path: Path, version: int) -> None:
    """Refuse a newer schema, or an SQLite file that is not a chatterm database."""
    if version > SCHEMA_VERSION:
        raise ChattermError(
            f"{path} was written by a newer chatterm (schema v{version}; this one "
            f"knows up to v{SCHEMA_VERSION}); upgrade chatterm or pass --db NEW_FILE"
        )
    if version == 0:
        tables = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
        ).fetchone()[0]
        if tables:
            raise ChattermError(
                f"{path} is an SQLite database but not a chatterm one; "
                "pass --db NEW_FILE to use another file"
            )


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Run the migrations up to SCHEMA_VERSION, each in one transaction."""
    if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return  # current: no write lock to wait for behind another process's write
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have
            # migrated while we waited.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            check_version(conn, path, version)
            if version == SCHEMA_VERSION:
                conn.execute("COMMIT")
                return
            MIGRATIONS[version](conn)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
