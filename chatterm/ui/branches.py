"""Branches of a stored conversation, as the chat uses them: regenerate, edit, switch.

Contract:
- The tree is the session store's (docs/conversations.md): a regenerated reply
  or an edited message is a sibling of the turn it replaces, and the model's
  history is the current path. These functions ask the store and return what
  the chat needs; they touch no widget and no engine.
- `prepare(store, session_id, turn)`: the path before a sibling of `turn`
  (regenerate: the same user text again; edit: a new one), whose history is
  sent; the conversation's leaf set to that path's end (`Conversation.leaf`)
  makes the turn it records that sibling.
- `switch(store, session_id, turn, delta)`: make the sibling `delta` places
  from `turn` current; returns it and the new path, or None when there is no
  sibling that way.
- `recorded(store, session_id, leaf)`: the turn a conversation just recorded
  (`Conversation.leaf`; not the store's current leaf, which another process
  may have moved since).
- Store errors arrive as `ChattermError` with one line, for the caller to show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chatterm.core.store.session_store import SessionStore, TurnRecord


def prepare(store: "SessionStore", session_id: int, turn: int) -> list["TurnRecord"]:
    """The path before `turn`, for its new sibling (see the module contract)."""
    return store.path_before(session_id, turn)


def switch(store: "SessionStore", session_id: int, turn: int, delta: int
           ) -> tuple[int, list["TurnRecord"]] | None:
    """Select the sibling `delta` places from `turn`: (that sibling, the new
    current path), or None when there is none that way."""
    siblings = store.siblings(session_id, turn)
    position = siblings.index(turn) + delta
    if not 0 <= position < len(siblings):
        return None
    return siblings[position], store.select_turn(session_id, siblings[position])


def recorded(store: "SessionStore", session_id: int, leaf: int | None) -> "TurnRecord | None":
    """The turn `leaf` (None or 0: nothing recorded)."""
    return store.turn(session_id, leaf) if leaf else None
