"""Sessions as listed: figures, title, preview and activity, in SQL.

Contract:
- `session_infos(query, tree, where, params)` reads the sessions `where`
  selects (over `s`, the session row), newest activity first: the figures
  over every computed turn (answered from the `turns_summary` covering
  index), the title, the preview of the current exchange and the session's
  fork origin, and how many turns the current path holds. Texts are cut in SQL, so a listing never reads a whole long
  message.
- `latest_sql(tree)` selects the first session of that order.
- `tree` says whether the schema has v8's columns; without them (an older
  database opened read-only) a session reads as one line, untitled, last
  active at its newest turn.
"""

from __future__ import annotations

from typing import Callable, Iterable

from chatterm.core.metrics.turn_metrics import percentile, usd
from chatterm.core.store.records import SessionInfo, default_title, preview_of

Query = Callable[[str, tuple], list[tuple]]
_CUT = 400
"""Characters of a text read for a title or a preview (both are cut shorter)."""


_ANCESTOR_TITLE = (
    # Up the forked_from links while the session reached has no title of its
    # own: a fork of an untitled fork goes by the name given further up. A
    # fork's id is always above its parent's, so the walk ends; the depth cap
    # is for a database edited by hand.
    "(WITH RECURSIVE up(parent, title, depth) AS ("
    "SELECT p.forked_from, p.title, 1 FROM sessions p WHERE p.id = s.forked_from UNION ALL "
    "SELECT p.forked_from, p.title, up.depth + 1 FROM up JOIN sessions p ON p.id = up.parent "
    "WHERE up.title IS NULL AND up.depth < 64) "
    "SELECT title FROM up WHERE title IS NOT NULL LIMIT 1)"
)


def session_sql(tree: bool) -> tuple[str, str, str]:
    """SQL over `s` for the current leaf, the last activity, and (title,
    forked_from, forked_turn, the title given to the nearest session up its
    fork line that has one)."""
    if tree:
        return ("s.current_index", "s.active_at", f"s.title, s.forked_from, s.forked_turn, {_ANCESTOR_TITLE}")
    return (
        "(SELECT MAX(turn_index) FROM turns WHERE session_id = s.id)",
        "COALESCE((SELECT MAX(recorded_at) FROM turns WHERE session_id = s.id), s.started_at)",
        "NULL, NULL, NULL, NULL",
    )


def path_length_sql(tree: bool) -> str:
    """SQL over `s` for the number of turns on the current path (the turns the
    conversation shows), NULL where that is every turn: a session without
    siblings is one line. Only a branched session's path is walked, by the
    primary key; which sessions branch is read from the `turns_by_parent` index."""
    if not tree:
        return "NULL"
    return (
        "CASE WHEN s.id IN (SELECT session_id FROM turns GROUP BY session_id, parent_index "
        "HAVING COUNT(*) > 1) THEN "
        "(WITH RECURSIVE path(idx) AS (SELECT s.current_index UNION ALL "
        "SELECT t.parent_index FROM path JOIN turns t ON t.session_id = s.id AND t.turn_index = path.idx "
        "WHERE t.parent_index IS NOT NULL) "
        "SELECT COUNT(*) FROM path JOIN turns t ON t.session_id = s.id AND t.turn_index = path.idx) END"
    )


def latest_sql(tree: bool) -> str:
    _, active, _ = session_sql(tree)
    return f"SELECT s.id FROM sessions s ORDER BY {active} DESC, s.id DESC LIMIT 1"


def _fork(forked_from: int | None, forked_turn: int | None) -> tuple[int, int] | None:
    return (forked_from, forked_turn) if forked_from is not None and forked_turn is not None else None


def session_infos(query: Query, tree: bool, where: str, params: tuple) -> list[SessionInfo]:
    current, active, extra = session_sql(tree)
    rows = query(
        "SELECT s.id, s.started_at, s.model_id, s.model_identity, s.engine, s.device, "
        "s.persona_id, COUNT(t.id), COALESCE(SUM(t.cost_usd), 0.0) "
        f"FROM sessions s LEFT JOIN turns t ON t.session_id = s.id {where} "
        f"GROUP BY s.id ORDER BY {active} DESC, s.id DESC",
        params,
    )
    ttfts: dict[int, list[float]] = {}
    for sid, ttft in query(
        "SELECT s.id, t.ttft_ms FROM sessions s JOIN turns t ON t.session_id = s.id "
        f"{where}{' AND' if where else 'WHERE'} t.ttft_ms IS NOT NULL",
        params,
    ):
        ttfts.setdefault(sid, []).append(ttft)
    # Apart, over forks only: read in the query above, `inherited` (not in the
    # covering index turns_summary) made it read every turn row, texts included.
    inherited: dict[int, float] = dict(query(
        "SELECT s.id, SUM(t.cost_usd) FROM sessions s JOIN turns t ON t.session_id = s.id "
        f"{where}{' AND' if where else 'WHERE'} s.forked_from IS NOT NULL AND t.inherited GROUP BY s.id",
        params,
    )) if tree else {}
    described = {
        r[0]: r[1:]
        for r in query(
            f"SELECT s.id, {extra}, substr(f.user_text, 1, {_CUT}), substr(c.user_text, 1, {_CUT}), "
            f"substr(c.reply, 1, {_CUT}), {active}, {path_length_sql(tree)} FROM sessions s "
            "LEFT JOIN turns f ON f.session_id = s.id AND f.turn_index = 1 "
            f"LEFT JOIN turns c ON c.session_id = s.id AND c.turn_index = {current} {where}",
            params,
        )
    }
    infos = []
    for row in rows:
        title, forked_from, forked_turn, parent_title, first, user, reply, active_at, on_path = described[row[0]]
        forked = _fork(forked_from, forked_turn)
        path = row[7] if on_path is None else on_path
        infos.append(SessionInfo(
            *row[:7],
            turns=row[7],
            path_turns=path,
            ttft_p50_ms=percentile(ttfts.get(row[0], []), 50),
            cost_usd=usd(row[8]),  # a SQL sum: 0.008538999999999998 for 0.008539
            inherited_cost_usd=usd(inherited.get(row[0]) or 0.0),
            title=title or default_title(first, forked, parent_title),
            # An untitled session's title is its first message: with one
            # exchange, the preview would say it twice on one line.
            preview=preview_of(user, reply, titled_by_it=not title and forked is None and path == 1 and user == first),
            active_at=active_at,
            forked_from=forked,
        ))
    return infos


def titles(query: Query, tree: bool, session_ids: Iterable[int]) -> dict[int, str]:
    """The titles of these sessions (see SessionInfo.title)."""
    ids = sorted(set(session_ids))
    if not ids:
        return {}
    _, _, extra = session_sql(tree)
    found = {}
    for sid, title, forked_from, forked_turn, parent_title, first in query(
        f"SELECT s.id, {extra}, substr(f.user_text, 1, {_CUT}) FROM sessions s "
        "LEFT JOIN turns f ON f.session_id = s.id AND f.turn_index = 1 "
        f"WHERE s.id IN ({', '.join('?' * len(ids))})",
        tuple(ids),
    ):
        found[sid] = title or default_title(first, _fork(forked_from, forked_turn), parent_title)
    return found
