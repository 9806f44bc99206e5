"""The chat application and `make_app`, the one factory shared by CLI and tests.

Contract:
- `make_app(workspace, ...)` resolves model, persona, theme and the session to
  resume (bad ids raise `ChattermError` before anything is drawn) and returns a
  `ChatApp`. Nothing is loaded at import or construction: the first frame comes
  at once and the model loads in a thread worker that reports progress.
- Everything blocking runs in thread workers that report with messages: model
  load (+ GPU probe + persona prefix), persona prepare, each turn, export, GPU
  polling. A turn's deltas go into a deque that a 25 Hz timer drains into the
  reply's `MarkdownStream`; the dashboard reads the live `TurnMetrics` from a
  5 Hz timer. Nothing is called per token on the UI thread (DESIGN.md:
  `call_from_thread` per token capped a producer at 365 tok/s).
- The UI drives `chatterm.core.conversation.Conversation` and shows what the
  core reports; it computes no metric. Errors (load, generation, store, export)
  become notifications or conversation notices, never tracebacks.
- Esc cancels the running turn (the engine checks per token); Ctrl+Q cancels it
  and quits; the engine is closed once no worker uses it (`EngineLease`).
"""

from __future__ import annotations

import gc
import logging
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.theme import BUILTIN_THEMES
from textual.widgets import Footer, ProgressBar, Static

from chatterm.core import paths
from chatterm.core.conversation import Conversation, EnergyMeter
from chatterm.core.engine import ChatMessage, DeviceInfo, Engine, PrefixReport, Turn
from chatterm.core.errors import ChattermError
from chatterm.core.format import SEP, fmt_ms, fmt_tok_s, prefix_outcome_label, printable
from chatterm.core.metrics import SessionSummary
from chatterm.core.personas import Persona
from chatterm.core.sessions import SessionPlan, history_of, max_history_turns, plan_resume
from chatterm.ui.conversation import AssistantReply, ConversationView
from chatterm.ui.dashboard import Dashboard
from chatterm.ui.engine_lease import EngineClosing, EngineLease
from chatterm.ui.prompt import PromptArea
from chatterm.ui.screens import HelpScreen, PersonaPicker, SessionsScreen
from chatterm.ui.settings import load_ui_settings, remember_theme
from chatterm.ui.themes import DEFAULT_THEME, ThemeSet, load_themes

if TYPE_CHECKING:
    from chatterm.core.gpu_telemetry import GpuStatus
    from chatterm.core.models import ModelSpec
    from chatterm.core.store import SessionStore, TurnRecord
    from chatterm.core.workspace import Workspace

log = logging.getLogger(__name__)

EngineFactory = Callable[["ModelSpec"], Engine]
GpuProbe = Callable[[], "GpuStatus | None"]
MeterFactory = Callable[[], "EnergyMeter | None"]

DASHBOARD_MIN_WIDTH = 100
"""Below this many columns the dashboard is hidden unless the user shows it (F4)."""


@dataclass
class Resume:
    """A stored session to continue, read before the app starts."""

    session_id: int
    records: list["TurnRecord"]
    history: list[ChatMessage]


def resumed_notice(resume: Resume) -> str:
    n = len(resume.records)
    return f"Resumed session {resume.session_id} ({n} turn{'' if n == 1 else 's'})."


def _gpu_status() -> "GpuStatus | None":
    from chatterm.core.gpu_telemetry import gpu_status

    return gpu_status()


def _energy_meter_factory(usd_per_kwh: float) -> MeterFactory:
    def make() -> "EnergyMeter | None":
        from chatterm.core.gpu_telemetry import energy_meter_or_none, resolve_usd_per_kwh

        return energy_meter_or_none(resolve_usd_per_kwh(usd_per_kwh))

    return make


