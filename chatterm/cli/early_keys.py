"""Keys typed while `chatterm launch` starts reach the app as typed.

Until Textual puts the terminal in raw mode (about half a second after the
command starts), the terminal's line discipline translates Enter (CR) into a
newline (LF), which the app then reads as Ctrl+J, "insert a new line": a
message typed and sent before the first frame stayed in the prompt. So the
first thing `launch` does (`hold`, a quarter second after the command starts,
before the app's imports) is turn that translation (ICRNL) off on a terminal
stdin. The translation happens as each key arrives, so an Enter pressed from
then on waits in the terminal as typed and reaches the app as Enter. Flow
control (IXON) goes off with it: the terminal took Ctrl+Q and Ctrl+S (the
app's Quit and Export) as XON and XOFF, so a Ctrl+Q pressed before the first
frame never reached the app, which then stayed open. Echo goes off too: the
keys are the app's to show, and what the terminal echoed stayed on the
screen the app left behind. Textual restores the settings
it found, which are these, so `restore` puts the user's own back: at the end
of launch, before an immediate exit, and at interpreter exit. Elsewhere (no
terminal, no termios) both do nothing.

Keys typed before `hold` (while the README's one-liner still installs, say)
were translated as they arrived: they wait in the terminal with each Enter
already a newline. `hold` reads them out at once and `take_typed` gives
them back, for the app to read first
(`chatterm.ui.paste_input.PasteSafeParser.typed_before_start`: its lines
as one message, the last Enter as Enter). Keys read out this way are the
app's: a launch that then fails on its arguments drops them, where the
shell would have run them as a command.
"""

from __future__ import annotations

import atexit
import os
import sys

_saved: tuple[int, list] | None = None
_typed = ""


def hold() -> None:
    global _saved
    try:
        import termios

        fd = sys.stdin.fileno()
        if _saved is not None or not sys.stdin.isatty():
            return
        before = termios.tcgetattr(fd)
        attrs = termios.tcgetattr(fd)
        attrs[0] &= ~(termios.ICRNL | termios.IXON)
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, attrs)  # not TCSAFLUSH: that drops what was typed
    except Exception:  # noqa: BLE001 - no termios, a closed stdin, a terminal that refuses: start as before
        return
    _saved = (fd, before)
    atexit.register(restore)
    _read_typed(fd)


def _read_typed(fd: int) -> None:
    """What waits in the terminal, typed before `hold`, kept for `take_typed`."""
    global _typed
    try:
        import fcntl
        import struct
        import termios

        def waiting() -> int:
            return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]

        data = b""
        # A canonical-mode read gives one line at a time; what follows the last
        # Enter stays in the terminal and reaches the app, in order, after these.
        while (count := waiting()) > 0:
            data += os.read(fd, count)
    except Exception:  # noqa: BLE001 - nothing to read, or no way to ask: the keys stay where they are
        return
    _typed = data.decode("utf-8", "replace")  # each Enter a newline: ICRNL translated it as it arrived


def take_typed() -> str:
    """The keys `hold` found typed before it (each Enter a newline); once."""
    global _typed
    typed, _typed = _typed, ""
    return typed


def restore() -> None:
    global _saved
    if _saved is None:
        return
    fd, before = _saved
    _saved = None
    try:
        import termios

        termios.tcsetattr(fd, termios.TCSANOW, before)
    except Exception:  # noqa: BLE001 - the terminal is gone (hung up): nothing to restore
        pass
