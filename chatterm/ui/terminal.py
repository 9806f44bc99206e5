"""The terminal driver: Textual's own, writing to a private copy of the terminal.

llama-cpp-python points file descriptors 1 and 2 at /dev/null while it loads a
model (it does so unless asked to be verbose), and here that load runs in a
background thread while the app is on screen. Textual writes the screen to
fd 2, so whatever it wrote in that window was lost: a Ctrl+Q during the load
left the terminal in the alternate screen with the cursor hidden, because the
sequences that restore it went to /dev/null. The driver here writes to a
duplicate of the terminal's descriptor made before any load starts, which no
later redirection of fd 2 reaches; the terminal's size is read from it too (a
resize while fd 1 pointed at /dev/null read 80x24). Where Textual uses another
driver (Windows, or a headless test), `driver_class` returns that one unchanged.

`placed` makes a whole-screen redraw position each widget's part of a row, as
Textual's partial redraws already do (docs/tui.md, "Wide characters").

The Linux driver's input is parsed by `paste_input.PasteSafeParser`, so a
paste that holds escape sequences arrives whole (docs/tui.md, "Pasting").
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
    _parse_pastes_whole()

    class PrivateTerminalDriver(default):  # type: ignore[valid-type, misc]
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            stderr = sys.__stderr__
            self._file = os.fdopen(
                os.dup(stderr.fileno()), "w", encoding=stderr.encoding, errors=stderr.errors, buffering=1
            )

        def _get_terminal_size(self) -> tuple[int, int]:
            # Asked of the private descriptor too: Textual's own asks fd 1 (via
            # shutil), which a load or a prefill points at /dev/null, and a
            # resize then read 80x24, whatever the terminal's size.
            try:
                return tuple(os.get_terminal_size(self._file.fileno()))  # type: ignore[return-value]
            except (AttributeError, ValueError, OSError):
                return super()._get_terminal_size()

        def close(self) -> None:
            super().close()  # stops the writer thread: everything is written
            self._file.close()

    return PrivateTerminalDriver


def _parse_pastes_whole() -> None:
    """Make the Linux driver's input thread parse with `PasteSafeParser`.

    The driver builds its parser from its module's `XTermParser` name when the
    input thread starts, and offers no other way in; where that name is not
    Textual's own parser (another Textual), it is left alone.
    """
    from textual._xterm_parser import XTermParser
    from textual.drivers import linux_driver

    from chatterm.ui.paste_input import PasteSafeParser

    if linux_driver.XTermParser is XTermParser:
        linux_driver.XTermParser = PasteSafeParser  # type: ignore[misc]


def placed(update: object) -> object:
    """`update` (what Textual's compositor hands the driver) with every widget's
    part of a row written after a cursor move to its own column.

    Textual writes a whole-screen redraw (a resize, a closed modal, a theme) as
    rows, one cursor move each; a partial one moves to each widget's part. Where
    the terminal counts an emoji sequence wider or narrower than rich does
    (tmux 3.3a: U+FE0F adds nothing, a skin-tone modifier two cells), the rest
    of such a row, borders and the dashboard included, would land off by the
    difference until it is redrawn. Each part's cells are erased before it is
    written, so a part drawn narrower leaves no old cells at its end. Any other
    update is returned as it is, and so is every update where Textual's
    internals are not what this expects.
    """
    if _PlacedLayoutUpdate is None or type(update) is not _LayoutUpdate:
        return update
    return _PlacedLayoutUpdate(update.strips, update.region)


try:
    from rich.control import Control
    from textual._compositor import LayoutUpdate as _LayoutUpdate

    class _PlacedLayoutUpdate(_LayoutUpdate):
        def render_segments(self, console) -> str:
            out: list[str] = []
            for y, row in enumerate(self.strips, self.region.y):
                x = self.region.x
                for strip in row:  # one Strip per widget's part of the row, left to right
                    move = Control.move_to(x, y).segment.text
                    # ECH first: where the terminal draws the part narrower, no
                    # cell of what was there before stays at its end.
                    out.append(f"{move}\x1b[0m\x1b[{strip.cell_length}X{move}")
                    out.append(strip.render(console))
                    x += strip.cell_length
            return "".join(out)

except ImportError:  # another Textual: its own rendering is used
    _LayoutUpdate = _PlacedLayoutUpdate = None  # type: ignore[assignment,misc]
