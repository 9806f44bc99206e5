"""Copying a reply, or one of its code blocks, to the clipboard.

Contract:
- `copy_reply(app, reply)` and `copy_code_block(app, reply, number)` put the
  text on the clipboard with Textual's `App.copy_to_clipboard`, which writes
  the OSC 52 escape sequence: it works through tmux (`set-clipboard on`) and
  SSH wherever the terminal accepts OSC 52. A notification says what was
  copied, and that a terminal that ignores OSC 52 is why nothing pastes.
- What is copied is what the reply shows: the model's text with control
  characters made visible (`printable`), so a paste can never carry an escape
  sequence into another program.
- `code_blocks(text)` lists a Markdown text's code blocks (fenced and indented),
  in order, as they would be pasted (no fence lines).
- `copy_code(app, reply)` is the copy-code key: the only block at once, else
  `CodeBlockPicker`, a modal listing the blocks that dismisses with the
  1-based block number or None.
- Nothing to copy (no reply yet, no code block, an unknown number) is one
  notification, never an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import on
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from chatterm.core.metrics.format import counted, printable
from chatterm.ui.notices import notify_plain

if TYPE_CHECKING:
    from textual.app import App

    from chatterm.ui.transcript import AssistantReply

PREVIEW_CHARS = 60
"""How much of a code block's first line the picker shows."""


def code_blocks(text: str) -> list[str]:
    """The code blocks of Markdown `text`, in order, each as its content."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("gfm-like").parse(text)
    return [t.content for t in tokens if t.type in ("fence", "code_block")]


def _lines(text: str) -> str:
    n = text.count("\n") + (0 if text.endswith("\n") else 1)
    return counted(n, "line")


SENT_BY = "\nSent as OSC 52: if nothing pastes, the terminal ignores it (tmux: set-clipboard on)."
"""The copy notice's second line: no terminal says whether it took the text,
so the notice cannot claim more than that it was sent."""


def copy_reply(app: "App", reply: "AssistantReply | None") -> None:
    """Copy the whole reply (its text as shown)."""
    if reply is None or not reply.source.strip():
        notify_plain(app, "No reply to copy yet.")
        return
    app.copy_to_clipboard(reply.source)
    notify_plain(app, f"Copied the reply ({_lines(reply.source)}) to the clipboard.{SENT_BY}", title="Copy")


def copy_code_block(app: "App", reply: "AssistantReply | None", number: int) -> None:
    """Copy the reply's code block `number` (1-based)."""
    if reply is None or not reply.source.strip():
        notify_plain(app, "No reply to copy yet.")
        return
    blocks = code_blocks(reply.source)
    if not blocks:
        notify_plain(app, "This reply has no code block.")
        return
    if not 1 <= number <= len(blocks):
        notify_plain(app, f"No code block {number}: this reply has {len(blocks)}.", severity="warning")
        return
    block = blocks[number - 1]
    app.copy_to_clipboard(block)
    notify_plain(app, f"Copied code block {number} of {len(blocks)} ({_lines(block)}) to the clipboard.{SENT_BY}",
                 title="Copy")


def copy_code(app: "App", reply: "AssistantReply | None") -> None:
    """The copy-code key: the only block at once, else a picker of the blocks."""
    blocks = code_blocks(reply.source) if reply is not None else []
    if len(blocks) <= 1:
        copy_code_block(app, reply, 1)
        return

    def chosen(number: int | None) -> None:
        if number is not None:
            copy_code_block(app, reply, number)

    app.push_screen(CodeBlockPicker(blocks), chosen)


def preview(block: str) -> str:
    """A block's first non-blank line, cut to `PREVIEW_CHARS`."""
    first = next((line.strip() for line in block.splitlines() if line.strip()), "")
    return first if len(first) <= PREVIEW_CHARS else first[: PREVIEW_CHARS - 1] + "…"


class CodeBlockPicker(ModalScreen[int | None]):
    """The reply's code blocks, one option each; Enter copies the highlighted one."""

    BINDINGS = [Binding("escape", "dismiss_none", "Close")]
    AUTO_FOCUS = "#code-blocks"

    def __init__(self, blocks: list[str]):
        super().__init__()
        self._blocks = blocks

    def compose(self):
        options = [
            Option(Content(printable(f"{i}. {preview(block)}  ({_lines(block)})")), id=str(i))
            for i, block in enumerate(self._blocks, 1)
        ]
        with Vertical(id="code-box", classes="modal-box"):
            yield Static(Content("Copy a code block"), classes="modal-title")
            yield OptionList(*options, id="code-blocks")
            yield Static(Content("Enter copies · Esc cancels"), classes="modal-hint")

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or 0))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
