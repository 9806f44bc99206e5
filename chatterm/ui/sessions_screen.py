"""The sessions screen (F3): past sessions, search, rename, delete, fork.

Contract:
- It lists the store's sessions, newest activity first (the store's order):
  each row shows the session's title over a preview of its last exchange, its
  turns, last activity, cost, persona and model. Where the persona and model
  columns do not fit beside a title of `TITLE_CELL` cells (under about 110
  columns, 80 included), they are left out rather than scrolled to sideways,
  and the screen's title line names them for the highlighted row. Titles,
  previews and search snippets come from the database and model output:
  shown literally.
- Typing in the search box searches user messages and replies
  (`SessionStore.search`, in a thread worker shortly after each change); the
  table then lists the hits (session, turn, where and a snippet) and Esc in the
  box or an empty box brings the list back. Any characters are safe.
- Keys on the table: Enter opens the session (a hit: at its turn), `f` forks
  it (at the hit's turn, else at its current turn), `r` renames it, `d`
  deletes it after a confirmation, `/` goes to the search box, Esc closes.
- Deleting the session in use, or one another chatterm has open
  (`SessionStore.check_deletable`), is refused with one line before any question;
  an empty title is refused with one line and the old title kept. What a
  rename or delete did, and that first refusal, are said once on the line
  under the table (a toast there covered the key hint); errors are toasts.
- Titles and previews are cut to their column in cells; a closing "(…)"
  note (a fork's origin) is kept and the text before it cut.
- It dismisses with a `SessionChoice` (open or fork, which session, which
  turn) or None. Store reads and writes run in thread workers; the delete
  itself is the `delete` callable it is given (it removes the KV states too,
  which needs the prompt cache), run in a worker. Errors are notifications.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual import events, on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Static

from chatterm.core.metrics.format import fmt_recent_time, fmt_usd, printable
from chatterm.core.store.records import turns_note
from chatterm.errors import ChattermError
from chatterm.ui.fit_text import cut_to_cells
from chatterm.ui.notices import notify_plain
from chatterm.ui.row_table import RowTable
from chatterm.ui.table_room import fit_table
from chatterm.ui.worker_errors import reported

if TYPE_CHECKING:
    from chatterm.core.store.records import SearchHit, SessionInfo
    from chatterm.core.store.session_store import SessionStore

SEARCH_DELAY_S = 0.15
"""A search starts this long after the last change to the box (typing is not searched per key)."""

BOX_ROWS = 15
"""The sessions box's rows besides the table: border, padding, title, search
box, a note of up to two lines and the hint."""
SHORT_ROWS = 30
"""Below this many rows the box drops its padding and the title's blank line
(chatterm.tcss): at 80x24 the table then shows three sessions, not two."""
SHORT_BOX_ROWS = BOX_ROWS - 3
TITLE_CELL = 36
"""Cells of the title / last-exchange column at least: the other columns stay in
view from 120 columns (narrower, the table scrolls sideways); wider, the title
takes the room they leave."""
HIT_CELL = TITLE_CELL + 20
"""The same for a search hit's title / match column (beside two narrow ones)."""


@dataclass(frozen=True)
class SessionChoice:
    """What the sessions screen was closed with."""

    session_id: int
    turn: int | None = None
    """The turn to go to (a search hit's, or the fork point); None: the current one."""
    fork: bool = False
    """Fork the session at `turn` and open the fork, instead of opening the session."""


