"""The model picker: the GGUF models on this machine, and loading one to switch to.

Contract:
- `ModelPicker` lists what `chatterm models` lists (chatterm.core.discovery:
  Ollama, LM Studio, the Hugging Face cache, models.toml's `model_folders`),
  with the same columns (`row_text`): the scan, and the header reads of
  files not in the facts cache, run in a thread worker, so the list fills in
  after the screen opens. Usable models come first; an unusable one shows its
  reason when highlighted and cannot be chosen.
- Enter on a usable model makes its spec (`ModelCatalog.get`: the default
  context this machine affords) and loads it in a thread of its own (not a
  Textual worker: the app's exit must not wait for a load) with a progress
  bar, while the chat keeps its model. Esc while it loads gives the load up
  (the engine abandons it at its next progress report, or is closed once it
  returns) and leaves the old model in place.
- Two keys choose, and the screen says what each does: Enter starts a new
  conversation with the same persona on the new model; c (offered when the
  conversation on screen is a stored session) continues that session there,
  its history the prompt of the next turn.
- The screen's result is the `ModelSwitch` (spec, loaded engine, device,
  whether to carry on), or None; `open_model_picker(app)` pushes the screen
  and hands a switch to the app (its title's model) and to
  `ChatSession.use_model`. A loaded engine is handed over exactly once or
  closed, never both.
- Names, paths and reasons come from files: every cell is literal text.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from rich.text import Text
from textual import events, on, work
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, ProgressBar, Static

from chatterm.core.discovery.fit import Memory
from chatterm.core.discovery.row_text import (
    PICKER_COLUMNS,
    memory_label,
    picker_cells,
    picker_detail,
    problem_text,
)
from chatterm.core.metrics.format import fmt_price, printable
from chatterm.errors import describe
from chatterm.ui.notices import notify_plain
from chatterm.ui.row_table import RowTable
from chatterm.ui.table_room import fit_table

if TYPE_CHECKING:
    from chatterm.core.config.catalog import ModelCatalog, ModelSpec
    from chatterm.core.discovery.listing import ModelRow
    from chatterm.core.engine.interface import DeviceInfo, Engine
    from chatterm.ui.app import ChatApp
    from chatterm.ui.engine_lease import EngineLease
    from chatterm.ui.engine_setup import EngineFactory

BOX_ROWS = 16
"""The models box's rows besides the table: border, padding, title, status,
a detail of up to four lines, the progress bar and a two-line hint."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSwitch:
    spec: "ModelSpec"
    engine: "Engine"
    """Loaded, not yet used."""
    device: "DeviceInfo"
    carry_on: bool
    """Continue the stored session on screen (else: a new conversation)."""


