"""The session store: every session and turn, durably, in one SQLite file.

Contract:
- `SessionStore(path)` opens (creating when needed) the database read-write;
  `SessionStore(path, readonly=True)` never creates, migrates or writes it (a
  missing file reads as an empty store). Export and `chatterm sessions` use the
  read-only form, so they never change the database.
- `record_turn` commits the turn in one transaction before it returns: a
  process killed afterwards (SIGKILL included) keeps it; a turn whose commit
  had not finished is absent, never half there. Cancelled and failed turns are
  recorded like the others; `TurnMetrics.stop_reason` marks them.
- A write the database refuses (read-only file or folder, disk full, I/O
  error, locked past the busy timeout) never raises: `create_session` and
  `record_turn` return None, the transaction is rolled back (nothing half
  written), `write_error` keeps the first reason and `take_write_notice()`
  hands the user-facing line out once. Later writes are still tried (a disk
  that was full may have room again). Misuse (a read-only store, an unknown or
  closed session store) still raises `ChattermError`.
- Several processes may use one database at once: WAL mode lets readers run
  beside the writer, writers wait for each other (busy timeout) and take the
  write lock before computing the next turn index, so indexes never collide.
- One connection per store, shared by the caller's threads behind a lock
  (the TUI records turns from a worker thread).
- The schema is versioned with `PRAGMA user_version`; `_MIGRATIONS[n]` brings a
  database from version n to n + 1 and runs in one transaction. A database
  from a newer chatterm, one that is not a chatterm database, or a corrupt file
  is refused with a `ChattermError` naming the file, and left untouched; so is
  a path that is a directory (one message, whatever the mode).
- Turns have one column per `TURN_FIELDS` name (derived `decode_tok_s` and
  `cost_usd` included, so SQL queries need no formulas). Reading tolerates an
  older schema opened read-only: a missing column reads as the field's default.
- Turn indexes count from 1 within a session.
"""

from __future__ import annotations

import numbers
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from chatterm.core.metrics.turn_metrics import TURN_FIELDS, TurnMetrics, percentile
from chatterm.errors import ChattermError

BUSY_TIMEOUT_S = 10.0
"""How long a write waits for another process's write to finish."""

_ENVIRONMENT_ERRORS = ("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_READONLY", "SQLITE_PERM")
"""SQLite errors that say nothing against the database file itself."""

_METRIC_FIELDS = {f.name for f in fields(TurnMetrics)}
_BOOL_FIELDS = {f.name for f in fields(TurnMetrics) if f.type in ("bool", bool)}
_FIELD_DEFAULTS = {f.name: f.default for f in fields(TurnMetrics) if f.default is not MISSING}
"""What a column an older database lacks reads as (derived fields: None)."""


def _sql_value(value: object) -> object:
    """A plain value for sqlite3. Engines may hand over numpy or ctypes numbers,
    which sqlite3 would silently store as BLOBs (they support the buffer protocol)."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if callable(getattr(value, "item", None)):  # numpy scalar -> Python scalar
        value = value.item()
        if value is None or isinstance(value, (str, int, float)):
            return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


@dataclass(frozen=True)
class SessionInfo:
    id: int
    started_at: float
    """Unix time (s) the session was created."""
    model_id: str
    model_identity: str
    """The exact model: file sha256, or server + model name."""
    engine: str
    device: str
    persona_id: str
    turns: int
    ttft_p50_ms: float | None
    cost_usd: float
    """Sum of the turns' API-equivalent cost."""


@dataclass(slots=True)
class TurnRecord:
    index: int
    """1 for the session's first turn."""
    user_text: str
    reply: str
    """The reply as streamed: partial for a cancelled turn, maybe empty on error."""
    metrics: TurnMetrics


# -- schema ------------------------------------------------------------------
# Migrations are written out in full and never edited once released: a new
# TurnMetrics field needs a new migration (tests/core/store/test_store.py checks that every
# TURN_FIELDS name has a column).


