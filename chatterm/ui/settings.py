"""Remembered TUI choices in the config folder's settings.toml (`[tui]` table).

Contract:
- `load_ui_settings(path)` never fails: a missing file gives the defaults, a
  broken one (bad TOML, a wrong type, an unknown key) gives the defaults plus a
  one-line `error` naming the file and key, for the app to show.
- `remember_theme(path, name)` rewrites the file atomically through tomlkit,
  so everything else the user wrote there (other tables, comments, layout)
  stays as it was; only `[tui] theme` changes. It raises ChattermError with one
  line when the file cannot be read back or written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError

from chatterm.core.config.schema import boolean, from_table, key, text
from chatterm.core.config.tomlfile import TOML_MAX_BYTES, read_toml
from chatterm.core.system.atomic import atomic_write_bytes
from chatterm.core.system.small_file import read_small
from chatterm.errors import ChattermError

SECTION = "tui"


@dataclass
class UiSettings:
    """The `[tui]` table."""

    theme: str | None = key(None, check=text)
    """The theme last chosen in the app (None: the default theme)."""
    type_ahead: bool = key(True, check=boolean)
    """Prefill a message while it is typed, so Enter leaves about one token to
    compute (`chatterm launch --no-type-ahead` turns it off for one run)."""
    error: str | None = field(default=None, compare=False)
    """Why the file could not be read, if it could not."""


def load_ui_settings(path: Path) -> UiSettings:
    if not path.exists():
        return UiSettings()
    try:
        settings = from_table(UiSettings, read_toml(path).get(SECTION, {}), path=path, where=SECTION)
    except ChattermError as exc:
        return UiSettings(error=f"settings ignored: {exc}")
    settings.theme = settings.theme or None  # theme = "" means the default theme
    return settings


def remember_theme(path: Path, theme: str) -> None:
    try:
        text = read_small(path, TOML_MAX_BYTES, "a TOML file").decode("utf-8") if path.exists() else None
        document = tomlkit.parse(text) if text is not None else tomlkit.document()
    except (OSError, UnicodeDecodeError, TOMLKitError) as exc:
        raise ChattermError(f"{path}: cannot update settings: {getattr(exc, 'strerror', None) or exc}") from None
    section = document.get(SECTION)
    if not isinstance(section, dict):
        section = tomlkit.table()
        document[SECTION] = section
    section["theme"] = theme
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # a fresh install has no config folder
        atomic_write_bytes(path, tomlkit.dumps(document).encode("utf-8"), mode=0o644)
    except OSError as exc:
        raise ChattermError(f"{path}: cannot save settings: {exc.strerror or exc}") from None
