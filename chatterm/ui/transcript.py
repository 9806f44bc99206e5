"""The conversation pane: user messages, assistant replies, notices.

Contract:
- Everything shown is literal: texts pass through `core.format.printable` and
  become `Content` (user text, notices), rich `Text` (a reply's name and
  footer) or rich Markdown without links (`hyperlinks=False`); Markdown
  parsing never interprets console markup such as `[bold]`.
- A reply is ONE widget that draws its own lines, renders Markdown while it
  streams and costs a bounded amount per write however long it gets
  (`AssistantReply`): a turn is two widgets in the layout, where a Textual
  Markdown tree would keep ~224 alive for a 2,000-token reply.
- Under each reply, its footer (`core.format.footer_line`), broken onto
  more lines only between its figures.
- A resumed session mounts its last turns only; older ones are paged in from
  the store as the user scrolls up (`ConversationView`).
- A reply knows its stored turn (`turn_id`) and its message (`user`). Its
  title line names the turn as the store numbers it (`turn 5`: the number the
  sessions screen, forks and `ask --fork ID:TURN` use, which counts every
  computed turn, so it can run ahead of the exchanges shown) and, with
  siblings, its place among them (`‹ 2/3 ›`). The view keeps a selected turn
  (Shift+↑ ↓ while it has the focus; none means the last) that the turn
  actions apply to (`current_reply`), can drop everything from a turn down
  (`remove_from`), mount a branch's turns (`show_path`) and page in until a
  given turn is mounted (`reveal`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from rich.console import Console
from rich.segment import Segment
from rich.text import Text
from textual.binding import ActiveBinding, Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from chatterm.core.metrics.format import SEP, footer_parts, printable
from chatterm.core.metrics.turn_metrics import StopReason, TurnMetrics
from chatterm.ui.fit_text import joined_within
from chatterm.ui.literal_markdown import LiteralMarkdown
from chatterm.ui.typing_to_prompt import TypingGoesToPrompt

if TYPE_CHECKING:
    from chatterm.core.store.session_store import TurnRecord

OlderTurns = Callable[[int, int], Sequence["TurnRecord"]]
"""(before turn index, limit) -> up to `limit` older turns, oldest first."""

USER_DISPLAY_CHARS = 4_000
"""A huge paste is sent whole but shown shortened: wrapping 100,000 characters
on every resize would freeze the pane for nothing."""


def literal(text: str) -> Content:
    return Content(printable(text))


def shortened(text: str, limit: int = USER_DISPLAY_CHARS) -> str:
    """The beginning and the end of a long message: a pasted document usually
    ends with the question the user typed about it."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return (f"{text[:half]}\n… {len(text) - 2 * half:,} characters not shown (x or click: show all) …\n"
            f"{text[-half:]}")


class MarkdownLines:
    """Markdown rendered to lines once per width; more can be appended without
    rendering again what is already there.

    A `Static` holding rich Markdown renders all of it twice per change (once
    to measure its height, once to draw); this renders each appended part once
    (rich Markdown: no links, no console markup) and keeps the lines until the
    width changes. Parts must be whole top-level blocks: they are rendered
    separately with a blank line between them, as Markdown separates blocks.
    """

    def __init__(self, text: str = "") -> None:
        self._parts: list[str] = [text] if text else []
        self._lines: list[Strip] = []
        self._width = 0

    @property
    def source(self) -> str:
        return "".join(self._parts)

    def append(self, text: str, console: Console) -> None:
        if not text:
            return
        self._parts.append(text)
        if self._width:
            self._lines += render_markdown(text, self._width, console, first=len(self._parts) == 1)

    def lines(self, width: int, console: Console) -> list[Strip]:
        if width != self._width:
            self._width = width
            self._lines = [
                line
                for index, part in enumerate(self._parts)
                for line in render_markdown(part, width, console, first=index == 0)
            ]
        return self._lines


def render_markdown(text: str, width: int, console: Console, first: bool = True) -> list[Strip]:
    """Printable Markdown as lines `width` wide (a blank line first unless `first`)."""
    lines = console.render_lines(LiteralMarkdown(text), console.options.update_width(max(width, 1)), pad=False)
    strips = Strip.from_lines(lines)
    return strips if first else [Strip.blank(0), *strips]


