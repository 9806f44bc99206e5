"""The conversation tree in SQL: paths, siblings and branch names.

Contract:
- A turn's parent is the turn before it on its path (`turns.parent_index`,
  NULL for a first turn); a child is always recorded after its parent, so
  indexes grow along a path. Siblings share a parent; they are ordered by
  index. The current path runs from a first turn to the session's current
  leaf (`sessions.current_index`).
- `path_sql` reads a path upwards from one turn, at most `limit` turns, each
  row with its sibling position and count; only the turns read are visited,
  so a page of a long session costs the same as a page of a short one.
- `branch_of_new` names the branch of a turn about to be recorded: a
  parent's first child continues its parent's branch, a later child starts
  its own ("b<index>"); a later first turn (an edit of turn 1) too.
- `copied_sql` is true for a fork's inherited turn while the session it
  came from is stored (its original is there); `adopt_forks` keeps a fork's
  inherited turns copies of its parent's when a session is deleted.
- `parent_sql` / `extras_sql` give the same columns for turns read another
  way; before v8 (a database opened read-only) a session reads as one line:
  each turn under the one before it, no siblings, all on "main".
- These functions build SQL or read through the `Query` they are given;
  `adopt_forks` alone writes, inside the caller's transaction.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from chatterm.core.store.records import (
    MAIN_BRANCH,
    TOKEN_COLUMNS,
    TurnRecord,
    branch_name,
    metrics_of,
    reply_tokens_of,
)

Query = Callable[[str, tuple], list[tuple]]


def path_sql(columns: str) -> str:
    """SQL for the path ending at turn ?1 of session ?2, at most ?3 turns (-1:
    all), root first, selecting `columns` (over `t`, the turn) then its parent,
    sibling position, sibling count, branch and inherited flag."""
    return (
        "WITH RECURSIVE path(idx, depth) AS ("
        " SELECT ?1, 0"
        " UNION ALL"
        " SELECT t.parent_index, path.depth + 1 FROM path"
        " JOIN turns t ON t.session_id = ?2 AND t.turn_index = path.idx"
        " WHERE t.parent_index IS NOT NULL LIMIT ?3) "
        f"SELECT {columns}, t.parent_index, {extras_sql(True)} "
        "FROM path JOIN turns t ON t.session_id = ?2 AND t.turn_index = path.idx "
        "ORDER BY path.depth DESC"
    )


def parent_sql(tree: bool) -> str:
    """A turn's parent (over `t`): its column, or before v8 the turn before it."""
    if tree:
        return "t.parent_index"
    return (
        "(SELECT MAX(p.turn_index) FROM turns p WHERE p.session_id = t.session_id "
        "AND p.turn_index < t.turn_index)"
    )


def copied_sql(tree: bool) -> str:
    """True for a turn (over `t`) that a fork copied from a session still
    stored: that session holds the same turn, so a search lists it there, once.
    Only the direct parent is looked at: `adopt_forks` keeps that true when a
    session in the middle of a fork line is deleted. (A database whose middle
    was deleted before it shows those copies again; a deleted parent's id is
    never reused, new ids are above the highest.)"""
    if not tree:
        return "0"
    return (
        "(t.inherited AND EXISTS (SELECT 1 FROM sessions s JOIN sessions p ON p.id = s.forked_from "
        "WHERE s.id = t.session_id))"
    )


def adopt_forks(conn: sqlite3.Connection, session_id: int) -> None:
    """Before session `session_id` is deleted (in the same transaction): each
    fork of it takes as its own the copies of the turns that were the
    deleted session's own (the only ones left), and hangs under the deleted
    session's parent at the last turn it still copies from there, or under
    none. So a fork's inherited turns are always copies of turns its parent
    holds: a search lists each turn once, and the fork's title names a
    session that exists."""
    parent, parent_turn = conn.execute(
        "SELECT s.forked_from, s.forked_turn FROM sessions s JOIN sessions p ON p.id = s.forked_from "
        "WHERE s.id = ?", (session_id,)
    ).fetchone() or (None, None)
    up = [r[0] for r in conn.execute(path_sql("t.turn_index"), (parent_turn, parent, -1))] if parent else []
    forks = conn.execute("SELECT id, forked_turn FROM sessions WHERE forked_from = ?", (session_id,)).fetchall()
    for fork, turn in forks:
        copied = [bool(r[0]) for r in conn.execute(path_sql("t.inherited"), (turn, session_id, -1))]
        conn.executemany(
            "UPDATE turns SET inherited = 0 WHERE session_id = ? AND turn_index = ?",
            [(fork, n) for n, was in enumerate(copied, start=1) if not (was and parent)],
        )
        still = sum(copied) if parent else 0  # copies of the parent's turns: the line's first ones
        conn.execute(
            "UPDATE sessions SET forked_from = ?, forked_turn = ? WHERE id = ?",
            (parent, up[still - 1], fork) if still else (None, None, fork),
        )


