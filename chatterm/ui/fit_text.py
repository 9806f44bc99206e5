"""The longest of a few wordings that fits a width.

Contract: `first_fitting(choices, width)` is the first of `choices` (longest
first) whose terminal cells fit `width`, else the last one cut to `width`,
ending in "…" (cut by the widget, it ended mid-word or on a dangling "·").
Used for one-line texts that must say something whole in an 80-column
terminal: the title, the prompt's placeholder, the dashboard's hint.
`cut_to_cells(text, cells)` is that cut, for any one-line text.
`joined_within(parts, sep, width)` joins parts into lines of `width` cells,
breaking only between parts (a reply's footer: "161 ms" never split).
"""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len, set_cell_size


def first_fitting(choices: Sequence[str], width: int) -> str:
    fitting = next((text for text in choices if cell_len(text) <= width), None)
    return fitting if fitting is not None else cut_to_cells(choices[-1], width)


def joined_within(parts: Sequence[str], sep: str, width: int) -> list[str]:
    """`parts` joined by `sep` into lines, a new line started where the next
    part would pass `width` (the `sep` there left out). A part wider than
    `width` is a line of its own, for the renderer to wrap."""
    lines: list[str] = []
    for part in parts:
        if lines and cell_len(joined := lines[-1] + sep + part) <= width:
            lines[-1] = joined
        else:
            lines.append(part)
    return lines


def cut_to_cells(text: str, cells: int) -> str:
    """`text` if it fits `cells`, else its start and "…" in `cells` at most (no
    trailing space or "·" before the "…"; "" when `cells` < 1)."""
    if cell_len(text) <= cells:
        return text
    return set_cell_size(text, cells - 1).rstrip(" ·") + "…" if cells > 0 else ""
