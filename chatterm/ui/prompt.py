"""The message prompt: a multi-line text area where Enter sends.

Enter posts `PromptArea.Submitted` with the text (blank text is ignored and the
prompt is kept, except while `editing` an earlier message: then the chat says
why a blank edit is refused). ↑ in an empty prompt posts `EditLastAsked`
(edit your last message, as chat apps do). A newline is inserted with Ctrl+J,
which every terminal sends as a distinct byte (LF); Shift+Enter and Alt+Enter
also work in terminals that report them (kitty keyboard protocol, most
xterm-likes for Alt).

Text pasted in loses its terminal escape sequences (a coloured log keeps its
words, not its colours) and shows any other control character as a symbol
(`pasted_text`): the text area writes what it holds to the terminal as it is.

The prompt's border is drawn by the box around it (`BOX_ID`), and every redraw
of the prompt redraws the rest of the box's rows after it (the border, the
dashboard beside it), so they keep their columns whatever width the terminal
gives an emoji sequence (docs/tui.md, "Wide characters").
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.geometry import Region
from textual.message import Message
from textual.widget import Widget
from textual.widgets import TextArea

from chatterm.core.metrics.format import printable
from chatterm.ui.fit_text import first_fitting

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")

BOX_ID = "prompt-box"
"""The container that draws the prompt's border (ui/chat_view.py)."""


PLACEHOLDERS = ("Message — Enter sends, Ctrl+J new line, F1 help", "Message — Enter sends, F1 help")
"""Longest first: the prompt is 33 cells wide at 80 columns with the dashboard shown."""


def pasted_text(text: str) -> str:
    """What a paste puts in the prompt: its line breaks as "\n" (most terminals
    send a pasted line break as CR), without ANSI escape sequences (SGR, OSC 8
    links, cursor moves), other controls made visible."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return printable(Text.from_ansi(text).plain) if "\x1b" in text or "\x9b" in text else printable(text)


class PromptArea(TextArea):
    @dataclass
    class Submitted(Message):
        """The user pressed Enter on a non-blank prompt."""

        prompt: "PromptArea"
        text: str

        @property
        def control(self) -> "PromptArea":
            return self.prompt

    class EditLastAsked(Message):
        """↑ was pressed in an empty prompt."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("soft_wrap", True)
        kwargs.setdefault("tab_behavior", "focus")
        kwargs.setdefault("show_line_numbers", False)
        kwargs.setdefault("highlight_cursor_line", False)
        kwargs.setdefault("compact", True)
        kwargs.setdefault("placeholder", PLACEHOLDERS[0])
        super().__init__(**kwargs)
        self.editing = False
        """The prompt holds an earlier message being edited (the chat sets it)."""

    def on_resize(self) -> None:
        self.placeholder = first_fitting(PLACEHOLDERS, self.content_size.width)

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False):
        # Whatever of this area is redrawn, the rest of its box's rows is redrawn
        # after it, to the screen's right edge: its border (chat_view.py: the
        # border is the box's) and whatever stands beside it. Textual starts each
        # widget's part of a row with a cursor move, so where the terminal counts
        # an emoji sequence wider than rich does and the text runs over the
        # border and the dashboard, they are written again at their own columns.
        result = super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)
        box = self.parent
        if repaint and self.is_mounted and isinstance(box, Widget) and box.id == BOX_ID:
            band = box.region
            if band:
                screen = self.screen
                screen.refresh(Region(band.x, band.y, screen.size.width - band.x, band.height))
        return result

    def _on_paste(self, event: events.Paste) -> None:
        # Textual calls each class's handler in turn: TextArea's inserts this text next.
        event.text = pasted_text(event.text)

    async def _on_key(self, event: events.Key) -> None:
        if self.read_only:
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text
            if text.strip() or self.editing:
                self.post_message(self.Submitted(self, text))
            return
        if event.key == "up" and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.EditLastAsked())
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        await super()._on_key(event)