def extras_sql(tree: bool) -> str:
    """What `path_sql` selects after the parent: sibling position and count,
    branch and inherited flag."""
    if not tree:
        return "1, 1, 'main', 0"
    return (
        "(SELECT COUNT(*) FROM turns s WHERE s.session_id = t.session_id "
        "AND s.parent_index IS t.parent_index AND s.turn_index <= t.turn_index), "
        "(SELECT COUNT(*) FROM turns s WHERE s.session_id = t.session_id "
        "AND s.parent_index IS t.parent_index), t.branch, t.inherited"
    )


def with_siblings(rows: list[tuple], parent_at: int) -> list[tuple]:
    """Every turn of a session (in index order, the parent at `parent_at`, then
    branch and inherited) with its sibling position and count inserted after
    the parent, as `extras_sql` gives them: counted here, in one pass, rather
    than by two subqueries per turn."""
    counts: dict[int | None, int] = {}
    for row in rows:
        counts[row[parent_at]] = counts.get(row[parent_at], 0) + 1
    seen: dict[int | None, int] = {}
    out = []
    for row in rows:
        parent = row[parent_at]
        seen[parent] = seen.get(parent, 0) + 1
        out.append((*row[: parent_at + 1], seen[parent], counts[parent], *row[parent_at + 1 :]))
    return out


def records(rows: list[tuple], columns: list[str], tokens: bool = False) -> list[TurnRecord]:
    """Rows of (turn_index, user_text, reply, *metric columns, parent, *extras)
    as TurnRecords (`columns`: the names up to the parent); with `tokens`, the
    last two of them are `TOKEN_COLUMNS`."""
    n = len(columns)
    end = n - len(TOKEN_COLUMNS) if tokens else n
    metrics = metrics_of(columns[3:end], (row[3:end] for row in rows))
    return [
        TurnRecord(r[0], r[1], r[2], m, parent=r[n], sibling=r[n + 1], siblings=r[n + 2], branch=r[n + 3],
                   inherited=bool(r[n + 4]), reply_tokens=reply_tokens_of(*r[end:n]) if tokens else None)
        for r, m in zip(rows, metrics, strict=True)
    ]


def branch_of_new(query: Query, session_id: int, parent: int | None, index: int) -> str:
    """The branch name of turn `index`, about to be recorded under `parent`."""
    first = query(
        "SELECT branch FROM turns WHERE session_id = ? AND parent_index IS ? ORDER BY turn_index LIMIT 1",
        (session_id, parent),
    )
    if first:
        return branch_name(index)
    if parent is None:
        return MAIN_BRANCH
    row = query("SELECT branch FROM turns WHERE session_id = ? AND turn_index = ?", (session_id, parent))
    return row[0][0] if row else MAIN_BRANCH


def newest_leaf(query: Query, session_id: int, index: int) -> int:
    """The newest turn under turn `index` (itself when it has none): where the
    user last went on from there. A newer turn has a larger index, and a child
    a larger one than its parent, so that turn is a leaf. Taking the latest
    child at each level instead lost a reply written under an earlier
    version of a message once a later version existed."""
    row = query(
        "WITH RECURSIVE under(i) AS (SELECT ? UNION ALL SELECT t.turn_index FROM turns t JOIN under"
        " ON t.parent_index = under.i WHERE t.session_id = ?) SELECT MAX(i) FROM under",
        (index, session_id),
    )
    return index if not row or row[0][0] is None else int(row[0][0])


def leads_to(query: Query, session_id: int, index: int, leaf: int) -> bool:
    """Turn `index` is on the path that ends at turn `leaf`."""
    row = query(
        "WITH RECURSIVE up(i) AS (SELECT ? UNION ALL SELECT t.parent_index FROM turns t JOIN up"
        " ON t.turn_index = up.i WHERE t.session_id = ? AND t.parent_index IS NOT NULL)"
        " SELECT 1 FROM up WHERE i = ? LIMIT 1",
        (leaf, session_id, index),
    )
    return bool(row)


def siblings(query: Query, session_id: int, parent: int | None) -> list[int]:
    """The indexes of the turns under `parent` (None: the first turns), oldest first."""
    rows = query(
        "SELECT turn_index FROM turns WHERE session_id = ? AND parent_index IS ? ORDER BY turn_index",
        (session_id, parent),
    )
    return [r[0] for r in rows]
