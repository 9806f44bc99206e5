"""The `chatterm` console script and `python -m chatterm`: the command line,
with a Ctrl+C that lands while it is still importing ending like one anywhere
else, in one line and exit status 130 (`chatterm.cli.main` handles the
rest). Nothing is imported here before that guard."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from chatterm.cli import main as run

        return run()
    except BaseException as exc:
        # Python 3.11 wraps an interrupt inside a class body's __set_name__
        # (a dataclass or a cached property being created) in a RuntimeError.
        if not isinstance(exc, KeyboardInterrupt) and not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        print("chatterm: interrupted", file=sys.stderr)
        return 130
