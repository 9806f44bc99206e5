"""Typing in a pane beside the prompt goes to the prompt.

Contract: when a widget that mixes in `TypingGoesToPrompt` (the conversation,
the dashboard) has the focus, the app asks it what each key is as the key
arrives (`route_key`): the prompt's, or a printable key's binding (the app's
`?`, the conversation's turn keys), run there and then unless the widget's
`key_acts` says the binding is not for now, or Textual's to route. The first
printable key that is text, or a paste, goes to the prompt with the focus,
and from then on every key does (Backspace, Enter), until the widget is
focused again; app-wide priority keys (Ctrl+Q, Ctrl+S) stay the app's. The
app decides in its own event handler because that is the one place keys
arrive in order and the focus is the one they were typed at: a key forwarded
to the widget waits in the widget's queue while the keys behind it go
straight to the prompt once the focus has moved (keys read in one go from a
slow link, a paste without bracketed paste), and a binding looked up there
later is looked up from the prompt. The keys are forwarded to the prompt's
queue, not typed into it, so the ones that arrive after the focus has moved
queue up behind them.
"""

from __future__ import annotations

from textual import events
from textual.binding import ActiveBinding


class TypingGoesToPrompt:
    """Mix in before the widget class; the app routes the keys (`route_key`)."""

    _typing = False
    """Every key goes to the prompt until the widget is focused again."""

    def key_acts(self, active: ActiveBinding) -> bool:
        """Whether a printable key's binding acts now (else it is text)."""
        return True

    def route_key(self, event: events.Key | events.Paste) -> ActiveBinding | bool:
        """Where a key or paste typed here goes: True, the prompt; a binding,
        to run now; False, where Textual routes it."""
        if isinstance(event, events.Paste):
            self._typing = True
            return True
        active = self.app.active_bindings.get(event.key)  # type: ignore[attr-defined]
        if active is not None and active.binding.priority:
            return False
        if self._typing:
            return True
        if not (event.is_printable and event.character):
            return False
        if active is not None and self.key_acts(active):
            return active
        self._typing = True
        return True

    def on_focus(self) -> None:
        self._typing = False
