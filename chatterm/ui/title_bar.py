"""The app's title line, fitted to its width.

Contract: `TitleBar(choices)` shows the first of its texts (longest first)
that fits the width it has at each render, else the last one, cut; `show`
gives it new texts. The texts are shown literally (the caller passes them
through `printable`)."""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len
from textual.content import Content
from textual.widget import Widget


class TitleBar(Widget):
    def __init__(self, choices: Sequence[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self._choices = tuple(choices)

    def show(self, choices: Sequence[str]) -> None:
        self._choices = tuple(choices)
        self.refresh()

    def render(self) -> Content:
        width = self.content_size.width
        return Content(next((text for text in self._choices if cell_len(text) <= width), self._choices[-1]))