class UserMessage(Static):
    """A user message; a long one shows its beginning and end until clicked
    (or `x` on its turn in the conversation)."""

    def __init__(self, text: str) -> None:
        super().__init__(literal(shortened(text)))
        self.text = text
        """The message as sent (an edit starts from it)."""
        self.expanded = False

    def on_click(self) -> None:
        self.toggle()

    def toggle(self) -> None:
        """Show all of a long message, or its beginning and end again."""
        if len(self.text) > USER_DISPLAY_CHARS:
            self.expanded = not self.expanded
            self.update(literal(self.text if self.expanded else shortened(self.text)))


MEMORY_MARK = "-memory-start"
MEMORY_TEXT = "── earlier turns are no longer in the model's context (they stay here and in the store) ──"


class Notice(Static):
    """A one-line message in the conversation (dropped turns, persona switch, errors)."""

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(literal(text), classes=f"-{kind}")


class AssistantReply(Widget):
    """One reply, one widget: the persona's name, the Markdown, the footer.

    It draws its own lines (Textual's line API), so a conversation costs the
    layout two widgets per turn. While streaming, finished top-level blocks are
    rendered once and appended (`MarkdownLines`); only the block still being
    written is rendered again on each write. So a write costs what it brings
    plus one block, however long the reply already is. (Textual's `Markdown`
    widget mounts a widget per block and re-lays them out on every append:
    150-270 ms frames on a 2-core machine, and tens of thousands of objects
    for the collector to sweep after a long reply.)
    Title and footer take their style from the component classes
    `reply--who` and `reply--meta` (the stylesheet, so themes apply).
    """

    COMPONENT_CLASSES = {"reply--who", "reply--meta"}
    PAD = 1
    """Columns left and right of the text and the footer."""

    def __init__(
        self,
        title: str,
        text: str = "",
        metrics: TurnMetrics | None = None,
        streaming: bool = False,
    ) -> None:
        super().__init__()
        self._title = printable(title)
        self._metrics = metrics
        self._streaming = streaming
        self._body = MarkdownLines(printable(text))
        self._live = ""
        """Text of the unfinished last block (rendered again on each write)."""
        self._live_lines: tuple[int, list[Strip]] | None = None
        self._cache: tuple[int, list[Strip]] | None = None
        self.turn_id: int | None = None
        """The stored turn this reply is (None until it is stored, or without a store)."""
        self.user: UserMessage | None = None
        """The message this reply answers."""
        self._branch = ""
        """`‹ 2/3 ›` when the reply has siblings (`branch_label`), else empty."""

    def set_turn(self, record: "TurnRecord") -> None:
        """Make the reply stored turn `record`: its number and its place among
        its siblings go into the title line."""
        branch = branch_label(record)
        if (record.index, branch) != (self.turn_id, self._branch):
            self.turn_id, self._branch = record.index, branch
            self._changed()

    @property
    def branch_text(self) -> str:
        return self._branch

    # -- what it shows, as text (tests and the benchmarks read these) -----------
    @property
    def source(self) -> str:
        """The reply's text as shown (control characters made visible): what a copy takes."""
        return self._body.source + self._live

    @property
    def title_text(self) -> str:
        return self._text_of(self._title_lines(self._width()))

    @property
    def body_text(self) -> str:
        return self._text_of(self._body_lines(self._width()))

    @property
    def footer_text(self) -> str:
        return self._text_of(self._footer_lines(self._width()))

    @staticmethod
    def _text_of(lines: list[Strip]) -> str:
        return "\n".join(line.text.rstrip() for line in lines)

    def _width(self) -> int:
        return self.size.width or 80

    # -- streaming ----------------------------------------------------------------
    @property
    def streaming(self) -> bool:
        """Still being written (its turn has not ended)."""
        return self._streaming

    async def write(self, text: str) -> None:
        """Append streamed text (the caller batches what arrived since its last write)."""
        if not self._streaming or not text:
            return
        self._live += printable(text)
        cut = settled_length(self._live)
        if cut > 0:
            done, self._live = self._live[:cut], self._live[cut:]
            self._body.append(done, self.app.console)
        self._live_lines = None
        self._changed()

    async def stop_stream(self) -> None:
        """Stop taking writes (the conversation is being cleared)."""
        self._streaming = False

    async def finish(self, text: str, metrics: TurnMetrics) -> None:
        """Stop streaming; the text stays as streamed; show the final footer."""
        self._streaming = False
        self._metrics = metrics
        shown = printable(text)
        if shown == self._body.source + self._live:
            self._body.append(self._live, self.app.console)
        else:
            # The engine's final text differs from what streamed (it never
            # should): show the final text whole.
            self._body = MarkdownLines(shown)
        self._live = ""
        self._live_lines = None
        self.set_class(metrics.stop_reason == StopReason.CANCELLED, "-stopped")
        self.set_class(metrics.stop_reason == StopReason.ERROR, "-error")
        self._changed()

    def _changed(self) -> None:
        self._cache = None
        self.refresh(layout=True)

    # -- drawing ---------------------------------------------------------------------
    def notify_style_update(self) -> None:
        self._cache = None  # title and footer colours come from the theme
        super().notify_style_update()

    def _title_lines(self, width: int) -> list[Strip]:
        style = self.get_component_rich_style("reply--who")
        title = Text(self._title, style=style)
        meta = self.get_component_rich_style("reply--meta")
        if self.turn_id is not None:
            title.append(f" · turn {self.turn_id}", style=meta)
        if self._branch:
            title.append(f"  {self._branch}", style=meta)
        return self._text_lines(title, width, pad=0)

    def _footer_lines(self, width: int) -> list[Strip]:
        if self._metrics is not None:
            # At 80 columns "cold prefill 161 ms" was split before its "ms".
            lines = joined_within(footer_parts(self._metrics), SEP, width - 2 * self.PAD)
        else:
            lines = ["…"] if self._streaming else []
        if not lines:
            return []
        style = self.get_component_rich_style("reply--meta")
        return self._text_lines(Text(printable("\n".join(lines)), style=style), width, pad=self.PAD)

    def _text_lines(self, text: Text, width: int, pad: int) -> list[Strip]:
        console = self.app.console
        lines = console.render_lines(text, console.options.update_width(max(width - 2 * pad, 1)), pad=False)
        return [Strip([Segment(" " * pad), *line]) if pad else Strip(line) for line in lines]

    def _body_lines(self, width: int) -> list[Strip]:
        inner = max(width - 2 * self.PAD, 1)
        console = self.app.console
        lines = self._body.lines(inner, console)
        if self._live.strip():
            if self._live_lines is None or self._live_lines[0] != inner:
                self._live_lines = (inner, render_markdown(self._live, inner, console, first=not lines))
            lines = lines + self._live_lines[1]
        elif not lines and not self._streaming:
            lines = [Strip([Segment("(no text)")])]
        return [Strip([Segment(" " * self.PAD), *line]) for line in lines]

    def _all_lines(self, width: int) -> list[Strip]:
        if self._cache is None or self._cache[0] != width:
            lines = self._title_lines(width) + self._body_lines(width) + self._footer_lines(width)
            self._cache = (width, lines)
        return self._cache[1]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._all_lines(width))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        lines = self._all_lines(width)
        style = self.rich_style
        if y >= len(lines):
            return Strip.blank(width, style)
        return lines[y].crop_extend(0, width, style).apply_style(style)


