"""Notifications (Textual toasts) that show their text literally.

Contract: every notification in chatterm.ui goes through `notify_plain`, which
never lets Textual parse the text as markup: the text may come from a file, the
database, an exception or the model, and `[` in it must stay a `[` (markup
could style it, link it, run an action or raise a MarkupError). Its control
characters are made visible (`printable`): a toast writes its text to the
terminal as it is. `notify_saved` says where a file was written, the same
way for every file the app writes (exports, screenshots).
"""

from __future__ import annotations

from pathlib import Path

from textual.app import App
from textual.notifications import SeverityLevel

from chatterm.core.metrics.format import home_short, printable


def notify_plain(
    app: App, text: str, *, title: str = "", severity: SeverityLevel = "information", timeout: float | None = None
) -> None:
    """Show `text` (and `title`) as a notification, literally."""
    app.notify(printable(text), title=printable(title), severity=severity, timeout=timeout, markup=False)


def notify_saved(app: App, path: Path, *, title: str, note: str = "") -> None:
    """`path` was written: its name (and `note`) on a line of its own, since a
    toast wraps a long path anywhere, the name included; then its folder."""
    notify_plain(app, f"{path.name}{note}\nin {home_short(path.parent)}", title=title, timeout=6)