def _two_lines(first: str, second: str, cells: int) -> Text:
    """A cell of two literal lines: the first bold, the second dim, each cut to `cells`."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(_cut_keeping_note(first, cells), style="bold")
    text.append("\n")
    text.append(_cut(second, cells), style="dim")
    return text


def _flat(text: str) -> str:
    """`text` on one line, literal."""
    return " ".join(printable(text).split())


def _cut(text: str, cells: int) -> str:
    return cut_to_cells(_flat(text), cells)


NOTE_HEAD = 4
"""The cells of a title kept at least before its closing note when both are
cut to fit: at 80 columns (36 cells) a fork of session 123 keeps its note."""


def _cut_keeping_note(text: str, cells: int) -> str:
    """`_cut`, but a closing "(…)" note (a fork's "(fork of session 1, turn
    2)") is kept and the text before it cut instead, while that leaves
    `NOTE_HEAD` cells of it: at 80 columns the note was what got cut."""
    flat = _flat(text)
    head, _, note = flat.rpartition(" (")
    if cell_len(flat) <= cells or not (head and note.endswith(")")) or cell_len(note) + 2 + NOTE_HEAD > cells:
        return _cut(flat, cells)
    return f"{_cut(head, cells - cell_len(note) - 2)} ({note}"


@dataclass(frozen=True)
class _Table:
    """What the sessions table shows: column labels, and rows of cells whose
    second (the title column) is its two lines of text, cut to the column.
    The last `optional` columns are left out where they do not fit."""

    labels: tuple[str, ...]
    rows: list[tuple]
    keys: list[str]
    floor: int
    """The title column's least width, in cells."""
    optional: int = 0

    @cached_property
    def widest(self) -> list[int]:
        """Each column's widest cell or label, in cells (0 for the title column):
        measured once, for the layout of every resize and the columns' widths."""
        return [
            max([cell_len(label), *(row[n].cell_len for row in self.rows)]) if n != 1 else 0
            for n, label in enumerate(self.labels)
        ]

    def layout(self, table: DataTable) -> tuple[int, int]:
        """(how many columns are shown, the title column's width). Columns
        from the last optional one back are left out while the rest with a
        title of `floor` cells is wider than `table`; the title is then its
        widest line, as far as the room left after the other columns' widest
        cells, every column's padding and a scrollbar, and at least `floor`."""
        widest = self.widest
        # As if the vertical scrollbar were there: it comes with the rows, after
        # this width is chosen, and would then cover the last column.
        width = table.content_region.width - table.styles.scrollbar_size_vertical

        def room(columns: int) -> int:
            return width - sum(widest[:columns]) - 2 * table.cell_padding * columns

        columns = len(self.labels)
        while columns > len(self.labels) - self.optional and room(columns) < self.floor:
            columns -= 1
        title = max((cell_len(_flat(line)) for row in self.rows for line in row[1]), default=0)
        return columns, max(self.floor, min(room(columns), title))


