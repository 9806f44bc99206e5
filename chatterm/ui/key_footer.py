"""The key footer every chatterm screen shows.

Contract: `KeyFooter` is Textual's `Footer` in its compact style, which leaves out the
`^p palette` key below `PALETTE_MIN_WIDTH` columns, so the screen's own keys fit in 80
(the roomy style cut Export and New there; F1 and the opening notice name Ctrl+P).
"""

from __future__ import annotations

from textual import events
from textual.widgets import Footer

PALETTE_MIN_WIDTH = 92
"""Columns from which the palette key fits beside the chat screen's keys."""


class KeyFooter(Footer):
    def __init__(self) -> None:
        super().__init__(compact=True)

    def on_mount(self) -> None:
        # Before the keys are first composed: a launch in 80 columns composes once.
        self.set_reactive(Footer.show_command_palette, self.app.size.width >= PALETTE_MIN_WIDTH)

    def on_resize(self, event: events.Resize) -> None:
        palette = event.size.width >= PALETTE_MIN_WIDTH
        if palette != self.show_command_palette:
            self.show_command_palette = palette
            self.refresh(recompose=True)  # Footer composes the palette key once, from the flag
