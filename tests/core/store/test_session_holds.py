"""A session another chatterm has open is not deleted under it: real SQLite,
real flock marks, a real second process (killed, to show no mark outlives it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from chatterm.core.store.session_store import SessionStore
from chatterm.errors import ChattermError
from tests.core.store.test_store import full_metrics, new_session

pytestmark = pytest.mark.skipif(os.name != "posix", reason="marks are flock's; none on Windows")


def test_a_session_held_by_another_store_is_not_deleted(tmp_path):
    path = tmp_path / "s.db"
    with SessionStore(path) as mine, SessionStore(path) as theirs:
        sid, other = new_session(mine), new_session(mine)
        mine.record_turn(sid, "q", "a", full_metrics())
        theirs.hold(sid)
        with pytest.raises(ChattermError, match=f"session {sid} is open in another chatterm"):
            mine.delete_session(sid)
        assert mine.session(sid).turns == 1  # nothing lost
        assert mine.delete_session(other) == 0  # the others are not held
        theirs.hold(None)
        assert mine.delete_session(sid) == 1
        assert not (tmp_path / "s.db-open" / str(sid)).exists()


def test_a_store_deletes_the_session_it_holds_itself_and_moves_its_mark(tmp_path):
    path = tmp_path / "s.db"
    with SessionStore(path) as mine, SessionStore(path) as theirs:
        first, second = new_session(mine), new_session(mine)
        theirs.hold(first)
        theirs.hold(second)  # one open session per store: the first is free again
        assert mine.delete_session(first) == 0
        with pytest.raises(ChattermError, match=f"session {second} is open"):
            mine.delete_session(second)
        assert theirs.delete_session(second) == 0  # its own mark does not stop it
    with SessionStore(path) as store:
        assert store.sessions() == []


def test_a_killed_holder_leaves_no_mark(tmp_path):
    path = tmp_path / "s.db"
    with SessionStore(path) as store:
        sid = new_session(store)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from chatterm.core.store.session_store import SessionStore
            store = SessionStore({str(path)!r})
            store.hold({sid})
            print("held", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with SessionStore(path) as store:
            with pytest.raises(ChattermError, match="open in another chatterm"):
                store.delete_session(sid)
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=10)
            assert store.delete_session(sid) == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_read_only_store_marks_nothing(tmp_path):
    path = tmp_path / "s.db"
    with SessionStore(path) as store:
        sid = new_session(store)
    with SessionStore(path, readonly=True) as reader:
        reader.hold(sid)
        with pytest.raises(ChattermError, match="read-only"):
            reader.delete_session(sid)
    assert not (tmp_path / "s.db-open").exists()
    with SessionStore(path) as store:
        assert store.delete_session(sid) == 0


def test_a_hold_only_if_holder_yields_to_whoever_asked_since(tmp_path):
    path = tmp_path / "s.db"
    with SessionStore(path) as mine, SessionStore(path) as theirs:
        first, opened = new_session(mine), new_session(mine)
        conversation, screen = object(), object()
        theirs.hold(None, conversation)
        theirs.hold(opened, screen)  # the user opened a session meanwhile
        theirs.hold(first, conversation, only_if_holder=True)  # the late first turn: not its mark now
        assert mine.delete_session(first) == 0
        with pytest.raises(ChattermError, match=f"session {opened} is open"):
            mine.delete_session(opened)


def test_a_link_to_the_database_shares_its_marks(tmp_path):
    real = tmp_path / "s.db"
    link = tmp_path / "link.db"
    with SessionStore(real) as store:
        sid = new_session(store)
    link.symlink_to(real)
    with SessionStore(link) as tui, SessionStore(real) as cli:
        tui.hold(sid)
        with pytest.raises(ChattermError, match=f"session {sid} is open"):
            cli.delete_session(sid)
