"""Theme files: TOML in `themes/` (bundled) and the user's themes folder.

Contract:
- Each `*.toml` file describes one Textual `Theme`: `name`, `dark`, the base
  colours (`primary` required; `secondary`, `accent`, `foreground`,
  `background`, `surface`, `panel`, `boost`, `warning`, `error`, `success`)
  and an optional `[variables]` table of Textual theme variables.
- Every colour is checked with `Color.parse` before the theme is built: Textual
  registers a theme with a bad colour without complaint and crashes only when
  it is selected. Variables whose name contains "style" are text styles
  ("bold", "b reverse") and are checked as such.
- A broken file never stops the others: it is skipped and its one-line error
  (file and reason) is returned in `ThemeSet.errors`, for the app to report once,
  and in `ThemeSet.broken` under the theme's name, for `--theme` to give.
- User themes override bundled ones of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.errors import StyleSyntaxError
from rich.style import Style
from textual.color import Color, ColorParseError
from textual.theme import Theme

from chatterm.core.config import paths, resources
from chatterm.core.config.schema import skipped
from chatterm.core.config.tomlfile import read_toml
from chatterm.errors import ChattermError

DEFAULT_THEME = "chatterm-dark"

COLOUR_KEYS = (
    "primary", "secondary", "accent", "foreground", "background", "surface",
    "panel", "boost", "warning", "error", "success",
)
_KNOWN_KEYS = {"name", "dark", "variables", "luminosity_spread", "text_alpha", *COLOUR_KEYS}


@dataclass
class ThemeSet:
    themes: dict[str, Theme] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)
    """A skipped file's theme name (its `name`, when that much reads, and its
    file name) -> its error: `--theme NAME` says why, not "unknown theme"."""


def _colour(path: Path, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ChattermError(f"{path}: {key} must be a colour string like \"#4EA1FF\"")
    try:
        Color.parse(value)
    except ColorParseError:
        raise ChattermError(f"{path}: {key} = {value!r} is not a colour") from None
    return value


def _style(path: Path, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ChattermError(f"{path}: variables.{key} must be a style string like \"bold\"")
    try:
        Style.parse(value)
    except StyleSyntaxError:
        raise ChattermError(f"{path}: variables.{key} = {value!r} is not a text style") from None
    return value


def theme_from_file(path: Path) -> Theme:
    """Read, validate and convert one theme file (ChattermError naming the file)."""
    raw = read_toml(path)
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise ChattermError(f"{path}: name must be a non-empty string")
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise ChattermError(f"{path}: unknown key {unknown[0]!r}")
    if "primary" not in raw:
        raise ChattermError(f"{path}: missing key 'primary'")
    dark = raw.get("dark", True)
    if not isinstance(dark, bool):
        raise ChattermError(f"{path}: dark must be true or false")
    colours = {key: _colour(path, key, raw[key]) for key in COLOUR_KEYS if key in raw}
    variables_raw = raw.get("variables", {})
    if not isinstance(variables_raw, dict):
        raise ChattermError(f"{path}: [variables] must be a table")
    variables = {
        str(key): _style(path, key, value) if "style" in key else _colour(path, f"variables.{key}", value)
        for key, value in variables_raw.items()
    }
    extra: dict[str, float] = {}
    for key in ("luminosity_spread", "text_alpha"):
        if key in raw:
            if not isinstance(raw[key], (int, float)) or not 0 <= raw[key] <= 1:
                raise ChattermError(f"{path}: {key} must be a number between 0 and 1")
            extra[key] = float(raw[key])
    return Theme(name=name.strip(), dark=dark, variables=variables, **colours, **extra)


def theme_folders() -> list[Path]:
    """Bundled themes first, then the user's (which override by name)."""
    return [resources.bundled_themes_dir(), paths.user_themes_dir()]


def _names_of(path: Path) -> list[str]:
    """The names a skipped theme file would have gone by."""
    try:
        name = read_toml(path).get("name")
    except ChattermError:  # not even TOML
        name = None
    return [n.strip() for n in (name, path.stem) if isinstance(n, str) and n.strip()]


def load_themes(folders: list[Path] | None = None) -> ThemeSet:
    result = ThemeSet()
    for folder in theme_folders() if folders is None else folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                theme = theme_from_file(path)
            except ChattermError as exc:
                result.errors.append(skipped(str(exc)))
                for name in _names_of(path):
                    result.broken.setdefault(name, str(exc))
                continue
            result.themes[theme.name] = theme
    return result