class SessionsScreen(ModalScreen["SessionChoice | None"]):
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("slash", "search", "Search", show=False),
    ]
    AUTO_FOCUS = "#sessions-table"
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_ROWS, "-tall")]
    # The persona and model are left out first where the width is short: the
    # turns (which the note under the table explains), the last activity and
    # the cost stay in view, and the title line names the two for the
    # highlighted row. Scrolled to sideways, they hid the ids at 80 columns.
    COLUMNS = ("id", "title · last exchange", "turns", "active", "cost", "persona", "model")
    OPTIONAL_COLUMNS = 2
    HIT_COLUMNS = ("id", "title · match", "turn")

    @dataclass
    class Listed(Message):
        """Posted by the list worker: the sessions (newest activity first)."""

        sessions: "list[SessionInfo]"

    @dataclass
    class Found(Message):
        """Posted by the search worker: the hits for `query`."""

        query: str
        hits: "list[SearchHit]"

    @dataclass
    class Changed(Message):
        """Posted by a rename or delete worker: what happened, or why not."""

        text: str
        error: bool = False

    def __init__(self, sessions: "Sequence[SessionInfo]", current: int | None, store: "SessionStore",
                 delete: Callable[[int], str]):
        super().__init__()
        self._sessions = list(sessions)
        self._current = current
        self._store = store
        self._delete = delete
        self._hits: "list[SearchHit] | None" = None
        """The hits shown (None: the sessions are shown)."""
        self._search_timer = None
        self._shown: _Table | None = None
        self._open_when_shown = False
        """Enter was pressed before the list was drawn."""
        self._done = ""
        """The last rename's or delete's outcome, said once under the list."""
        self._shown_layout = (0, 0)
        """The table shown: how many columns, the title column's width."""

    def compose(self):
        with Vertical(id="sessions-box", classes="modal-box"):
            yield Static(Content("Sessions"), classes="modal-title", id="sessions-title")
            yield Input(placeholder="Search messages and replies (/)", id="sessions-search")
            yield RowTable(id="sessions-table", zebra_stripes=True)
            yield Static(Content(""), id="sessions-note")
            yield Static(Content("Enter opens · f forks · r renames · d deletes · / searches · Esc closes"),
                         classes="modal-hint")

    def on_mount(self) -> None:
        # Once laid out: the title column's width depends on the table's, and
        # a long list is then drawn once, not again at the first resize.
        self.call_after_refresh(self._shown_at_last)

    def on_resize(self, event: events.Resize) -> None:
        short = event.size.height < SHORT_ROWS
        fit_table(self._table(), event.size.height, SHORT_BOX_ROWS if short else BOX_ROWS)
        self.call_after_refresh(self._fit_title)

    # -- what the table shows ----------------------------------------------------------
    def _table(self) -> DataTable:
        return self.query_one("#sessions-table", DataTable)

    def _shown_at_last(self) -> None:
        """The list, and then the row an Enter before it chose."""
        self._show_sessions()
        if self._open_when_shown:
            self._row_selected()

    def _show_sessions(self) -> None:
        self._hits = None
        rows = [
            (
                Text(f"{info.id}{' ●' if info.id == self._current else ''}"),
                (info.title or "(untitled)", info.preview),
                Text(info.turns_label, justify="right"),
                Text(fmt_recent_time(info.active_at or info.started_at)),  # narrow: the cost stays in view at 80
                Text(fmt_usd(info.cost_usd), justify="right"),
                Text(printable(info.persona_id)),
                Text(printable(info.model_id)),
            )
            for info in self._sessions
        ]
        self._fill(_Table(self.COLUMNS, rows, [str(info.id) for info in self._sessions], TITLE_CELL,
                          self.OPTIONAL_COLUMNS))
        self._say_note()

    def _show_hits(self, query: str, hits: "list[SearchHit]") -> None:
        self._hits = hits
        rows = [
            (
                Text(str(hit.session_id)),
                (hit.title or "(untitled)", f"{'you' if hit.role == 'user' else 'reply'}: {hit.snippet}"),
                Text(str(hit.turn_index), justify="right"),
            )
            for hit in hits
        ]
        self._fill(_Table(self.HIT_COLUMNS, rows, [str(n) for n in range(len(hits))], HIT_CELL))
        self._say(self._after_done("" if hits else f"Nothing matches {printable(query)!r}."))

    def _fill(self, shown: "_Table") -> None:
        """The table drawn afresh with `shown`, its title column as wide as the
        table leaves after the other columns (at least `shown.floor`: also the
        width before the table is laid out)."""
        table = self._table()
        table.clear(columns=True)
        columns, cells = shown.layout(table)
        self._shown, self._shown_layout = shown, (columns, cells)
        # Every column at the width `layout` measured, none left to DataTable's
        # auto width: that is measured on the table's next Idle, and a frame
        # painted before it (a real terminal, after a delete) cached the cells
        # at their labels' widths, which DataTable's cell cache kept: the cost
        # cut to "$0.0" over "0169", and ↓ redrew only the rows it left, at
        # the new widths.
        widest = shown.widest
        for n, label in enumerate(shown.labels[:columns]):
            table.add_column(label, width=cells if n == 1 else widest[n])
        for key, (first, (title, second), *rest) in zip(shown.keys, shown.rows, strict=True):
            table.add_row(first, _two_lines(title, second, cells), *rest[: columns - 2], key=key, height=2)
        self._name_left_out()

    def _fit_title(self) -> None:
        """After a resize (the first layout too): the table again if the title
        column's width changed, the highlight kept on its row. At 150 columns
        a title was cut at 36 cells beside empty room."""
        if self._shown is None or self._shown.layout(self._table()) == self._shown_layout:
            return
        table = self._table()
        row = table.cursor_row
        self._fill(self._shown)
        table.move_cursor(row=row)

    @on(DataTable.RowHighlighted, "#sessions-table")
    def _name_left_out(self) -> None:
        """The title line: "Sessions", and where the table leaves out the
        persona and model, the highlighted session's."""
        title = "Sessions"
        chosen = self._chosen_row() if self._hits is None and self._shown is not None else None
        if chosen is not None and self._shown_layout[0] < len(self.COLUMNS):
            info = next((s for s in self._sessions if s.id == chosen[0]), None)
            if info is not None:
                title += f" · session {info.id}: {printable(info.persona_id)} on {printable(info.model_id)}"
        self.query_one("#sessions-title", Static).update(Content(title))

    def _say_note(self) -> None:
        """The note under the session list: the last rename's or delete's outcome, then the turns note."""
        self._say(self._after_done("No stored sessions yet: they appear after the first reply." if not self._sessions
                                 else turns_note(self._sessions)))

    def _after_done(self, note: str) -> str:
        """`note` after the last rename's or delete's outcome, which is then said."""
        done, self._done = self._done, ""
        return " ".join(part for part in (done, note) if part)

    def _say(self, text: str) -> None:
        """The line under the table: why it is empty, or what its figures mean."""
        note = self.query_one("#sessions-note", Static)
        note.update(Content(text))
        note.display = bool(text)

    def _chosen_row(self) -> tuple[int, int | None] | None:
        """(session id, turn) of the highlighted row (a hit's turn; None for a session)."""
        table = self._table()
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if self._hits is not None:
            hit = self._hits[int(key or 0)]
            return hit.session_id, hit.turn_index
        return int(key or 0), None

    # -- search --------------------------------------------------------------------------
    def action_search(self) -> None:
        self.query_one("#sessions-search", Input).focus()

    @on(Input.Changed, "#sessions-search")
    def _query_changed(self, event: Input.Changed) -> None:
        if self._search_timer is not None:
            self._search_timer.stop()
        if not event.value.strip():
            self._show_sessions()
            return
        self._search_timer = self.set_timer(SEARCH_DELAY_S, lambda: self._search(event.value))

    @on(Input.Submitted, "#sessions-search")
    def _query_submitted(self) -> None:
        self._table().focus()

    def key_down(self, event: events.Key) -> None:
        """↓ in the search box goes to the list, as Enter does: the first row
        looks highlighted, and an Enter there opened nothing."""
        if self.focused is self.query_one("#sessions-search", Input):
            event.stop()
            self._table().focus()

    @work(thread=True, exclusive=True, group="session-search", exit_on_error=False)
    def _search(self, query: str) -> None:
        with reported(self, lambda error: self.Changed(error, error=True), "search"):
            self.post_message(self.Found(query, self._store.search(query)))

    @on(Found)
    def _found(self, event: Found) -> None:
        if event.query == self.query_one("#sessions-search", Input).value:
            self._show_hits(event.query, event.hits)

    # -- open, fork ------------------------------------------------------------------------
    @on(DataTable.RowSelected)
    def _row_selected(self) -> None:
        chosen = self._chosen_row()
        if chosen is not None:
            self.dismiss(SessionChoice(*chosen))

    def key_enter(self, event: events.Key) -> None:
        """Enter before the list is drawn (F3 and Enter typed together) opens its
        first row once it is: the table had no row to select yet, and the key
        was lost."""
        if self._shown is None and not isinstance(self.focused, Input):
            event.stop()
            self._open_when_shown = True

    def _table_key(self, event: events.Key) -> tuple[int, int | None] | None:
        """The highlighted row, for a letter key pressed in the table, which the
        key is then spent on: left to bubble, it reached the app's bindings
        after the screen was dismissed, and `f` forked the conversation behind
        it too."""
        if self.focused is not self._table():
            return None
        event.stop()
        return self._chosen_row()

    def key_f(self, event: events.Key) -> None:
        chosen = self._table_key(event)
        if chosen is not None:
            self.dismiss(SessionChoice(*chosen, fork=True))

    # -- rename, delete ----------------------------------------------------------------------
    def key_r(self, event: events.Key) -> None:
        chosen = self._table_key(event)
        if chosen is None:
            return
        session_id = chosen[0]
        info = next((s for s in self._sessions if s.id == session_id), None)

        def renamed(title: str | None) -> None:
            if title is not None:
                self._rename(session_id, title)

        self.app.push_screen(RenameScreen(session_id, info.title if info else ""), renamed)

    def key_d(self, event: events.Key) -> None:
        chosen = self._table_key(event)
        if chosen is None:
            return
        session_id = chosen[0]
        if session_id == self._current:
            self._done = (f"Session {session_id} is open: start a new conversation (Ctrl+N) "
                          "or open another session before deleting it.")
            self._say_note()
            return
        try:
            self._store.check_deletable(session_id)
        except ChattermError as exc:  # open in another chatterm: said before the question, not after it
            self._done = f"{str(exc)[:1].upper()}{str(exc)[1:]}."
            self._say_note()
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._delete_worker(session_id)

        self._say_note()  # an earlier refusal, said already, is not left under the question
        self.app.push_screen(ConfirmScreen(f"Delete session {session_id}, its turns and its KV states?"),
                             confirmed)

    @work(thread=True, group="session-change", exit_on_error=False)
    def _rename(self, session_id: int, title: str) -> None:
        if not title.strip():
            self.post_message(self.Changed(f"A title cannot be empty: session {session_id} keeps its title.", True))
            return
        with reported(self, lambda error: self.Changed(error, error=True), "rename"):
            self._store.rename_session(session_id, title)
            self.post_message(self.Changed(f"Session {session_id} renamed."))

    @work(thread=True, group="session-change", exit_on_error=False)
    def _delete_worker(self, session_id: int) -> None:
        with reported(self, lambda error: self.Changed(error, error=True), "delete"):
            self.post_message(self.Changed(self._delete(session_id)))

    @on(Changed)
    def _changed(self, event: Changed) -> None:
        if event.error:
            notify_plain(self.app, event.text, severity="error")
            return
        # Said under the table, not in a toast: one covered the screen's key hint.
        self._done = event.text
        self._reload()

    @work(thread=True, exclusive=True, group="session-list", exit_on_error=False)
    def _reload(self) -> None:
        with reported(self, lambda error: self.Changed(error, error=True), "reading the sessions"):
            self.post_message(self.Listed(self._store.sessions()))

    @on(Listed)
    def _listed(self, event: Listed) -> None:
        self._sessions = event.sessions
        query = self.query_one("#sessions-search", Input).value
        if query.strip():
            self._search(query)
            return
        # After a rename or a delete the highlight stays where the user was (the
        # row after a deleted one): back on the first row, the next `d` or `f`
        # took another session than the one in mind.
        table = self._table()
        row = table.cursor_row
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value if table.row_count else None
        self._show_sessions()
        keys = [str(info.id) for info in self._sessions]
        if keys:
            table.move_cursor(row=keys.index(key) if key in keys else min(row, len(keys) - 1))

    def action_close(self) -> None:
        search = self.query_one("#sessions-search", Input)
        if self.focused is search and search.value:
            search.value = ""  # Esc in the box clears the search first
            self._table().focus()
            return
        self.dismiss(None)


class RenameScreen(ModalScreen[str | None]):
    """One line to edit a session's title; Enter renames, Esc cancels."""

    BINDINGS = [Binding("escape", "dismiss_none", "Cancel")]
    AUTO_FOCUS = "#rename-input"

    def __init__(self, session_id: int, title: str):
        super().__init__()
        self._session_id = session_id
        self._title = title

    def compose(self):
        with Vertical(id="rename-box", classes="modal-box"):
            yield Static(Content(f"Rename session {self._session_id}"), classes="modal-title")
            yield Input(value=printable(self._title), id="rename-input")  # Input draws it as it is
            yield Static(Content("Enter renames · Esc cancels"), classes="modal-hint")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question: y or the Delete button confirms; n, Esc or Cancel do not."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    AUTO_FOCUS = "#confirm-no"

    def __init__(self, question: str):
        super().__init__()
        self._question = question

    def compose(self):
        with Vertical(id="confirm-box", classes="modal-box"):
            yield Static(Content(self._question), classes="modal-title")
            with Horizontal(id="confirm-buttons"):
                yield Button("Delete (y)", variant="error", id="confirm-yes")
                yield Button("Cancel (n)", id="confirm-no")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
