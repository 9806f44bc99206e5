"""Forking and deleting sessions: their rows in the store and their KV states in
the prompt cache, together.

Contract:
- `fork_session(store, cache, session_id, turn)` makes a new session holding
  the path up to `turn` (None: the current leaf; see
  `SessionStore.fork_session`) and copies every KV state saved for the
  parent's slot ("session", id) to the fork's slot, one per model: the
  fork's first turn restores the shared prefix instead of prefilling its
  history (the cache finds the longest token prefix; the parent's tokens past
  `turn` are simply not reused). A state whose payload fails its digests is
  not copied. The rows are written first: a state copy that fails leaves a
  fork that prefills its first turn, nothing worse.
- `delete_session(store, cache, session_id, in_use=)` refuses the session in
  use (`in_use`: the one the caller has open) with one line, else removes
  its rows, then its KV states (RAM and disk) from the cache.
- Only the prompt cache's public API is used (`entries`, `open`, `save`,
  `clear`), so it works whatever the cache's file layout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from chatterm.core.cache.prompt_cache import Candidate, Miss, PromptCache
from chatterm.core.metrics.format import counted
from chatterm.core.store.session_store import SessionStore
from chatterm.errors import ChattermError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fork:
    session_id: int
    turns: int
    """Turns the fork inherited."""
    states: int
    """KV states copied (one per model the parent had a state for)."""


@dataclass(frozen=True)
class Deleted:
    turns: int
    states: int
    """KV states removed (RAM and disk entries)."""

    def summary(self, session_id: int) -> str:
        """The one sentence the CLI and the TUI report a deletion with."""
        return f"Deleted session {session_id}: {counted(self.turns, 'turn')}, {counted(self.states, 'KV state')}."


def copy_session_states(cache: PromptCache, source: int, target: int) -> int:
    """Copy every usable KV state of session `source`'s slot to `target`'s; the
    number copied."""
    copied: set[str] = set()
    # A slot may show up in several tiers (RAM, disk): one copy per model, from
    # the most recently used entry that can be read.
    for entry in cache.entries():
        if entry.slot != cache.session_slot(source) or entry.problem or entry.model_id in copied:
            continue
        opened = cache.open(Candidate(entry, len(entry.tokens)))
        if isinstance(opened, Miss):
            log.info("fork: state not copied: %s", opened.reason)
            continue
        try:
            if opened.verify is not None and not opened.verify():
                log.info("fork: state of %s not copied: its payload fails its digests", entry.slot.label)
                continue
            if cache.save(entry.model_id, cache.session_slot(target), opened.tokens, opened.payload, entry.compat,
                          entry.info) is not None:
                copied.add(entry.model_id)
        finally:
            opened.close()
    return len(copied)


def fork_session(store: SessionStore, cache: PromptCache | None, session_id: int, turn: int | None = None) -> Fork:
    """Fork session `session_id` at `turn` (see the module contract)."""
    new, turns = store.fork_session(session_id, turn)
    states = copy_session_states(cache, session_id, new) if cache is not None else 0
    return Fork(new, turns, states)


def delete_session(
    store: SessionStore, cache: PromptCache | None, session_id: int, *, in_use: int | None = None
) -> Deleted:
    """Delete session `session_id` with its KV states (see the module contract)."""
    if in_use is not None and session_id == in_use:
        raise ChattermError(f"session {session_id} is the one in use; open another before deleting it")
    turns = store.delete_session(session_id)
    states = cache.clear(kind="session", key=cache.session_slot(session_id).key) if cache is not None else 0
    return Deleted(turns, states)
