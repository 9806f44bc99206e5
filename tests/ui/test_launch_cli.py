"""`chatterm launch` refuses bad input with one line and exit status 2, before drawing."""

import os
import subprocess
import sys

import pytest


def launch(*args: str) -> subprocess.CompletedProcess:
    # No terminal: a launch that got past validation would fail differently.
    return subprocess.run([sys.executable, "-m", "chatterm", "launch", *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env=dict(os.environ), timeout=60)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--theme", "nope"], "unknown theme 'nope'; valid themes:"),
        (["--persona", "nope"], "unknown persona 'nope'; valid personas: assistant"),
        (["--model", "nope"], "unknown model 'nope'; valid models:"),
        (["--resume"], "no stored session to resume"),
        (["--resume", "42"], "no stored session to resume"),
        (["--resume", "x"], "session id must be a number, not 'x'"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message, isolated_dirs):
    out = launch(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert not (isolated_dirs["CHATTERM_DATA_DIR"] / "chatterm.db").exists()  # nothing left behind


def test_resume_of_an_unknown_session_names_it(isolated_dirs):
    from chatterm.core.store.session_store import SessionStore

    db = isolated_dirs["CHATTERM_DATA_DIR"] / "chatterm.db"
    db.parent.mkdir(parents=True)
    SessionStore(db).close()
    out = launch("--resume", "42")
    assert out.returncode == 2 and "unknown session 42" in out.stderr


def test_without_a_terminal_it_says_so_instead_of_drawing_into_a_pipe(isolated_dirs):
    out = launch()
    assert out.returncode == 2 and out.stdout == ""
    assert "stdin and stdout must be a terminal" in out.stderr and "chatterm ask" in out.stderr
    assert not (isolated_dirs["CHATTERM_DATA_DIR"] / "chatterm.db").exists()
