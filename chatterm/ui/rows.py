"""`Rows`: `label value` lines in two columns, for the dashboard and the pickers.

Contract:
- The label column is as wide as `label_width` (or the longest label plus one
  space) and never wraps. A value wraps inside its own column, so a continuation
  line starts under the value, never at the left edge; a word wider than the
  column folds. Nothing is cut.
- String labels and values are literal text (never markup); `Content` keeps
  its styles. A `Fitted` value is drawn for the value column's width instead of
  wrapped (a bar to scale, which a wrap would break). `str(rows)` is the
  unwrapped text, one `label value` per pair.
- It is a Textual `Visual`: a `Static` or an `OptionList` option sizes it to
  its width like any text.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable

from textual.content import Content
from textual.css.styles import RulesMap
from textual.strip import Strip
from textual.style import Style
from textual.visual import RenderOptions, Visual

from chatterm.core.metrics.format import printable

LABEL_WIDTH = 12
"""The dashboard's label column: its longest label (`input share`) and a space."""


Fitted = Callable[[int], Content]
"""A value drawn to fit: called with the cells its column has (`sys.maxsize`
for `str()`, which does not wrap), it returns one line no wider."""


def _content(value: str | Content) -> Content:
    return value if isinstance(value, Content) else Content(printable(value))


def _value(value: str | Content | Fitted) -> Content | Fitted:
    return value if callable(value) else _content(value)


def _at(value: Content | Fitted, width: int) -> Content:
    return value(width) if callable(value) else value


class Rows(Visual):
    def __init__(
        self, pairs: Iterable[tuple[str | Content, str | Content | Fitted]], label_width: int = LABEL_WIDTH,
        label_style: str = "dim",
    ) -> None:
        self._pairs = [(_content(label), _value(value)) for label, value in pairs]
        self._label_width = max([label_width, *(label.cell_length + 1 for label, _ in self._pairs if label)])
        self._label_style = label_style
        self._laid_out: tuple[int, Content] | None = None

    def __str__(self) -> str:
        return "\n".join(
            f"{label.plain.ljust(self._label_width)}{_at(value, sys.maxsize).plain}" for label, value in self._pairs
        )

    def lines(self, width: int) -> Content:
        """The rows wrapped to `width` cells (kept for the last width asked)."""
        if self._laid_out is None or self._laid_out[0] != width:
            value_width = max(width - self._label_width, 1)
            out = []
            for label, value in self._pairs:
                head = label.pad_right(self._label_width - label.cell_length)
                if self._label_style:
                    head = head.stylize_before(self._label_style)
                for part in _at(value, value_width).wrap(value_width) or [Content("")]:
                    out.append(head + part)
                    head = Content(" " * self._label_width)
            self._laid_out = (width, Content("\n").join(out))
        return self._laid_out[1]

    def render_strips(self, width: int, height: int | None, style: Style, options: RenderOptions) -> list[Strip]:
        return self.lines(width).render_strips(width, height, style, options)

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        value_width = max(container_width - self._label_width, 1)
        widths = (_at(value, value_width).get_optimal_width(rules, container_width) for _, value in self._pairs)
        return self._label_width + max(widths, default=0)

    def get_minimal_width(self, rules: RulesMap) -> int:
        return self._label_width + 1

    def get_height(self, rules: RulesMap, width: int) -> int:
        return len(self.lines(width).plain.split("\n"))
