"""The app's title line, fitted to its width.

Contract: `TitleBar(choices)` shows the first of its texts (longest first)
that fits the width it has at each render, else the last one, cut; `show`
gives it new texts. The texts are shown literally (the caller passes them
through `printable`)."""

from __future__ import annotations

from typing import Sequence

from textual.content import Content
from textual.widget import Widget

from chatterm.ui.fit_text import first_fitting


class TitleBar(Widget):
    def __init__(self, choices: Sequence[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self._choices = tuple(choices)

    def show(self, choices: Sequence[str]) -> None:
        self._choices = tuple(choices)
        self.refresh()

    def render(self) -> Content:
        return Content(first_fitting(self._choices, self.content_size.width))
