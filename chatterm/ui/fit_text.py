"""The longest of a few wordings that fits a width.

Contract: `first_fitting(choices, width)` is the first of `choices` (longest
first) whose terminal cells fit `width`, else the last one, which the caller's
widget then cuts. Used for one-line texts that must say something whole in an
80-column terminal: the title, the prompt's placeholder, the dashboard's hint.
"""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len


def first_fitting(choices: Sequence[str], width: int) -> str:
    return next((text for text in choices if cell_len(text) <= width), choices[-1])
