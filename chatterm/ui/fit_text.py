"""The longest of a few wordings that fits a width.

Contract: `first_fitting(choices, width)` is the first of `choices` (longest
first) whose terminal cells fit `width`, else the last one cut to `width`,
ending in "…" (cut by the widget, it ended mid-word or on a dangling "·").
Used for one-line texts that must say something whole in an 80-column
terminal: the title, the prompt's placeholder, the dashboard's hint.
"""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len, set_cell_size


def first_fitting(choices: Sequence[str], width: int) -> str:
    fitting = next((text for text in choices if cell_len(text) <= width), None)
    if fitting is not None or width < 1:
        return fitting if fitting is not None else ""
    return set_cell_size(choices[-1], width - 1).rstrip(" ·") + "…"
