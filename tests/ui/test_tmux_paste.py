"""End to end: a paste of coloured terminal text in the real `chatterm launch` in tmux.

`tmux paste-buffer -p` sends the buffer as a bracketed paste with its escape
sequences and CR line breaks, as a terminal pastes copied coloured output.
The paste must land in the prompt whole, as text: no CR may act as Enter.
Real default model; skipped when tmux is missing.
"""

from __future__ import annotations

import os
import shutil

import pytest
from test_tmux_e2e import Tmux, launch_command, only_turn, replied, title

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

PASTED = (
    "\x1b[1;31mfirst line\x1b[0m\r"
    "\x1b]8;;https://x.example\x1b\\second\x1b]8;;\x1b\\ line\r"  # an OSC 8 link
    "\x1b[32mthird\x1b[0m line"
)


def test_a_coloured_paste_lands_whole_in_the_prompt(tmp_path):
    db = tmp_path / "data" / "chatterm.db"
    db.parent.mkdir()
    pasted = tmp_path / "pasted.txt"
    pasted.write_bytes(PASTED.encode())
    command = launch_command(tmp_path, "--db", str(db))
    tmux = Tmux(f"chatterm-paste-{os.getpid()}", tmp_path / "tmux.sock")
    try:
        tmux.run("new-session", "-d", "-s", tmux.target, "-x", "120", "-y", "40", command)
        tmux.wait_for(lambda s: "· ready" in title(s), 120, "the model to load")
        tmux.run("load-buffer", str(pasted))
        tmux.run("paste-buffer", "-p", "-t", tmux.target)
        tmux.wait_for(lambda s: "third line" in s, 30, "the paste in the prompt")
        before_enter = tmux.screen()
        tmux.run("send-keys", "-t", tmux.target, "Enter")
        screen = tmux.wait_for(replied, 120, "the reply")
        tmux.quit()
    finally:
        tmux.kill()
    assert "Traceback" not in screen
    assert "␛" not in before_enter and "[0m" not in before_enter
    record = only_turn(db)
    assert record.user_text == "first line\nsecond line\nthird line"
