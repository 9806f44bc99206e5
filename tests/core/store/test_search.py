"""Full-text search on real SQLite: FTS5, and the plain scan of a build without it."""

from __future__ import annotations

import sqlite3

import pytest

from chatterm.core.store import schema
from chatterm.core.store.session_store import SessionStore
from tests.core.store.test_store import full_metrics, new_session

NASTY = ['"', '""', "*", "a*", '"unbalanced', "(", ")", "AND", "OR NOT", "NEAR(a b)", "user_text:x",
         "reply:", "^start", "-x", "+", "{a b}: c", "'; DROP TABLE turns; --", "%", "_", "\\", "\x00",
         "🙂", "a" * 2000, "NEAR/3", "col : *"]


@pytest.fixture(params=[True, False], ids=["fts5", "scan"])
def store(request, tmp_path, monkeypatch):
    """A store with the full-text index, and one made where SQLite lacks FTS5."""
    if not request.param:
        monkeypatch.setattr(schema, "fts5_available", lambda conn: False)
    with SessionStore(tmp_path / "s.db") as s:
        assert s._fts is request.param
        yield s


def test_a_word_is_found_in_a_store_of_1000_sessions(store):
    with store.batch():
        for n in range(1000):
            sid = new_session(store, started_at=1000.0 + n)
            store.record_turn(sid, f"question {n} about lists", f"reply {n} on sorting", full_metrics())
            if n == 617:
                store.record_turn(sid, "what is a quokka?", "A small marsupial.", full_metrics())
    hits = store.search("quokka")
    assert [(h.session_id, h.turn_index, h.role) for h in hits] == [(618, 2, "user")]
    assert hits[0].title == "question 617 about lists" and "quokka" in hits[0].snippet
    # In a reply, any case; every word must match.
    assert [(h.session_id, h.role) for h in store.search("MARSUPIAL")] == [(618, "assistant")]
    assert [h.session_id for h in store.search("question 617 lists")] == [618]
    assert store.search("question marsupial nowhere") == []
    # Newest first, up to the limit; the last word may be a prefix.
    assert [h.session_id for h in store.search("sorting", limit=3)] == [1000, 999, 998]
    assert [h.session_id for h in store.search("quok")] == [618]


def test_fts_syntax_characters_never_raise(store):
    sid = new_session(store)
    store.record_turn(sid, 'say "NEAR(a b)" AND user_text:x -x 100% a_b c:\\d', "ok", full_metrics())
    for text in NASTY:
        hits = store.search(text)
        assert all(h.session_id == sid for h in hits), text
    assert [h.turn_index for h in store.search('"NEAR(a b)"')] == [1]
    assert [h.turn_index for h in store.search("100%")] == [1]
    assert store.search("") == [] and store.search("   ") == []
    assert sqlite3.connect(store.path).execute("SELECT count(*) FROM turns").fetchone() == (1,)


def test_the_index_follows_deletes_and_forks(store):
    keep, gone = new_session(store), new_session(store)
    store.record_turn(keep, "the pelican flies", "yes", full_metrics())
    store.record_turn(gone, "the pelican swims", "no", full_metrics())
    assert {h.session_id for h in store.search("pelican")} == {keep, gone}
    store.delete_session(gone)
    assert [h.session_id for h in store.search("pelican")] == [keep]
    # A fork's copy of a turn is found in the session it came from, once; its
    # own turns are found in it, and its copies too once the parent is gone.
    fork, _ = store.fork_session(keep)
    store.record_turn(fork, "and the pelican dives", "sometimes", full_metrics())
    assert [(h.session_id, h.turn_index) for h in store.search("pelican")] == [(fork, 2), (keep, 1)]
    grandchild, _ = store.fork_session(fork)
    assert [(h.session_id, h.turn_index) for h in store.search("pelican")] == [(fork, 2), (keep, 1)]
    store.delete_session(keep)
    assert [(h.session_id, h.turn_index) for h in store.search("pelican")] == [(fork, 2), (fork, 1)]


def test_deleting_the_middle_of_a_fork_line_lists_each_turn_once(store):
    root = new_session(store)
    store.record_turn(root, "the heron waits", "patiently", full_metrics())
    middle, _ = store.fork_session(root)
    store.record_turn(middle, "the heron strikes", "quickly", full_metrics())
    last, _ = store.fork_session(middle)
    store.delete_session(middle)
    # The root's turn is found in the root; the middle's, now held only by the
    # last fork, in it.
    assert [(h.session_id, h.turn_index) for h in store.search("heron")] == [(last, 2), (root, 1)]
    assert [r.inherited for r in store.turns(last)] == [True, False]
    assert store.session(last).forked_from == (root, 1)
    store.delete_session(root)
    assert [(h.session_id, h.turn_index) for h in store.search("heron")] == [(last, 2), (last, 1)]
    assert store.session(last).forked_from is None and not any(r.inherited for r in store.turns(last))


def test_an_older_regeneration_is_a_hit_only_where_its_reply_matches_as_the_index_does(store):
    sid = new_session(store)
    store.record_turn(sid, "tell me about the cat", "concatenate strings instead", full_metrics())
    store.record_turn(sid, "tell me about the cat", "a cat is a feline", full_metrics(), after=0)
    store.record_turn(sid, "tell me about the cat", "the cat purrs", full_metrics(), after=0)
    # The newest is the message's hit; "a cat is…" holds "cat" too; "concatenate" does not.
    assert [(h.turn_index, h.role) for h in store.search("cat")] == [(3, "user"), (2, "assistant")]


def test_a_hits_snippet_shows_the_word_that_matched():
    from chatterm.core.store.search import snippet

    # "art" begins a word only in the reply: the user's "start" is not the match.
    assert snippet("How do I start?", "Modern art is one answer.", "art") == (
        "assistant", "Modern art is one answer.")
    # Diacritics and case ignored, as FTS5's tokenizer does: "cafe" found in "Café".
    assert snippet("Where is a good Café?", "Try the corner.", "cafe") == ("user", "Where is a good Café?")
    # Inside a word only (a plain scan's LIKE match): still the place it is in.
    role, cut = snippet("x " * 40 + "restart it", "no", "start")
    assert role == "user" and "restart" in cut and cut.startswith("…")
    # Far into a long message: the match comes early enough for the sessions screen's cell
    # (36 characters, after "you: "), and the snippet starts on a word.
    role, cut = snippet("Explain why the sky is blue, and mention Rayleigh scattering briefly.", "no", "Rayleigh")
    assert cut == "…and mention Rayleigh scattering briefly."
    assert cut.index("Rayleigh") + len("you: Rayleigh") <= 36
