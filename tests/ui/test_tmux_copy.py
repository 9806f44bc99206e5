"""End to end: copying a reply in the real `chatterm launch` in tmux emits OSC 52.

tmux with `set-clipboard on` takes an application's OSC 52 sequence into a paste
buffer, so `tmux show-buffer` holding the reply proves the sequence reached the
terminal, with the text intact. Real default model; skipped when tmux is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from test_tmux_e2e import Tmux, flat, launch_command, only_turn, replied, title

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def buffer(tmux: Tmux) -> str | None:
    """The newest paste buffer (None while there is none)."""
    out = subprocess.run(tmux._tmux("show-buffer"), capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def test_copy_reply_emits_osc_52_in_tmux(tmp_path):
    db = tmp_path / "data" / "chatterm.db"
    db.parent.mkdir()
    command = launch_command(tmp_path, "--db", str(db))
    tmux = Tmux(f"chatterm-copy-{os.getpid()}", tmp_path / "tmux.sock")
    try:
        # The option is set before the app starts: the pane begins with a shell
        # that waits, and is respawned with the app.
        tmux.run("new-session", "-d", "-s", tmux.target, "-x", "120", "-y", "40", "sleep 600")
        tmux.run("set-option", "-g", "set-clipboard", "on")
        tmux.run("respawn-pane", "-k", "-t", tmux.target, command)
        tmux.wait_for(lambda s: "· ready" in title(s), 120, "the model to load")
        tmux.run("send-keys", "-t", tmux.target, "-l", "Say hello in French.")
        tmux.run("send-keys", "-t", tmux.target, "Enter")
        tmux.wait_for(replied, 120, "the reply")
        assert buffer(tmux) is None
        tmux.run("send-keys", "-t", tmux.target, "F9")
        screen = tmux.wait_for(lambda s: "Copied the reply" in flat(s), 30, "the copy notice")
        copied = buffer(tmux)
        tmux.quit()
    finally:
        tmux.kill()
    assert "Traceback" not in screen
    record = only_turn(db)
    assert record.reply.strip() and copied == record.reply
