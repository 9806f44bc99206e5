"""The conversation tree on real SQLite: regenerate and edit make siblings, the
current path is the history, switching siblings, and the schema migration
from the previous version (v7) keeps old databases opening."""

from __future__ import annotations

import csv
import io
import json
import sqlite3

import pytest

from chatterm.core.engine.interface import ChatMessage
from chatterm.core.store.records import turns_note
from chatterm.core.store.resume import history_of
from chatterm.core.store.session_store import SCHEMA_VERSION, SessionStore
from chatterm.errors import ChattermError
from tests.conftest import export_text
from tests.core.store.test_store import full_metrics, new_session, old_database


def four_turns(store: SessionStore) -> int:
    sid = new_session(store)
    for i in range(1, 5):
        store.record_turn(sid, f"question {i}", f"answer {i}", full_metrics(i))
    return sid


def record_sibling(store, sid, turn, user_text, reply, metrics) -> int | None:
    """Record a regenerated or edited version of `turn`, as a Conversation does:
    under the end of the path before it."""
    path = store.path_before(sid, turn)
    return store.record_turn(sid, user_text, reply, metrics, after=path[-1].index if path else 0)


def shape(records) -> list[tuple]:
    return [(r.index, r.parent, r.sibling_label, r.branch) for r in records]