class ChatApp(App[None]):
    CSS_PATH = "chatterm.tcss"
    TITLE = "chatterm"
    ESCAPE_TO_MINIMIZE = False
    AUTO_FOCUS = "#prompt"
    FLUSH_HZ = 25
    DASHBOARD_HZ = 5
    GPU_POLL_S = 2.0

    BINDINGS = [
        Binding("f1", "help", "Help"),
        Binding("question_mark", "help", "Help", show=False),
        Binding("f2", "personas", "Persona"),
        Binding("f3", "sessions", "Sessions"),
        Binding("f4", "toggle_dashboard", "Dashboard"),
        Binding("ctrl+s", "export('md')", "Export", priority=True),
        Binding("ctrl+n", "new_conversation", "New", priority=True),
        Binding("escape", "stop", "Stop reply", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    # -- messages from the workers (posted from threads: thread-safe) --------
    @dataclass
    class LoadProgressed(Message):
        fraction: float

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, ChatApp.LoadProgressed)

    @dataclass
    class EngineLoaded(Message):
        engine: Engine
        device: DeviceInfo
        gpu: "GpuStatus | None"
        energy: "EnergyMeter | None"

    @dataclass
    class LoadFailed(Message):
        error: str

    @dataclass
    class PersonaPrepared(Message):
        persona: Persona
        report: PrefixReport | None
        error: str | None = None

    @dataclass
    class TurnEnded(Message):
        reply: AssistantReply
        turn: Turn | None
        conversation: Conversation
        error: str | None = None

    @dataclass
    class GpuPolled(Message):
        status: "GpuStatus | None"

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, ChatApp.GpuPolled)

    @dataclass
    class SessionExported(Message):
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
        resume: Resume | None = None,
        gpu_status: GpuProbe = _gpu_status,
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
        self.gpu_probe = gpu_status
        self.energy_meter_factory = energy_meter or _energy_meter_factory(workspace.catalog.usd_per_kwh)
        self.conversation: Conversation | None = None
        self.engine_error: str | None = None
        self.device_info: DeviceInfo | None = None
        self.gpu: "GpuStatus | None" = None
        self.energy: "EnergyMeter | None" = None
        self.lease = EngineLease()
        self._resume = resume
        self._startup_notices = list(startup_notices)
        self._pending: deque[str] = deque()
        self._reply: AssistantReply | None = None
        self._turn: Turn | None = None
        self._turn_active = False
        self._prefix_pending = False
        self._stop_requested = False
        self._store_error_shown: str | None = None
        self._dashboard_mode = "auto"
        self._persona_state = "waiting for the model"
        for theme_obj in (themes.themes.values() if themes else ()):
            self.register_theme(theme_obj)
        self.theme = theme
        self._last_theme = theme

    # -- layout ---------------------------------------------------------------
    def compose(self):
        yield Static(self._title_content(), id="title-bar")
        with Horizontal(id="body"):
            with Vertical(id="chat"):
                yield ConversationView(id="conversation")
                with Horizontal(id="status-line"):
                    yield ProgressBar(total=1.0, show_eta=False, id="load-progress")
                    yield Static(Content("starting…"), id="status")
                yield PromptArea(id="prompt", placeholder="Message — Enter sends, Ctrl+J new line, F1 help")
            yield Dashboard(id="dashboard")
        yield Footer()

    def _title_content(self, state: str = "") -> Content:
        parts = ["chatterm", self.persona.name, self.spec.label or self.spec.id]
        if self.conversation is not None and self.conversation.session_id is not None:
            parts.append(f"session {self.conversation.session_id}")
        if state:
            parts.append(state)
        return Content(printable(SEP.join(parts)))

    async def on_mount(self) -> None:
        self._flush_timer = self.set_interval(1 / self.FLUSH_HZ, self._flush_tick, pause=True)
        self._dash_timer = self.set_interval(1 / self.DASHBOARD_HZ, self._dashboard_tick, pause=True)
        self._theme_save_timer = None
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self._apply_width(self.size.width)
        for notice in self._startup_notices:
            self.notify(notice, severity="warning", markup=False, timeout=8)
        dashboard = self.query_one(Dashboard)
        dashboard.show_persona(self.persona.name, self._persona_state)
        dashboard.show_model(self.spec.label, None, None, None, status="loading…")
        if self._resume is not None:
            await self._show_records(self._resume.records)
            await self.query_one(ConversationView).add_notice(
                resumed_notice(self._resume)
            )
            turns = [r.metrics for r in self._resume.records]
            dashboard.show_session(SessionSummary.of(turns), turns)
        self._set_status("loading model…")
        self._load_engine()

    def on_resize(self, event) -> None:
        self._apply_width(event.size.width)

    def _apply_width(self, width: int) -> None:
        hidden = {
            "auto": width < DASHBOARD_MIN_WIDTH,
            "shown": False,
            "hidden": True,
        }[self._dashboard_mode]
        self.query_one(Dashboard).display = not hidden

    def _set_status(self, text: str) -> None:
        self.query_one("#status", Static).update(Content(printable(text)), layout=False)
        self.query_one("#title-bar", Static).update(self._title_content(text), layout=False)

    # -- model loading ----------------------------------------------------------
    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load_engine(self) -> None:
        engine: Engine | None = None
        try:
            engine = self.engine_factory(self.spec)
            engine.load(self._load_progress)
        except Exception as exc:  # noqa: BLE001 - shown to the user, never a traceback
            if not isinstance(exc, ChattermError):
                log.exception("model load failed")
            message = str(exc) if isinstance(exc, ChattermError) else f"{type(exc).__name__}: {exc}"
            if engine is not None:
                _close_quietly(engine)
            self.post_message(self.LoadFailed(message))
            return
        if not self.lease.adopt(engine):
            return  # the app quit while the model loaded
        try:
            with self.lease.use():
                device = engine.device()
                # The GPU probe may import torch (seconds): here, off the UI thread.
                gpu = self._probe_gpu()
                energy = self._make_energy_meter() if gpu is not None else None
                self.post_message(self.EngineLoaded(engine, device, gpu, energy))
                self._prepare(engine, self.persona)
        except EngineClosing:
            return
        except Exception as exc:  # noqa: BLE001
            log.exception("engine set-up failed")
            self.post_message(self.LoadFailed(f"{type(exc).__name__}: {exc}"))

    def _load_progress(self, fraction: float) -> bool:
        """Report load progress; False (app quitting) makes the engine abandon the load."""
        self.post_message(self.LoadProgressed(fraction))
        return not self.lease.closing

    def _make_energy_meter(self) -> "EnergyMeter | None":
        try:
            return self.energy_meter_factory()
        except Exception:  # noqa: BLE001 - no meter means energy shows "n/a"
            log.debug("no energy meter", exc_info=True)
            return None

    def _probe_gpu(self) -> "GpuStatus | None":
        try:
            return self.gpu_probe()
        except Exception:  # noqa: BLE001 - no telemetry is "n/a", not an error
            log.debug("GPU probe failed", exc_info=True)
            return None

    def _prepare(self, engine: Engine, persona: Persona) -> None:
        """Make the persona prefix ready (in a worker thread) and report how."""
        try:
            report = engine.prepare_persona(persona)
        except ChattermError as exc:
            self.post_message(self.PersonaPrepared(persona, None, str(exc)))
        except Exception as exc:  # noqa: BLE001
            log.exception("persona prepare failed")
            self.post_message(self.PersonaPrepared(persona, None, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.PersonaPrepared(persona, report))

    @on(LoadProgressed)
    def _load_progressed(self, event: LoadProgressed) -> None:
        self.query_one("#load-progress", ProgressBar).update(progress=max(0.0, min(event.fraction, 1.0)))

    @on(EngineLoaded)
    def _engine_loaded(self, event: EngineLoaded) -> None:
        self.device_info = event.device
        self.gpu = event.gpu
        self.energy = event.energy
        resume = self._resume
        self._resume = None
        if resume is not None:
            self.conversation = self._new_conversation_object(
                session_id=resume.session_id,
                history=resume.history,
                turns=[r.metrics for r in resume.records],
            )
        else:
            self.conversation = self._new_conversation_object()
        self.query_one("#load-progress").display = False
        for note in event.device.notes:
            self.notify(note, severity="warning", markup=False, timeout=8)
        self._prefix_pending = True
        self._set_status(self._preparing_status(event.engine, self.persona))
        self._show_model()
        self._persona_state = "preparing…"
        self.query_one(Dashboard).show_persona(self.persona.name, self._persona_state)
        self.call_after_refresh(self._collect_garbage)
        if event.gpu is not None:
            self.set_interval(self.GPU_POLL_S, self._poll_gpu)

    @on(LoadFailed)
    async def _load_failed(self, event: LoadFailed) -> None:
        self.engine_error = event.error
        self.query_one("#load-progress").display = False
        self._set_status("model failed to load")
        self.query_one(Dashboard).show_model(self.spec.label, None, None, None, status="failed to load")
        self.notify(event.error, title="Model failed to load", severity="error", markup=False, timeout=15)
        await self.query_one(ConversationView).add_notice(f"Model failed to load: {event.error}", "error")

    def _new_conversation_object(self, **resume) -> Conversation:
        assert self.lease.engine is not None
        return Conversation(self.lease.engine, self.persona, self.store, energy=self.energy, **resume)

    def _show_model(self) -> None:
        engine = self.lease.engine
        used = engine.context_used() if engine is not None else None
        self.query_one(Dashboard).show_model(self.spec.label, self.device_info, used, self.gpu)

    def _poll_gpu(self) -> None:
        self._poll_gpu_worker()

    @work(thread=True, exclusive=True, group="gpu", exit_on_error=False)
    def _poll_gpu_worker(self) -> None:
        self.post_message(self.GpuPolled(self._probe_gpu()))

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
        if engine.persona_cached(persona):
            return f"restoring {persona.name} from disk…"
        return f"prefilling {persona.name}'s prompt (first use)…"

    @on(PersonaPrepared)
    def _persona_prepared(self, event: PersonaPrepared) -> None:
        if event.persona.id != self.persona.id:
            return  # an earlier switch; a newer one is under way
        self._prefix_pending = False
        if not self._turn_active:
            self._set_status("ready")
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

    @work(thread=True, group="prepare", exit_on_error=False)
    def _prepare_worker(self, persona: Persona) -> None:
        try:
            with self.lease.use() as engine:
                self._prepare(engine, persona)
        except EngineClosing:
            pass

    async def switch_persona(self, persona_id: str) -> None:
        try:
            persona = self.workspace.personas.get(persona_id)
        except ChattermError as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        self._cancel_turn()
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
            self._prefix_pending = True
            self._set_status(self._preparing_status(self.lease.engine, persona))
            self._prepare_worker(persona)

    async def _start_over(self, notice: str, resume: Resume | None = None) -> None:
        """Replace the conversation (and the view) with a new or resumed one."""
        view = self.query_one(ConversationView)
        await view.clear()
        self._reply = None
        if resume is not None:
            await self._show_records(resume.records)
        if self.lease.engine is not None:
            kwargs = {}
            if resume is not None:
                kwargs = dict(
                    session_id=resume.session_id,
                    history=resume.history,
                    turns=[r.metrics for r in resume.records],
                )
            self.conversation = self._new_conversation_object(**kwargs)
        else:
            self._resume = resume
        await view.add_notice(notice)
        dashboard = self.query_one(Dashboard)
        dashboard.show_turn(None)
        self._refresh_session()
        dashboard.show_persona(self.persona.name, self._persona_state)
        self._set_status("ready" if self.conversation is not None else "loading model…")
        self.call_after_refresh(self._collect_garbage)

    async def _show_records(self, records: Iterable["TurnRecord"]) -> None:
        view = self.query_one(ConversationView)
        with self.batch_update():
            for record in records:
                await view.add_user(record.user_text)
                await view.add_reply(self.persona.name, text=record.reply, metrics=record.metrics)

    def _refresh_session(self) -> None:
        conv = self.conversation
        if conv is None:
            return
        self.query_one(Dashboard).show_session(conv.summary(), conv.turns)

    # -- sending and streaming ----------------------------------------------------
    @on(PromptArea.Submitted)
    async def _submitted(self, event: PromptArea.Submitted) -> None:
        if self.conversation is None:
            if self.engine_error:
                self.notify(f"No model: {self.engine_error}", severity="error", markup=False)
            else:
                self.notify("The model is still loading; your message is kept.", markup=False)
            return
        if self._turn_active:
            self.notify("A reply is streaming: Esc stops it.", markup=False)
            return
        text = event.text
        event.prompt.clear()
        view = self.query_one(ConversationView)
        await view.add_user(text)
        self._reply = await view.add_reply(self.persona.name, streaming=True)
        self._turn = None
        self._turn_active = True
        self._stop_requested = False
        self._set_status(
            "waiting for the persona prefix, then the first token…"
            if self._prefix_pending
            else "waiting for the first token…"
        )
        self._flush_timer.resume()
        self._dash_timer.resume()
        self._run_turn(self.conversation, text, self._reply)

    @work(thread=True, group="turn", exit_on_error=False)
    def _run_turn(self, conversation: Conversation, text: str, reply: AssistantReply) -> None:
        pending = self._pending
        turn: Turn | None = None
        try:
            with self.lease.use():
                # send() may tokenize a long prompt: off the UI thread too.
                turn = conversation.send(text)
                self._turn = turn
                if self._stop_requested:
                    turn.cancel()
                for delta in turn.stream():
                    pending.append(delta)
        except EngineClosing:
            return
        except Exception as exc:  # noqa: BLE001 - stream() never raises; send() might
            log.exception("turn failed to start")
            self.post_message(self.TurnEnded(reply, turn, conversation, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(self.TurnEnded(reply, turn, conversation))

    async def _flush_tick(self) -> None:
        try:
            await self._drain_pending()
        except Exception:  # noqa: BLE001 - a display glitch must not kill the app
            log.exception("flush failed")

    async def _drain_pending(self) -> None:
        """Move queued deltas into the streaming reply (one write per tick)."""
        pending = self._pending
        if not pending:
            return
        chunks = []
        while pending:
            chunks.append(pending.popleft())
        if self._reply is not None:
            await self._reply.write("".join(chunks))

    def _dashboard_tick(self) -> None:
        try:
            turn = self._turn
            if turn is None:
                return
            m = turn.metrics
            self.query_one(Dashboard).show_turn(m, running=not turn.done)
            if m.ttft_ms is not None:
                self._set_status(f"streaming{SEP}TTFT {fmt_ms(m.ttft_ms)}{SEP}{fmt_tok_s(m.decode_tok_s)}")
        except Exception:  # noqa: BLE001
            log.exception("dashboard update failed")

    @on(TurnEnded)
    async def _turn_ended(self, event: TurnEnded) -> None:
        self._flush_timer.pause()
        self._dash_timer.pause()
        self._turn = None
        self._stop_requested = False
        # After the final frame is on screen, while the user reads.
        self.set_timer(0.25, self._collect_garbage)
        try:
            await self._drain_pending()
            await self._show_turn_end(event)
        except Exception:  # noqa: BLE001 - a display glitch must not kill the app
            log.exception("showing the end of a turn failed")
        finally:
            # Only now: a new turn must not start while this one is being drawn.
            self._turn_active = False

    async def _show_turn_end(self, event: TurnEnded) -> None:
        reply, turn = event.reply, event.turn
        if not (event.conversation is self.conversation and reply.is_attached):
            # The conversation was replaced (persona switch, resume) mid-turn.
            if turn is not None and reply.is_attached:
                await reply.finish(turn.reply, turn.metrics)
            return
        view = self.query_one(ConversationView)
        if turn is None:
            await reply.remove()
            await view.add_notice(f"Could not start the reply: {event.error}", "error")
            self._set_status("ready")
            return
        m = turn.metrics
        await reply.finish(turn.reply, m)
        for notice in turn.notices:
            await view.add_notice(notice, "warning")
        if m.stop_reason == "error":
            await view.add_notice(f"Generation failed: {m.error}", "error")
        store_error = event.conversation.store_error
        if store_error and store_error != self._store_error_shown:
            self._store_error_shown = store_error
            self.notify(store_error, title="Session store", severity="warning", markup=False)
        self.query_one(Dashboard).show_turn(m)
        self._refresh_session()
        self._show_model()
        self._set_status({"cancelled": "stopped", "error": "error"}.get(m.stop_reason, "ready"))

    def _collect_garbage(self) -> None:
        """Collect once the finished reply is on screen, then freeze what is left.

        Full (generation 2) collections scan every object: with a long
        conversation on screen they paused the loop for 40-60 ms several times
        per 2,000-token reply. Frozen objects are skipped by collections, so
        streaming only pays for what it allocates. Unfreezing first lets
        widgets removed since the last freeze (new conversation, resume) be
        collected here, at an idle moment, instead of leaking.
        """
        if self._turn_active:
            return
        gc.unfreeze()
        gc.collect()
        gc.freeze()

    def _cancel_turn(self) -> None:
        if self._turn_active:
            self._stop_requested = True
            turn = self._turn
            if turn is not None:
                turn.cancel()

    # -- actions --------------------------------------------------------------------
    def action_stop(self) -> None:
        if self._turn_active:
            self._cancel_turn()
            self._set_status("stopping…")

    async def action_quit(self) -> None:
        self._cancel_turn()
        self.exit()

    def on_unmount(self) -> None:
        self._cancel_turn()
        self._save_theme()
        self.lease.close_when_idle()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_personas(self) -> None:
        engine = self.lease.engine
        cached: dict[str, bool | None] = {}
        for persona in self.workspace.personas:
            try:
                cached[persona.id] = engine.persona_cached(persona) if engine is not None else None
            except Exception:  # noqa: BLE001 - unknown is fine for a picker
                cached[persona.id] = None

        async def chosen(persona_id: str | None) -> None:
            if persona_id is not None:
                await self.switch_persona(persona_id)

        self.push_screen(PersonaPicker(list(self.workspace.personas), self.persona.id, cached), chosen)

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
            resume, plan = read_resume(self.store, self.workspace, session_id, self.spec.id)
        except ChattermError as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        for warning in plan.warnings:
            self.notify(warning, severity="warning", markup=False)
        self._cancel_turn()
        self.persona = plan.persona
        if self.lease.engine is not None:
            self._persona_state = "preparing…"
        await self._start_over(resumed_notice(resume), resume)
        if self.lease.engine is not None:
            self._prepare_worker(self.persona)

    async def action_new_conversation(self) -> None:
        self._cancel_turn()
        await self._start_over(f"New conversation with {self.persona.name}.")

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
        from chatterm.core.export import export_session

        try:
            path = export_session(self.store, session_id, fmt)
        except ChattermError as exc:
            self.post_message(self.SessionExported(None, str(exc)))
        except Exception as exc:  # noqa: BLE001
            log.exception("export failed")
            self.post_message(self.SessionExported(None, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.SessionExported(path))

    @on(SessionExported)
    def _exported(self, event: SessionExported) -> None:
        if event.path is not None:
            self.notify(f"Exported to {event.path}", title="Export", markup=False, timeout=10)
        else:
            self.notify(event.error or "export failed", title="Export failed", severity="error", markup=False)

    # -- themes -----------------------------------------------------------------------
    def _theme_changed(self, theme) -> None:
        if theme.name == self._last_theme:
            return
        self._last_theme = theme.name
        # The theme picker previews each highlighted theme: save once it settles.
        if self._theme_save_timer is not None:
            self._theme_save_timer.stop()
        self._theme_save_timer = self.set_timer(1.0, self._save_theme)

    def _save_theme(self) -> None:
        timer, self._theme_save_timer = getattr(self, "_theme_save_timer", None), None
        if timer is None or self.settings_path is None:
            return
        timer.stop()
        try:
            remember_theme(self.settings_path, self.theme)
        except ChattermError as exc:
            self.notify(str(exc), severity="warning", markup=False)

    # -- command palette ----------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for persona in self.workspace.personas:
            yield SystemCommand(
                palette_text(f"Persona: {persona.name}"),
                palette_text(f"Switch to {persona.id} (starts a new conversation)"),
                partial(self.switch_persona, persona.id),
            )
        yield SystemCommand("Persona picker", "List personas and their cache state (F2)", self.action_personas)
        yield SystemCommand("Sessions", "Open a past session to continue it (F3)", self.action_sessions)
        yield SystemCommand("New conversation", "Start over with the same persona (Ctrl+N)",
                            self.action_new_conversation)
        for fmt, label in (("md", "Markdown report"), ("jsonl", "JSONL"), ("csv", "CSV")):
            yield SystemCommand(f"Export session: {label}", f"Write this session as {fmt} to the data folder",
                                partial(self.action_export, fmt))
        yield SystemCommand("Toggle dashboard", "Show or hide the latency dashboard (F4)", self.action_toggle_dashboard)
        yield SystemCommand("Help", "Every key (F1)", self.action_help)


def palette_text(text: str) -> str:
    """Text for the command palette, which parses markup: every `[` escaped
    (textual.markup.escape leaves a trailing `[/` as is, textual#6155)."""
    return printable(text).replace("[", "\\[")


def _close_quietly(engine: Engine) -> None:
    try:
        engine.close()
    except Exception:  # noqa: BLE001 - the load error is the one to show
        log.debug("closing a half-loaded engine failed", exc_info=True)


def read_resume(
    store: "SessionStore", workspace: "Workspace", session: int | str, model_id: str | None,
    persona_id: str | None = None,
) -> tuple[Resume, "SessionPlan"]:
    """Read a stored session to continue under the one resume rule (core.sessions)."""
    plan = plan_resume(store, workspace, session, model_id=model_id, persona_id=persona_id)
    records = store.turns(plan.session_id, newest=max_history_turns(plan.spec))
    return Resume(plan.session_id, records, history_of(records)), plan


def require_theme(theme: str | None, known: set[str] | None = None) -> None:
    """A ChattermError listing the valid themes when `theme` is not one of them."""
    if theme is None:
        return
    if known is None:
        known = set(BUILTIN_THEMES) | set(load_themes().themes)
    if theme not in known:
        raise ChattermError(f"unknown theme {theme!r}; valid themes: {', '.join(sorted(known))}")


def make_app(
    workspace: "Workspace",
    *,
    model_id: str | None = None,
    persona_id: str | None = None,
    theme: str | None = None,
    resume: int | str | None = None,
    store: "SessionStore | None" = None,
    engine_factory: EngineFactory | None = None,
    theme_folders: list[Path] | None = None,
    settings_path: Path | None = None,
    gpu_status: GpuProbe = _gpu_status,
    energy_meter: MeterFactory | None = None,
) -> ChatApp:
    """Build the app. `resume` is a session id or "latest" (needs `store`)."""
    notices = list(workspace.personas.errors)
    resume_data = None
    if resume is not None:
        if store is None:
            raise ChattermError("--resume needs the session database")
        resume_data, plan = read_resume(store, workspace, resume, model_id, persona_id)
        spec, persona = plan.spec, plan.persona
        notices += plan.warnings
    else:
        spec, persona = workspace.resolve(model_id, persona_id)

    settings_path = paths.settings_file() if settings_path is None else settings_path
    settings = load_ui_settings(settings_path)
    if settings.error:
        notices.append(settings.error)
    themes = load_themes(theme_folders)
    notices += themes.errors
    known = set(BUILTIN_THEMES) | set(themes.themes)
    require_theme(theme, known)
    chosen = theme or settings.theme or DEFAULT_THEME
    if chosen not in known:
        notices.append(f"remembered theme {chosen!r} is not available; using {DEFAULT_THEME}")
        chosen = DEFAULT_THEME if DEFAULT_THEME in known else "textual-dark"
    return ChatApp(
        workspace,
        spec,
        persona,
        engine_factory=engine_factory or workspace.make_engine,
        store=store,
        themes=themes,
        theme=chosen,
        settings_path=settings_path,
        resume=resume_data,
        gpu_status=gpu_status,
        energy_meter=energy_meter,
        startup_notices=notices,
    )
