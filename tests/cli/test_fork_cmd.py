"""`chatterm ask --fork ID[:TURN]` as a user runs it: real processes, the real
default model, the real prompt cache on disk."""

from __future__ import annotations

import json
import sqlite3

from tests.cli.test_cli_core import chatterm, write_greedy_persona


def ask_json(tmp_path, *args):
    result = chatterm(tmp_path, "ask", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_fork_resumes_with_no_history_prefill(tmp_path):
    write_greedy_persona(tmp_path)
    first = ask_json(tmp_path, "--persona", "quick", "My name is Ada and I live in a small town by the sea.")
    parent = first["session_id"]
    ask_json(tmp_path, "--session", str(parent), "What is the town near?")
    third = ask_json(tmp_path, "--session", str(parent), "Tell me about the sea.")
    history_tokens = third["metrics"]["prompt_tokens"]

    # Forked at turn 2: the fork's question restores the shared history.
    forked = ask_json(tmp_path, "--fork", f"{parent}:2", "What is my name?")
    fork = forked["session_id"]
    assert fork != parent
    m = forked["metrics"]
    assert m["cache_outcome"] == "restored", m["cache_detail"]
    assert m["prefilled_tokens"] < 30 < m["cached_tokens"], m["cache_detail"]
    # Then the fork goes on like any session, from its own state.
    again = ask_json(tmp_path, "--session", str(fork), "And where do I live?")
    assert again["metrics"]["cache_outcome"] == "restored"
    assert again["metrics"]["prefilled_tokens"] < 30 < again["metrics"]["cached_tokens"]
    assert again["metrics"]["prompt_tokens"] > history_tokens // 2

    db = tmp_path / "data" / "chatterm.db"
    rows = sqlite3.connect(db).execute(
        "SELECT turn_index, inherited, user_text FROM turns WHERE session_id = ? ORDER BY turn_index", (fork,)
    ).fetchall()
    assert [(i, bool(inh)) for i, inh, _ in rows] == [(1, True), (2, True), (3, False), (4, False)]
    assert rows[1][2] == "What is the town near?" and rows[2][2] == "What is my name?"
    # The parent is left as it was.
    assert sqlite3.connect(db).execute(
        "SELECT count(*) FROM turns WHERE session_id = ?", (parent,)
    ).fetchone() == (3,)
    listing = chatterm(tmp_path, "sessions")
    assert f"(fork of session {parent}, turn 2)" in listing.stdout
    # The fork's cost holds the two turns it copied; the listing says how much, so a
    # sum over sessions can count them once.
    infos = {i["id"]: i for i in map(json.loads, chatterm(tmp_path, "sessions", "--json").stdout.splitlines())}
    copied = sum(c for (c,) in sqlite3.connect(db).execute(
        "SELECT cost_usd FROM turns WHERE session_id = ? AND turn_index <= 2", (parent,)))
    assert copied > 0 and infos[parent]["inherited_cost_usd"] == 0
    assert abs(infos[fork]["inherited_cost_usd"] - copied) < 1e-12
    assert infos[fork]["cost_usd"] > infos[fork]["inherited_cost_usd"]


def test_fork_of_an_unknown_session_or_turn_is_one_line(tmp_path):
    write_greedy_persona(tmp_path)
    missing_db = chatterm(tmp_path, "ask", "--fork", "3", "hi")
    assert missing_db.returncode == 2 and "unknown session 3" in missing_db.stderr
    assert not (tmp_path / "data" / "chatterm.db").exists()
    parent = ask_json(tmp_path, "--persona", "quick", "Hello there.")["session_id"]
    db = tmp_path / "data" / "chatterm.db"
    for spec, words in ((f"{parent + 5}", f"unknown session {parent + 5}"),
                        (f"{parent}:7", f"session {parent} has no turn 7: its turns are 1-1"),
                        ("x:1", "--fork takes ID or ID:TURN")):
        result = chatterm(tmp_path, "ask", "--fork", spec, "hi")
        assert result.returncode == 2, result.stderr
        assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.stderr
    # Nothing was made of the refused forks.
    assert sqlite3.connect(db).execute("SELECT count(*) FROM sessions").fetchone() == (1,)
