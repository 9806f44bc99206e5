"""The chat application: bootstrap, key bindings, screens and the palette.

Contract:
- Build it with `chatterm.ui.launch.make_app`. Nothing is loaded at import or
  construction: the first frame comes at once and the model loads in a thread
  worker that reports progress.
- The App bootstraps and routes: it starts the thread workers that load the
  model, probe the GPU, prepare personas (the work: ui/engine_setup.py), read
  a resumed session's history and export; it owns the key bindings, the
  screens (help, personas, sessions) and the command palette (ui/palette.py);
  theme saving is ui/theme_memory.py. The conversation, its turn loop and its
  state live in `ChatView` (ui/chat_view.py): what Enter does is written there.
- The UI shows what the core reports; it computes no metric. Errors (load,
  generation, store, export) become notifications or conversation notices,
  never tracebacks.
- Esc cancels the running turn (the engine checks per token); Ctrl+Q cancels it
  and quits; the engine is closed once no worker uses it (`EngineLease`).
- Ctrl+Q while the model loads quits at once. llama.cpp's load cannot be
  interrupted once its progress phase is over, so the load runs in a thread of
  its own, not a Textual worker (whose executor the app's event loop joins on
  exit): `model_loading` tells the process (the CLI) that the load is still
  going, and the CLI then ends without waiting for it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from chatterm.core.config.personas import Persona
from chatterm.core.engine.conversation import Conversation, EnergyMeter
from chatterm.core.engine.interface import DeviceInfo, Engine
from chatterm.core.metrics.format import SEP, prefill_progress_line, prefix_outcome_label, printable
from chatterm.core.store.resume import resume_conversation
from chatterm.errors import ChattermError, describe
from chatterm.ui import terminal
from chatterm.ui.chat_view import ChatView, TurnPhase
from chatterm.ui.dashboard import Dashboard
from chatterm.ui.engine_lease import EngineLease
from chatterm.ui.engine_setup import (
    EngineFactory,
    EngineLoaded,
    EngineSetup,
    GpuPolled,
    GpuProbe,
    LoadFailed,
    LoadProgressed,
    MeterFactory,
    PersonaPrepared,
    PersonaProgressed,
    default_gpu_status,
    energy_meter_factory,
)
from chatterm.ui.latency_screen import LatencyScreen, TurnDetailScreen
from chatterm.ui.palette import chat_commands
from chatterm.ui.resume import Resume, read_history, read_resume, resumed_notice
from chatterm.ui.screens import HelpScreen, PersonaPicker, SessionsScreen
from chatterm.ui.theme_memory import ThemeMemory
from chatterm.ui.themes import DEFAULT_THEME, ThemeSet
from chatterm.ui.transcript import OlderTurns

if TYPE_CHECKING:
    from chatterm.core.config.catalog import ModelSpec
    from chatterm.core.store.session_store import SessionStore
    from chatterm.core.system.gpu import GpuStatus
    from chatterm.core.workspace import Workspace

log = logging.getLogger(__name__)

DASHBOARD_MIN_WIDTH = 100
"""Below this many columns the dashboard is hidden unless the user shows it (F4)."""


class ChatApp(App[None]):
    CSS_PATH = "chatterm.tcss"
    TITLE = "chatterm"
    ESCAPE_TO_MINIMIZE = False
    AUTO_FOCUS = "#prompt"
    GPU_POLL_S = 2.0

    BINDINGS = [
        Binding("f1", "help", "Help"),
        Binding("question_mark", "help", "Help", show=False),
        Binding("f2", "personas", "Persona"),
        Binding("f3", "sessions", "Sessions"),
        Binding("f4", "toggle_dashboard", "Dashboard"),
        Binding("f5", "latency", "Latency"),
        Binding("f8", "last_turn", "Last turn", show=False),  # F6/F7 select in the prompt
        Binding("ctrl+s", "export('md')", "Export", priority=True),
        Binding("ctrl+n", "new_conversation", "New", priority=True),
        Binding("escape", "stop", "Stop reply", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    @dataclass
    class HistoryRead(Message):
        """Posted by the history worker: a resumed session's history is read."""

        resume: Resume
        error: str | None = None

    @dataclass
    class SessionExported(Message):
        """Posted by the export worker (from its thread)."""

        path: Path | None
        error: str | None = None

    def __init__(
        self,
        workspace: "Workspace",
        spec: "ModelSpec",
        persona: Persona,
        *,
        engine_factory: EngineFactory,
        store: "SessionStore | None" = None,
        themes: ThemeSet | None = None,
        theme: str = DEFAULT_THEME,
        settings_path: Path | None = None,
        type_ahead: bool = True,
        resume: Resume | None = None,
        gpu_status: GpuProbe = default_gpu_status,
        energy_meter: MeterFactory | None = None,
        startup_notices: Iterable[str] = (),
    ):
        super().__init__()
        self.workspace = workspace
        self.spec = spec
        self.persona = persona
        self.store = store
        self.engine_factory = engine_factory
        self.settings_path = settings_path
        self.lease = EngineLease()
        self.setup = EngineSetup(
            self, self.lease, engine_factory, gpu_status,
            energy_meter or energy_meter_factory(workspace.catalog.usd_per_kwh),
        )
        self.engine_error: str | None = None
        self.device_info: DeviceInfo | None = None
        self.gpu: "GpuStatus | None" = None
        self.energy: "EnergyMeter | None" = None
        self._resume = resume
        """A session to continue once the model is loaded."""
        self._startup_notices = list(startup_notices)
        self._type_ahead = type_ahead
        self._dashboard_mode = "auto"
        self._persona_state = "waiting for the model"
        self._chat: ChatView | None = None
        self._theme_memory: ThemeMemory | None = None
        self._load_thread: threading.Thread | None = None
        for theme_obj in (themes.themes.values() if themes else ()):
            self.register_theme(theme_obj)
        self.theme = theme

    # -- layout ---------------------------------------------------------------
    def compose(self):
        dashboard = Dashboard(id="dashboard")
        self._chat = ChatView(self.persona.name, dashboard, self.lease, type_ahead=self._type_ahead, id="chat")
        yield Static(self._title_content(), id="title-bar")
        with Horizontal(id="body"):
            yield self._chat
            yield dashboard
        yield Footer()

    @property
    def chat(self) -> ChatView:
        """The chat: conversation, status line, prompt and the turn loop."""
        return self._chat

    @property
    def conversation(self) -> Conversation | None:
        """The conversation on screen (None until the model is loaded)."""
        return self.chat.conversation

    def _title_content(self, state: str = "") -> Content:
        parts = ["chatterm", self.persona.name, self.spec.label or self.spec.id]
        conversation = self._chat.conversation if self._chat is not None else None
        if conversation is not None and conversation.session_id is not None:
            parts.append(f"session {conversation.session_id}")
        if state:
            parts.append(state)
        return Content(printable(SEP.join(parts)))

    async def on_mount(self) -> None:
        self._theme_memory = ThemeMemory(self, self.settings_path)
        self._apply_width(self.size.width)
        for notice in self._startup_notices:
            self.notify(notice, severity="warning", markup=False, timeout=8)
        dashboard = self.query_one(Dashboard)
        dashboard.show_persona(self.persona.name, self._persona_state)
        dashboard.show_model(self.spec.label, None, None, None, status="loading…")
        if self._resume is not None:
            await self.chat.messages.show_records(
                self.persona.name, self._resume.tail, self._older_turns(self._resume)
            )
            await self.chat.messages.add_notice(resumed_notice(self._resume))
            self._read_history(self._resume)
        self.chat.set_status("loading model…")
        self._load_thread = threading.Thread(
            target=self.setup.load, args=(self.spec, self.persona), name="chatterm-load"
        )
        self._load_thread.start()

    @property
    def model_loading(self) -> bool:
        """llama.cpp's model load is still running. Once it has returned, the
        same thread may still prepare the persona or close the engine after a
        quit: that must finish (state saves), so this is False by then."""
        thread = self._load_thread
        return thread is not None and thread.is_alive() and not self.setup.model_loaded.is_set()

    def get_driver_class(self):
        # The screen must survive llama-cpp-python's fd 2 redirection (ui/terminal.py).
        return terminal.driver_class(super().get_driver_class())

    def on_resize(self, event) -> None:
        self._apply_width(event.size.width)

    def _apply_width(self, width: int) -> None:
        hidden = {
            "auto": width < DASHBOARD_MIN_WIDTH,
            "shown": False,
            "hidden": True,
        }[self._dashboard_mode]
        self.query_one(Dashboard).display = not hidden

    @on(ChatView.StatusChanged)
    def _status_changed(self, event: ChatView.StatusChanged) -> None:
        for title in self.query("#title-bar").results(Static):  # none while the app closes
            title.update(self._title_content(event.text), layout=False)

    @on(ChatView.TurnFinished)
    def _turn_finished(self, event: ChatView.TurnFinished) -> None:
        self._show_model()

    # -- model loading (the work itself: ui/engine_setup.py) ----------------------
    def _run_setup(self, work: Callable[..., None], *args, group: str) -> None:
        """Run an `EngineSetup` step in a thread worker (GPU polls: one at a
        time; persona prepares: one per switch)."""
        self.run_worker(partial(work, *args), thread=True, group=group,
                        exclusive=group != "prepare", exit_on_error=False)

    @on(LoadProgressed)
    def _load_progressed(self, event: LoadProgressed) -> None:
        self.chat.show_load_progress(event.fraction)

    @on(EngineLoaded)
    def _engine_loaded(self, event: EngineLoaded) -> None:
        self.device_info = event.device
        self.gpu = event.gpu
        self.energy = event.energy
        self._attach_when_ready()
        self.chat.show_load_progress(None)
        for note in event.device.notes:
            self.notify(note, severity="warning", markup=False, timeout=8)
        self.chat.prefix_pending = True
        self.chat.set_status(self._preparing_status(event.engine, self.persona))
        self._show_model()
        self._persona_state = "preparing…"
        self.query_one(Dashboard).show_persona(self.persona.name, self._persona_state)
        self.call_after_refresh(self.chat.collect_garbage)
        if event.gpu is not None:
            self.set_interval(self.GPU_POLL_S, partial(self._run_setup, self.setup.poll_gpu, group="gpu"))

    @on(LoadFailed)
    async def _load_failed(self, event: LoadFailed) -> None:
        self.engine_error = event.error
        self.chat.no_model(event.error)
        self.chat.show_load_progress(None)
        self.chat.set_status("model failed to load")
        self.query_one(Dashboard).show_model(self.spec.label, None, None, None, status="failed to load")
        self.notify(event.error, title="Model failed to load", severity="error", markup=False, timeout=15)
        await self.chat.messages.add_notice(f"Model failed to load: {event.error}", "error")

    def _new_conversation_object(self, resume: Resume | None = None) -> Conversation:
        engine = self.lease.engine
        assert engine is not None
        if resume is not None and self.store is not None:
            return resume_conversation(
                resume.plan, self.store, engine, energy=self.energy, continuation=resume.continuation
            )
        return Conversation(engine, self.persona, self.store, energy=self.energy)

    def _show_model(self) -> None:
        engine = self.lease.engine
        used = engine.context_used() if engine is not None else None
        self.query_one(Dashboard).show_model(self.spec.label, self.device_info, used, self.gpu)

    @on(GpuPolled)
    def _gpu_polled(self, event: GpuPolled) -> None:
        self.gpu = event.status
        self._show_model()

    # -- personas -----------------------------------------------------------------
    def _preparing_status(self, engine: Engine, persona: Persona) -> str:
        """What the status line says while a persona's prefix is made ready: a
        first use prefills the whole system prompt, which takes seconds on a CPU."""
        if not engine.capabilities.persona_cache:
            return "ready"
        tier = engine.cached_personas().get(persona.id)
        if tier is not None:
            return f"restoring {persona.name} from {'memory' if tier == 'ram' else 'disk'}…"
        return f"prefilling {persona.name}'s prompt (first use)…"

    @on(PersonaProgressed)
    def _persona_progressed(self, event: PersonaProgressed) -> None:
        if event.persona.id != self.persona.id:
            return
        line = prefill_progress_line(event.progress)
        if self.chat.phase is TurnPhase.IDLE:
            self.chat.set_status(f"{event.persona.name}: {line}")
        elif self.chat.phase is TurnPhase.STREAMING and self.chat.prefix_pending:
            # A message sent meanwhile waits for this prefill: say how long.
            self.chat.set_status(f"your message is next · {line}")

    @on(PersonaPrepared)
    def _persona_prepared(self, event: PersonaPrepared) -> None:
        if event.persona.id != self.persona.id:
            return  # an earlier switch; a newer one is under way
        chat = self.chat
        chat.prefix_pending = False
        if chat.phase is TurnPhase.IDLE:  # not while a resumed session's history is read
            chat.set_status("ready")
        if event.error is not None:
            self._persona_state = f"not prepared: {event.error}"
            self.notify(event.error, title="Persona", severity="warning", markup=False)
        else:
            r = event.report
            self._persona_state = prefix_outcome_label(r.outcome, r.ms, r.tokens)
            if r.detail:
                self._persona_state += f" — {r.detail}"
        self.query_one(Dashboard).show_persona(self.persona.name, self._persona_state)
        self._show_model()

    async def switch_persona(self, persona_id: str) -> None:
        try:
            persona = self.workspace.personas.get(persona_id)
        except ChattermError as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        self.persona = persona
        if persona.model and persona.model != self.spec.id:
            self.notify(
                f"{persona.name} prefers model {persona.model}; keeping {self.spec.id} "
                f"(relaunch with --model {persona.model} to use it).",
                severity="warning",
                markup=False,
            )
        if self.lease.engine is not None:
            self._persona_state = "preparing…"
        await self._start_over(f"New conversation with {persona.name}.")
        if self.lease.engine is not None:
            self.chat.prefix_pending = True
            self.chat.set_status(self._preparing_status(self.lease.engine, persona))
            self._run_setup(self.setup.prepare, persona, group="prepare")

    async def _start_over(self, notice: str, resume: Resume | None = None) -> None:
        """Replace the conversation (and what the chat shows) with a new or resumed one."""
        chat = self.chat
        chat.persona_name = self.persona.name
        self._resume = resume  # taken up once the model is loaded and the history read
        conversation = None
        if resume is None and self.lease.engine is not None:
            conversation = self._new_conversation_object()
        await chat.start_over(conversation, notice, resume.tail if resume else (), self._older_turns(resume))
        if resume is not None:
            self._read_history(resume)
        self.query_one(Dashboard).show_persona(self.persona.name, self._persona_state)

    # -- resumed sessions (which sessions, models and personas may be resumed:
    #    chatterm/core/store/resume.py; here only how a resumed session is shown and attached) ---
    def _attach_when_ready(self) -> None:
        """Give the chat its conversation once the engine is loaded and a
        resumed session's history is read (whichever comes last calls this)."""
        resume = self._resume
        if self.lease.engine is None or self.device_info is None:
            return
        if resume is not None and resume.continuation is None:
            return
        self._resume = None
        self.chat.attach(self._new_conversation_object(resume))

    @work(thread=True, exclusive=True, group="history", exit_on_error=False)
    def _read_history(self, resume: Resume) -> None:
        try:
            read_history(self.store, resume)
        except ChattermError as exc:
            self.post_message(self.HistoryRead(resume, str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown to the user, never a traceback
            log.exception("reading the session failed")
            self.post_message(self.HistoryRead(resume, describe(exc)))
        else:
            self.post_message(self.HistoryRead(resume))

    @on(HistoryRead)
    async def _history_read(self, event: HistoryRead) -> None:
        if event.resume is not self._resume:
            return  # another session was opened meanwhile
        if event.error is not None:
            self._resume = None
            self.notify(event.error, severity="error", markup=False)
            await self._start_over(f"Could not continue session {event.resume.session_id}; new conversation.")
            return
        assert event.resume.continuation is not None
        self.chat.show_session(event.resume.continuation.turns)
        self._attach_when_ready()
        if self.chat.conversation is not None and self.chat.phase is TurnPhase.IDLE and not self.chat.prefix_pending:
            self.chat.set_status("ready")

    def _older_turns(self, resume: Resume | None) -> OlderTurns | None:
        """How the conversation pane reads a resumed session's older turns."""
        if self.store is None or resume is None:
            return None
        return partial(self.store.turns_page, resume.session_id)

    def action_sessions(self) -> None:
        if self.store is None:
            self.notify("No session store: sessions are not being saved.", severity="warning", markup=False)
            return
        try:
            sessions = self.store.sessions()
        except ChattermError as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        current = self.conversation.session_id if self.conversation is not None else None

        async def chosen(session_id: int | None) -> None:
            if session_id is not None:
                await self.open_session(session_id)

        self.push_screen(SessionsScreen(sessions, current), chosen)

    async def open_session(self, session_id: int) -> None:
        """Continue a stored session: show it, restore its persona, carry on."""
        if self.store is None:
            return
        try:
            resume = read_resume(self.store, self.workspace, session_id, self.spec.id)
        except ChattermError as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        for warning in resume.plan.warnings:
            self.notify(warning, severity="warning", markup=False)
        self.chat.cancel()
        self.persona = resume.plan.persona
        if self.lease.engine is not None:
            self._persona_state = "preparing…"
        await self._start_over(resumed_notice(resume), resume)
        if self.lease.engine is not None:
            self._run_setup(self.setup.prepare, self.persona, group="prepare")

    # -- actions --------------------------------------------------------------------
    def action_stop(self) -> None:
        self.chat.stop()

    async def action_quit(self) -> None:
        self.chat.cancel()
        self.exit()

    def on_unmount(self) -> None:
        if self._chat is not None:
            self._chat.cancel()
        if self._theme_memory is not None:
            self._theme_memory.save_now()
        self.lease.close_when_idle()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_personas(self) -> None:
        engine = self.lease.engine
        try:
            cached = engine.cached_personas() if engine is not None else None
        except Exception:  # noqa: BLE001 - unknown is fine for a picker
            cached = None

        async def chosen(persona_id: str | None) -> None:
            if persona_id is not None:
                await self.switch_persona(persona_id)

        self.push_screen(PersonaPicker(list(self.workspace.personas), self.persona.id, cached), chosen)

    async def action_new_conversation(self) -> None:
        await self._start_over(f"New conversation with {self.persona.name}.")

    def action_latency(self) -> None:
        self.push_screen(LatencyScreen(self._turn_metrics(), self.workspace.catalog.prices))

    def action_last_turn(self) -> None:
        turns = self._turn_metrics()
        if turns:
            self.push_screen(TurnDetailScreen(len(turns), turns[-1]))
        else:
            self.notify("No turn yet.", markup=False)

    def _turn_metrics(self) -> list:
        if self.conversation is not None:
            return list(self.conversation.turns)
        resume = self._resume
        if resume is None:
            return []
        if resume.continuation is not None:
            return list(resume.continuation.turns)
        return [r.metrics for r in resume.tail]

    def action_toggle_dashboard(self) -> None:
        visible = self.query_one(Dashboard).display
        self._dashboard_mode = "hidden" if visible else "shown"
        self._apply_width(self.size.width)

    def action_export(self, fmt: str = "md") -> None:
        if self.store is None:
            self.notify("No session store: nothing to export.", severity="warning", markup=False)
            return
        conv = self.conversation
        session_id = conv.session_id if conv is not None else (self._resume.session_id if self._resume else None)
        if session_id is None:
            self.notify("Nothing to export yet: this conversation has no stored turn.", markup=False)
            return
        self._export_worker(session_id, fmt)

    @work(thread=True, group="export", exit_on_error=False)
    def _export_worker(self, session_id: int, fmt: str) -> None:
        from chatterm.core.report.export import export_session

        try:
            path = export_session(self.store, session_id, fmt, prices=self.workspace.catalog.prices)
        except ChattermError as exc:
            self.post_message(self.SessionExported(None, str(exc)))
        except Exception as exc:  # noqa: BLE001
            log.exception("export failed")
            self.post_message(self.SessionExported(None, describe(exc)))
        else:
            self.post_message(self.SessionExported(path))

    @on(SessionExported)
    def _exported(self, event: SessionExported) -> None:
        if event.path is not None:
            self.notify(f"Exported to {event.path}", title="Export", markup=False, timeout=10)
        else:
            self.notify(event.error or "export failed", title="Export failed", severity="error", markup=False)

    # -- command palette (entries: ui/palette.py) -------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from chat_commands(self)
