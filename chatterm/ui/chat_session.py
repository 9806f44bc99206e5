"""The chat's body: the chat and its dashboard, and which model, persona and session they show.

Contract:
- `ChatSession` composes the `ChatView` and the `Dashboard` and is the target
  of `EngineSetup`'s messages: it shows the model load's progress, gives the
  chat a conversation once the engine is loaded, shows the GPU polls, and
  follows each persona prefix's preparation (the status line while it runs,
  the dashboard's persona section once it is done). The app starts the load
  thread (`setup.load`) once `begin` has shown what is known before it.
- It owns the persona and the stored session the chat shows, and switching
  them: `switch_persona` (another persona: back to its last conversation of
  this run, `return_to`, resumed like any stored session; else a new one, whose
  prefix is then prepared), `new_conversation`, `open_session` (continue a stored
  session, optionally at a given turn: its last turns at once, its history read
  in a thread worker; the conversation is attached once both the engine and the
  history are there).
- `show_sessions` opens the sessions screen (ui/sessions_screen.py); `fork`
  makes a new session with the history up to a turn and continues it; delete
  and fork go through chatterm/core/store/lifecycle.py with the engine's
  prompt cache (its memory tier included) or, without one, the workspace's.
  Which sessions may be resumed, with which model and persona, is
  chatterm/core/store/resume.py's rule; ui/resume.py reads what is shown.
- `export(fmt)` writes the session on screen to the data folder in a thread
  worker and says where (or why not) in a notification.
- Switches run in this widget's message queue, in order with the engine's
  messages, so a switch never interleaves with the engine's arrival.
- Errors (load, persona, store) become notifications or conversation notices,
  never tracebacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from textual import on, work
from textual.containers import Horizontal
from textual.message import Message

from chatterm.core.config.personas import Persona
from chatterm.core.engine.conversation import Conversation
from chatterm.core.metrics.format import prefix_outcome_label
from chatterm.core.store.resume import resume_conversation
from chatterm.errors import ChattermError
from chatterm.ui.chat_view import ChatView
from chatterm.ui.dashboard import Dashboard
from chatterm.ui.engine_lease import EngineLease
from chatterm.ui.engine_setup import EngineFactory, EngineSetup, GpuProbe, MeterFactory
from chatterm.ui.notices import notify_plain, notify_saved
from chatterm.ui.resume import Resume, read_history, read_resume, resumed_notice, turns_phrase
from chatterm.ui.sessions_screen import SessionChoice, SessionsScreen
from chatterm.ui.transcript import OlderTurns
from chatterm.ui.worker_errors import reported

if TYPE_CHECKING:
    from chatterm.core.cache.prompt_cache import PromptCache
    from chatterm.core.config.catalog import ModelSpec
    from chatterm.core.engine.conversation import EnergyMeter
    from chatterm.core.engine.interface import DeviceInfo, Engine
    from chatterm.core.metrics.turn_metrics import TurnMetrics
    from chatterm.core.store.session_store import SessionStore
    from chatterm.core.system.gpu import GpuStatus
    from chatterm.core.workspace import Workspace


def preparing_status(event: EngineSetup.PersonaPreparing) -> str:
    """What the status line says while a persona's prefix is made ready: a
    first use prefills the whole system prompt, which takes seconds on a CPU."""
    if not event.cacheable:
        return "ready"
    if event.tier is not None:
        return f"restoring {event.persona.name} from {'memory' if event.tier == 'ram' else 'disk'}…"
    return f"prefilling {event.persona.name}'s prompt (first use)…"


EARLIER_SESSIONS = ("Earlier conversations are kept: F3 lists and searches them, "
                    "and chatterm launch --resume continues the last one.")
"""The notice of a plain launch when the store holds sessions."""

FIRST_LAUNCH = ("Type a message and press Enter. The dashboard beside the chat (F4) times each turn "
                "and prices it; F1 lists every key, Ctrl+P every command.")
"""The notice of a launch with no stored session yet: where to start."""


class ChatSession(Horizontal):
    GPU_POLL_S = 2.0

    @dataclass
    class HistoryRead(Message):
        """Posted by the history worker: a resumed session's history is read (or why not)."""

        resume: Resume
        error: str | None = None

    @dataclass
    class Forked(Message):
        """Posted by the fork worker: the new session (or why not)."""

        session_id: int | None
        error: str | None = None
        parent: int | None = None
        turns: int = 0

    @dataclass
    class Exported(Message):
        """Posted by the export worker: where the session was written (or why not)."""

        path: Path | None
        error: str | None = None
        replaced: bool = False
        """An earlier export of the session was at that path (it is the session's own file name)."""

    def __init__(
        self,
        workspace: "Workspace",
        spec: "ModelSpec",
        persona: Persona,
        *,
        store: "SessionStore | None",
        lease: EngineLease,
        engine_factory: EngineFactory,
        gpu_status: GpuProbe,
        energy_meter: MeterFactory,
        type_ahead: bool,
        resume: Resume | None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.workspace = workspace
        self.spec = spec
        self.persona = persona
        """The persona the chat talks as."""
        self.store = store
        self.lease = lease
        self.setup = EngineSetup(self, lease, engine_factory, gpu_status, energy_meter)
        self.dashboard = Dashboard(id="dashboard")
        self.chat = ChatView(persona.name, self.dashboard, lease, type_ahead=type_ahead, id="chat")
        self.engine_error: str | None = None
        self.device_info: "DeviceInfo | None" = None
        self.gpu: "GpuStatus | None" = None
        self.energy: "EnergyMeter | None" = None
        self.persona_state = "waiting for the model"
        """The persona's prefix as the dashboard words it (preparing, restored, not prepared)."""
        self._resume = resume
        """A session to continue once the model is loaded and its history read."""
        self._last_sessions: dict[str, int] = {}
        """Persona id -> the stored session last shown with it (switching back returns there)."""

    def compose(self):
        yield self.chat
        yield self.dashboard

    async def begin(self) -> None:
        """Show what is known before the model loads (a resumed session's last turns)."""
        self._show_persona()
        self.dashboard.show_model(self.spec.label, None, None, None, status="loading…")
        resume = self._resume
        if resume is not None:
            self._hold(resume.session_id)  # from now, not once the model is loaded
            await self.chat.messages.show_records(self.persona.name, resume.tail, self._older_turns(resume))
            await self.chat.messages.add_notice(resumed_notice(resume))
            self.chat.show_last_stored(resume.tail)
            self._read_history(resume)
        elif self.store is not None and self.store.has_sessions():
            # A plain launch starts afresh: say where the earlier conversations are.
            await self.chat.messages.add_notice(EARLIER_SESSIONS)
        else:
            await self.chat.messages.add_notice(FIRST_LAUNCH)
        self.chat.set_status("loading model…")

    # -- what the session shows -----------------------------------------------------
    @property
    def session_id(self) -> int | None:
        """The stored session on screen, the one being resumed included."""
        conversation = self.chat.conversation
        if conversation is not None:
            return conversation.session_id
        return self._resume.session_id if self._resume is not None else None

    def turn_metrics(self) -> list["TurnMetrics"]:
        """The session's turns (a resumed one's while its history is still read)."""
        if self.chat.conversation is not None:
            return list(self.chat.conversation.turns)
        resume = self._resume
        if resume is None:
            return []
        if resume.continuation is not None:
            return list(resume.continuation.turns)
        return [r.metrics for r in resume.tail]

    def _show_persona(self) -> None:
        self.dashboard.show_persona(self.persona.name, self.persona_state)

    def _show_model(self) -> None:
        engine = self.lease.engine
        used = engine.context_used() if engine is not None else None
        self.dashboard.show_model(self.spec.label, self.device_info, used, self.gpu)

    @on(ChatView.TurnFinished)
    def _turn_finished(self) -> None:
        self._show_model()

    # -- the engine (the work itself: ui/engine_setup.py) ----------------------------
    def _run_setup(self, step: Callable[..., None], *args, group: str) -> None:
        """Run an `EngineSetup` step in a thread worker (GPU polls: one at a
        time; persona prepares: one per switch)."""
        self.run_worker(partial(step, *args), thread=True, group=group,
                        exclusive=group != "prepare", exit_on_error=False)

    @on(EngineSetup.LoadProgressed)
    def _load_progressed(self, event: EngineSetup.LoadProgressed) -> None:
        self.chat.show_load_progress(event.fraction)

    @on(EngineSetup.Loaded)
    def _engine_loaded(self, event: EngineSetup.Loaded) -> None:
        self.device_info = event.device
        self.gpu = event.gpu
        self.energy = event.energy
        # The prefix is pending before the conversation is attached: attaching
        # prefills the history, which waits for the prefix (and runs when it is done).
        self.chat.prefix_started()
        self._attach_when_ready()
        self.chat.show_load_progress(None)
        for note in event.device.notes:
            notify_plain(self.app, note, severity="warning", timeout=8)
        self._show_model()
        self.persona_state = "preparing…"
        self._show_persona()
        self.call_after_refresh(self.chat.collect_garbage)
        if event.gpu is not None:
            self.set_interval(self.GPU_POLL_S, partial(self._run_setup, self.setup.poll_gpu, group="gpu"))

    @on(EngineSetup.LoadFailed)
    async def _load_failed(self, event: EngineSetup.LoadFailed) -> None:
        self.engine_error = event.error
        self.dashboard.show_model(self.spec.label, None, None, None, status="failed to load")
        notify_plain(self.app, event.error, title="Model failed to load", severity="error", timeout=15)
        await self.chat.no_model(event.error)

    @on(EngineSetup.GpuPolled)
    def _gpu_polled(self, event: EngineSetup.GpuPolled) -> None:
        self.gpu = event.status
        self._show_model()

    # -- the persona's prefix ---------------------------------------------------------
    # Reports about an earlier persona are dropped: a newer switch is under way.
    @on(EngineSetup.PersonaPreparing)
    def _persona_preparing(self, event: EngineSetup.PersonaPreparing) -> None:
        if event.persona.id == self.persona.id:
            self.chat.prefix_preparing(preparing_status(event))

    @on(EngineSetup.PersonaProgressed)
    def _persona_progressed(self, event: EngineSetup.PersonaProgressed) -> None:
        if event.persona.id == self.persona.id:
            self.chat.prefix_progressed(event.progress)

    @on(EngineSetup.PersonaPrepared)
    def _persona_prepared(self, event: EngineSetup.PersonaPrepared) -> None:
        if event.persona.id != self.persona.id:
            return
        self.chat.prefix_done(failed=event.error is not None)
        if event.error is not None:
            self.persona_state = f"not prepared: {event.error}"
            notify_plain(self.app, event.error, title="Persona", severity="warning")
        else:
            r = event.report
            self.persona_state = prefix_outcome_label(r.outcome, r.ms, r.tokens, r.tier)
            if r.detail:
                self.persona_state += f" — {r.detail}"
        self._show_persona()
        self._show_model()

    # -- switching: persona, new conversation, stored session -------------------------
    def switch_persona(self, persona_id: str) -> None:
        """Start a new conversation as `persona_id` (an unknown id is a notification)."""
        self.call_later(self._switch_persona, persona_id)

    def new_conversation(self) -> None:
        """Start a new conversation with the same persona."""
        self.call_later(self._start_over, f"New conversation with {self.persona.name}.")

    def open_session(self, session_id: int, turn: int | None = None) -> None:
        """Continue stored session `session_id`: show it, restore its persona, carry
        on; `turn` (a search hit's): make that turn current and select it."""
        self.call_later(self._open_session, session_id, None, turn)

    def return_to(self, persona_id: str) -> int | None:
        """The stored session switching to `persona_id` goes back to (None: a new
        conversation): the last one talked in with it since the app started."""
        if persona_id == self.persona.id:
            return self.session_id
        back = self._last_sessions.get(persona_id)
        if back is not None and self.store is not None and not self.store.has_session(back):
            # Deleted since (F3, or another chatterm): the picker offered it,
            # and choosing it said "unknown session" before a new conversation.
            del self._last_sessions[persona_id]
            return None
        return back

    async def _switch_persona(self, persona_id: str) -> None:
        try:
            persona = self.workspace.personas.get(persona_id)
        except ChattermError as exc:
            notify_plain(self.app, str(exc), severity="error")
            return
        if persona.id == self.persona.id:
            notify_plain(self.app, f"Already talking with {persona.name}; Ctrl+N starts a new conversation.")
            return
        if not await self.chat.end_turn():  # a first reply stopped here creates the session remembered
            return
        back = self.return_to(persona.id)
        self._remember_current()
        if back is not None and await self._open_session(back, f"Back to your conversation with {persona.name}"):
            return
        self.persona = persona
        if persona.model and persona.model != self.spec.id:
            notify_plain(
                self.app,
                f"{persona.name} prefers model {persona.model}; keeping {self.spec.id} "
                f"(relaunch with --model {persona.model} to use it).",
                severity="warning",
            )
        if self.lease.engine is not None:
            self.chat.prefix_started()
        await self._start_over(f"New conversation with {persona.name}.", prepare=True)

    def _remember_current(self) -> None:
        """Note the session on screen as its persona's last one (before leaving it)."""
        if self.session_id is not None:
            self._last_sessions[self.persona.id] = self.session_id
        else:
            self._last_sessions.pop(self.persona.id, None)  # left a new conversation: that is the last one

    async def _open_session(self, session_id: int, back: str | None = None, turn: int | None = None, *,
                            warn: bool = True) -> bool:
        """Continue `session_id` (at `turn`); `back`: the notice's start when returning to a
        persona's last conversation; `warn`: say when it goes on on another model than
        its own. False (and a notification) when it cannot."""
        if self.store is None:
            return False
        if not await self.chat.end_turn():  # stored first: continuing this very session, it holds a stopped reply
            return False
        try:
            if turn is not None:
                # The hit's branch becomes the one continued (the one on screen when the hit is on it).
                self.store.select_turn(session_id, turn, keep_path=True)
            resume = read_resume(self.store, self.workspace, session_id, self.spec.id)
        except ChattermError as exc:
            notify_plain(self.app, str(exc), severity="error")
            return False
        for warning in resume.plan.warnings if warn else ():
            notify_plain(self.app, warning, severity="warning")
        if back is None:
            self._remember_current()
        self.persona = resume.plan.persona
        if self.lease.engine is not None:
            self.chat.prefix_started()
        notice = resumed_notice(resume) if back is None else f"{back}: {turns_phrase(resume)}."
        await self._start_over(notice, resume, prepare=True)
        if turn is not None and await self.chat.messages.reveal(turn):
            # A search hit, selected. The focus stays in the prompt: in the
            # conversation, the first letters typed ran its turn keys (an `e`
            # started an edit of the hit).
            notify_plain(self.app, f"Turn {turn} selected: F9 copies it; in the conversation (Shift+Tab), "
                                   "r regenerates it, e edits it and f forks there.")
        return True

    async def _start_over(self, notice: str, resume: Resume | None = None, *, prepare: bool = False) -> None:
        """Replace the conversation (and what the chat shows) with a new or resumed
        one; `prepare`: the persona changed, so its prefix is made ready."""
        if not await self.chat.end_turn():
            return
        loaded = self.lease.engine is not None
        if prepare and loaded:
            self.persona_state = "preparing…"
        self.chat.persona_name = self.persona.name
        self._hold(resume.session_id if resume is not None else None)
        self._resume = resume  # taken up once the model is loaded and the history read
        conversation = self._new_conversation_object() if resume is None and loaded else None
        await self.chat.start_over(conversation, notice, resume.tail if resume else (), self._older_turns(resume))
        # Keys typed next are the next message: with the conversation focused
        # (Tab, Shift+↑) they went to its letter keys and were lost.
        self.chat.focus_prompt()
        self.dashboard.scroll_home(animate=False)  # another conversation's figures, from their top
        if resume is not None:
            self._read_history(resume)
        self._show_persona()
        if prepare and loaded:
            self._run_setup(self.setup.prepare, self.persona, group="prepare")

    def _hold(self, session_id: int | None) -> None:
        """Mark the session now on screen as open (another chatterm's delete of
        it is refused): at once, though its conversation comes with the model
        and the history; the conversation then holds it in its turn."""
        if self.store is not None:
            self.store.hold(session_id, self)

    def _new_conversation_object(self, resume: Resume | None = None) -> Conversation:
        engine = self.lease.engine
        assert engine is not None
        if resume is not None and self.store is not None:
            return resume_conversation(
                resume.plan, self.store, engine, energy=self.energy, continuation=resume.continuation
            )
        return Conversation(engine, self.persona, self.store, energy=self.energy)

    # -- resumed sessions: shown at once, attached once the history is read ------------
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
        with reported(self, lambda error: self.HistoryRead(resume, error), "reading the session"):
            read_history(self.store, resume)
            self.post_message(self.HistoryRead(resume))

    @on(HistoryRead)
    async def _history_read(self, event: HistoryRead) -> None:
        if event.resume is not self._resume:
            return  # another session was opened meanwhile
        if event.error is not None:
            self._resume = None
            notify_plain(self.app, event.error, severity="error")
            await self._start_over(f"Could not continue session {event.resume.session_id}; new conversation.")
            return
        assert event.resume.continuation is not None
        self.chat.show_session(event.resume.continuation.turns, event.resume.plan.info.path_turns)
        self._attach_when_ready()
        self.chat.show_ready()

    def _older_turns(self, resume: Resume | None) -> OlderTurns | None:
        """How the conversation pane reads a resumed session's older turns."""
        if self.store is None or resume is None:
            return None
        return partial(self.store.turns_page, resume.session_id)

    # -- the sessions screen and forks (the store's lifecycle: core/store/lifecycle.py) --
    def show_sessions(self) -> None:
        """Open the sessions screen (F3): open, fork or delete a stored session."""
        if self.store is None:
            notify_plain(self.app, "No session store: sessions are not being saved.", severity="warning")
            return
        try:
            sessions = self.store.sessions()
        except ChattermError as exc:
            notify_plain(self.app, str(exc), severity="error")
            return

        def chosen(choice: SessionChoice | None) -> None:
            if choice is None:
                return
            if choice.fork:
                self.fork(choice.turn, choice.session_id)
            else:
                self.open_session(choice.session_id, choice.turn)

        self.app.push_screen(SessionsScreen(sessions, self.session_id, self.store, self._delete_session), chosen)

    def _prompt_cache(self) -> "PromptCache | None":
        """The loaded engine's prompt cache (its RAM tier too), else the workspace's on disk."""
        cache = getattr(self.lease.engine, "kv_cache", None)
        return cache if cache is not None else self.workspace.kv_cache()

    def _delete_session(self, session_id: int) -> str:
        """Delete `session_id` with its KV states (the sessions screen's worker runs it); what was removed."""
        from chatterm.core.store.lifecycle import delete_session

        assert self.store is not None
        gone = delete_session(self.store, self._prompt_cache(), session_id, in_use=self.session_id)
        return gone.summary(session_id)

    def fork(self, turn: int | None, session_id: int | None = None) -> None:
        """A new session holding `session_id`'s path up to `turn` (None: the session on
        screen, its current turn), opened to carry on from there."""
        parent = session_id if session_id is not None else self.session_id
        if self.store is None or parent is None:
            notify_plain(self.app, "Nothing to fork yet: this conversation has no stored turn.")
            return
        self._fork_worker(parent, turn)

    @work(thread=True, group="fork", exit_on_error=False)
    def _fork_worker(self, parent: int, turn: int | None) -> None:
        from chatterm.core.store.lifecycle import fork_session

        with reported(self, lambda error: self.Forked(None, error), "fork"):
            made = fork_session(self.store, self._prompt_cache(), parent, turn)
            self.post_message(self.Forked(made.session_id, parent=parent, turns=made.turns))

    @on(Forked)
    async def _forked(self, event: Forked) -> None:
        if event.session_id is None:
            notify_plain(self.app, event.error or "fork failed", title="Fork failed", severity="error")
            return
        if not await self.chat.end_turn():
            return
        self._remember_current()
        # A fork of the conversation on screen goes on where it was: on the model
        # loaded, which it may have moved to since its last turn ("session 5 was
        # recorded with ..." of a session made a moment before).
        await self._open_session(event.session_id, f"Fork of session {event.parent}",
                                 warn=event.parent != self.session_id)

    # -- switching the model (the picker: ui/models_screen.py loads it) ----------------
    def use_model(self, spec: "ModelSpec", engine: "Engine", device: "DeviceInfo", *, carry_on: bool) -> None:
        """Carry on with `engine`, loaded for `spec`: `carry_on`, the stored session on
        screen continues there (its history is the prompt of the next turn), else a
        new conversation with the same persona starts; the persona's prefix is then
        prepared on it, and the engine it replaces is closed once no worker uses it."""
        self.call_later(self._use_model, spec, engine, device, carry_on)

    async def _use_model(self, spec: "ModelSpec", engine: "Engine", device: "DeviceInfo", carry_on: bool) -> None:
        if not await self.chat.end_turn():  # the reply streaming on the old engine, stopped and stored
            engine.close()  # the app quits: the new engine was never taken up
            return
        session_id = self.session_id if carry_on else None
        self.spec = spec
        self.lease.replace(engine)
        self.engine_error = None
        self.device_info = device
        self.chat.show_load_progress(None)
        self.chat.prefix_started()
        self._show_model()
        # Asked for: "continuing with <this model>" needs no warning.
        if session_id is not None and await self._open_session(session_id, f"Now on {spec.label}, continuing",
                                                               warn=False):
            return
        await self._start_over(f"Now on {spec.label}: a new conversation with {self.persona.name}.", prepare=True)

    # -- export --------------------------------------------------------------------------
    def export(self, fmt: str) -> None:
        """Write the session on screen as `fmt` (md, html, jsonl, csv) to the data folder."""
        if self.store is None:
            notify_plain(self.app, "No session store: nothing to export.", severity="warning")
            return
        session_id = self.session_id
        if session_id is None:
            notify_plain(self.app, "Nothing to export yet: this conversation has no stored turn.")
            return
        self._export_worker(session_id, fmt)

    @work(thread=True, group="export", exit_on_error=False)
    def _export_worker(self, session_id: int, fmt: str) -> None:
        from chatterm.core.report.export import default_export_path, export_session

        with reported(self, lambda error: self.Exported(None, error), "export"):
            replaced = default_export_path(session_id, fmt).exists()
            path = export_session(self.store, session_id, fmt, prices=self.workspace.catalog.prices)
            self.post_message(self.Exported(path, replaced=replaced))

    @on(Exported)
    def _exported(self, event: Exported) -> None:
        if event.path is not None:
            again = " (replacing the earlier export)" if event.replaced else ""
            notify_saved(self.app, event.path, title="Exported", note=again)
        else:
            notify_plain(self.app, event.error or "export failed", title="Export failed", severity="error")