class ModelPicker(ModalScreen["ModelSwitch | None"]):
    BINDINGS = [Binding("escape", "close", "Close"), Binding("c,C", "carry_on", "Continue here", show=False)]
    AUTO_FOCUS = "#models-table"
    DEFAULT_CSS = """
    ModelPicker { align: center middle; }
    ModelPicker #models-table { height: auto; max-height: 50vh; }
    ModelPicker #models-progress { display: none; margin: 1 0 0 0; }
    ModelPicker.-loading #models-progress { display: block; }
    """

    @dataclass
    class Scanned(Message):
        rows: "Sequence[ModelRow]"
        memory: Memory | None
        error: str | None = None

    @dataclass
    class LoadProgressed(Message):
        fraction: float

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, ModelPicker.LoadProgressed)

    @dataclass
    class Loaded(Message):
        switch: ModelSwitch

    @dataclass
    class LoadFailed(Message):
        model_id: str
        error: str

    def __init__(self, catalog: "ModelCatalog", current_id: str, persona_name: str, session_id: int | None,
                 engine_factory: "EngineFactory", lease: "EngineLease"):
        super().__init__()
        self._session_id = session_id
        """The stored session on screen (None: nothing to continue)."""
        self._catalog = catalog
        self._current = current_id
        self._persona = persona_name
        self._factory = engine_factory
        self._lease = lease
        self._rows: dict[str, ModelRow] = {}
        self._lock = threading.Lock()
        self._loading: str | None = None
        """The id being loaded."""
        self._carry_on = False
        self._cancelled = False
        self._handed = False

    # -- the list ------------------------------------------------------------------
    def compose(self):
        with Vertical(id="models-box", classes="modal-box"):
            yield Static(Content("Models on this machine"), classes="modal-title")
            yield Static(Content("Looking in Ollama, LM Studio, the Hugging Face cache and model_folders…"),
                         id="models-status")
            yield RowTable(id="models-table", zebra_stripes=True, fixed_columns=1)
            yield Static(id="models-detail")
            yield ProgressBar(total=1.0, show_eta=False, id="models-progress")
            yield Static(Content(self._hint()), classes="modal-hint")

    def _hint(self) -> str:
        new = f"Enter: load it, a new conversation with {printable(self._persona)}"
        carry = (f" · c: load it, session {self._session_id} continues there (its history prefilled)"
                 if self._session_id is not None else "")
        return f"{new}{carry} · Esc: close (while loading: keep the current model)"

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*PICKER_COLUMNS)
        self._scan()

    def on_resize(self, event: events.Resize) -> None:
        fit_table(self.query_one(DataTable), event.size.height, BOX_ROWS)

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _scan(self) -> None:
        from chatterm.core.discovery.fit import machine_memory
        from chatterm.core.discovery.listing import configured, list_models

        try:
            memory = machine_memory()
            folders = [Path(f) for f in self._catalog.defaults.model_folders]
            rows = list_models(folders, memory=memory, configured=configured(self._catalog))
        except Exception as exc:  # noqa: BLE001 - a listing that fails is a line on the screen
            log.debug("listing models failed", exc_info=True)
            self.post_message(self.Scanned((), None, describe(exc)))
            return
        self.post_message(self.Scanned(rows, memory))

    @on(Scanned)
    def _scanned(self, event: Scanned) -> None:
        status = self.query_one("#models-status", Static)
        if event.error is not None:
            status.update(Content(f"Could not list the models: {printable(event.error)}"))
            return
        rows = sorted(event.rows, key=lambda r: not r.usable)  # stable: the stores' order within each
        # Keyed by position: a shadowed model shows the id of the one it shadows.
        self._rows = {str(i): row for i, row in enumerate(rows)}
        table = self.query_one(DataTable)
        marked = next((key for key, row in self._rows.items() if row.id == self._current), None)
        for key, row in self._rows.items():
            texts = picker_cells(row)
            if key == marked:  # the first row of its id: a shadowed one repeats it
                texts = (f"● {texts[0]}", *texts[1:])
            table.add_row(*(Text(t) for t in texts), key=key)
        usable = sum(1 for r in rows if r.usable)
        if not rows:
            status.update(Content("No GGUF models found (docs/models.md says where chatterm looks)."))
        else:
            fits = f"; fits: weights + KV cache against {memory_label(event.memory)}" if event.memory else ""
            status.update(Content(f"{usable} usable, {len(rows) - usable} unusable{fits}"))
        self._show_detail("0" if rows else None)

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self._loading is None:
            self._show_detail(event.row_key.value)

    def _show_detail(self, key: str | None, refused: bool = False) -> None:
        """The line under the table for row `key`; `refused`: Enter or c was
        pressed on it and it cannot be used (said so, not the same line again)."""
        row = self._rows.get(key) if key is not None else None
        if row is None:
            text = ""
        elif refused:
            text = f"Not loaded: {row.id} cannot be used ({problem_text(row).rstrip('.')}). Pick another model, or Esc."
        elif not row.usable:
            text = f"{row.id} cannot be used: {problem_text(row)}"
        elif row.id == self._current:
            text = f"{row.id} is the model in use · {picker_detail(row)}"
        else:
            text = f"{row.id}: {picker_detail(row)}"
        self.query_one("#models-detail", Static).update(Content(printable(text)))

    # -- choosing and loading ----------------------------------------------------------
    @on(DataTable.RowSelected)
    def _chosen(self, event: DataTable.RowSelected) -> None:
        self._switch(event.row_key.value, carry_on=False)

    def action_carry_on(self) -> None:
        table = self.query_one(DataTable)
        if self._session_id is None or not table.row_count:
            return
        key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        self._switch(key.value, carry_on=True)

    def _switch(self, key: str | None, *, carry_on: bool) -> None:
        row = self._rows.get(key) if key is not None else None
        if self._loading is not None or row is None:
            return
        if not row.usable:
            self.app.bell()
            self._show_detail(key, refused=True)
            return
        model_id = row.id
        if model_id == self._current:
            self.dismiss(None)
            return
        self._loading = model_id
        self._carry_on = carry_on
        self.add_class("-loading")
        self.query_one("#models-detail", Static).update(
            Content(printable(f"Loading {model_id}… Esc keeps {self._current}."))
        )
        threading.Thread(target=self._load, args=(model_id,), name="chatterm-model-switch", daemon=True).start()

    def _progress(self, fraction: float) -> bool:
        """Report the load's progress; False (Esc, or the app quitting) makes the engine give it up."""
        self.post_message(self.LoadProgressed(fraction))
        return not self._cancelled and not self._lease.closing

    def _load(self, model_id: str) -> None:
        """The load (a thread): make the spec, load the engine, hand it over or close it."""
        engine = None
        try:
            spec = self._catalog.get(model_id)
            engine = self._factory(spec)
            engine.load(self._progress)
            device = engine.device()
        except Exception as exc:  # noqa: BLE001 - the reason is shown; the old model stays
            log.debug("loading %s failed", model_id, exc_info=True)
            if engine is not None:
                _close_quietly(engine)
            if not self._cancelled:
                self.post_message(self.LoadFailed(model_id, describe(exc)))
            return
        with self._lock:
            self._handed = not self._cancelled and not self._lease.closing
        if self._handed:
            self.post_message(self.Loaded(ModelSwitch(spec, engine, device, self._carry_on)))
        else:
            _close_quietly(engine)

    @on(LoadProgressed)
    def _load_progressed(self, event: LoadProgressed) -> None:
        self.query_one("#models-progress", ProgressBar).update(progress=max(0.0, min(event.fraction, 1.0)))

    @on(Loaded)
    def _loaded(self, event: Loaded) -> None:
        self.dismiss(event.switch)

    @on(LoadFailed)
    def _load_failed(self, event: LoadFailed) -> None:
        self._loading = None
        self.remove_class("-loading")
        self.query_one("#models-detail", Static).update(
            Content(printable(f"{event.model_id} did not load: {event.error}. Still on {self._current}."))
        )

    def _give_up(self) -> bool:
        """Stop a load in progress from being handed over; False once it has been."""
        with self._lock:
            if self._handed:
                return False
            self._cancelled = True
            return True

    def action_close(self) -> None:
        if self._give_up():
            self.dismiss(None)

    def on_unmount(self) -> None:
        self._give_up()


