"""A bracketed paste holding escape sequences is parsed as one Paste event,
however the terminal's input is split into reads; keys outside it are untouched."""

from __future__ import annotations

import time

import pytest
from textual import events
from textual._xterm_parser import XTermParser

from chatterm.ui.paste_input import PASTE_END, PASTE_START, PasteFilter, PasteSafeParser

COLOURED = (
    "\x1b[1;31mred line\x1b[0m\rsecond \x1b]8;;https://x.example\x1b\\link\x1b]8;;\x1b\\ line"
    "\x1b(B\x1bP1$r\x1b\\\r"  # a charset switch, a DCS
)
TEXT = "red line\rsecond link line\r"


def parsed(parser: XTermParser, chunks: list[str], settle: bool = False) -> list[object]:
    """The events from feeding `chunks`; with `settle`, also those after
    Textual's ESCAPE_DELAY, when an ESC read alone becomes the Escape key."""
    events_out = [event for chunk in chunks for event in parser.feed(chunk)]
    if settle:
        time.sleep(0.15)
        events_out += parser.tick()
    return events_out


def splits(data: str):
    """`data` cut into two reads at every position, and one character per read."""
    for at in range(len(data) + 1):
        yield [data[:at], data[at:]] if 0 < at < len(data) else [data]
    yield list(data)


def test_stock_parser_turns_a_coloured_paste_into_keys():
    """What the filter is for: without it, the paste's CR is an Enter key."""
    keys = [e.key for e in parsed(XTermParser(), [PASTE_START + COLOURED + PASTE_END]) if isinstance(e, events.Key)]
    assert "enter" in keys


@pytest.mark.parametrize("chunks", list(splits("ab" + PASTE_START + COLOURED + PASTE_END + "z")))
def test_a_coloured_paste_is_one_paste_event_split_anywhere(chunks):
    out = parsed(PasteSafeParser(), chunks)
    assert [e.text for e in out if isinstance(e, events.Paste)] == [TEXT]
    assert [e.character for e in out if isinstance(e, events.Key)] == ["a", "b", "z"]


def test_the_escape_key_outside_a_paste_is_not_held_back():
    """A lone ESC read on its own passes through at once, so it is the Escape
    key after Textual's usual delay, and an arrow key's sequence is still one key."""
    paste_filter = PasteFilter()
    assert paste_filter("\x1b") == "\x1b"
    assert paste_filter("[A") == "[A"
    keys = [e.key for e in parsed(PasteSafeParser(), ["\x1b"], settle=True) if isinstance(e, events.Key)]
    assert keys == ["escape"]
    keys = [e.key for e in parsed(PasteSafeParser(), ["\x1b", "[A"], settle=True) if isinstance(e, events.Key)]
    assert keys == ["up"]


def test_an_unfinished_sequence_inside_a_paste_waits_for_the_next_read():
    paste_filter = PasteFilter()
    assert paste_filter(PASTE_START + "one\x1b[3") == PASTE_START + "one"
    assert paste_filter("1mtwo\x1b") == "two"
    assert paste_filter("[201~x") == PASTE_END + "x"


def test_a_runaway_sequence_inside_a_paste_is_let_go():
    """An OSC never ended is held only up to 4 KiB; then its text is pasted."""
    paste_filter = PasteFilter()
    body = "\x1b]0;" + "t" * 5000
    assert paste_filter(PASTE_START + body) == PASTE_START + "]0;" + "t" * 5000


def test_end_of_input_still_ends_the_parser():
    parser = PasteSafeParser()
    list(parser.feed(PASTE_START + "\x1b["))  # all held back: nothing fed, no end signalled
    assert not parser.is_eof
    list(parser.feed(""))
    assert parser.is_eof


def test_a_paste_start_typed_after_an_escape_key_is_keys_not_a_paste():
    """Esc, then `[200~` typed: the parser timed the ESC out as the Escape key
    and reads the rest as keys; the filter must not think a paste began (it
    then stripped arrow keys, and the next real paste became keys)."""
    now = [0.0]
    paste_filter = PasteFilter(clock=lambda: now[0])
    assert paste_filter("\x1b") == "\x1b"
    now[0] += 0.5  # past ESCAPE_DELAY: the Escape key
    for ch in "[200~":
        assert paste_filter(ch) == ch
    assert paste_filter("\x1b[A") == "\x1b[A"  # still outside a paste: the arrow key passes
    assert paste_filter(PASTE_START + "one\x1b[1mtwo" + PASTE_END) == PASTE_START + "onetwo" + PASTE_END


def test_focus_and_resize_reports_inside_a_paste_are_passed_on_after_it():
    out = parsed(PasteSafeParser(), [PASTE_START + "abc\x1b[O\x1b[48;40;120;800;1200t" + "def" + PASTE_END])
    assert [type(e).__name__ for e in out] == ["Paste", "AppBlur", "Resize"]
    assert out[0].text == "abcdef" and out[2].size == (120, 40)


def test_keys_typed_before_start_are_one_pasted_message_and_its_last_enter():
    """Typed before launch could keep them: two lines glued into one
    ("Hello there.What is 3 times 3?") when each newline was an Enter."""
    PasteSafeParser.typed_before_start = "Hello there.\nWhat is 3 times 3?\n"
    out = list(PasteSafeParser().tick())
    assert [type(e).__name__ for e in out] == ["Paste", "Key"]
    assert out[0].text == "Hello there.\nWhat is 3 times 3?" and out[1].key == "enter"
    assert PasteSafeParser.typed_before_start == ""  # once
    PasteSafeParser.typed_before_start = "half a line"  # no Enter yet: text only
    out = list(PasteSafeParser().feed("x"))
    assert [e.text for e in out if isinstance(e, events.Paste)] == ["half a line"]
    assert [e.character for e in out if isinstance(e, events.Key)] == ["x"]
