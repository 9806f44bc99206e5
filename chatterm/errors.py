"""User-facing errors.

A `ChattermError` carries one line that names the file, value or id at fault.
The CLI prints it without a traceback and exits with status 2; the TUI shows it
as a notification or a message in the conversation.
"""


class ChattermError(Exception):
    """An error caused by the user's input or environment, explained in one line."""

    exit_status = 2


def describe(exc: BaseException) -> str:
    """The one line a user is shown for an exception: a ChattermError's own line,
    anything else as 'TypeName: message' (an unexpected error names its kind)."""
    if isinstance(exc, ChattermError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
