"""Wide characters in the real `chatterm launch` in tmux: the prompt box's right
border, and the dashboard's edge beside it, keep their columns whatever width the
terminal gives an emoji sequence (docs/tui.md, "Wide characters").

tmux 3.3a and rich disagree on such sequences: a variation selector (U+FE0F)
widens `🌧` and `☀` in rich, not in tmux; a skin-tone modifier adds nothing in rich
and two cells in tmux. The text after such a sequence is where the terminal puts
it; the border is written at its own column. Plain CJK agrees everywhere. Each
case is typed into the prompt, redrawn partially (typing) and in full (a closed
help screen with the prompt unfocused, so no cursor blink redraws it), and the
captured screen is checked. Real default model; skipped when tmux is missing.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
from test_tmux_e2e import Tmux, launch_command, title

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

WIDTH, HEIGHT = 120, 40
CASES = {
    "cjk": "abc 中文字 z",
    "variation-selector": "abc 🌧️☀️ z",
    "skin-tone": "abc 👍🏽👍🏽 z",
    "zwj": "abc 👨‍👩‍👧 z",
    "all": "abc 🌧️☀️ x 👍🏽👨‍👩‍👧 y 中文字 z",
}


def prompt_rows(screen: str) -> tuple[str, str, str]:
    """The prompt box's top, text and bottom rows (a one-line message)."""
    rows = screen.splitlines()
    top = max(i for i, row in enumerate(rows) if row.startswith("╭"))
    return rows[top], rows[top + 1], rows[top + 2]


def from_right(row: str, char: str) -> int:
    """How many characters from the row's end `char` is, the last time it occurs.
    Everything right of the prompt box is the dashboard's narrow text, so in a
    row captured with its trailing spaces this is a column counted from the
    screen's right edge, whatever widths the terminal gave the text before it."""
    return len(row) - row.rindex(char)


def in_box(row: str) -> str:
    """What a row holds between the prompt box's borders, trailing blanks dropped."""
    return row[1 : row.rindex("│")].strip() if row.startswith("│") and "│" in row[1:] else ""


def assert_border_still(screen: str, text: str) -> None:
    top, middle, bottom = prompt_rows(screen)
    # The text typed, as tmux keeps it (the joiner of a ZWJ sequence included).
    assert in_box(middle).replace("\u200d", "") == text.replace("\u200d", ""), middle
    column = from_right(bottom, "╯")
    assert from_right(top, "╮") == column
    assert from_right(middle, "│") == column, f"right border moved:\n{top}\n{middle}\n{bottom}"
    # The dashboard's edge (thick while it has the focus) follows the border,
    # not written over by the text.
    edge = bottom[len(bottom) - column + 1]
    assert edge in "▏█" and middle[len(middle) - column + 1] == edge, (middle, bottom)


def settled(capture, predicate, timeout: float, what: str) -> str:
    """The screen once `predicate` holds and two captures 0.2 s apart agree
    (a redraw is written in pieces; a half-written frame proves nothing)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        now = capture()
        if predicate(now) and now == last:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; screen:\n{now}")
        last = now
        time.sleep(0.2)


@pytest.mark.parametrize("text", CASES.values(), ids=CASES.keys())
def test_the_prompt_border_keeps_its_column(tmp_path, text):
    command = launch_command(tmp_path, LANG="C.UTF-8")
    tmux = Tmux(f"chatterm-wide-{os.getpid()}", tmp_path / "tmux.sock")

    def capture() -> str:
        return tmux.run("capture-pane", "-p", "-N", "-t", tmux.target)  # -N: trailing spaces kept

    try:
        tmux.run("new-session", "-d", "-s", tmux.target, "-x", str(WIDTH), "-y", str(HEIGHT), command)
        # With no client attached tmux may fall back to its default size (80x24,
        # no dashboard) at any time: the window keeps this one.
        tmux.run("set-option", "-t", tmux.target, "window-size", "manual")
        tmux.run("resize-window", "-t", tmux.target, "-x", str(WIDTH), "-y", str(HEIGHT))
        tmux.wait_for(lambda s: "· ready" in title(s), 120, "the model to load")
        tmux.run("send-keys", "-t", tmux.target, "-l", text)
        # Partial redraws: each key redrew the prompt (and the rows beside it).
        typed = settled(capture, lambda s: in_box(prompt_rows(s)[1]).endswith(" z"), 10, "the text in the prompt")
        assert_border_still(typed, text)
        # A full redraw with the prompt unfocused (Tab: the dashboard has the
        # focus): no cursor blink redraws the prompt's row after it.
        tmux.run("send-keys", "-t", tmux.target, "Tab")
        tmux.run("send-keys", "-t", tmux.target, "F1")
        tmux.wait_for(lambda s: "chatterm — keys" in s, 10, "the help screen")
        tmux.run("send-keys", "-t", tmux.target, "Escape")
        redrawn = settled(capture, lambda s: "chatterm — keys" not in s, 10, "the help screen to close")
        assert_border_still(redrawn, text)
        tmux.quit()
    finally:
        tmux.kill()
