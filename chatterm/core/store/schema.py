"""The session database's schema, as a tuple of migrations.

Contract:
- The schema is versioned with `PRAGMA user_version`; `MIGRATIONS[n]` brings a
  database from version n to n + 1 (the store runs each in one transaction).
  A new version is a new function appended to `MIGRATIONS`; released ones
  are written out in full and never edited (tests/core/store/test_store.py
  checks v1 against the shipped schema, and that every TURN_FIELDS name has a
  column: a new TurnMetrics field needs a new migration).
- v8 stores the conversation as a tree (`turns.parent_index`, the current
  leaf in `sessions.current_index`), a session's title, last activity and the
  session it was forked from, and a full-text index `turns_fts` (SQLite FTS5,
  kept by triggers) where the SQLite build has FTS5; where it lacks it the
  store searches with a plain scan.
- v9 never gives a deleted session's id out again: SQLite's rowid is the
  largest id + 1, so deleting the newest session made its id the next one's,
  while an export, a note or a script may still name it. `id_floor` keeps the
  largest id ever deleted (a trigger), and a new session takes
  `NEW_SESSION_ID`. (AUTOINCREMENT would need the table rebuilt, and dropping
  the old one cascades into the turns.)
- v10 splits the type-ahead credit (`ahead_history_tokens`: history prefilled
  again while typing, not the message) and keeps each reply's sampling `seed`.
- v11 keeps a local model's reply as the tokens it sampled (`reply_tokens`,
  little-endian int32, and `reply_tokens_model`, the model's identity): a
  resumed conversation's prompt then matches the KV state cached after it,
  which its text tokenized again may not.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

FTS_TABLE = "turns_fts"


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


def _to_v7(conn: sqlite3.Connection) -> None:
    # v7: a conversation longer than the context: the turns left out at this
    # turn (the cut moved), and the tokens a context shift removed and its time.
    conn.execute("ALTER TABLE turns ADD COLUMN cut_turns INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE turns ADD COLUMN shifted_tokens INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE turns ADD COLUMN shift_ms REAL NOT NULL DEFAULT 0")


def fts5_available(conn: sqlite3.Connection) -> bool:
    """Whether this SQLite build has the FTS5 extension."""
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.fts5_probe USING fts5(x)")
    except sqlite3.OperationalError:
        return False
    conn.execute("DROP TABLE temp.fts5_probe")
    return True


def _to_v8(conn: sqlite3.Connection) -> None:
    # v8: branches, titles, activity, forks, full-text search.
    # A turn hangs under the turn before it on its path (NULL: a first turn);
    # the turns already stored form one line, each under the one before it.
    conn.execute("ALTER TABLE turns ADD COLUMN parent_index INTEGER")
    conn.execute("ALTER TABLE turns ADD COLUMN inherited INTEGER NOT NULL DEFAULT 0")
    # Named when the turn is recorded: a parent's first child continues its
    # branch, a later one (a regenerated reply, an edited message) starts its own.
    conn.execute("ALTER TABLE turns ADD COLUMN branch TEXT NOT NULL DEFAULT 'main'")
    conn.execute(
        """
        UPDATE turns SET parent_index = (
            SELECT MAX(p.turn_index) FROM turns p
             WHERE p.session_id = turns.session_id AND p.turn_index < turns.turn_index)"""
    )
    # Siblings (same parent) in order, and the children a walk down a branch reads, from the index.
    conn.execute("CREATE INDEX turns_by_parent ON turns(session_id, parent_index, turn_index)")
    conn.execute("ALTER TABLE sessions ADD COLUMN title TEXT")
    conn.execute("ALTER TABLE sessions ADD COLUMN current_index INTEGER")
    conn.execute("ALTER TABLE sessions ADD COLUMN active_at REAL")
    conn.execute("ALTER TABLE sessions ADD COLUMN forked_from INTEGER")
    conn.execute("ALTER TABLE sessions ADD COLUMN forked_turn INTEGER")
    conn.execute(
        """
        UPDATE sessions SET
            current_index = (SELECT MAX(turn_index) FROM turns WHERE session_id = sessions.id),
            active_at = COALESCE(
                (SELECT MAX(recorded_at) FROM turns WHERE session_id = sessions.id), started_at)"""
    )
    # The listing, newest activity first, and `--resume` without an id: index order.
    conn.execute("CREATE INDEX sessions_by_activity ON sessions(active_at, id)")
    if not fts5_available(conn):
        return
    # External content: the texts stay once, in `turns`; triggers keep the index.
    conn.execute(
        f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5("
        "user_text, reply, content='turns', content_rowid='id', tokenize='unicode61 remove_diacritics 2')"
    )
    conn.execute(
        f"""
        CREATE TRIGGER turns_fts_insert AFTER INSERT ON turns BEGIN
            INSERT INTO {FTS_TABLE}(rowid, user_text, reply) VALUES (new.id, new.user_text, new.reply);
        END"""
    )
    conn.execute(
        f"""
        CREATE TRIGGER turns_fts_delete AFTER DELETE ON turns BEGIN
            INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, user_text, reply)
                VALUES ('delete', old.id, old.user_text, old.reply);
        END"""
    )
    conn.execute(
        f"""
        CREATE TRIGGER turns_fts_update AFTER UPDATE OF user_text, reply ON turns BEGIN
            INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, user_text, reply)
                VALUES ('delete', old.id, old.user_text, old.reply);
            INSERT INTO {FTS_TABLE}(rowid, user_text, reply) VALUES (new.id, new.user_text, new.reply);
        END"""
    )
    conn.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('rebuild')")


def _to_v9(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE id_floor (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    conn.execute("INSERT INTO id_floor VALUES ('sessions', (SELECT coalesce(max(id), 0) FROM sessions))")
    conn.execute(
        """
        CREATE TRIGGER sessions_id_floor AFTER DELETE ON sessions BEGIN
            UPDATE id_floor SET value = max(value, old.id) WHERE name = 'sessions';
        END"""
    )


def _to_v10(conn: sqlite3.Connection) -> None:
    # v10: the type-ahead credit split (history prefilled again while typing
    # after a model switch or fork, not the message), and the sampling seed.
    conn.execute("ALTER TABLE turns ADD COLUMN ahead_history_tokens INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE turns ADD COLUMN seed INTEGER")


def _to_v11(conn: sqlite3.Connection) -> None:
    # v11: the reply's sampled tokens, and the model they belong to.
    conn.execute("ALTER TABLE turns ADD COLUMN reply_tokens BLOB")
    conn.execute("ALTER TABLE turns ADD COLUMN reply_tokens_model TEXT")


NEW_SESSION_ID = (
    "(SELECT max(coalesce((SELECT max(id) FROM sessions), 0), value) + 1 FROM id_floor WHERE name = 'sessions')"
)
"""The id of a session inserted now: above every id there is or was (v9)."""

MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _to_v1, _to_v2, _to_v3, _to_v4, _to_v5, _to_v6, _to_v7, _to_v8, _to_v9, _to_v10, _to_v11,
)
SCHEMA_VERSION = len(MIGRATIONS)
