"""Typing in a pane beside the prompt goes to the prompt.

Contract: when a widget that mixes in `TypingGoesToPrompt` (the conversation,
the dashboard) has the focus, the app asks it what each key is as the key
arrives (`route_key`): text, typed into the prompt there and then (and from
the first such key every printable key is text until the widget is focused
again), or a printable key's binding (the app's `?`, the conversation's turn
keys), run there and then unless the widget's `key_acts` says the binding is
not for now. The app decides in its own event handler because that is the one
place keys arrive in order and the focus is the one they were typed at: a key
forwarded to the widget waits in the widget's queue while the keys behind it
go straight to the prompt once the focus has moved (keys read in one go from
a slow link, a paste without bracketed paste), and a binding looked up there
later is looked up from the prompt.
"""

from __future__ import annotations

from textual import events
from textual.binding import ActiveBinding


class TypingGoesToPrompt:
    """Mix in before the widget class; the app routes the keys (`route_key`)."""

    _typing = False
    """Printable keys go to the prompt until the widget is focused again."""

    def key_acts(self, active: ActiveBinding) -> bool:
        """Whether a printable key's binding acts now (else it is text)."""
        return True

    def route_key(self, event: events.Key) -> str | ActiveBinding | None:
        """What a key typed here is: text for the prompt (the character; every
        printable key is, from then on), a binding to run now, or None (not
        printable: Textual routes it)."""
        if not (event.is_printable and event.character):
            return None
        if not self._typing:
            active = self.app.active_bindings.get(event.key)  # type: ignore[attr-defined]
            if active is not None and self.key_acts(active):
                return active
        self._typing = True
        return event.character

    def on_focus(self) -> None:
        self._typing = False
