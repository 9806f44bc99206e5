"""Where chatterm keeps its files.

Every path comes from here. platformdirs gives the per-user defaults; an
environment variable overrides each folder, which is how tests and CI point
chatterm at a temporary directory:

- CHATTERM_CONFIG_DIR  models.toml, personas/, themes/, settings.toml
- CHATTERM_DATA_DIR    the session database and exports
- CHATTERM_CACHE_DIR   persona KV state files (kv/) and the model hash cache
- CHATTERM_DB          the session database file itself
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "chatterm"


def _dir(env_var: str, default: Path) -> Path:
    value = os.environ.get(env_var)
    return Path(value).expanduser() if value else default


def config_dir() -> Path:
    return _dir("CHATTERM_CONFIG_DIR", platformdirs.user_config_path(APP_NAME))


def data_dir() -> Path:
    return _dir("CHATTERM_DATA_DIR", platformdirs.user_data_path(APP_NAME))


def cache_dir() -> Path:
    return _dir("CHATTERM_CACHE_DIR", platformdirs.user_cache_path(APP_NAME))


def folder_problem() -> str | None:
    """A config, data or cache folder that is there and is not a folder (a
    variable pointing at a file): one line naming it, else None. Without the
    check a file there was read as an empty folder, or gave "File exists"."""
    for env_var, name, folder in (("CHATTERM_CONFIG_DIR", "config", config_dir),
                                  ("CHATTERM_DATA_DIR", "data", data_dir), ("CHATTERM_CACHE_DIR", "cache", cache_dir)):
        path = folder()
        if path.exists() and not path.is_dir():
            named = f"${env_var} {path}" if os.environ.get(env_var) else f"chatterm's {name} folder {path}"
            return f"{named} is a file, not a folder"
    return None


def kv_cache_dir() -> Path:
    return cache_dir() / "kv"


def model_hash_cache_file() -> Path:
    return cache_dir() / "model-hashes.json"


def named_db_path() -> Path | None:
    """$CHATTERM_DB: a database the user named (like --db), or None."""
    value = os.environ.get("CHATTERM_DB")
    return Path(value).expanduser() if value else None


def data_db_path() -> Path:
    """The data folder's own database (what `default_db_path` is without $CHATTERM_DB)."""
    return data_dir() / "chatterm.db"


def default_db_path() -> Path:
    return named_db_path() or data_db_path()


def exports_dir() -> Path:
    return data_dir() / "exports"


def launch_log_file() -> Path:
    """Where `chatterm launch` logs while the app owns the terminal."""
    return data_dir() / "launch.log"


def user_models_file() -> Path:
    return config_dir() / "models.toml"


def user_personas_dir() -> Path:
    return config_dir() / "personas"


def user_themes_dir() -> Path:
    return config_dir() / "themes"


def settings_file() -> Path:
    return config_dir() / "settings.toml"
