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
        (["--resume"], "no stored session to resume in"),
        (["--resume", "42"], "unknown session 42"),
        (["--resume", "x"], "session id must be a number, not 'x'"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message):
    out = launch(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
