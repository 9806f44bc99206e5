"""`chatterm sessions --search`, `sessions rename` and `sessions delete` on a real
database and a real prompt cache folder."""

from __future__ import annotations

import io
import json
import sqlite3

import pytest

from chatterm.cli import main
from chatterm.core.cache.prompt_cache import PromptCache, Slot
from chatterm.core.config import paths
from chatterm.core.store.session_store import SessionStore
from tests.core.store.test_search import NASTY
from tests.core.store.test_store import full_metrics, new_session


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Config, data and cache folders of the test's own; the database's path."""
    for name in ("CONFIG", "DATA", "CACHE"):
        monkeypatch.setenv(f"CHATTERM_{name}_DIR", str(tmp_path / name.lower()))
    db = tmp_path / "data" / "chatterm.db"
    db.parent.mkdir()
    monkeypatch.setenv("CHATTERM_DB", str(db))
    monkeypatch.setenv("COLUMNS", "160")
    return db


class Terminal(io.StringIO):
    """Standard input that is a terminal, with the user's answer typed in."""

    def isatty(self) -> bool:
        return True


def sample(db) -> tuple[int, int]:
    with SessionStore(db) as store:
        first, second = new_session(store), new_session(store)
        store.record_turn(first, "How do I sort a list?", "Use sorted(xs).", full_metrics())
        store.record_turn(second, "Tell me about the [bold]pelican[/]", "A large \x1b[31mwater bird.",
                          full_metrics())
    return first, second


def test_search_lists_matching_turns(env, capsys):
    first, second = sample(env)
    assert main(["sessions", "--search", "pelican"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("SESSION:TURN ")  # what "2:1" means, once
    assert out.splitlines()[1].startswith(f"{second}:1 ")
    assert "[bold]pelican[/]" in out and "\x1b" not in out  # literal, control characters inert
    assert main(["sessions", "--search", "bird", "--json"]) == 0
    (hit,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (hit["session_id"], hit["turn_index"], hit["role"]) == (second, 1, "assistant")
    assert main(["sessions", "--search", "nothing-like-this"]) == 0
    assert "No turn" in capsys.readouterr().out
    for text in NASTY[:12]:
        assert main(["sessions", "--search", text]) == 0, text
    # Nothing to look for is a mistake, not "no match".
    for text in ("", "   "):
        assert main(["sessions", "--search", text]) == 2
        err = capsys.readouterr().err
        assert "--search needs a word" in err and len(err.strip().splitlines()) == 1
    assert first


def test_rename_sets_the_title_shown_in_the_listing(env, capsys):
    first, _ = sample(env)
    assert main(["sessions", "rename", str(first), "Sorting in Python"]) == 0
    assert "Sorting in Python" in capsys.readouterr().out
    assert main(["sessions"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.split()[0] == str(first))
    assert lines[row + 1].strip().startswith("Sorting in Python · How do I sort a list?")
    for args, words in ((["rename", "99", "x"], "unknown session 99"),
                        (["rename", str(first), "  "], f"title of session {first} is empty")):
        assert main(["sessions", *args]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1
    with SessionStore(env, readonly=True) as store:
        assert store.session(first).title == "Sorting in Python"


def test_rename_or_delete_without_a_database_creates_none(env, capsys):
    for args in (["rename", "1", "x"], ["delete", "1", "--yes"]):
        assert main(["sessions", *args]) == 2
        assert "unknown session 1" in capsys.readouterr().err
    assert not env.exists()


def kv_files(slot: Slot) -> list:
    return [e for e in PromptCache(paths.kv_cache_dir()).entries() if e.slot == slot]


def test_each_database_s_sessions_have_their_own_kv_states(env, tmp_path, capsys, monkeypatch):
    """Session ids are unique within one database only and every database
    shares the cache folder: deleting `--db other.db`'s session 1 removed the
    data folder's session 1 states too."""
    from chatterm.core.workspace import Workspace

    other = tmp_path / "other.db"
    assert sample(env)[0] == sample(other)[0] == 1
    own, theirs = (Workspace.load(db_path=db).kv_cache() for db in (env, other))
    assert own.session_slot(1) == Slot.session(1)  # the data folder's: bare ids, as cached before
    assert theirs.session_slot(1).label == f"session 1 of database {theirs.session_scope}"
    for cache in (own, theirs, theirs):
        cache.save("smollm2-135m", cache.session_slot(1), list(range(30)), bytearray(4096), {"x": 1})
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["--db", str(other), "sessions", "delete", "1", "--yes"]) == 0
    assert "Deleted session 1: 1 turn, 1 KV state." in capsys.readouterr().out
    assert kv_files(own.session_slot(1)) and not kv_files(theirs.session_slot(1))
    assert main(["--db", str(other), "cache", "clear", "--session", "1"]) == 2
    assert "no cached state for session '1' (no session of this database is cached)" in capsys.readouterr().err
    assert main(["cache", "clear", "--session", "1"]) == 0 and not kv_files(own.session_slot(1))


def test_delete_asks_on_a_terminal_and_needs_yes_without_one(env, capsys, monkeypatch):
    first, second = sample(env)
    cache = PromptCache(paths.kv_cache_dir())
    cache.save("smollm2-135m", Slot.session(first), list(range(30)), bytearray(4096), {"x": 1})
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal (CI)
    assert main(["sessions", "delete", str(first)]) == 2
    assert "--yes" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    assert main(["sessions", "delete", str(first)]) == 1
    assert "Nothing deleted" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", Terminal(""))  # Ctrl+D: no answer is a no
    assert main(["sessions", "delete", str(first)]) == 1
    assert "Nothing deleted" in capsys.readouterr().out
    with SessionStore(env, readonly=True) as store:
        assert store.session(first).turns == 1
    assert kv_files(Slot.session(first))

    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    assert main(["sessions", "delete", str(first)]) == 0
    assert "Deleted session 1: 1 turn, 1 KV state." in capsys.readouterr().out
    conn = sqlite3.connect(env)
    assert conn.execute("SELECT count(*) FROM turns WHERE session_id = ?", (first,)).fetchone() == (0,)
    assert conn.execute("SELECT id FROM sessions").fetchall() == [(second,)]
    assert not kv_files(Slot.session(first))

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["sessions", "delete", str(second), "--yes"]) == 0
    assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
    assert main(["sessions", "delete", str(second), "--yes"]) == 2
    assert f"unknown session {second}" in capsys.readouterr().err


def test_delete_refuses_a_session_open_in_another_chatterm(env, capsys, monkeypatch):
    first, _ = sample(env)
    with SessionStore(env) as tui:
        tui.hold(first)
        assert main(["sessions", "delete", str(first), "--yes"]) == 2
        err = capsys.readouterr().err
        assert f"session {first} is open in another chatterm" in err and len(err.strip().splitlines()) == 1
        # Asked on a terminal: refused before the question, not after the answer.
        monkeypatch.setattr("sys.stdin", Terminal("y\n"))
        assert main(["sessions", "delete", str(first)]) == 2
        out, err = capsys.readouterr()
        assert "[y/N]" not in out and f"session {first} is open in another chatterm" in err
        assert tui.session(first).turns == 1
    assert main(["sessions", "delete", str(first), "--yes"]) == 0  # its holder closed


@pytest.mark.parametrize("argv", [["sessions", "delete"], ["sessions", "rename", "1"],
                                  ["sessions", "delete", "x"]])
def test_bad_arguments_are_one_line(env, capsys, argv):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
