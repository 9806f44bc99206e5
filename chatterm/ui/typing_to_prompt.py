"""Typing in a pane beside the prompt goes to the prompt.

Contract: a widget that mixes in `TypingGoesToPrompt` (the conversation, the
dashboard) and has the focus posts `TypingGoesToPrompt.Typed` for a printable
character instead of losing it, and keeps doing so for every printable key
until it is focused again: whoever handles the message (ui/chat_session.py)
moves the focus to the prompt and types the character there. A printable key
bound to an action (the app's `?`, the conversation's turn keys) runs it,
unless the widget's `key_acts` says the binding is not for now; it runs here,
at once, not when the key has bubbled up to the app. Keys read in one go (a
slow link, a paste without bracketed paste) all reach the widget before the
focus moves, and a binding looked up later, from the prompt, was lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.binding import ActiveBinding
from textual.message import Message


class TypingGoesToPrompt:
    """Mix in before the widget class (its `on_key` then comes first)."""

    _typing = False
    """Printable keys go to the prompt until the widget is focused again."""

    @dataclass
    class Typed(Message):
        """A character typed in a pane beside the prompt, for the prompt."""

        character: str

    def key_acts(self, active: ActiveBinding) -> bool:
        """Whether a printable key's binding acts now (else it is text)."""
        return True

    async def on_key(self, event: events.Key) -> None:
        if not (event.is_printable and event.character):
            return
        event.stop()
        event.prevent_default()
        active = None if self._typing else self.app.active_bindings.get(event.key)  # type: ignore[attr-defined]
        if active is None or not self.key_acts(active):
            self._typing = True
            self.post_message(self.Typed(event.character))  # type: ignore[attr-defined]
        elif active.enabled:
            await active.node.run_action(active.binding.action)

    def on_focus(self) -> None:
        self._typing = False
