"""`early_keys.hold` on a real pseudo-terminal: keys typed before the app's
first frame reach it as typed (Enter as Enter, Ctrl+Q and Ctrl+S not taken
for flow control, nothing echoed), and `restore` gives the settings back."""

from __future__ import annotations

import os
import pty
import select
import termios

from chatterm.cli import early_keys


def test_hold_passes_keys_through_and_restore_gives_the_terminal_back(monkeypatch):
    leader, follower = pty.openpty()
    stdin = os.fdopen(follower, "r")
    try:
        monkeypatch.setattr("sys.stdin", stdin)
        monkeypatch.setattr(early_keys, "_saved", None)
        before = termios.tcgetattr(follower)
        assert before[0] & termios.ICRNL and before[0] & termios.IXON and before[3] & termios.ECHO
        early_keys.hold()
        held = termios.tcgetattr(follower)
        assert not held[0] & (termios.ICRNL | termios.IXON) and not held[3] & termios.ECHO
        os.write(leader, b"hi\x11\r")  # Ctrl+Q, then Enter: both stay in the input as typed
        raw = termios.tcgetattr(follower)
        raw[3] &= ~termios.ICANON  # what the app's raw mode does, without dropping the input
        termios.tcsetattr(follower, termios.TCSANOW, raw)
        assert os.read(follower, 16) == b"hi\x11\r"
        assert select.select([leader], [], [], 0.2)[0] == []  # nothing echoed
        early_keys.restore()
        assert termios.tcgetattr(follower) == before
    finally:
        early_keys.restore()
        stdin.close()
        os.close(leader)


def test_keys_typed_before_hold_are_given_back_with_enter_as_enter(monkeypatch):
    """Typed while the install still ran: the terminal had made each Enter a
    newline (Ctrl+J to the app), so the message stayed in the prompt."""
    leader, follower = pty.openpty()
    stdin = os.fdopen(follower, "r")
    try:
        monkeypatch.setattr("sys.stdin", stdin)
        monkeypatch.setattr(early_keys, "_saved", None)
        os.write(leader, "What is 3×3?\rand more\r".encode())
        select.select([follower], [], [], 1.0)
        early_keys.hold()
        assert early_keys.take_typed() == "What is 3×3?\nand more\n"
        assert early_keys.take_typed() == ""  # once
        assert select.select([follower], [], [], 0.1)[0] == []  # taken out of the terminal
    finally:
        early_keys.restore()
        stdin.close()
        os.close(leader)
