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
  A read of several queries (a listing, a path, an export's rows) is one read
  transaction: it sees the file as it was when it began. A write that waits
  out the busy timeout names the other process's lock, not a damaged file.
- One connection per store, shared by the caller's threads behind a lock
  (the TUI records turns from a worker thread).
- The schema is `chatterm.core.store.schema`'s tuple of migrations (each run
  in one transaction). A database from a newer chatterm, one that is not a
  chatterm database, or a corrupt file is refused with a `ChattermError`
  naming the file, and left untouched; so is a path that is a directory (one
  message, whatever the mode).
- Turns have one column per `TURN_FIELDS` name (derived `decode_tok_s` and
  `cost_usd` included, so SQL queries need no formulas). Reading tolerates an
  older schema opened read-only: a missing column reads as the field's
  default, and a session from before the tree reads as one line.
- Turn indexes count from 1 within a session, in the order turns were
  computed. A session is a tree of turns (`chatterm.core.store.tree`): the
  current path is the model's history (`turns`, `turns_page`); regenerating
  or editing a turn records a sibling of it (`path_before` gives the history,
  `record_turn(after=...)` puts the new turn under its end), and
  `select_turn` switches the current path. Figures, exports and the latency
  log cover every computed turn, one row each (`turn_metrics`, `export_rows`,
  `all_turns`).
- Sessions are listed newest activity first; `latest_session_id` is the first
  of that list. Renaming, deleting and forking a session are writes the user
  asked for: a refused one raises `ChattermError` (one line) instead of
  setting `write_error`. Search: `chatterm.core.store.search`.
- `hold(sid)` marks the session its owner has open; `delete_session` of a
  session another process holds is refused (`chatterm.core.store.session_holds`).
- `continued_elsewhere(sid)` names the current leaf when another process (or
  another store on the file) moved it since this store last read or wrote it
  (`turns`, `turns_page`, `record_turn`, `select_turn`, a new or forked
  session): a regenerate or edit this store prepared and never recorded is
  not a move.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from chatterm.core.engine.interface import ReplyTokens
from chatterm.core.metrics.format import counted
from chatterm.core.metrics.turn_metrics import STAMP_DIGITS, TURN_FIELDS, TurnMetrics
from chatterm.core.store import listing, opening, tree
from chatterm.core.store import search as text_search
from chatterm.core.store.records import (
    FIELD_DEFAULTS,
    METRIC_FIELDS,
    TOKEN_COLUMNS,
    SearchHit,
    SessionInfo,
    TurnRecord,
    metrics_of,
    sql_value,
    tokens_blob,
)
from chatterm.core.store.schema import FTS_TABLE, NEW_SESSION_ID, SCHEMA_VERSION
from chatterm.core.store.session_holds import SessionHolds
from chatterm.core.system.atomic import cannot_create_in
from chatterm.errors import ChattermError

__all__ = ["SCHEMA_VERSION", "SearchHit", "SessionInfo", "SessionStore", "TurnRecord"]

_ENVIRONMENT_ERRORS = ("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_READONLY", "SQLITE_PERM")
"""SQLite errors that say nothing against the database file itself."""

_FOLDER_REFUSED = ("SQLITE_CANTOPEN", "SQLITE_READONLY_DIRECTORY")
"""What SQLite says when it cannot make a database's -wal or -shm file."""

_LOCKED = ("SQLITE_BUSY", "SQLITE_LOCKED")
"""Another connection held the lock past the busy timeout."""

T = TypeVar("T")


