"""A DataTable of rows to pick from (sessions, models, turns).

Contract: `RowTable` is Textual's DataTable with a row cursor, where Home and
End go to the first and the last row, as in any list. (DataTable's own Home and
End go to the row's first and last column: in a table wider than its box they
scrolled it sideways and hid the id and title columns.) Ctrl+Home and Ctrl+End
still do the same.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import DataTable


class RowTable(DataTable):
    BINDINGS = [
        Binding("home", "scroll_top", "First row", show=False),
        Binding("end", "scroll_bottom", "Last row", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("cursor_type", "row")
        super().__init__(**kwargs)
