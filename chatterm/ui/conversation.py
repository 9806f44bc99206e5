"""The conversation pane: user messages, assistant replies, notices.

Contract:
- Everything shown is literal: texts pass through `core.format.printable` and
  become `Content` (user text, notices, footers) or Markdown without links
  that open anything (`open_links=False`, rich `hyperlinks=False`); Markdown
  parsing never interprets console markup such as `[bold]`.
- A reply streams into a Textual `Markdown` through `Markdown.get_stream()`.
  When it ends it is collapsed into ONE `Static` holding a rich Markdown
  renderable: a finished 2,000-token reply as Textual Markdown keeps ~224
  widgets alive and frame cost grows with widget count (DESIGN.md measured
  1.2 s frames with 20 such replies against 82 ms collapsed).
- Under each reply, a footer line from `core.format.footer_line`.
"""

from __future__ import annotations

from rich.markdown import Markdown as RichMarkdown
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Markdown, Static

from chatterm.core.format import footer_line, printable
from chatterm.core.metrics import TurnMetrics

USER_DISPLAY_CHARS = 4_000
"""A huge paste is sent whole but shown shortened: wrapping 100,000 characters
on every resize would freeze the pane for nothing."""


def literal(text: str) -> Content:
    return Content(printable(text))


def shortened(text: str, limit: int = USER_DISPLAY_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit:,} more characters not shown)"


def collapsed_body(text: str) -> Static:
    """A finished reply as one cheap widget (rich Markdown: no markup, no links)."""
    text = printable(text)
    if not text.strip():
        return Static(Content("(no text)"), classes="body empty")
    return Static(RichMarkdown(text, hyperlinks=False), classes="body")


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(literal(shortened(text)))


class Notice(Static):
    """A one-line message in the conversation (dropped turns, persona switch, errors)."""

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(literal(text), classes=f"-{kind}")


class AssistantReply(Vertical):
    """One reply: streaming Markdown while it arrives, one Static once finished."""

    def __init__(
        self,
        title: str,
        text: str = "",
        metrics: TurnMetrics | None = None,
        streaming: bool = False,
    ) -> None:
        super().__init__()
        self._title = title
        self._text = text
        self._metrics = metrics
        self._streaming = streaming
        self._stream = None
        self.set_class(streaming, "-streaming")

    def compose(self):
        yield Static(literal(self._title), classes="who")
        if self._streaming:
            yield Markdown(open_links=False, classes="body")
        else:
            yield collapsed_body(self._text)
        yield Static(self._footer_content(), classes="meta")

    def _footer_content(self) -> Content:
        m = self._metrics
        if m is None:
            return Content("…" if self._streaming else "")
        return literal(footer_line(m))

    def on_mount(self) -> None:
        if self._streaming:
            self._stream = Markdown.get_stream(self.query_one(Markdown))

    async def write(self, text: str) -> None:
        """Append streamed text (batched by the caller; MarkdownStream batches more)."""
        if self._stream is not None and text:
            await self._stream.write(printable(text))

    async def stop_stream(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    async def finish(self, text: str, metrics: TurnMetrics) -> None:
        """Stop streaming and collapse into one widget with the final footer."""
        await self.stop_stream()
        self._streaming = False
        self._text = text
        self._metrics = metrics
        markdown = self.query(Markdown)
        with self.app.batch_update():
            await self.mount(collapsed_body(text), before=self.query_one(".meta"))
            await markdown.remove()
            self.query_one(".meta", Static).update(self._footer_content())
            self.remove_class("-streaming")
            self.set_class(metrics.stop_reason == "cancelled", "-stopped")
            self.set_class(metrics.stop_reason == "error", "-error")


class ConversationView(VerticalScroll):
    """The scrolling list of messages; it follows the bottom while a reply streams."""

    def on_mount(self) -> None:
        self.anchor()

    async def add_user(self, text: str) -> UserMessage:
        widget = UserMessage(text)
        await self.mount(widget)
        return widget

    async def add_reply(self, title: str, *, text: str = "", metrics: TurnMetrics | None = None,
                        streaming: bool = False) -> AssistantReply:
        widget = AssistantReply(title, text, metrics, streaming)
        await self.mount(widget)
        self.anchor()
        return widget

    async def add_notice(self, text: str, kind: str = "info") -> Notice:
        widget = Notice(text, kind)
        await self.mount(widget)
        return widget

    async def clear(self) -> None:
        for reply in self.query(AssistantReply):
            await reply.stop_stream()
        await self.remove_children()
