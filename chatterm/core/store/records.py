"""What the session store hands out: sessions, turns, search hits.

Contract:
- `SessionInfo` is one session as listed: its figures over every computed
  turn, its title (stored, else the first user message cut to `TITLE_CHARS`
  on one line) and the preview of its current exchange (`PREVIEW_CHARS`).
- `TurnRecord` is one turn with its place in the session's tree: `parent`
  (None for a first turn), its position among its siblings (the turns sharing
  its parent) and its `branch`: "main" for the line that began with the
  session's first turn and always took a turn's first reply, else "b<N>",
  the branch that turn N (a regenerated reply or an edited message) started.
- Texts are as stored: model output is untrusted, and whoever shows a title,
  a preview or a snippet renders it literally.
- `sql_value` and `metrics_of` convert between TurnMetrics and SQLite values.
"""

from __future__ import annotations

import numbers
from dataclasses import MISSING, dataclass, fields
from typing import Iterable, Sequence

from chatterm.core.engine.interface import ReplyTokens
from chatterm.core.metrics.turn_metrics import TurnMetrics

TITLE_CHARS = 60
PREVIEW_CHARS = 100
MAIN_BRANCH = "main"

METRIC_FIELDS = {f.name for f in fields(TurnMetrics)}
BOOL_FIELDS = {f.name for f in fields(TurnMetrics) if f.type in ("bool", bool)}
FIELD_DEFAULTS = {f.name: f.default for f in fields(TurnMetrics) if f.default is not MISSING}
"""What a column an older database lacks reads as (derived fields: None)."""


def one_line(text: str, limit: int) -> str:
    """`text` with its whitespace runs as single spaces, cut to `limit` characters
    (the last one an ellipsis when cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def branch_name(first_index: int | None) -> str:
    """The name of the branch turn `first_index` started (None: the main line)."""
    return MAIN_BRANCH if first_index is None else f"b{first_index}"


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
    """Every computed turn, on any branch (a fork's inherited turns included)."""
    ttft_p50_ms: float | None
    cost_usd: float
    """Sum of the turns' API-equivalent cost (a fork's inherited turns included:
    they are its history; see `inherited_cost_usd`)."""
    title: str = ""
    """The title given, else the first user message cut (empty: no turn yet)."""
    path_turns: int = 0
    """The turns on the current path: the exchanges the conversation shows."""
    preview: str = ""
    """The current exchange, "user text → reply", on one line and cut; "→ reply"
    where the message is the title already (an untitled session of one exchange)."""
    active_at: float = 0.0
    """Unix time (s) of the last turn recorded, else of the start: the listing's order."""
    forked_from: tuple[int, int] | None = None
    """(session id, turn index) this session was forked from."""
    inherited_cost_usd: float = 0.0
    """The part of `cost_usd` a fork copied with its parent's turns: spent in
    the parent, so a sum over sessions takes `cost_usd - inherited_cost_usd`."""

    @property
    def turns_label(self) -> str:
        """The listings' turn count: "5", or "1 +2" when 2 more turns were
        computed on other branches (regenerations, edits and what followed them)."""
        other = self.turns - self.path_turns
        return f"{self.path_turns} +{other}" if other > 0 else str(self.path_turns)


def turns_note(sessions: Iterable[SessionInfo]) -> str:
    """What a "1 +2" in the listings means, for a listing that shows one; else ""."""
    s = next((s for s in sessions if s.turns > s.path_turns), None)
    if s is None:
        return ""
    # "such as": the session it names may be scrolled out of view.
    return (f"Turns such as {s.turns_label}: {s.path_turns} on the branch shown, {s.turns - s.path_turns} more "
            "on other branches (regenerated, edited).")


@dataclass(slots=True)
class TurnRecord:
    index: int
    """The turn's number in its session: 1 for the first computed turn."""
    user_text: str
    reply: str
    """The reply as streamed: partial for a cancelled turn, maybe empty on error."""
    metrics: TurnMetrics
    parent: int | None = None
    """The index of the turn before this one on its path (None: a first turn)."""
    sibling: int = 1
    """Its position among the turns sharing its parent, from 1, oldest first."""
    siblings: int = 1
    branch: str = MAIN_BRANCH
    inherited: bool = False
    """Copied from the session this one was forked from, not computed here."""
    reply_tokens: ReplyTokens | None = None
    """The reply's sampled tokens (read with the history only, see `TOKEN_COLUMNS`)."""

    @property
    def sibling_label(self) -> str:
        """"2/3" when the turn has alternatives, else empty."""
        return f"{self.sibling}/{self.siblings}" if self.siblings > 1 else ""


@dataclass(frozen=True)
class SearchHit:
    session_id: int
    turn_index: int
    title: str
    """The session's title (see SessionInfo.title)."""
    role: str
    """"user" or "assistant": where the match is."""
    snippet: str
    """Plain text around the match, on one line (no markup)."""


TOKEN_COLUMNS = ("reply_tokens", "reply_tokens_model")
"""The reply's sampled tokens and the model they belong to (v11)."""


def tokens_blob(tokens: ReplyTokens | None) -> tuple[bytes | None, str | None]:
    """The TOKEN_COLUMNS values for `tokens`."""
    return (None, None) if tokens is None else (tokens.data, tokens.model_identity)


def reply_tokens_of(blob: bytes | None, model_identity: str | None) -> ReplyTokens | None:
    """The TOKEN_COLUMNS values read back (None for a turn without them, or a
    blob that is not whole int32s)."""
    if not blob or not model_identity or len(blob) % 4:
        return None
    return ReplyTokens(model_identity, bytes(blob))


def sql_value(value: object) -> object:
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


def metrics_of(names: list[str], rows: Iterable[Sequence]) -> list[TurnMetrics]:
    """Rows of metric columns (`names`, all TurnMetrics fields) as TurnMetrics.
    A NULL where the field has a value by default (the schema lets metric
    columns be NULL; an early chatterm or a hand edit left some) reads as that
    default: the reports add and compare them."""
    bools = [i for i, name in enumerate(names) if name in BOOL_FIELDS]
    filled = [(i, FIELD_DEFAULTS[name]) for i, name in enumerate(names)
              if FIELD_DEFAULTS.get(name) is not None]
    metrics = []
    for row in rows:
        values = list(row)
        for i, default in filled:
            if values[i] is None:
                values[i] = default
        for i in bools:
            values[i] = bool(values[i])
        metrics.append(TurnMetrics(**dict(zip(names, values, strict=True))))
    return metrics


def default_title(
    first_user_text: str | None, forked_from: tuple[int, int] | None, parent_title: str | None = None
) -> str:
    """The title of a session nobody named: its first user message, cut; a fork
    says where it came from, under the title its parent was given if any (the
    name the user knows that conversation by)."""
    if forked_from is None:
        return one_line(first_user_text or "", TITLE_CHARS)
    # The text is cut shorter so that where the fork came from still shows
    # in a listing's one line.
    origin = f"(fork of session {forked_from[0]}, turn {forked_from[1]})"
    text = parent_title or first_user_text or ""
    return f"{one_line(text, TITLE_CHARS - len(origin) - 1)} {origin}".lstrip()


def preview_of(user_text: str | None, reply: str | None, titled_by_it: bool = False) -> str:
    """The one-line preview of an exchange (empty: no turn yet); `titled_by_it`:
    the message is the session's title already, and only the reply is shown."""
    if user_text is None:
        return ""
    return one_line(f"→ {reply or ''}" if titled_by_it else f"{user_text} → {reply or ''}", PREVIEW_CHARS)