def _reason(exc: Exception) -> str:
    """SQLite's words, or for a lock another process held too long, the user's."""
    if getattr(exc, "sqlite_errorname", "").startswith(_LOCKED):
        return f"another process is writing it and held its lock for over {opening.BUSY_TIMEOUT_S:g} s"
    return str(exc)


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the transaction a failed write left, where SQLite has not
    already done so itself (after SQLITE_FULL it has, and ROLLBACK fails)."""
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


_UNSEEN = object()
"""A session whose leaf this store had not noted (`batch`'s rollback)."""

_TREE_COLUMNS = {"id", "session_id", "turn_index", "parent_index", "branch", "inherited"}
"""Turn columns a fork sets itself rather than copies."""


def _reader(conn: sqlite3.Connection) -> tree.Query:
    """Queries inside a write transaction (on its connection, errors raised)."""
    return lambda sql, params: conn.execute(sql, params).fetchall()


class SessionStore:
    """Sessions and turns in one SQLite file. See the module contract."""

    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()  # re-entered by writes inside batch()
        self._batch: dict[int, object] | None = None
        """Inside batch(): each session whose leaf its writes noted, with what
        was noted before (`_UNSEEN`: nothing), put back on a rollback."""
        self._conn: sqlite3.Connection | None = None
        self._turn_columns: set[str] = set()
        """Empty when there is no schema yet (a missing or new file opened read-only)."""
        self._turn_column_order: list[str] = []
        self._tree = False
        """Whether the schema has the conversation tree (v8; else it reads as one line)."""
        self._leaf_seen: dict[int, int | None] = {}
        """Each session's current leaf as this store last read or wrote it."""
        self._fts = False
        """Whether the database has the FTS5 index (else search scans)."""
        self._closed = False
        self._holds = SessionHolds(self.path)
        self.write_error: str | None = None
        """Why the first refused write failed (None while every write succeeded)."""
        self._notice_given = False
        try:
            is_dir, existed = self.path.is_dir(), self.path.exists()
        except OSError as exc:  # a name too long for the file system, a looping link
            raise ChattermError(f"cannot open {self.path}: {exc.strerror or exc}") from None
        if is_dir:
            # Checked first: SQLite's words for a folder depend on the mode
            # ("disk I/O error" read-only, "unable to open database file" else).
            raise ChattermError(
                f"{self.path} is a directory, not a database file; pass --db {self.path / 'chatterm.db'} "
                "to keep the database in it"
            )
        if readonly and not existed:
            return  # nothing stored yet; reading gives empty results
        try:
            try:
                self._conn = opening.connect(self.path, readonly)
                opening.prepare(self._conn, self.path, readonly)
            except sqlite3.Error as exc:
                folder = self._folder_problem(exc, existed)
                if folder is None:
                    raise
                if not readonly or Path(f"{self.path}-wal").exists():
                    raise ChattermError(
                        f"cannot open {self.path}: its folder {self.path.parent} cannot be written ({folder}), "
                        f"and SQLite keeps the database's -wal and -shm files there; make it writable, or pass "
                        "--db with a database in a folder that is"
                    ) from None
                # Read-only, nothing uncommitted: read it as it is (export, sessions).
                if self._conn is not None:
                    self._conn.close()
                self._conn = opening.connect(self.path, readonly, immutable=True)
                opening.prepare(self._conn, self.path, readonly)
            self._read_schema()
        except sqlite3.Error as exc:
            self.close()
            name = getattr(exc, "sqlite_errorname", "")
            if not existed:  # SQLite could not make it: no file to blame
                raise ChattermError(
                    f"cannot create {self.path}: {exc} (is its folder {self.path.parent} writable, "
                    "and is there room on the disk?)"
                ) from None
            if name.startswith(_LOCKED):
                raise ChattermError(f"cannot open {self.path}: {_reason(exc)}; try again") from None
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

    def _folder_problem(self, exc: sqlite3.Error, existed: bool) -> str | None:
        """Why the folder of an existing database cannot be written, when that is
        why SQLite could not open it (it said only "unable to open database
        file", which read as a corrupt database: CANTOPEN where the OS said
        EPERM, READONLY_DIRECTORY where it said EACCES, a mode's refusal)."""
        if not existed or getattr(exc, "sqlite_errorname", "") not in _FOLDER_REFUSED:
            return None
        return cannot_create_in(self.path.parent)  # SQLite needs it even to read a WAL database

    def _read_schema(self) -> None:
        conn = self._require()
        self._turn_column_order = [row[1] for row in conn.execute("PRAGMA table_info(turns)")]
        self._turn_columns = set(self._turn_column_order)
        self._tree = "parent_index" in self._turn_columns
        self._fts = bool(conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (FTS_TABLE,)
        ).fetchone())

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
        """Create a session row and return its id (`started_at` defaults to now;
        to the microsecond, as a turn's `submitted_at`); None when the database
        refused the write (see `write_error`)."""
        start = round(time.time() if started_at is None else started_at, STAMP_DIGITS)
        values = (start, model_id, model_identity, engine, device, persona_id, start)

        def insert(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO sessions (id, started_at, model_id, model_identity, engine, device, "
                f"persona_id, active_at) VALUES ({NEW_SESSION_ID}, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
            return int(cur.lastrowid)

        return self._write("could not create a session", insert, leaf=lambda new: (new, None))

    def move_session(self, session_id: int, *, model_id: str, model_identity: str, engine: str, device: str) -> None:
        """The session carries on with this model: it becomes the session's, the one
        `chatterm sessions`, the reports and a resume name (each turn keeps its own).
        Written like a turn: a refused write is `write_error`, never an exception."""

        def move(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE sessions SET model_id = ?, model_identity = ?, engine = ?, device = ? WHERE id = ?",
                (model_id, model_identity, engine, device, session_id),
            )

        self._write(f"could not record session {session_id}'s new model", move)

    def record_turn(
        self, session_id: int, user_text: str, reply: str, metrics: TurnMetrics, after: int | None = None,
        reply_tokens: ReplyTokens | None = None,
    ) -> int | None:
        """Commit one turn (all its metrics, the reply's sampled tokens when
        given) and return its index in the session;
        None when the database refused the write (see `write_error`). The turn
        goes under turn `after` (the turn the caller's history ends at; 0: none,
        a new first turn), else (None, or a turn the session does not have)
        under the current leaf, and becomes the current leaf. With `after`, a
        regenerated or edited turn is a sibling of the one it replaces, and a
        turn another process recorded in the session meanwhile stays out of
        this one's history: the new turn becomes its sibling, a branch,
        instead of its child."""
        data = metrics.to_dict()

        def insert(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT current_index FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise ChattermError(f"unknown session {session_id} in {self.path}")
            # The write lock is held (BEGIN IMMEDIATE), so no other process can
            # take the same index between this read and the insert.
            index = conn.execute(
                "SELECT COALESCE(MAX(turn_index), 0) + 1 FROM turns WHERE session_id = ?",
                (session_id,),
            ).fetchone()[0]
            parent = row[0]
            if after == 0:
                parent = None
            elif after is not None and conn.execute(
                "SELECT 1 FROM turns WHERE session_id = ? AND turn_index = ?", (session_id, after)
            ).fetchone():
                parent = after
            branch = tree.branch_of_new(_reader(conn), session_id, parent, index)
            now = time.time()
            names = ["session_id", "turn_index", "parent_index", "branch", "recorded_at", "user_text", "reply",
                     *TOKEN_COLUMNS, *TURN_FIELDS]
            values = [session_id, index, parent, branch, now, user_text, reply, *tokens_blob(reply_tokens),
                      *(sql_value(data[k]) for k in TURN_FIELDS)]
            conn.execute(
                f"INSERT INTO turns ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                values,
            )
            conn.execute(
                "UPDATE sessions SET current_index = ?, active_at = ? WHERE id = ?", (index, now, session_id)
            )
            return int(index)

        return self._write(f"could not save a turn of session {session_id}", insert,
                           leaf=lambda index: (session_id, index))

    def path_before(self, session_id: int, turn_index: int) -> list[TurnRecord]:
        """The path up to turn `turn_index`'s parent: the history a regenerated or
        edited version of it is sent after, and recorded under (`record_turn`'s
        `after`: the path's last index, 0 when empty). Nothing is written.
        ChattermError for an unknown session or turn."""
        target = self.turn(session_id, turn_index)
        return [] if target.parent is None else self._path(session_id, target.parent, -1)

    def select_turn(self, session_id: int, turn_index: int, *, keep_path: bool = False) -> list[TurnRecord]:
        """Make turn `turn_index` current, going on to the newest turn recorded
        under it (where that branch was last continued), and return the new current path.
        `keep_path` (opening a search hit): a turn on the current path keeps
        that path, the branch the user was on."""
        self.turn(session_id, turn_index)  # unknown session or turn: named

        def select(conn: sqlite3.Connection) -> int:
            read = _reader(conn)
            if keep_path:
                current = conn.execute("SELECT current_index FROM sessions WHERE id = ?", (session_id,)).fetchone()
                if current and current[0] is not None and tree.leads_to(read, session_id, turn_index, current[0]):
                    return int(current[0])
            leaf = tree.newest_leaf(read, session_id, turn_index)
            conn.execute("UPDATE sessions SET current_index = ? WHERE id = ?", (leaf, session_id))
            return leaf

        leaf = self._write(f"could not switch session {session_id} to turn {turn_index}", select, strict=True,
                           leaf=lambda new: (session_id, new))
        return self._path(session_id, leaf, -1)

    def rename_session(self, session_id: int, title: str) -> str:
        """Give the session a title (whitespace runs made single spaces); the title
        kept. ChattermError for a blank title or an unknown session."""
        clean = " ".join(title.split())
        if not clean:
            raise ChattermError(f"the new title of session {session_id} is empty")

        def rename(conn: sqlite3.Connection) -> int:
            if conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (clean, session_id)).rowcount == 0:
                raise self._unknown(session_id)
            return 1

        self._write(f"could not rename session {session_id}", rename, strict=True)
        return clean

    def delete_session(self, session_id: int) -> int:
        """Remove the session and its turns (search index included); the number of
        turns removed; refused (ChattermError) while another chatterm has it
        open (`hold`). Its forks keep their copies of its turns as their own
        and hang under its parent instead (`tree.adopt_forks`). Its KV states are the prompt cache's: see
        `chatterm.core.store.lifecycle.delete_session`."""

        def delete(conn: sqlite3.Connection) -> int:
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                raise self._unknown(session_id)
            if self._tree:
                tree.adopt_forks(conn, session_id)
            turns = conn.execute("DELETE FROM turns WHERE session_id = ?", (session_id,)).rowcount
            conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            return turns

        # A read-only store refuses the write below; it leaves no mark file either.
        with nullcontext() if self.readonly else self._holds.deleting(session_id):
            removed = self._write(f"could not delete session {session_id}", delete, strict=True)
        return int(removed or 0)

    def check_deletable(self, session_id: int) -> None:
        """ChattermError now when `delete_session` would be refused because
        another chatterm has the session open: asked before a question."""
        if not self.readonly:
            self._holds.check_not_open_elsewhere(session_id)

    def hold(self, session_id: int | None, holder: object = None, *, only_if_holder: bool = False) -> None:
        """Mark `session_id` as the one this store's owner has open (None: none)
        for `holder`, so another chatterm's delete of it is refused; with
        `only_if_holder`, only while `holder` asked last
        (`chatterm.core.store.session_holds`). A read-only store marks nothing."""
        if not self.readonly:
            self._holds.hold(session_id, holder, only_if_holder=only_if_holder)

    def fork_session(self, session_id: int, turn_index: int | None = None) -> tuple[int, int]:
        """A new session holding the path up to turn `turn_index` (None: the current
        leaf) as one line of inherited turns, numbered from 1: (its id, the
        turns copied). Same model, persona and device; it starts now."""

        def fork(conn: sqlite3.Connection) -> tuple[int, int]:
            row = conn.execute(
                "SELECT model_id, model_identity, engine, device, persona_id, current_index "
                "FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None:
                raise self._unknown(session_id)
            end = row[5] if turn_index is None else turn_index
            if end is None:
                raise ChattermError(f"session {session_id} has no turns to fork")
            if conn.execute(
                "SELECT 1 FROM turns WHERE session_id = ? AND turn_index = ?", (session_id, end)
            ).fetchone() is None:
                raise self._unknown_turn(session_id, end)
            now = time.time()
            new = int(conn.execute(
                "INSERT INTO sessions (id, started_at, model_id, model_identity, engine, device, persona_id, "
                f"active_at, forked_from, forked_turn) VALUES ({NEW_SESSION_ID}, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (now, *row[:5], now, session_id, end),
            ).lastrowid)
            # Every column but the tree's: a column a later migration adds is copied too.
            kept = [c for c in self._turn_column_order if c not in _TREE_COLUMNS]
            rows = conn.execute(
                tree.path_sql(", ".join(f"t.{c}" for c in kept)), (end, session_id, -1)
            ).fetchall()
            names = ["session_id", "turn_index", "parent_index", "inherited", *kept]
            conn.executemany(
                f"INSERT INTO turns ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                [(new, n, n - 1 if n > 1 else None, 1, *r[: len(kept)]) for n, r in enumerate(rows, start=1)],
            )
            conn.execute("UPDATE sessions SET current_index = ? WHERE id = ?", (len(rows), new))
            return new, len(rows)

        forked = self._write(f"could not fork session {session_id}", fork, strict=True, leaf=lambda forked: forked)
        assert forked is not None  # strict: a refused write raised
        return forked

    def _write(self, what: str, action: Callable[[sqlite3.Connection], T], *, strict: bool = False,
               leaf: Callable[[T], tuple[int, int | None]] | None = None) -> T | None:
        """Run `action` in one transaction. A write the database refuses: None and
        `write_error` (turns, which must never stop a chat), or with `strict`
        a ChattermError naming it (what the user asked for explicitly). `leaf`:
        the (session, leaf) the write made current, from its result, noted as
        seen (`continued_elsewhere`) under the lock, so no reader comes between."""
        if self.readonly:
            raise ChattermError(f"{self.path} is open read-only; {what}")
        with self._lock:
            result = self._run_write(what, action, strict)
            if leaf is not None and result is not None:
                session_id, current = leaf(result)
                if self._batch is not None:  # not committed yet: what it replaces is kept for a rollback
                    self._batch.setdefault(session_id, self._leaf_seen.get(session_id, _UNSEEN))
                self._leaf_seen[session_id] = current
            return result

    def _run_write(self, what: str, action: Callable[[sqlite3.Connection], T], strict: bool) -> T | None:
        """`_write`'s transaction (the lock held)."""
        conn = self._require()
        if self._batch is not None:
            return action(conn)  # inside batch(): its one transaction commits
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = action(conn)
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        except (sqlite3.Error, OSError, UnicodeError) as exc:  # UnicodeError: a lone surrogate in a text
            reason = _reason(exc)
            if strict:
                raise ChattermError(f"{self.path}: {what}: {reason}") from None
            if self.write_error is None:
                self.write_error = f"{self.path}: {what}: {reason}"
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
            self._batch = {}
            try:
                yield self
            except BaseException:
                # The leaves the batch's writes noted were never committed:
                # kept, the next `continued_elsewhere` saw a move nobody made.
                for session_id, before in self._batch.items():
                    if before is _UNSEEN:
                        self._leaf_seen.pop(session_id, None)
                    else:
                        self._leaf_seen[session_id] = before
                _rollback(conn)
                raise
            else:
                conn.execute("COMMIT")
            finally:
                self._batch = None

    def take_write_notice(self) -> str | None:
        """The line telling the user that turns are not being stored, once (None
        before any write failed, and after the line was taken)."""
        if self.write_error is None or self._notice_given:
            return None
        self._notice_given = True
        return f"Turns are no longer being stored: {self.write_error}"

    # -- reading sessions ---------------------------------------------------
    def sessions(self) -> list[SessionInfo]:
        """Every session, newest activity first (the last turn recorded, else the start)."""
        return self._session_infos("", ())

    def session(self, session_id: int) -> SessionInfo:
        infos = self._session_infos("WHERE s.id = ?", (session_id,))
        if not infos:
            raise self._unknown(session_id)
        return infos[0]

    def _session_infos(self, where: str, params: tuple) -> list[SessionInfo]:
        with self._snapshot():
            if self._empty():
                return []
            return listing.session_infos(self._query, self._tree, where, params)

    def has_session(self, session_id: int) -> bool:
        """Whether `session_id` is stored (one row read: the UI thread may ask)."""
        with self._lock:
            return not self._empty() and bool(self._query("SELECT 1 FROM sessions WHERE id = ?", (session_id,)))

    def has_sessions(self) -> bool:
        """Whether any session is stored: one row read, so the UI thread may ask (a launch's notice)."""
        with self._lock:
            return not self._empty() and bool(self._query("SELECT 1 FROM sessions LIMIT 1"))

    def latest_session_id(self) -> int | None:
        """The first session of `sessions()`: the one holding the most recently
        recorded turn (a resume or an export without an id means "where I left
        off"), else the most recently started; None when there is no session."""
        with self._lock:
            if self._empty():
                return None
            row = self._query(listing.latest_sql(self._tree))
        return row[0][0] if row else None

    def search(self, text: str, limit: int = 50) -> list[SearchHit]:
        """Turns whose user message or reply holds every word of `text`, newest
        first (see `chatterm.core.store.search`: any text is safe). A message
        found in the user's text is listed once: its regenerations (turns of the
        same parent and text) are one hit, the newest, and a regeneration whose
        reply holds every word of `text` too is a hit for that reply. A fork's copy of its
        parent's turn is no hit of its own while the parent is stored."""
        with self._snapshot():
            if self._empty():
                return []
            rows = text_search.search(self._query, text, limit, fts=self._fts, parent=tree.parent_sql(self._tree),
                                      skip=tree.copied_sql(self._tree))
            titles = listing.titles(self._query, self._tree, (r[0] for r in rows))
        hits = []
        seen: set[tuple] = set()
        for sid, index, user_text, reply, parent in rows:
            role, cut = text_search.snippet(user_text, reply, text)
            if role == "user":
                message = (sid, parent, user_text)
                if message in seen:
                    # A regeneration of a message already listed: a hit of its
                    # own only where its reply holds every word too.
                    if not text_search.holds_every_word(reply, text):
                        continue
                    role, cut = text_search.snippet("", reply, text)
                seen.add(message)
            hits.append(SearchHit(sid, index, titles.get(sid, ""), role, cut))
        return hits

    # -- reading turns ------------------------------------------------------
    def continued_elsewhere(self, session_id: int) -> int | None:
        """The session's current leaf when something else moved it since this
        store last read or wrote it, else None (once: the move is seen now);
        ChattermError when the session is unknown."""
        with self._lock:
            leaf = self._leaf(session_id)
            seen = self._leaf_seen.get(session_id, leaf)
            self._leaf_seen[session_id] = leaf
            return leaf if leaf != seen else None

    def turns(self, session_id: int) -> list[TurnRecord]:
        """The current path, oldest first: what the model's history is made of
        (ChattermError when the session is unknown)."""
        with self._snapshot():
            return self._path(session_id, self._seen_leaf(session_id), -1)

    def turns_page(self, session_id: int, before_index: int | None, limit: int) -> list[TurnRecord]:
        """Up to `limit` turns of the current path before turn `before_index` (the
        oldest one shown; None: from the current leaf), oldest first: a long
        session is read a screenful at a time. ChattermError when the session
        is unknown."""
        limit = max(limit, 0)
        with self._snapshot():
            leaf = self._seen_leaf(session_id) if before_index is None else self._leaf(session_id)
            if before_index is None or not limit:
                return self._path(session_id, leaf, limit) if limit else []
            row = self._query(
                f"SELECT {tree.parent_sql(self._tree)} FROM turns t WHERE session_id = ? AND turn_index = ?",
                (session_id, before_index),
            )
            if row:
                return self._path(session_id, row[0][0], limit)
            # Not a turn (an index past the newest, say): the path's turns below it.
            return [r for r in self._path(session_id, leaf, -1) if r.index < before_index][-limit:]

    def turn(self, session_id: int, turn_index: int) -> TurnRecord:
        """One turn, on the current path or not (ChattermError naming an unknown
        session or turn)."""
        with self._snapshot():
            self._leaf(session_id)  # unknown session: named
            records = self._path(session_id, turn_index, 1)
        if not records or records[0].index != turn_index:
            raise self._unknown_turn(session_id, turn_index)
        return records[0]

    def siblings(self, session_id: int, turn_index: int) -> list[int]:
        """The indexes of the turns sharing turn `turn_index`'s parent, oldest
        first, itself included (switching between alternatives)."""
        parent = self.turn(session_id, turn_index).parent
        with self._lock:
            if not self._tree:
                return [turn_index]
            return tree.siblings(self._query, session_id, parent)

    def all_turns(self, session_id: int) -> list[TurnRecord]:
        """Every computed turn in index order, on any branch (the reports)."""
        with self._snapshot():
            self._leaf(session_id)
            columns = ", ".join(f"t.{c}" for c in self._record_columns)
            branch = "t.branch, t.inherited" if self._tree else "'main', 0"
            rows = self._query(
                f"SELECT {columns}, {tree.parent_sql(self._tree)}, {branch} FROM turns t "
                "WHERE t.session_id = ? ORDER BY t.turn_index",
                (session_id,),
            )
        return tree.records(tree.with_siblings(rows, len(self._record_columns)), self._record_columns)

    def _seen_leaf(self, session_id: int) -> int | None:
        """`_leaf`, for a read that shows the session as it is now."""
        leaf = self._leaf_seen[session_id] = self._leaf(session_id)
        return leaf

    def _leaf(self, session_id: int) -> int | None:
        """The current leaf (None: no turn yet); ChattermError when the session is unknown."""
        if self._empty():
            raise self._unknown(session_id)
        current, _, _ = listing.session_sql(self._tree)
        row = self._query(f"SELECT {current} FROM sessions s WHERE s.id = ?", (session_id,))
        if not row:
            raise self._unknown(session_id)
        return row[0][0]

    def _path(self, session_id: int, end: int | None, limit: int) -> list[TurnRecord]:
        """The path ending at turn `end`, at most `limit` turns (-1: all), root
        first, with the replies' sampled tokens (the history sent to a model)."""
        if end is None or limit == 0:
            return []
        tokens = [f"t.{c}" if c in self._turn_columns else "NULL" for c in TOKEN_COLUMNS]
        columns = ", ".join([*(f"t.{c}" for c in self._record_columns), *tokens])
        if self._tree:
            rows = self._query(tree.path_sql(columns), (end, session_id, limit))
        else:  # before v7, read-only: one line
            rows = self._query(
                f"SELECT {columns}, {tree.parent_sql(self._tree)}, {tree.extras_sql(self._tree)} FROM turns t "
                "WHERE t.session_id = ? AND t.turn_index <= ? ORDER BY t.turn_index DESC LIMIT ?",
                (session_id, end, limit),
            )
            rows.reverse()
        return tree.records(rows, [*self._record_columns, *TOKEN_COLUMNS], tokens=True)

    @property
    def _record_columns(self) -> list[str]:
        return ["turn_index", "user_text", "reply", *sorted(METRIC_FIELDS & self._turn_columns)]

    def export_rows(self, session_id: int) -> list[tuple]:
        """The session's turns as flat rows, every computed turn in index order,
        for export: `(turn_index, *the TURN_FIELDS values in that order,
        parent_index, branch, inherited, user_text, reply)`. Values are as
        stored (derived fields included; booleans as SQLite keeps them, 0/1), and
        a column an older database lacks reads as the field's default. No
        TurnMetrics are built: exporting 100,000 turns spent a third of its time
        making them. ChattermError when the session is unknown."""
        with self._snapshot():
            if not self.has_session(session_id):
                raise self._unknown(session_id)
            columns, defaults = ["turn_index"], []
            for name in TURN_FIELDS:
                if name in self._turn_columns:
                    columns.append(name)
                else:
                    columns.append("?")
                    defaults.append(FIELD_DEFAULTS.get(name))
            tree_columns = "parent_index, branch, inherited" if self._tree else (
                f"{tree.parent_sql(self._tree)}, 'main', 0"
            )
            return self._query(
                f"SELECT {', '.join(columns)}, {tree_columns}, user_text, reply FROM turns t "
                "WHERE session_id = ? ORDER BY turn_index",
                (*defaults, session_id),
            )

    def turn_metrics(self, session_id: int) -> list[TurnMetrics]:
        """Every computed turn's metrics in order, on any branch, without the
        texts (session figures: a regenerated turn keeps its own TTFT and cost)."""
        with self._snapshot():
            if not self.has_session(session_id):
                raise self._unknown(session_id)
            columns = sorted(METRIC_FIELDS & self._turn_columns)
            rows = self._query(
                f"SELECT {', '.join(columns)} FROM turns WHERE session_id = ? ORDER BY turn_index",
                (session_id,),
            )
        return metrics_of(columns, rows)

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """The lock, and one read transaction: a read made of several queries
        sees one state of the file (WAL), never a session another process
        deleted between two of them (a listing's KeyError)."""
        with self._lock:
            conn = self._conn
            if conn is None or conn.in_transaction:  # nothing stored yet, or inside a write
                yield
                return
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise ChattermError(f"{self.path}: cannot read the session database ({exc})") from None
            try:
                yield
            finally:
                _rollback(conn)  # it wrote nothing

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

    def _unknown_turn(self, session_id: int, turn_index: int) -> ChattermError:
        """Names the turns there are: a turn's number counts every turn computed,
        those on other branches included (`sessions` shows "4 +1" for five)."""
        with self._lock:
            row = self._query("SELECT count(*), max(turn_index) FROM turns WHERE session_id = ?", (session_id,))
        count, last = row[0] if row else (0, None)
        if not count:
            held = "it has no turns"
        elif last == count:
            held = f"its turns are 1-{last}"
        else:
            held = f"it has {counted(count, 'turn')}, the last numbered {last}"
        return ChattermError(f"session {session_id} has no turn {turn_index}: {held}")

    # -- closing ------------------------------------------------------------
    def close(self) -> None:
        """Close the connection. Safe to call twice."""
        with self._lock:
            self._closed = True
            self._holds.release()
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
