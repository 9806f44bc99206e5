"""Reading TOML files with errors that name the file and line."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from chatterm.core.errors import ChattermError


def read_toml(path: Path) -> dict[str, Any]:
    """Parse `path`; a missing, unreadable or malformed file is a one-line ChattermError.

    tomllib's message already carries "(at line N, column M)".
    """
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ChattermError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ChattermError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ChattermError(f"{path}: cannot read: {exc.strerror}") from None
