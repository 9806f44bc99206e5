"""Remembering the theme the user picks (`settings.toml`, `[tui] theme`).

Contract: `ThemeMemory(app, settings_path)` follows the app's theme signal and
saves a new theme once it has stayed chosen for `SETTLE_S` (the theme picker
previews every highlighted theme; only the one kept is saved). `save_now()`
writes a pending change at once (the app quitting). A write error is a
warning notification, never a traceback. With no settings path nothing is
written (`--theme` for one run).
"""

from __future__ import annotations

from pathlib import Path

from textual.app import App
from textual.timer import Timer

from chatterm.errors import ChattermError
from chatterm.ui.notices import notify_plain
from chatterm.ui.settings import remember_theme


class ThemeMemory:
    SETTLE_S = 1.0

    def __init__(self, app: App, settings_path: Path | None) -> None:
        self.app = app
        self.settings_path = settings_path
        self._last = app.theme
        self._timer: Timer | None = None
        app.theme_changed_signal.subscribe(app, self._changed)

    def _changed(self, theme) -> None:
        if theme.name == self._last:
            return
        self._last = theme.name
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.app.set_timer(self.SETTLE_S, self.save_now)

    def save_now(self) -> None:
        timer, self._timer = self._timer, None
        if timer is None or self.settings_path is None:
            return
        timer.stop()
        try:
            remember_theme(self.settings_path, self.app.theme)
        except ChattermError as exc:
            notify_plain(self.app, str(exc), severity="warning")
