"""User-facing errors.

A `ChattermError` carries one line that names the file, value or id at fault.
The CLI prints it without a traceback and exits with status 2; the TUI shows it
as a notification or a message in the conversation.
"""


class ChattermError(Exception):
    """An error caused by the user's input or environment, explained in one line."""

    exit_status = 2
