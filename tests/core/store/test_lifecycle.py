"""Forking and deleting sessions with their KV states: real SQLite, a real
prompt cache with its state files on disk."""

from __future__ import annotations

import sqlite3

import pytest

from chatterm.core.cache.prompt_cache import DISK, PromptCache, Slot
from chatterm.core.store.lifecycle import delete_session, fork_session
from chatterm.core.store.session_store import SessionStore
from chatterm.errors import ChattermError
from tests.core.store.test_store import full_metrics, new_session, old_database

COMPAT = {"model_sha256": "ab" * 32, "llama_cpp_build": "cd" * 32}


def state(seed: int) -> bytearray:
    return bytearray([seed]) * (5 << 20)  # more than one 4 MiB digest chunk


@pytest.fixture
def world(tmp_path):
    cache = PromptCache(tmp_path / "kv")
    with SessionStore(tmp_path / "s.db") as store:
        yield store, cache


def files(cache: PromptCache) -> set[tuple[str, str]]:
    return {(e.model_id, e.slot.label) for e in PromptCache(cache.folder).entries() if e.tier == DISK}


def test_delete_removes_the_rows_and_the_state_files(world):
    store, cache = world
    sid, other = new_session(store), new_session(store)
    for n in range(3):
        store.record_turn(sid, f"q{n}", f"a{n}", full_metrics())
    store.record_turn(other, "q", "a", full_metrics())
    for model in ("m1", "m2"):
        cache.save(model, Slot.session(sid), list(range(40)), state(1), COMPAT)
    cache.save("m1", Slot.session(other), list(range(40)), state(2), COMPAT)
    cache.put("m1", Slot.session(sid), list(range(40)), state(3), COMPAT, disk=False)  # RAM too

    with pytest.raises(ChattermError, match=f"session {sid} is the one in use"):
        delete_session(store, cache, sid, in_use=sid)
    assert store.session(sid).turns == 3  # refused: nothing removed

    deleted = delete_session(store, cache, sid, in_use=other)
    assert (deleted.turns, deleted.states) == (3, 3)  # two files, one RAM entry
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT count(*) FROM turns WHERE session_id = ?", (sid,)).fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM sessions WHERE id = ?", (sid,)).fetchone() == (0,)
    assert files(cache) == {("m1", f"session {other}")}
    assert [e.slot for e in cache.entries()] == [Slot.session(other)]
    with pytest.raises(ChattermError, match=f"unknown session {sid}"):
        store.session(sid)
    with pytest.raises(ChattermError, match=f"unknown session {sid}"):
        delete_session(store, cache, sid)
    assert [s.id for s in store.sessions()] == [other]


def test_fork_copies_the_parents_states_to_its_own_slot(world):
    store, cache = world
    sid = new_session(store)
    for n in range(2):
        store.record_turn(sid, f"q{n}", f"a{n}", full_metrics())
    cache.save("m1", Slot.session(sid), list(range(64)), state(7), COMPAT, {"prefill_ms": 12.5})
    cache.save("m1", Slot.session(sid + 100), list(range(64)), state(8), COMPAT)  # someone else's

    fork = fork_session(store, cache, sid, 1)
    assert (fork.turns, fork.states) == (1, 1)
    assert [r.user_text for r in store.turns(fork.session_id)] == ["q0"]
    assert files(cache) == {("m1", f"session {sid}"), ("m1", f"session {sid + 100}"),
                            ("m1", f"session {fork.session_id}")}
    # The copy is a whole, valid state file: same tokens, same payload.
    reader = PromptCache(cache.folder)
    found = reader.lookup("m1", COMPAT, list(range(64)) + [5], expect=[Slot.session(fork.session_id)])
    assert not found.misses
    copy = next(c for c in found.candidates if c.entry.slot == Slot.session(fork.session_id))
    assert copy.shared == 64 and copy.entry.info["prefill_ms"] == 12.5
    opened = reader.open(copy)
    assert opened.verify() and bytes(opened.payload) == bytes(state(7))
    opened.close()
    assert all(f.ok for f in cache.verify_files())
    # Deleting the parent leaves the fork and its state.
    delete_session(store, cache, sid)
    assert ("m1", f"session {fork.session_id}") in files(cache)
    assert [r.user_text for r in store.turns(fork.session_id)] == ["q0"]


def test_a_fork_without_saved_states_still_works(world):
    store, cache = world
    sid = new_session(store)
    store.record_turn(sid, "q", "a", full_metrics())
    fork = fork_session(store, cache, sid)
    assert (fork.turns, fork.states) == (1, 0)
    assert fork_session(store, None, sid).states == 0


def test_a_deleted_sessions_id_is_never_given_out_again(world, tmp_path):
    store, cache = world
    first, newest = new_session(store), new_session(store)
    store.record_turn(first, "q", "a", full_metrics())
    delete_session(store, cache, newest)
    again = new_session(store)
    assert again == newest + 1  # SQLite alone would give `newest` again
    forked = fork_session(store, cache, first, None).session_id
    assert forked == again + 1
    for sid in (first, again, forked):
        delete_session(store, cache, sid)
    assert new_session(store) == forked + 1  # an empty table too
    # A database from before v9 starts its floor at its largest id.
    db = tmp_path / "v8.db"
    conn = old_database(db, 8)
    conn.execute("INSERT INTO sessions (id, started_at, model_id, model_identity, engine, device, persona_id) "
                 "VALUES (7, 1.0, 'm', 'sha', 'local', 'CPU', 'assistant')")
    conn.commit()
    conn.close()
    with SessionStore(db) as old:
        delete_session(old, cache, 7)
        assert new_session(old) == 8
