"""Remembered TUI choices in the config folder's settings.toml (`[tui]` table).

Contract:
- `load_ui_settings(path)` never fails: a missing file gives the defaults, a
  broken one gives the defaults plus a one-line `error` for the app to show.
- `remember_theme(path, name)` rewrites the file atomically, keeping every other
  table and key it holds (settings.toml is shared; only `[tui]` is ours). It
  raises ChattermError with one line when the file cannot be written.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatterm.core.atomic import atomic_write_bytes
from chatterm.core.errors import ChattermError
from chatterm.core.tomlfile import read_toml

SECTION = "tui"


@dataclass
class UiSettings:
    theme: str | None = None
    """The theme last chosen in the app (None: the default theme)."""
    error: str | None = None
    """Why the file could not be read, if it could not."""


def load_ui_settings(path: Path) -> UiSettings:
    if not path.exists():
        return UiSettings()
    try:
        table = read_toml(path).get(SECTION, {})
    except ChattermError as exc:
        return UiSettings(error=f"settings ignored: {exc}")
    theme = table.get("theme") if isinstance(table, dict) else None
    return UiSettings(theme=theme if isinstance(theme, str) and theme else None)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):  # a table inside an array ([[name]] or [{...}])
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date subclass
        return value.isoformat()
    raise ChattermError(f"cannot rewrite a value of type {type(value).__name__}")


def _string(text: str) -> str:
    # A JSON string is a TOML basic string, given two differences: TOML has no
    # surrogate escapes (so no ensure_ascii) and wants DEL escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(key: str) -> str:
    return key if key.replace("-", "").replace("_", "").isalnum() and key.isascii() else _string(key)


def _dump(data: dict[str, Any], prefix: str = "") -> list[str]:
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            name = f"{prefix}{_key(k)}"
            lines += ["", f"[{name}]", *_dump(v, f"{name}.")]
    return lines


def remember_theme(path: Path, theme: str) -> None:
    data = read_toml(path) if path.exists() else {}
    section = data.get(SECTION)
    if not isinstance(section, dict):
        section = data[SECTION] = {}
    section["theme"] = theme
    try:
        text = "\n".join(_dump(data)).lstrip("\n") + "\n"
        atomic_write_bytes(path, text.encode("utf-8"), mode=0o644)
    except OSError as exc:
        raise ChattermError(f"{path}: cannot save settings: {exc.strerror or exc}") from None
    except ChattermError as exc:
        raise ChattermError(f"{path}: cannot save settings: {exc}") from None