def _to_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            started_at REAL NOT NULL,
            model_id TEXT NOT NULL,
            model_identity TEXT NOT NULL,
            engine TEXT NOT NULL,
            device TEXT NOT NULL,
            persona_id TEXT NOT NULL
        )"""
    )
    # Metric columns are nullable on purpose: a turn must be stored even when
    # an engine left a field unset.
    conn.execute(
        """
        CREATE TABLE turns (
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            turn_index INTEGER NOT NULL,
            recorded_at REAL NOT NULL,
            user_text TEXT NOT NULL,
            reply TEXT NOT NULL,
            engine TEXT,
            model_id TEXT,
            persona_id TEXT,
            submitted_at REAL,
            price_profile TEXT,
            cache_outcome TEXT,
            cache_detail TEXT,
            restore_ms REAL,
            prefill_ms REAL,
            prompt_tokens INTEGER,
            cached_tokens INTEGER,
            prefilled_tokens INTEGER,
            generated_tokens INTEGER,
            ttft_ms REAL,
            decode_ms REAL,
            total_ms REAL,
            stop_reason TEXT,
            error TEXT,
            dropped_turns INTEGER,
            tokens_estimated INTEGER,
            cost_input_usd REAL,
            cost_cached_input_usd REAL,
            cost_output_usd REAL,
            saved_prefill_ms REAL,
            saved_usd REAL,
            decode_tok_s REAL,
            cost_usd REAL
        )"""
    )


def _to_v2(conn: sqlite3.Connection) -> None:
    # v2: GPU energy per turn, and an index that makes per-session reads and
    # the next-index lookup cheap while also forbidding duplicate indexes.
    conn.execute("ALTER TABLE turns ADD COLUMN energy_wh REAL")
    conn.execute("ALTER TABLE turns ADD COLUMN energy_cost_usd REAL")
    conn.execute("CREATE UNIQUE INDEX turns_by_session ON turns(session_id, turn_index)")


def _to_v3(conn: sqlite3.Connection) -> None:
    # v3: the conversation as messages, one row per user or assistant message.
    # A view, not a table: the texts live once, in `turns`, next to the
    # metrics of the turn they belong to, so the two can never disagree.
    conn.execute(
        """
        CREATE VIEW messages AS
            SELECT session_id, turn_index, 0 AS position, 'user' AS role,
                   user_text AS content, submitted_at AS created_at
              FROM turns
            UNION ALL
            SELECT session_id, turn_index, 1, 'assistant', reply, recorded_at
              FROM turns
            ORDER BY session_id, turn_index, position"""
    )


def _to_v4(conn: sqlite3.Connection) -> None:
    # v4: indexes for big databases (benchmarks/store_load.py, 100,000 turns).
    # `chatterm sessions` counts and sums every session's turns and reads their
    # TTFTs: an index holding exactly (session_id, cost_usd, ttft_ms) lets SQLite
    # answer from it ("USING COVERING INDEX") instead of reading every turn row
    # with its texts (about 40x less data read).
    conn.execute("CREATE INDEX turns_summary ON turns(session_id, cost_usd, ttft_ms)")
    # Newest first (the listing, `--resume` latest): read in index order, no sort.
    conn.execute("CREATE INDEX sessions_by_start ON sessions(started_at, id)")


def _to_v5(conn: sqlite3.Connection) -> None:
    # v5: type-ahead prefill, reported beside TTFT (which it is not part of).
    conn.execute("ALTER TABLE turns ADD COLUMN ahead_tokens INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE turns ADD COLUMN ahead_ms REAL NOT NULL DEFAULT 0")


def _to_v6(conn: sqlite3.Connection) -> None:
    # v6: the time a turn waited for the engine (part of its TTFT), and whether
    # its restore happened at the persona switch (not part of it). Older turns
    # read as no wait and an in-turn restore: nothing recorded says otherwise.
    conn.execute("ALTER TABLE turns ADD COLUMN wait_ms REAL NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE turns ADD COLUMN restore_at_switch INTEGER NOT NULL DEFAULT 0")


_MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _to_v1, _to_v2, _to_v3, _to_v4, _to_v5, _to_v6,
)
SCHEMA_VERSION = len(_MIGRATIONS)


def _metrics_of(names: list[str], rows: Iterable[Sequence]) -> list[TurnMetrics]:
    """Rows of metric columns (`names`, all TurnMetrics fields) as TurnMetrics."""
    bools = [i for i, name in enumerate(names) if name in _BOOL_FIELDS]
    metrics = []
    for row in rows:
        values = list(row)
        for i in bools:
            values[i] = bool(values[i])
        metrics.append(TurnMetrics(**dict(zip(names, values, strict=True))))
    return metrics


class SessionStore:
    """Sessions and turns in one SQLite file. See the module contract."""

    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()  # re-entered by writes inside batch()
        self._batch = False
        self._conn: sqlite3.Connection | None = None
        self._turn_columns: set[str] = set()
        """Empty when there is no schema yet (a missing or new file opened read-only)."""
        self._closed = False
        self.write_error: str | None = None
        """Why the first refused write failed (None while every write succeeded)."""
        self._notice_given = False
        if self.path.is_dir():
            # Checked first: SQLite's words for a folder depend on the mode
            # ("disk I/O error" read-only, "unable to open database file" else).
            raise ChattermError(
                f"{self.path} is a directory, not a database file; pass --db {self.path / 'chatterm.db'} "
                "to keep the database in it"
            )
        if readonly and not self.path.exists():
            return  # nothing stored yet; reading gives empty results
        try:
            self._conn = self._connect()
            self._prepare()
        except sqlite3.Error as exc:
            self.close()
            name = getattr(exc, "sqlite_errorname", "")
            if name.startswith(_ENVIRONMENT_ERRORS):
                # The file may be fine: the disk or the folder is the problem.
                raise ChattermError(
                    f"cannot open {self.path}: {exc} (is the disk full, or the file or its folder read-only?)"
                ) from None
            raise ChattermError(
                f"{self.path} is not a usable chatterm database ({exc}); "
                "move it away, or pass --db NEW_FILE to start a fresh one"
            ) from None
        except OSError as exc:
            self.close()
            raise ChattermError(f"cannot open {self.path}: {exc.strerror or exc}") from None
        except BaseException:
            self.close()
            raise

    # -- opening ------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            target, uri = self.path.resolve().as_uri() + "?mode=ro", True
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            target, uri = str(self.path), False
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE), so
        # nothing stays open between calls behind the caller's back.
        conn = sqlite3.connect(
            target, uri=uri, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        return conn

    def _prepare(self) -> None:
        conn = self._conn
        assert conn is not None
        # Check the version before anything that writes (journal_mode=WAL writes
        # the header): a refused file must stay byte for byte as it was. One
        # read transaction, so another process's first migration cannot land
        # between reading the version and counting the tables.
        conn.execute("BEGIN")
        try:
            self._check_version(conn.execute("PRAGMA user_version").fetchone()[0])
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
        if not self.readonly:
            self._switch_to_wal()
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        self._turn_columns = {row[1] for row in conn.execute("PRAGMA table_info(turns)")}

    def _switch_to_wal(self) -> None:
        conn = self._conn
        assert conn is not None
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

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise ChattermError(
                f"{self.path} was written by a newer chatterm (schema v{version}; this one "
                f"knows up to v{SCHEMA_VERSION}); upgrade chatterm or pass --db NEW_FILE"
            )
        if version == 0 and self._conn is not None:
            tables = self._conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
            ).fetchone()[0]
            if tables:
                raise ChattermError(
                    f"{self.path} is an SQLite database but not a chatterm one; "
                    "pass --db NEW_FILE to use another file"
                )

    def _migrate(self) -> None:
        conn = self._conn
        assert conn is not None
        while True:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-read under the write lock: another process may have
                # migrated while we waited.
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                self._check_version(version)
                if version == SCHEMA_VERSION:
                    conn.execute("COMMIT")
                    return
                _MIGRATIONS[version](conn)
                conn.execute(f"PRAGMA user_version = {version + 1}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    # -- writing ------------------------------------------------------------
    def create_session(
        self,
        *,
        model_id: str,
        model_identity: str,
        engine: str,
        device: str,
        persona_id: str,
        started_at: float | None = None,
    ) -> int | None:
        """Create a session row and return its id (`started_at` defaults to now);
        None when the database refused the write (see `write_error`)."""
        values = (
            time.time() if started_at is None else started_at,
            model_id,
            model_identity,
            engine,
            device,
            persona_id,
        )

        def insert(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO sessions (started_at, model_id, model_identity, engine, device, "
                "persona_id) VALUES (?, ?, ?, ?, ?, ?)",
                values,
            )
            return int(cur.lastrowid)

        return self._write("could not create a session", insert)

    def record_turn(self, session_id: int, user_text: str, reply: str, metrics: TurnMetrics) -> int | None:
        """Commit one turn (all its metrics) and return its index in the session;
        None when the database refused the write (see `write_error`)."""
        data = metrics.to_dict()

        def insert(conn: sqlite3.Connection) -> int:
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                raise ChattermError(f"unknown session {session_id} in {self.path}")
            # The write lock is held (BEGIN IMMEDIATE), so no other process can
            # take the same index between this read and the insert.
            index = conn.execute(
                "SELECT COALESCE(MAX(turn_index), 0) + 1 FROM turns WHERE session_id = ?",
                (session_id,),
            ).fetchone()[0]
            names = ["session_id", "turn_index", "recorded_at", "user_text", "reply", *TURN_FIELDS]
            values = [
                session_id, index, time.time(), user_text, reply, *(_sql_value(data[k]) for k in TURN_FIELDS)
            ]
            conn.execute(
                f"INSERT INTO turns ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                values,
            )
            return int(index)

        return self._write(f"could not save a turn of session {session_id}", insert)

    def _write(self, what: str, action: Callable[[sqlite3.Connection], int]) -> int | None:
        if self.readonly:
            raise ChattermError(f"{self.path} is open read-only; {what}")
        with self._lock:
            conn = self._require()
            if self._batch:
                return action(conn)  # inside batch(): its one transaction commits
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = action(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        try:
                            conn.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass  # SQLite has already rolled back (e.g. after SQLITE_FULL)
                    raise
            except (sqlite3.Error, OSError) as exc:
                if self.write_error is None:
                    self.write_error = f"{self.path}: {what}: {exc}"
                return None
            return result

    @contextmanager
    def batch(self) -> Iterator["SessionStore"]:
        """Run many writes as one transaction (bulk loads: one commit instead of one
        per turn). Any error rolls the whole batch back and is raised."""
        if self.readonly:
            raise ChattermError(f"{self.path} is open read-only; cannot write a batch")
        with self._lock:
            conn = self._require()
            conn.execute("BEGIN IMMEDIATE")
            self._batch = True
            try:
                yield self
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")
            finally:
                self._batch = False

    def take_write_notice(self) -> str | None:
        """The line telling the user that turns are not being stored, once (None
        before any write failed, and after the line was taken)."""
        if self.write_error is None or self._notice_given:
            return None
        self._notice_given = True
        return f"Turns are no longer being stored: {self.write_error}"

    # -- reading ------------------------------------------------------------
    def sessions(self) -> list[SessionInfo]:
        """Every session, newest first."""
        return self._session_infos("", ())

    def session(self, session_id: int) -> SessionInfo:
        infos = self._session_infos("WHERE s.id = ?", (session_id,))
        if not infos:
            raise self._unknown(session_id)
        return infos[0]

    def _session_infos(self, where: str, params: tuple) -> list[SessionInfo]:
        with self._lock:
            if self._empty():
                return []
            rows = self._query(
                "SELECT s.id, s.started_at, s.model_id, s.model_identity, s.engine, s.device, "
                "s.persona_id, COUNT(t.id), COALESCE(SUM(t.cost_usd), 0.0) "
                f"FROM sessions s LEFT JOIN turns t ON t.session_id = s.id {where} "
                "GROUP BY s.id ORDER BY s.started_at DESC, s.id DESC",
                params,
            )
            ttfts: dict[int, list[float]] = {}
            for sid, ttft in self._query(
                "SELECT s.id, t.ttft_ms FROM sessions s JOIN turns t ON t.session_id = s.id "
                f"{where}{' AND' if where else 'WHERE'} t.ttft_ms IS NOT NULL",
                params,
            ):
                ttfts.setdefault(sid, []).append(ttft)
        return [
            SessionInfo(
                *row[:7],
                turns=row[7],
                ttft_p50_ms=percentile(ttfts.get(row[0], []), 50),
                cost_usd=row[8],
            )
            for row in rows
        ]

    def latest_session_id(self) -> int | None:
        """The session last used: the one holding the most recently stored turn
        (a resume or an export without an id means "where I left off"); with
        no turn stored yet, the most recently started session; None when there
        is no session."""
        with self._lock:
            if self._empty():
                return None
            # Turn ids grow with every insert: the newest turn is the last row
            # of the primary key, read without a scan.
            row = self._query("SELECT session_id FROM turns ORDER BY id DESC LIMIT 1")
            if not row:
                row = self._query("SELECT id FROM sessions ORDER BY started_at DESC, id DESC LIMIT 1")
        return row[0][0] if row else None

    def turns(self, session_id: int) -> list[TurnRecord]:
        """The session's turns in order (ChattermError when the session is unknown)."""
        return self._turn_records(session_id, "", (), newest_first=False)

    def turns_page(self, session_id: int, before_index: int | None, limit: int) -> list[TurnRecord]:
        """Up to `limit` turns with an index below `before_index` (None: the
        newest), oldest first: a long session is read a screenful at a time.
        ChattermError when the session is unknown."""
        before = before_index if before_index is not None else 2**62
        return self._turn_records(
            session_id, "AND turn_index < ? ", (before,), newest_first=True, limit=max(limit, 0)
        )

    def _turn_records(
        self, session_id: int, where: str, params: tuple, *, newest_first: bool, limit: int | None = None
    ) -> list[TurnRecord]:
        with self._lock:
            if self._empty() or not self._query("SELECT 1 FROM sessions WHERE id = ?", (session_id,)):
                raise self._unknown(session_id)
            columns = ["turn_index", "user_text", "reply", *sorted(_METRIC_FIELDS & self._turn_columns)]
            sql = (
                f"SELECT {', '.join(columns)} FROM turns WHERE session_id = ? {where}"
                f"ORDER BY turn_index {'DESC' if newest_first else ''}"
            )
            if limit is not None:
                sql += f" LIMIT {int(limit)}"
            rows = self._query(sql, (session_id, *params))
        if newest_first:
            rows.reverse()
        metrics = _metrics_of(columns[3:], (row[3:] for row in rows))
        return [TurnRecord(row[0], row[1], row[2], m) for row, m in zip(rows, metrics, strict=True)]

    def export_rows(self, session_id: int) -> list[tuple]:
        """The session's turns as flat rows, oldest first, for export: `(turn_index,
        *the TURN_FIELDS values in that order, user_text, reply)`. Values are as
        stored (derived fields included; booleans as SQLite keeps them, 0/1), and
        a column an older database lacks reads as the field's default. No
        TurnMetrics are built: exporting 100,000 turns spent a third of its time
        making them. ChattermError when the session is unknown."""
        with self._lock:
            if self._empty() or not self._query("SELECT 1 FROM sessions WHERE id = ?", (session_id,)):
                raise self._unknown(session_id)
            columns, defaults = ["turn_index"], []
            for name in TURN_FIELDS:
                if name in self._turn_columns:
                    columns.append(name)
                else:
                    columns.append("?")
                    defaults.append(_FIELD_DEFAULTS.get(name))
            return self._query(
                f"SELECT {', '.join(columns)}, user_text, reply FROM turns "
                "WHERE session_id = ? ORDER BY turn_index",
                (*defaults, session_id),
            )

    def turn_metrics(self, session_id: int) -> list[TurnMetrics]:
        """Every turn's metrics in order, without the texts (session figures)."""
        with self._lock:
            if self._empty() or not self._query("SELECT 1 FROM sessions WHERE id = ?", (session_id,)):
                raise self._unknown(session_id)
            columns = sorted(_METRIC_FIELDS & self._turn_columns)
            rows = self._query(
                f"SELECT {', '.join(columns)} FROM turns WHERE session_id = ? ORDER BY turn_index",
                (session_id,),
            )
        return _metrics_of(columns, rows)

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self._require().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise ChattermError(f"{self.path}: cannot read the session database ({exc})") from None

    def _empty(self) -> bool:
        """No schema to read: nothing stored yet (raises once the store is closed)."""
        if self._closed:
            self._require()
        return not self._turn_columns

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ChattermError(f"{self.path}: the session store is closed")
        return self._conn

    def _unknown(self, session_id: int) -> ChattermError:
        return ChattermError(f"unknown session {session_id} in {self.path}; `chatterm sessions` lists them")

    # -- closing ------------------------------------------------------------
    def close(self) -> None:
        """Close the connection. Safe to call twice."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
