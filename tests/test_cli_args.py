"""Command-line input the commands check before they chat: where the database
is, export file names, counts, --models, skipped persona files. Real SQLite
files and `chatterm.cli.main`; none of it loads a model."""

from __future__ import annotations

import pytest

from chatterm.cli import main

# Every command that opens the database; `launch --resume` gets to the store
# without a terminal, which a plain `launch` needs first.
DB_COMMANDS = [["sessions"], ["export"], ["ask", "hi"], ["launch"], ["launch", "--resume"]]


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


# -- --db and $CHATTERM_DB ------------------------------------------------------------
@pytest.mark.parametrize("command", DB_COMMANDS, ids=" ".join)
def test_a_named_database_in_a_missing_folder_is_an_error_that_creates_nothing(tmp_path, monkeypatch, capsys, command):
    db = tmp_path / "missing" / "x.db"
    assert main([*command, "--db", str(db)]) == 2
    assert one_line_error(capsys) == (
        f"chatterm: error: --db {db}: folder {db.parent} does not exist; create it first or choose another path"
    )
    monkeypatch.setenv("CHATTERM_DB", str(db))
    assert main(command) == 2
    assert f"$CHATTERM_DB {db}: folder {db.parent} does not exist" in one_line_error(capsys)
    assert not db.parent.exists()


def test_a_named_database_under_a_file_says_the_file_is_not_a_folder(tmp_path, capsys):
    (tmp_path / "notes").write_text("a file")
    assert main(["sessions", "--db", str(tmp_path / "notes" / "x.db")]) == 2
    assert f"{tmp_path / 'notes'} is not a folder" in one_line_error(capsys)


def test_a_missing_database_file_in_an_existing_folder_is_still_no_sessions_yet(tmp_path, capsys):
    db = tmp_path / "new.db"
    assert main(["sessions", "--db", str(db)]) == 0
    assert "No sessions yet" in capsys.readouterr().out
    assert not db.exists()


def test_a_directory_as_database_is_the_same_line_for_every_command(tmp_path, capsys):
    folder = tmp_path / "dbdir"
    folder.mkdir()
    lines = set()
    for command in DB_COMMANDS[:3] + DB_COMMANDS[4:]:
        assert main([*command, "--db", str(folder)]) == 2, command
        lines.add(one_line_error(capsys))
    assert lines == {
        f"chatterm: error: {folder} is a directory, not a database file; "
        f"pass --db {folder / 'chatterm.db'} to keep the database in it"
    }
    assert list(folder.iterdir()) == []
