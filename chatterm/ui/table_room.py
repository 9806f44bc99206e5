"""How many rows a dialog's table may take, so the rest of its box stays in view.

Contract: `fit_table(table, screen_height, box_rows)` caps the table's height at
what a box of at most 90 % of the screen (`.modal-box`'s max-height) leaves
after its `box_rows` other rows (border, padding, title, notes, hint), at most
half the screen and never under `MIN_TABLE_ROWS`. Without it a long table
pushed the dialog's hint out of an 80x24 terminal.
"""

from __future__ import annotations

from textual.widgets import DataTable

BOX_SHARE = 0.9
"""`.modal-box { max-height: 90% }` in chatterm.tcss."""
MIN_TABLE_ROWS = 5
"""A header and two sessions' two-line rows, however short the screen."""


def fit_table(table: DataTable, screen_height: int, box_rows: int) -> None:
    room = int(screen_height * BOX_SHARE) - box_rows
    table.styles.max_height = max(min(room, screen_height // 2), MIN_TABLE_ROWS)