_parser = None


def settled_length(source: str) -> int:
    """Length of the leading part of `source` made of finished top-level blocks.

    The last top-level block may still grow (a paragraph, a list, an open code
    fence), so everything before the line it starts on is settled.
    """
    global _parser
    if _parser is None:
        from markdown_it import MarkdownIt

        _parser = MarkdownIt("gfm-like")
    starts = [t.map[0] for t in _parser.parse(source) if t.level == 0 and t.map is not None]
    if len(starts) < 2:
        return 0
    lines = source.splitlines(keepends=True)
    return sum(len(line) for line in lines[: starts[-1]])


class ConversationView(TypingGoesToPrompt, VerticalScroll):
    """The scrolling list of messages; it follows the bottom while a reply streams.

    A resumed session shows its last turns only (`show_records`); scrolling
    near the top pages older turns in from the store, `PAGE_TURNS` at a time,
    mounted above the first message while the view keeps the user's place.
    """

    class OlderShown(Message):
        """A page of older turns was mounted (a good moment to collect garbage)."""

    # Focused, the view scrolls with ↑ ↓ (VerticalScroll's keys); these act on
    # the selected turn: ← → on the last one until Shift+↑ ↓ picks one, the
    # letters only once one is picked (`key_acts`). The actions are the
    # app's, shared with its keys and the command palette.
    BINDINGS = [
        Binding("shift+up", "select_turn(-1)", "Previous turn", show=False),
        Binding("shift+down", "select_turn(1)", "Next turn", show=False),
        Binding("left", "app.branch(-1)", "Previous branch", show=False),
        Binding("right", "app.branch(1)", "Next branch", show=False),
        Binding("e", "app.edit_message", "Edit message", show=False),
        Binding("r", "app.regenerate", "Regenerate reply", show=False),
        Binding("f", "app.fork", "Fork here", show=False),
        Binding("y", "app.copy_reply", "Copy reply", show=False),
        Binding("c", "app.copy_code", "Copy code", show=False),
        Binding("x", "toggle_message", "Expand message", show=False),
    ]

    PAGE_TURNS = 4
    LOAD_MARGIN = 3
    """Rows from the top at which the next older page is read."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._older: "OlderTurns | None" = None
        self._oldest_index: int | None = None
        self._older_title = ""
        self._loading_older = False
        self._selected: AssistantReply | None = None

    def on_mount(self) -> None:
        self.anchor()

    @property
    def has_older(self) -> bool:
        """Older turns exist in the store that are not mounted yet."""
        return self._older is not None

    async def show_records(self, title: str, records: Sequence["TurnRecord"],
                           older: "OlderTurns | None" = None) -> None:
        """Show stored turns (oldest first); `older` reads the turns before them."""
        self._older_title = title
        self._oldest_index = records[0].index if records else None
        self._older = older if records else None
        await self.mount_all(_record_widgets(title, records))
        self.call_after_refresh(self._maybe_load_older)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value <= self.LOAD_MARGIN and self._older is not None:
            self.call_later(self._maybe_load_older)

    async def _maybe_load_older(self) -> None:
        """Mount the previous page when the user is at the top (or nothing scrolls yet)."""
        if self._older is None or self._loading_older or self._oldest_index is None:
            return
        if self.scroll_y > self.LOAD_MARGIN and self.max_scroll_y > 0:
            return
        self._loading_older = True
        try:
            height_before = self.virtual_size.height
            if await self._mount_older_page():
                # Keep the user's place: what they looked at moved down by the
                # height of what was mounted above it.
                self.call_after_refresh(self._keep_place, height_before)
        finally:
            self._loading_older = False

    async def _mount_older_page(self) -> bool:
        """Mount the page of turns before the oldest mounted one; False when there is none."""
        if self._older is None or self._oldest_index is None:
            return False
        records = self._older(self._oldest_index, self.PAGE_TURNS)
        if len(records) < self.PAGE_TURNS:
            self._older = None
        if not records:
            return False
        self._oldest_index = records[0].index
        await self.mount_all(_record_widgets(self._older_title, records), before=0)
        self.post_message(self.OlderShown())
        return True

    async def reveal(self, turn: int) -> bool:
        """Select stored turn `turn`, paging older turns in until it is mounted
        (a search hit); False when the current path does not hold it."""
        while True:
            reply = next((r for r in self.query(AssistantReply) if r.turn_id == turn), None)
            if reply is not None:
                self.select(reply)
                return True
            if self._loading_older or not await self._mount_older_page():
                return False

    async def _keep_place(self, height_before: int) -> None:
        added = self.virtual_size.height - height_before
        if added > 0 and self._anchor_released:
            # A scroll still animating towards the top (Home, a fling) would
            # drag the view up again and page in the whole session.
            await self.app.animator.stop_animation(self, "scroll_y", complete=False)
            self.scroll_to(y=self.scroll_y + added, animate=False, immediate=True)
        self.call_after_refresh(self._maybe_load_older)

    # -- the selected turn ------------------------------------------------------------
    @property
    def has_selection(self) -> bool:
        return self._selected is not None and self._selected.is_attached

    def key_acts(self, active: ActiveBinding) -> bool:
        """A turn key acts on a selected turn only: without one, the letters
        are a sentence typed here by mistake (after a Shift+Tab), for the
        prompt; they forked and regenerated the last turn unseen."""
        return active.node is not self or self.has_selection

    def current_reply(self) -> AssistantReply | None:
        """The reply the turn actions apply to: the selected one, else the last."""
        if self.has_selection:
            return self._selected
        replies = self.query(AssistantReply)
        return replies.last() if replies else None

    def copy_source(self) -> AssistantReply | None:
        """The reply the copy keys copy: the selected one, else the last with
        text that is not streaming (the last finished while a new one is
        written; not one stopped before any text)."""
        if self.has_selection:
            return self._selected
        return next((r for r in reversed(list(self.query(AssistantReply)))
                     if not r.streaming and r.source.strip()), None)

    def action_toggle_message(self) -> None:
        """Show all of the selected turn's long message (the last turn's when none is selected)."""
        reply = self.current_reply()
        if reply is not None and reply.user is not None:
            reply.user.toggle()

    def action_select_turn(self, delta: int) -> None:
        replies = list(self.query(AssistantReply))
        if not replies:
            return
        selected = self._selected
        # Nothing marked yet: the first Shift+↑ marks the last turn (the one
        # ← → and Ctrl+R act on until then), not the one before it.
        index = replies.index(selected) if selected in replies else len(replies)
        self.select(replies[max(0, min(index + delta, len(replies) - 1))])

    def select(self, reply: AssistantReply | None) -> None:
        """Mark `reply` (and its message) as the selected turn and bring it into view;
        None: back to the last turn, unmarked."""
        for widget in self.query(".-selected"):
            widget.remove_class("-selected")
        self._selected = reply
        if reply is None:
            return
        reply.add_class("-selected")
        if reply.user is not None:
            reply.user.add_class("-selected")
        self.call_after_refresh(self._bring_into_view, reply)

    def _bring_into_view(self, reply: AssistantReply) -> None:
        """Scroll the selected turn to the top, once laid out. While the turns fit
        the view, the anchor keeps them at its bottom (a negative scroll_y);
        releasing it there froze that offset, and turns mounted next (the path
        under a branch switched to) sat below the view, out of reach until a
        resize. So the anchor is let go only once there is something to scroll."""
        if reply is not self._selected or not reply.is_attached or self.max_scroll_y <= 0:
            return
        self.release_anchor()
        self.scroll_to_widget(reply.user or reply, animate=False, top=True)

    async def remove_after(self, widget: Widget) -> None:
        """Remove everything below `widget` (a message: its turn's notices and
        reply, and the turns after them, for another reply in their place)."""
        children = list(self.children)
        if widget in children and widget is not children[-1]:
            await self.remove_from(children[children.index(widget) + 1])

    async def remove_from(self, widget: Widget) -> None:
        """Remove `widget` and everything below it (a branch is left: the store keeps it)."""
        children = list(self.children)
        if widget in children:
            doomed = children[children.index(widget):]
            for reply in doomed:
                if isinstance(reply, AssistantReply):
                    await reply.stop_stream()
            await self.remove_children(doomed)

    async def show_path(self, title: str, records: Sequence["TurnRecord"]) -> AssistantReply | None:
        """Mount stored turns at the bottom (a branch switched to); its first reply."""
        widgets = _record_widgets(title, records)
        await self.mount_all(widgets)
        return next((w for w in widgets if isinstance(w, AssistantReply)), None)

    async def add_user(self, text: str) -> UserMessage:
        widget = UserMessage(text)
        await self.mount(widget)
        return widget

    async def add_reply(self, title: str, *, text: str = "", metrics: TurnMetrics | None = None,
                        streaming: bool = False, user: UserMessage | None = None) -> AssistantReply:
        widget = AssistantReply(title, text, metrics, streaming)
        widget.user = user
        await self.mount(widget)
        self.anchor()
        return widget

    async def add_notice(self, text: str, kind: str = "info") -> Notice:
        widget = Notice(text, kind)
        await self.mount(widget)
        return widget

    async def mark_memory_start(self, kept_turns: int) -> Notice | None:
        """Mark where the model's memory begins: before the oldest of the last
        `kept_turns` user messages shown (a cut conversation keeps only those in
        its context). The marker moves with the cut; None when that message is
        not on screen (an older page) or nothing is left out."""
        for old in self.query(f"Notice.{MEMORY_MARK}"):
            await old.remove()
        users = list(self.query(UserMessage))
        if kept_turns <= 0 or kept_turns >= len(users) + 1 or kept_turns == len(users) and not self.has_older:
            return None
        widget = Notice(MEMORY_TEXT, "info")
        widget.add_class(MEMORY_MARK)
        await self.mount(widget, before=users[-kept_turns])
        return widget

    async def clear(self) -> None:
        self._selected = None
        self._older = None
        self._oldest_index = None
        for reply in self.query(AssistantReply):
            await reply.stop_stream()
        await self.remove_children()
        # A turn selected in the conversation left had let the anchor go: the
        # next one (a persona switched back to) opened scrolled to its top.
        self.anchor()


def branch_label(record: "TurnRecord") -> str:
    """What a reply with siblings shows in its title line (`‹ 2/3 ›`), else empty."""
    return f"‹ {record.sibling_label} ›" if record.sibling_label else ""


def _record_widgets(title: str, records: Sequence["TurnRecord"]) -> list[Widget]:
    widgets: list[Widget] = []
    for record in records:
        user = UserMessage(record.user_text)
        reply = AssistantReply(title, record.reply, record.metrics)
        reply.user = user
        reply.set_turn(record)
        widgets += (user, reply)
    return widgets