def open_model_picker(app: "ChatApp") -> None:
    """Push the picker over `app`; a chosen model becomes the app's and its session's."""
    session = app.session

    def chosen(switch: ModelSwitch | None) -> None:
        if switch is not None:
            app.spec = switch.spec
            session.use_model(switch.spec, switch.engine, switch.device, carry_on=switch.carry_on)

    for problem in app.workspace.reload_catalog():  # models.toml edited since the launch
        notify_plain(app, problem, title="models.toml", severity="warning")
    if app.lease.engine is not None and app.workspace.reprice(app.lease.engine):
        price = app.lease.engine.price
        cached = price.cached_input_per_m
        cached_text = f" ({fmt_price(cached)} cached)" if cached is not None and cached != price.input_per_m else ""
        notify_plain(app, f"The next turns are priced as models.toml now sets {price.label}: "
                     f"{fmt_price(price.input_per_m)} per 1M input tokens{cached_text}, "
                     f"{fmt_price(price.output_per_m)} per 1M output.",
                     title="models.toml")
    app.push_screen(ModelPicker(app.workspace.catalog, app.spec.id, session.persona.name, session.session_id,
                                session.setup.engine_factory, app.lease), chosen)


def _close_quietly(engine: "Engine") -> None:
    try:
        engine.close()
    except Exception:  # noqa: BLE001 - a load given up must not fail on its close
        log.debug("closing an abandoned engine failed", exc_info=True)
