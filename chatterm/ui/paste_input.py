"""Terminal input with a bracketed paste kept whole, whatever escape sequences it holds.

Textual's `XTermParser` reads a bracketed paste one character at a time, but
an ESC inside it starts its escape-sequence search, and the characters that
search consumes are re-issued as key presses instead of joining the paste. A
pasted line of coloured terminal output (`tmux paste-buffer -p` keeps its SGR
codes; some terminals do too) thus became keys: its CR pressed Enter, part of
the paste went off as a message and the rest was lost. `PasteFilter` removes
the escape sequences inside a paste before the parser sees them (xterm and
Alacritty drop the ESC byte alone and leave `[31m` as text; here the whole
sequence goes, and a lone ESC), so the parser collects the paste as text and
emits one Paste event. Reports the terminal sends in the middle of a paste
(focus in or out, an in-band resize) are passed on right after it. Outside a
paste the input passes through unchanged and at once: an Escape key press is
never held back. A paste's start is looked for across reads only while they
come within the parser's ESCAPE_DELAY: later, the parser has given up on the
sequence (an Esc, then `[200~` typed, is keys), and so does the filter.
"""

from __future__ import annotations

import re
import time
from typing import Callable, Iterable

from textual import constants
from textual._xterm_parser import BRACKETED_PASTE_END as PASTE_END
from textual._xterm_parser import BRACKETED_PASTE_START as PASTE_START
from textual._xterm_parser import XTermParser
from textual.message import Message

__all__ = ["PASTE_END", "PASTE_START", "PasteFilter", "PasteSafeParser"]

# ECMA-48: CSI, OSC (ended by BEL or ST), DCS/SOS/PM/APC (ended by ST), and
# the two-character escapes, whose final byte is none of the introducers above.
_ESCAPE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]"
    r"|\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|[PX^_][^\x1b]*\x1b\\"
    r"|[ -/]*[0-OQ-WYZ\\`a-~])"
)
# What the terminal reports mid-paste and the app still needs: focus in and
# out, an in-band resize (Textual's own patterns).
_REPORT = re.compile(r"\x1b\[[IO]|\x1b\[48;[\d:;]*t")
# The start of one of those, cut off by the end of the text read so far.
_STARTED = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[PX^_][^\x1b]*\x1b?|[ -/]*)\Z")
# An unfinished sequence held back longer than this is let go (its ESC dropped):
# a terminal's chunk of input is 4 KiB, and no real sequence comes near it.
_LONGEST_HELD = 4096


def _without_escapes(text: str, reports: list[str]) -> str:
    """`text` without its escape sequences; the reports among them added to `reports`."""

    def drop(match: re.Match[str]) -> str:
        if _REPORT.fullmatch(match.group()):
            reports.append(match.group())
        return ""

    return _ESCAPE.sub(drop, text).replace("\x1b", "")


def _unfinished(text: str) -> int:
    """How many characters at the end of `text` (inside a paste) may be the
    start of an escape sequence, or of the paste's end, still to arrive."""
    at = 0
    while (start := text.find("\x1b", at)) >= 0:
        if whole := _ESCAPE.match(text, start):
            at = whole.end()
        elif len(text) - start <= _LONGEST_HELD and _STARTED.match(text, start):
            return len(text) - start
        else:
            at = start + 1
    return 0


class PasteFilter:
    """Called with each chunk of decoded terminal input; returns the chunk to
    parse. Keeps its state (inside a paste or not, what is held back) between
    chunks, since a paste and its markers may be split anywhere."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._pasting = False
        self._held = ""  # outside a paste: the last characters passed, to find a split PASTE_START
        self._reports: list[str] = []
        """Reports read inside the paste, passed on after its end."""
        self._clock = clock
        self._last_read = float("-inf")

    def __call__(self, data: str) -> str:
        now = self._clock()
        if not self._pasting and now - self._last_read > constants.ESCAPE_DELAY:
            self._held = ""  # the parser has timed that sequence out: nothing left to complete
        self._last_read = now
        out: list[str] = []
        while data:
            seen = self._held + data
            if not self._pasting:
                at = seen.find(PASTE_START)
                if at < 0:
                    out.append(data)
                    self._held = seen[-(len(PASTE_START) - 1) :]
                    break
                after = at + len(PASTE_START) - len(self._held)  # in `data`: the held part was passed already
                out.append(data[:after])
                data, self._held, self._pasting = data[after:], "", True
            else:
                at = seen.find(PASTE_END)
                if at < 0:
                    keep = _unfinished(seen)
                    out.append(_without_escapes(seen[: len(seen) - keep], self._reports))
                    self._held = seen[len(seen) - keep :]
                    break
                out.append(_without_escapes(seen[:at], self._reports) + PASTE_END)
                out.extend(self._reports)
                self._reports.clear()
                data, self._held, self._pasting = seen[at + len(PASTE_END) :], "", False
        return "".join(out)


class PasteSafeParser(XTermParser):
    """Textual's parser, fed through a `PasteFilter`; first of all with
    `typed_before_start` (keys typed before `chatterm launch` could keep them
    as typed: `chatterm.cli.early_keys`), at the first read or tick."""

    typed_before_start = ""

    def __init__(self, debug: bool = False) -> None:
        self._paste_filter = PasteFilter()
        super().__init__(debug)

    def _typed_first(self) -> str:
        """The keys typed before start, as the terminal would have sent them:
        their lines as a paste (one message, its newlines kept; as Enters the
        lines were glued into one line and sent alone), the last Enter as Enter."""
        typed, PasteSafeParser.typed_before_start = PasteSafeParser.typed_before_start, ""
        body, enter = (typed[:-1], "\r") if typed.endswith("\n") else (typed, "")
        return (f"{PASTE_START}{body}{PASTE_END}" if body else "") + enter

    def tick(self) -> Iterable[Message]:
        # The input thread ticks every 0.1 s: the early keys go in without waiting for a new one.
        typed = self._typed_first()
        return [*self.feed(typed), *super().tick()] if typed else super().tick()

    def feed(self, data: str) -> Iterable[Message]:
        if not data:  # the end of input, as Textual signals it
            return super().feed(data)
        data = self._typed_first() + data
        kept = self._paste_filter(data)
        # Everything held back (the start of a sequence inside a paste) is not
        # fed: an empty feed would tell the parser that input has ended.
        return super().feed(kept) if kept else ()
