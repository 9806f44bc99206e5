"""`chatterm launch` refuses bad input with one line and exit status 2, before drawing."""

import os
import re
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


def test_a_database_damaged_past_its_header_ends_the_app_with_one_line(isolated_dirs):
    """The file opens (its header and schema page are whole); the first read of
    a session fails inside the running app. It ends with the CLI's one line and
    status 2, not a traceback over the user's terminal."""
    import fcntl
    import pty
    import struct
    import termios

    from tests.core.store.test_store import damaged_past_its_header

    db = isolated_dirs["CHATTERM_DATA_DIR"] / "chatterm.db"
    db.parent.mkdir(parents=True)
    damaged_past_its_header(db)
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    # Textual draws on stderr: both go to the terminal, as in a user's.
    with subprocess.Popen([sys.executable, "-m", "chatterm", "launch"], stdin=secondary, stdout=secondary,
                          stderr=secondary, env=dict(os.environ)) as proc:
        os.close(secondary)
        screen = b""
        try:
            while chunk := os.read(primary, 65536):
                screen += chunk
        except OSError:  # the child closed its side
            pass
        assert proc.wait(timeout=120) == 2, screen[-2000:]
    os.close(primary)
    text = screen.decode(errors="replace")
    assert "Traceback" not in text and "╭" not in text
    # After the app gave the terminal back (alternate screen left): the one line.
    after = text.rsplit("\x1b[?1049l", 1)[-1]
    (line,) = [x for x in re.sub(r"\x1b\[[0-9;?<>=$]*[a-zA-Z~]", "", after).splitlines() if x.strip()]
    assert line.startswith("chatterm: error: ") and "cannot read the session database" in line
