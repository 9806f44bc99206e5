"""Modal screens: help and the persona picker (the sessions screen: ui/sessions_screen.py).

Each screen gets plain data from the app (no engine or store calls here) and
dismisses with the user's choice: a persona id, or None.
Every string that comes from a file or the database is shown literally
(`Content`, rich `Text` cells), never parsed as markup.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rich.table import Table
from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from chatterm.core.config.personas import Persona
from chatterm.core.metrics.format import printable
from chatterm.ui.rows import Rows

HELP_KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send the message"),
    ("Ctrl+J", "new line (Shift/Alt+Enter too); F7 selects all (to clear)"),
    ("Esc", "stop the reply / unselect the turn / drop the type-ahead"),
    ("F1 or ?", "this help (? when the prompt is not focused)"),
    ("F2", "switch persona (to its last conversation, else a new one)"),
    ("F3", "sessions: open, search, rename (r), delete (d), fork (f)"),
    ("F4", "show / hide the latency dashboard"),
    ("F5", "latency: TTFT, decode and cost charts, turns, what-if"),
    ("F8", "the last turn: its timeline, per-token costs and cost"),
    ("Ctrl+S", "export as a Markdown report (data folder, path shown)"),
    ("Ctrl+N", "new conversation with the same persona"),
    ("Ctrl+R", "regenerate the selected (else the last) reply as a branch"),
    ("↑", "edit your last message (empty prompt); Enter resends it"),
    ("F9 / F10", "copy the reply / one of its code blocks to the clipboard"),
    ("Shift+↑ ↓", "select a turn (in the conversation: Shift+Tab), then ← → branch, "
                  "r regenerate, e edit, f fork, y c copy, x expand"),
    ("Ctrl+P", "command palette: personas, models, themes, sessions, exports"),
    ("Tab / Shift+Tab", "focus prompt → dashboard → conversation (arrows, PgUp)"),
    ("Ctrl+Q", "quit (at any time; twice with a message typed)"),
)
"""Every key the app answers to; docs/tui.md has the same table, in more words.
Each description fits two lines at 80x24, so the whole list fits there."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q,question_mark", "dismiss", "Close")]
    # The keys scroll with ↑ ↓ PgUp PgDn Home End from the start: on a short
    # terminal they are the only way to reach the last keys without a mouse.
    AUTO_FOCUS = "#help-scroll"
    # Below 36 rows the box drops its blank rows and takes the whole width
    # (chatterm.tcss), so every key fits at 80x24; the breakpoint is where the
    # roomy layout stops fitting at 80 columns.
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]

    CLOSE = "Esc closes this help."

    def compose(self):
        # A grid, so a wrapped description stays in its column (80x24 included).
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column()
        for key, what in HELP_KEYS:
            grid.add_row(Text(key), Text(what))
        with Vertical(id="help-box", classes="modal-box"):
            yield Static(Content("chatterm — keys"), classes="modal-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(grid, id="help-keys")
            yield Static(Content(self.CLOSE), id="help-hint", classes="modal-hint")

    def on_mount(self) -> None:
        # A scrollbar thumb alone is easy to miss: the hint says when keys are
        # hidden below, following the scrollbar and the scroll position.
        scroll = self.query_one("#help-scroll", VerticalScroll)
        self.watch(scroll, "show_vertical_scrollbar", self._show_hint)
        self.watch(scroll, "scroll_y", self._show_hint)

    def on_resize(self) -> None:
        # A resize can move the end of the list without moving the scroll
        # position; the new layout is known after the refresh.
        self.call_after_refresh(self._show_hint)

    def _show_hint(self) -> None:
        scroll = self.query_one("#help-scroll", VerticalScroll)
        hint = self.query_one("#help-hint", Static)
        more = scroll.show_vertical_scrollbar and not scroll.is_vertical_scroll_end
        if more:
            text = f"▼ More keys below: ↓ PgDn End scroll · {self.CLOSE}"
        elif scroll.show_vertical_scrollbar:
            text = f"▲ ↑ PgUp Home scroll back · {self.CLOSE}"
        else:
            text = self.CLOSE
        hint.update(Content(text))
        hint.set_class(more, "-more")


class PersonaPicker(ModalScreen[str | None]):
    """Lists personas with where their KV prefix state is cached (`cached`: persona
    id -> "ram" or "disk" for the cached ones; None while the model loads)."""

    BINDINGS = [Binding("escape", "dismiss_none", "Close")]
    AUTO_FOCUS = "#persona-list"

    _TIER = {"ram": "in RAM", "disk": "on disk"}
    _STATE = {tier: f"KV state cached {where}" for tier, where in _TIER.items()}

    def __init__(self, personas: Sequence[Persona], current: str, cached: Mapping[str, str] | None,
                 returns: Mapping[str, int | None] | None = None, misfits: Mapping[str, str] | None = None):
        super().__init__()
        self._personas = list(personas)
        self._current = current
        self._cached = cached
        self._returns = returns or {}
        """Persona id -> the session switching to it goes back to (None or absent: a new conversation)."""
        self._misfits = misfits or {}
        """Persona id -> why it cannot chat on this model (its prompt does not fit the context)."""

    def _outcome(self, persona: Persona) -> str:
        if persona.id == self._current:
            return "current conversation"
        session = self._returns.get(persona.id)
        return "new conversation" if session is None else f"back to session {session}"

    def _prompt(self, persona: Persona) -> Rows:
        if persona.id in self._misfits:  # said before it is chosen, not only after
            state = f"does not fit this model: {self._misfits[persona.id]}"
        elif self._cached is None:
            state = "cache state unknown until the model has loaded"
        elif persona.id == self._current and self._cached.get(persona.id) in self._TIER:
            # Its prefix is in the model's context now; "cached on disk" read as if it had to be loaded.
            state = f"KV state in use (a copy {self._TIER[self._cached[persona.id]]})"
        else:
            state = self._STATE.get(self._cached.get(persona.id, ""), "not cached (first use prefills)")
        mark = "●" if persona.id == self._current else ""
        head = Content.assemble((printable(persona.name), "bold"), f"  ({printable(persona.id)})  ", (state, "italic"))
        # What Enter does on a line of its own: after the state, at 80 columns
        # "→ new conversation" broke across two lines.
        outcome = Content.assemble(("→ ", "bold"), self._outcome(persona))
        # Two columns, so a wrapped name line or description stays indented under the name.
        return Rows([(mark, head), ("", outcome), *([("", persona.description)] if persona.description else [])],
                    label_width=2, label_style="")

    def compose(self):
        with Vertical(id="persona-box", classes="modal-box"):
            yield Static(Content("Switch persona"), classes="modal-title")
            yield OptionList(*[Option(self._prompt(p), id=p.id) for p in self._personas], id="persona-list")
            yield Static(Content("Enter switches: back to that persona's last conversation, or a new one "
                                 "(→ says which) · Ctrl+N new conversation · Esc cancels"), classes="modal-hint")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        for index, persona in enumerate(self._personas):
            if persona.id == self._current:
                options.highlighted = index

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