def test_regenerate_keeps_the_old_reply_and_makes_the_new_one_current(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        history = store.path_before(sid, 4)
        assert [r.index for r in history] == [1, 2, 3]
        assert store.record_turn(sid, "question 4", "another answer 4", full_metrics(9, ttft_ms=7.0), after=3) == 5
        assert shape(store.turns(sid)) == [(1, None, "", "main"), (2, 1, "", "main"), (3, 2, "", "main"),
                                           (5, 3, "2/2", "b5")]
        assert store.turn(sid, 4).reply == "answer 4"  # the old reply is kept
        assert store.siblings(sid, 5) == [4, 5]
        # The latency log: one row per computed turn, each with its own TTFT.
        assert [m.ttft_ms for m in store.turn_metrics(sid)] == [50.0, 60.0, 70.0, 80.0, 7.0]
        info = store.session(sid)
        assert (info.turns, info.path_turns, info.turns_label) == (5, 4, "4 +1")
        # A regenerated message is one search hit (the newest); its replies are two.
        assert [(h.turn_index, h.role) for h in store.search("question 4")] == [(5, "user")]
        assert [h.turn_index for h in store.search("answer")] == [5, 4, 3, 2, 1]
        # Where the older reply holds every word too, it is a hit of its own.
        assert [(h.turn_index, h.role) for h in store.search("4")] == [(5, "user"), (4, "assistant")]
        assert [(h.turn_index, h.role) for h in store.search("4 answ")] == [(5, "user"), (4, "assistant")]
        # The next turn continues the new reply.
        store.record_turn(sid, "question 6", "answer 6", full_metrics())
        assert [r.index for r in store.turns(sid)] == [1, 2, 3, 5, 6]
        # The listings say what "4 +1" means, and only when one shows such a count.
        plain = store.session(four_turns(store))
        assert turns_note([plain]) == ""
        assert turns_note([plain, info]).startswith(
            "Turns such as 4 +1: 4 on the branch shown, 1 more on other branches")


def test_a_turn_goes_under_the_turn_its_history_ends_at(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        # after=2: a sibling of turn 3 (another process moved the leaf past 2).
        assert store.record_turn(sid, "q", "a", full_metrics(), after=2) == 5
        assert shape(store.turns(sid)) == [(1, None, "", "main"), (2, 1, "", "main"), (5, 2, "2/2", "b5")]
        # after=0: a new first turn; an `after` that is no turn of the session: the current leaf.
        assert store.record_turn(sid, "q", "a", full_metrics(), after=0) == 6
        assert store.turn(sid, 6).parent is None
        assert store.record_turn(sid, "q", "a", full_metrics(), after=99) == 7
        assert store.turn(sid, 7).parent == 6


def test_continued_elsewhere_names_only_another_stores_move_and_once(tmp_path):
    with SessionStore(tmp_path / "s.db") as store, SessionStore(tmp_path / "s.db") as other:
        sid = four_turns(store)
        assert store.continued_elsewhere(sid) is None
        # A regenerate prepared here and never recorded (the engine closed): not a move.
        store.path_before(sid, 4)
        assert store.continued_elsewhere(sid) is None
        # A switch here: not one either; a turn recorded by another store is, once.
        store.select_turn(sid, 2)
        assert store.continued_elsewhere(sid) is None
        assert other.record_turn(sid, "elsewhere", "answer", full_metrics()) == 5
        assert store.continued_elsewhere(sid) == 5
        assert store.continued_elsewhere(sid) is None
        # Reading the session shows it as it is: the move is seen.
        assert other.record_turn(sid, "again", "answer", full_metrics()) == 6
        assert [r.index for r in store.turns(sid)] == [1, 2, 3, 4, 5, 6]
        assert store.continued_elsewhere(sid) is None
        # A session forked or created here starts in step.
        fork, _ = store.fork_session(sid, 2)
        assert store.continued_elsewhere(fork) is None
        with pytest.raises(ChattermError, match="99"):
            store.continued_elsewhere(99)


def test_a_rolled_back_batch_leaves_no_move_to_report(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        with pytest.raises(RuntimeError), store.batch():
            store.record_turn(sid, "never kept", "answer", full_metrics())
            raise RuntimeError("the bulk load failed")
        assert store.continued_elsewhere(sid) is None
        assert [r.index for r in store.turns(sid)] == [1, 2, 3, 4]
        # SQLite rolled back itself (a full disk): the store's own ROLLBACK has
        # no transaction left, and the batch's error is still the one raised.
        with pytest.raises(OSError, match="disk full"), store.batch():
            store.record_turn(sid, "never kept", "answer", full_metrics())
            store._conn.execute("ROLLBACK")
            raise OSError("disk full")
        assert store.continued_elsewhere(sid) is None


def test_an_edit_at_turn_2_of_4_branches_there_and_the_history_is_the_new_path(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        history = history_of(store.path_before(sid, 2))
        assert history == [ChatMessage("user", "question 1"), ChatMessage("assistant", "answer 1")]
        store.record_turn(sid, "question 2, edited", "answer 2b", full_metrics(), after=1)
        store.record_turn(sid, "question 3b", "answer 3b", full_metrics())
        assert shape(store.turns(sid)) == [(1, None, "", "main"), (5, 1, "2/2", "b5"), (6, 5, "", "b5")]
        assert history_of(store.turns(sid))[2:] == [
            ChatMessage("user", "question 2, edited"), ChatMessage("assistant", "answer 2b"),
            ChatMessage("user", "question 3b"), ChatMessage("assistant", "answer 3b"),
        ]
        # Switching back to the first alternative brings its whole line back.
        assert [r.index for r in store.select_turn(sid, 2)] == [1, 2, 3, 4]
        assert [r.index for r in store.turns(sid)] == [1, 2, 3, 4]
        assert store.turns(sid)[1].sibling_label == "1/2"
        assert [r.index for r in store.select_turn(sid, 5)] == [1, 5, 6]
        assert store.session(sid).turns_label == "3 +3"
        assert [r.index for r in store.select_turn(sid, 4)] == [1, 2, 3, 4]
        assert store.session(sid).turns_label == "4 +2"
        store.select_turn(sid, 5)
        # Going on under the first version after the edit: from the top, the
        # newest turn is under it (the latest child at each level was 5's line).
        store.select_turn(sid, 2)
        store.record_turn(sid, "question 5", "answer 5", full_metrics())
        assert [r.index for r in store.select_turn(sid, 1)] == [1, 2, 3, 4, 7]
        # A search hit on the path shown keeps it; one off it goes to its branch.
        store.select_turn(sid, 5)
        assert [r.index for r in store.select_turn(sid, 1, keep_path=True)] == [1, 5, 6]
        assert [r.index for r in store.select_turn(sid, 3, keep_path=True)] == [1, 2, 3, 4, 7]
        assert [r.index for r in store.select_turn(sid, 7, keep_path=True)] == [1, 2, 3, 4, 7]
        store.select_turn(sid, 5)
    # The choice is stored: another process sees the same path.
    with SessionStore(tmp_path / "s.db", readonly=True) as store:
        assert [r.index for r in store.turns(sid)] == [1, 5, 6]
        assert store.session(sid).preview == "question 3b → answer 3b"


def test_nothing_changes_until_the_new_turn_is_recorded(tmp_path):
    db = tmp_path / "s.db"
    with SessionStore(db) as store:
        sid = four_turns(store)
        store.path_before(sid, 3)  # an edit begun, then the app closes before the turn ends
    with SessionStore(db) as store:
        assert [r.index for r in store.turns(sid)] == [1, 2, 3, 4]
        store.record_turn(sid, "question 5", "answer 5", full_metrics())
        assert [r.index for r in store.turns(sid)] == [1, 2, 3, 4, 5]


def test_editing_the_first_message_makes_a_second_first_turn(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        assert store.path_before(sid, 1) == []
        store.record_turn(sid, "a new start", "fine", full_metrics(), after=0)
        assert shape(store.turns(sid)) == [(5, None, "2/2", "b5")]
        assert store.siblings(sid, 1) == [1, 5]
        assert store.session(sid).title == "question 1"  # the first message asked, still


def test_unknown_turns_and_sessions_are_named(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        for call in (store.path_before, store.select_turn, store.turn, store.siblings):
            with pytest.raises(ChattermError, match=f"session {sid} has no turn 9: its turns are 1-4$"):
                call(sid, 9)
            with pytest.raises(ChattermError, match="unknown session 77"):
                call(77, 1)
        with pytest.raises(ChattermError, match="unknown session 77"):
            store.fork_session(77)
        with pytest.raises(ChattermError, match=f"session {sid} has no turn 12"):
            store.fork_session(sid, 12)


def test_pages_of_a_branched_path(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        record_sibling(store, sid, 3, "b0", "r0", full_metrics())
        for i in range(1, 3):
            store.record_turn(sid, f"b{i}", f"r{i}", full_metrics())
        assert [r.index for r in store.turns(sid)] == [1, 2, 5, 6, 7]
        assert [r.index for r in store.turns_page(sid, None, 2)] == [6, 7]
        assert [r.index for r in store.turns_page(sid, 6, 2)] == [2, 5]
        assert [r.index for r in store.turns_page(sid, 2, 5)] == [1]
        assert store.turns_page(sid, 1, 5) == []
        assert [r.index for r in store.turns_page(sid, 2**40, 3)] == [5, 6, 7]
        assert [r.index for r in store.all_turns(sid)] == [1, 2, 3, 4, 5, 6, 7]


def test_fork_copies_the_path_as_inherited_turns(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        store.rename_session(sid, "Original")
        record_sibling(store, sid, 3, "question 3b", "answer 3b", full_metrics())
        fork, copied = store.fork_session(sid, 3)  # a turn off the current path
        assert copied == 3
        records = store.turns(fork)
        assert [(r.index, r.parent, r.inherited, r.user_text) for r in records] == [
            (1, None, True, "question 1"), (2, 1, True, "question 2"), (3, 2, True, "question 3")
        ]
        assert [r.metrics for r in records] == [full_metrics(i) for i in (1, 2, 3)]
        info = store.session(fork)
        # Under the name the parent was given, not its first message.
        assert info.forked_from == (sid, 3) and info.title == "Original (fork of session 1, turn 3)"
        assert store.sessions()[0].id == fork  # the newest activity
        store.record_turn(fork, "fork question", "fork answer", full_metrics())
        assert [(r.index, r.inherited) for r in store.turns(fork)][-1] == (4, False)
        assert [r.index for r in store.turns(sid)] == [1, 2, 5]  # the parent is as it was
        default_fork, copied = store.fork_session(sid)
        assert copied == 3 and store.turns(default_fork)[-1].user_text == "question 3b"


def test_a_fork_of_an_untitled_fork_goes_by_the_name_given_further_up(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        store.rename_session(sid, "Rivers chat")
        child, _ = store.fork_session(sid, 3)
        grandchild, _ = store.fork_session(child, 2)
        assert store.session(child).title == f"Rivers chat (fork of session {sid}, turn 3)"
        assert store.session(grandchild).title == f"Rivers chat (fork of session {child}, turn 2)"
        # The nearest name wins, and without any the fork's first message stands.
        store.rename_session(child, "Tributaries")
        assert store.session(grandchild).title == f"Tributaries (fork of session {child}, turn 2)"
        # With the middle gone, the grandchild hangs under the first session at
        # the last turn it copies from there.
        store.delete_session(child)
        assert store.session(grandchild).title == f"Rivers chat (fork of session {sid}, turn 2)"
        assert [r.inherited for r in store.turns(grandchild)] == [True, True]


def test_rename_and_titles(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = new_session(store)
        assert store.session(sid).title == ""
        store.record_turn(sid, "  How do\nI sort   a list " + "x" * 100, "Use sorted().", full_metrics())
        title = store.session(sid).title
        assert title.startswith("How do I sort a list x") and title.endswith("…") and len(title) == 60
        assert store.rename_session(sid, "  Sorting\tlists ") == "Sorting lists"
        assert store.session(sid).title == "Sorting lists"
        for blank in ("", "   \n"):
            with pytest.raises(ChattermError, match=f"title of session {sid} is empty"):
                store.rename_session(sid, blank)
        with pytest.raises(ChattermError, match="unknown session 5"):
            store.rename_session(5, "x")
        assert store.session(sid).title == "Sorting lists"


def make_v7_database(path) -> int:
    """A database as the previous chatterm left it (schema v7), with one session
    of three turns."""
    conn = old_database(path, 7)
    conn.execute("INSERT INTO sessions (started_at, model_id, model_identity, engine, device, persona_id) "
                 "VALUES (100.0, 'smollm2-135m', 'sha256:abc', 'local', 'CPU', 'assistant')")
    for i in (1, 2, 3):
        conn.execute("INSERT INTO turns (session_id, turn_index, recorded_at, user_text, reply, stop_reason, "
                     "ttft_ms) VALUES (1, ?, ?, ?, ?, 'eos', 10.0)", (i, 200.0 + i, f"old question {i}", "zebra"))
    conn.commit()
    conn.close()
    return 1


def test_migration_from_v7_keeps_the_turns_as_one_line(tmp_path):
    db = tmp_path / "v7.db"
    sid = make_v7_database(db)
    # Read-only, unmigrated: one line, untitled, search by scanning.
    with SessionStore(db, readonly=True) as store:
        assert shape(store.turns(sid)) == [(1, None, "", "main"), (2, 1, "", "main"), (3, 2, "", "main")]
        info = store.session(sid)
        assert (info.title, info.preview, info.active_at) == ("old question 1", "old question 3 → zebra", 203.0)
        assert [(h.session_id, h.turn_index) for h in store.search("question 2")] == [(sid, 2)]
        assert store.export_rows(sid)[1][-5:] == (1, "main", 0, "old question 2", "zebra")
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 7
    with SessionStore(db) as store:
        assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 11
        assert shape(store.turns(sid)) == [(1, None, "", "main"), (2, 1, "", "main"), (3, 2, "", "main")]
        assert store.session(sid).active_at == 203.0
        # The old texts are in the new full-text index.
        assert [h.turn_index for h in store.search("zebra")] == [3, 2, 1]
        assert record_sibling(store, sid, 3, "old question 3", "new reply", full_metrics()) == 4
        assert shape(store.turns(sid))[-1] == (4, 2, "2/2", "b4")
    conn = sqlite3.connect(db)
    indexes = {r[1] for r in conn.execute("PRAGMA index_list(turns)")}
    assert {"turns_by_session", "turns_summary", "turns_by_parent"} <= indexes
    assert "sessions_by_activity" in {r[1] for r in conn.execute("PRAGMA index_list(sessions)")}


def test_exports_name_the_branch_of_each_turn(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = four_turns(store)
        record_sibling(store, sid, 4, "question 4", "answer 4, again", full_metrics(ttft_ms=7.0))
        fork, _ = store.fork_session(sid, 2)
        rows = [json.loads(line) for line in export_text(store, [sid], "jsonl").splitlines()]
        # One row per computed turn: the regenerated one keeps its own TTFT.
        assert [(r["turn_index"], r["parent_index"], r["branch"], r["ttft_ms"]) for r in rows] == [
            (1, None, "main", 50.0), (2, 1, "main", 60.0), (3, 2, "main", 70.0), (4, 3, "main", 80.0),
            (5, 3, "b5", 7.0)]
        assert {r["inherited"] for r in rows} == {False}
        forked = [json.loads(line) for line in export_text(store, [fork], "jsonl").splitlines()]
        assert [(r["turn_index"], r["inherited"]) for r in forked] == [(1, True), (2, True)]
        table = list(csv.DictReader(io.StringIO(export_text(store, [sid], "csv"))))
        assert [(r["branch"], r["parent_index"], r["inherited"]) for r in table][-2:] == [
            ("main", "3", "false"), ("b5", "3", "false")]
        md = export_text(store, [sid, fork], "md")
        assert "### Branches" in md and "| 5 | b5 | 3 | 2/2 |  |" in md and "| 4 | main | 3 | 1/2 |  |" in md
        assert f"Forked from session {sid} at turn 2" in md and "| 1 | main | – | – | yes |" in md
        html = export_text(store, [sid], "html")
        assert "<h3>Branches</h3>" in html and "<td>b5</td>" in html
        # A session of one line gets no branches section.
        plain = four_turns(store)
        assert "Branches" not in export_text(store, [plain], "md")
        assert "Branches" not in export_text(store, [plain], "html")
