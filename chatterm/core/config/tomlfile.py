"""Reading TOML files with errors that name the file and line."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from chatterm.core.system.small_file import read_small
from chatterm.errors import ChattermError

TOML_MAX_BYTES = 16 << 20
"""Far more than any models.toml, persona or settings file."""


def read_toml(path: Path, *, named: bool = False) -> dict[str, Any]:
    """Parse `path`; a missing, unreadable or malformed file is a one-line ChattermError.
    `named`: the user named it (`--models FILE`), so a pipe is read as well;
    else a FIFO is an error, not a hang.

    tomllib's message already carries "(at line N, column M)".
    """
    data = b""
    try:
        data = read_small(path, TOML_MAX_BYTES, "a TOML file", streams=named)
        return tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise ChattermError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        if "(at end of document)" in message:
            # e.g. an unclosed string: name the last line so the user knows where to look.
            lines = data.count(b"\n") + 1
            message = message.replace("(at end of document)", f"(at end of document, line {lines})")
        raise ChattermError(f"{path}: invalid TOML: {message}") from None
    except UnicodeDecodeError as exc:
        raise ChattermError(f"{path}: invalid TOML: not UTF-8 (byte {exc.start})") from None
    except ValueError as exc:  # tomllib lets int()'s digit limit through: x = 999...9 (4,301+ digits)
        raise ChattermError(f"{path}: invalid TOML: {str(exc).split(';')[0]}") from None
    except RecursionError:
        raise ChattermError(f"{path}: invalid TOML: arrays or tables nested too deeply") from None
    except OSError as exc:
        raise ChattermError(f"{path}: cannot read: {exc.strerror}") from None
