"""The terminal driver: Textual's own, writing to a private copy of the terminal.

llama-cpp-python points file descriptors 1 and 2 at /dev/null while it loads a
model (it does so unless asked to be verbose), and here that load runs in a
background thread while the app is on screen. Textual writes the screen to
fd 2, so whatever it wrote in that window was lost: a Ctrl+Q during the load
left the terminal in the alternate screen with the cursor hidden, because the
sequences that restore it went to /dev/null. The driver here writes to a
duplicate of the terminal's descriptor made before any load starts, which no
later redirection of fd 2 reaches. Where Textual uses another driver (Windows,
or a headless test), `driver_class` returns that one unchanged.
"""

from __future__ import annotations

import os
import sys

from textual.driver import Driver


def driver_class(default: type[Driver]) -> type[Driver]:
    """The driver class to use instead of Textual's `default`."""
    from textual.drivers.linux_driver import LinuxDriver

    if not issubclass(default, LinuxDriver):
        return default

    class PrivateTerminalDriver(default):  # type: ignore[valid-type, misc]
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            stderr = sys.__stderr__
            self._file = os.fdopen(
                os.dup(stderr.fileno()), "w", encoding=stderr.encoding, errors=stderr.errors, buffering=1
            )

        def close(self) -> None:
            super().close()  # stops the writer thread: everything is written
            self._file.close()

    return PrivateTerminalDriver
