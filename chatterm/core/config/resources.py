"""Files shipped with chatterm: models.toml, themes/ and the built-in personas.

`models.toml` and `themes/` live at the repository root (so users find them) and
are copied into the wheel as `chatterm/_bundled/` (see pyproject.toml). An
editable install has no `_bundled` folder, so the repository root is used.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[2]  # chatterm/core/config/ -> chatterm/


def _bundled(name: str) -> Path:
    packaged = _PACKAGE_DIR / "_bundled" / name
    return packaged if packaged.exists() else _PACKAGE_DIR.parent / name


def bundled_models_file() -> Path:
    return _bundled("models.toml")


def bundled_themes_dir() -> Path:
    return _bundled("themes")


def builtin_personas_dir() -> Path:
    return _PACKAGE_DIR / "personas"
