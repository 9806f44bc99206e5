"""The chat application: bootstrap, key bindings and screens.

Contract:
- Build it with `chatterm.ui.launch.make_app`. Nothing is loaded at import or
  construction: the first frame comes at once and the model loads in a thread
  that reports progress.
- The App bootstraps, binds keys and pushes screens: it builds the
  `ChatSession` (ui/chat_session.py: the chat, the dashboard, which model,
  persona and session they show, and switching them), starts the model load,
  owns the key bindings, the screens (help, personas, latency) and the
  command palette's entries (ui/palette.py); theme saving is
  ui/theme_memory.py. The turn loop, what Enter does and the turn actions
  (regenerate, edit, branches) are `ChatView`'s (ui/chat_view.py); the
  sessions screen and forks are `ChatSession`'s; copying is
  ui/copy_actions.py. Each action here is one call to them.
- The UI shows what the core reports; it computes no metric. Errors become
  notifications (always literal text: ui/notices.py) or conversation notices,
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
import time
from dataclasses import dataclass, field
from functools import partial
from inspect import isawaitable
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from textual import events, on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from chatterm.core.config.personas import Persona
from chatterm.core.engine.conversation import Conversation
from chatterm.core.metrics.format import SEP, printable
from chatterm.errors import ChattermError
from chatterm.ui import terminal
from chatterm.ui.chat_session import ChatSession
from chatterm.ui.chat_view import ChatView, TurnPhase
from chatterm.ui.copy_actions import copy_code, copy_reply
from chatterm.ui.engine_lease import EngineLease
from chatterm.ui.engine_setup import EngineFactory, GpuProbe, MeterFactory, default_gpu_status, energy_meter_factory
from chatterm.ui.key_footer import KeyFooter
from chatterm.ui.latency_screen import LatencyScreen, TurnDetailScreen
from chatterm.ui.notices import notify_plain, notify_saved
from chatterm.ui.palette import TEXTUAL_HIDDEN, TEXTUAL_RETOLD, chat_commands
from chatterm.ui.prompt import PromptArea
from chatterm.ui.resume import Resume
from chatterm.ui.screens import HelpScreen, PersonaPicker
from chatterm.ui.theme_memory import ThemeMemory
from chatterm.ui.themes import DEFAULT_THEME, ThemeSet
from chatterm.ui.title_bar import TitleBar
from chatterm.ui.typing_to_prompt import TypingGoesToPrompt

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from chatterm.core.config.catalog import ModelSpec
    from chatterm.core.store.session_store import SessionStore
    from chatterm.core.workspace import Workspace

QUIT_AGAIN_S = 3.0
"""With a message typed and not sent, Ctrl+Q says so, and quits when pressed again within this."""
DASHBOARD_MIN_WIDTH = 100
"""Below this many columns the dashboard is hidden unless the user shows it (F4)."""


class ChatApp(App[None]):
    CSS_PATH = "chatterm.tcss"
    TITLE = "chatterm"
    ESCAPE_TO_MINIMIZE = False
    AUTO_FOCUS = "#prompt"

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
        Binding("ctrl+r", "regenerate", "Regenerate", show=False),
        Binding("f9", "copy_reply", "Copy reply", show=False),
        Binding("f10", "copy_code", "Copy code", show=False),
        Binding("escape", "stop", "Stop reply", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    @dataclass
    class PersonaCacheRead(Message):
        """Posted by the persona picker's worker: persona id -> "ram" or "disk"
        for the cached ones (None: unknown, e.g. while the model loads), and
        persona id -> why it does not fit the model, for those that do not."""

        cached: Mapping[str, str] | None
        misfits: Mapping[str, str] = field(default_factory=dict)

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
        self.store = store
        self.settings_path = settings_path
        self.lease = EngineLease()
        self.session = ChatSession(
            workspace, spec, persona, store=store, lease=self.lease, engine_factory=engine_factory,
            gpu_status=gpu_status, energy_meter=energy_meter or energy_meter_factory(workspace.catalog.usd_per_kwh),
            type_ahead=type_ahead, resume=resume, id="body",
        )
        self._startup_notices = list(startup_notices)
        self._dashboard_mode = "auto"
        self._title_state = ""
        """The chat's state as the title bar shows it last (ChatView.StatusChanged)."""
        self._theme_memory: ThemeMemory | None = None
        self._load_thread: threading.Thread | None = None
        self._quit_asked = -QUIT_AGAIN_S
        """When Ctrl+Q last stopped to say a typed message would be lost (monotonic s)."""
        self.fatal: str | None = None
        """The line a ChattermError nothing caught ended the app with (`_handle_exception`)."""
        for theme_obj in (themes.themes.values() if themes else ()):
            self.register_theme(theme_obj)
        self.theme = theme

    def _handle_exception(self, error: Exception) -> None:
        # A ChattermError is a line for the user (a database damaged past its
        # header, found by a read after the start): the app ends with it and
        # exit status 2, as the CLI does (`chatterm launch` prints `fatal`),
        # not with a traceback. Anything else is a bug: Textual's report stands.
        if isinstance(error, ChattermError):
            self.fatal = str(error)
            self.exit(return_code=2)
            return
        super()._handle_exception(error)

    # -- layout ---------------------------------------------------------------
    def compose(self):
        yield TitleBar(self._title_choices(), id="title-bar")
        yield self.session
        yield KeyFooter()

    @property
    def chat(self) -> ChatView:
        """The chat: conversation, status line, prompt and the turn loop."""
        return self.session.chat

    @property
    def conversation(self) -> Conversation | None:
        """The conversation on screen (None until the model is loaded)."""
        return self.chat.conversation

    @property
    def persona(self) -> Persona:
        return self.session.persona

    def _title_choices(self, state: str | None = None) -> tuple[str, ...]:
        """The title bar's texts, longest first: persona, model, session and the
        chat's state, which must stay in view (a prefill's progress); in a
        narrow terminal the app's name goes first, then the model's long
        label, then the model."""
        if state is not None:
            self._title_state = state
        conversation = self.conversation
        session = f"session {conversation.session_id}" if conversation and conversation.session_id else ""
        persona, state = printable(self.persona.name), printable(self._title_state)
        label, model_id = printable(self.spec.label or self.spec.id), printable(self.spec.id)
        return tuple(SEP.join(p for p in parts if p) for parts in (
            ("chatterm", persona, label, session, state), (persona, label, session, state),
            (persona, model_id, session, state), (persona, session, state)))

    def _show_title(self, state: str | None = None) -> None:
        for bar in self.query("#title-bar").results(TitleBar):  # none while the app closes
            bar.show(self._title_choices(state))

    @on(ChatView.StatusChanged)
    def _status_changed(self, event: ChatView.StatusChanged) -> None:
        self._show_title(event.text)

    async def on_mount(self) -> None:
        self._theme_memory = ThemeMemory(self, self.settings_path)
        self._apply_width(self.size.width)
        await self.session.begin()
        # In the conversation, where they stay to be read (five toasts stacked
        # over the title and were gone in 8 s), and in launch.log; one toast
        # says they are there.
        for notice in self._startup_notices:
            log.warning("%s", notice)
            await self.chat.messages.add_notice(notice, "warning")
        if self._startup_notices:
            count = len(self._startup_notices)
            notify_plain(self, f"{count} configuration problem{'s' if count > 1 else ''} at start: "
                               "shown in the conversation.", severity="warning")
        self._load_thread = threading.Thread(
            target=self.session.setup.load, args=(self.spec, self.persona), name="chatterm-load"
        )
        self._load_thread.start()

    @property
    def model_loading(self) -> bool:
        """llama.cpp's model load is still running. Once it has returned, the
        same thread may still prepare the persona or close the engine after a
        quit: that must finish (state saves), so this is False by then."""
        thread = self._load_thread
        return thread is not None and thread.is_alive() and not self.session.setup.model_loaded.is_set()

    def get_driver_class(self):
        # The screen must survive llama-cpp-python's fd 2 redirection (ui/terminal.py).
        return terminal.driver_class(super().get_driver_class())

    def _display(self, screen: Screen, renderable) -> None:
        # Every widget's part of a row at its own column, also in a full redraw
        # (ui/terminal.py: emoji sequences the terminal counts differently).
        super()._display(screen, terminal.placed(renderable))

    def on_resize(self, event) -> None:
        self._apply_width(event.size.width)

    def _apply_width(self, width: int) -> None:
        hidden = {
            "auto": width < DASHBOARD_MIN_WIDTH,
            "shown": False,
            "hidden": True,
        }[self._dashboard_mode]
        self.session.dashboard.display = not hidden

    # -- actions: keys and palette entries ---------------------------------------------
    def action_stop(self) -> None:
        self.chat.stop()

    async def action_quit(self) -> None:
        unsent = self.chat.query_one(PromptArea).text.strip()
        now = time.monotonic()
        if unsent and now - self._quit_asked > QUIT_AGAIN_S:
            self._quit_asked = now
            notify_plain(self, f"The message you are typing ({len(unsent):,} characters) is not kept: "
                               "Ctrl+Q again quits.", severity="warning", timeout=QUIT_AGAIN_S)
            return
        self.chat.let_go()
        self.exit()

    async def on_event(self, event: events.Event) -> None:
        # Text typed beside the prompt goes in here, where keys arrive in order
        # (ui/typing_to_prompt.py); everything else as Textual routes it.
        if isinstance(event, (events.Key, events.Paste)) and not event.is_forwarded:
            focused = self.focused
            route = focused.route_key(event) if isinstance(focused, TypingGoesToPrompt) else False
            if route is True:
                self.chat.to_prompt(event)
                return
            if route:
                if route.enabled:
                    await route.node.run_action(route.binding.action)
                return
        await super().on_event(event)

    def on_unmount(self) -> None:
        self.chat.let_go()
        if self._theme_memory is not None:
            self._theme_memory.save_now()
        self.lease.close_when_idle()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_personas(self) -> None:
        self._read_persona_cache()

    @work(thread=True, exclusive=True, group="persona-cache", exit_on_error=False)
    def _read_persona_cache(self) -> None:
        """Where each persona's prefix is cached: a scan of the cache folder, so off the UI thread."""
        misfits: dict[str, str] = {}
        # A persona file added or edited since the launch is offered now.
        try:
            problems = self.workspace.reload_personas(keep=self.persona)
        except (OSError, ChattermError):  # the folder unreadable now: the personas read before stand
            log.warning("persona files not read again", exc_info=True)
            problems = []
        for problem in problems:
            self.call_from_thread(notify_plain, self, problem, title="personas", severity="warning")
        try:
            with self.lease.use() as engine:
                cached = engine.cached_personas()
                for persona in self.workspace.personas:
                    if (why := engine.persona_misfit(persona)) is not None:
                        misfits[persona.id] = why
        except Exception:  # noqa: BLE001 - unknown is fine for a picker (EngineClosing: still loading)
            cached = None
        self.post_message(self.PersonaCacheRead(cached, misfits))

    @on(PersonaCacheRead)
    def _persona_cache_read(self, event: PersonaCacheRead) -> None:
        def chosen(persona_id: str | None) -> None:
            if persona_id is not None:
                self.session.switch_persona(persona_id)

        personas = list(self.workspace.personas)
        returns = {p.id: self.session.return_to(p.id) for p in personas}
        self.push_screen(PersonaPicker(personas, self.persona.id, event.cached, returns, event.misfits), chosen)

    def action_sessions(self) -> None:
        self.session.show_sessions()

    def action_new_conversation(self) -> None:
        self.session.new_conversation()

    def action_latency(self) -> None:
        self.push_screen(LatencyScreen(self.session.turn_metrics(), self.workspace.catalog.prices))

    def action_last_turn(self) -> None:
        turns = self.session.turn_metrics()
        if turns:
            self.push_screen(TurnDetailScreen(len(turns), turns[-1]))
        else:
            notify_plain(self, "No turn yet.")

    def action_toggle_dashboard(self) -> None:
        self._dashboard_mode = "hidden" if self.session.dashboard.display else "shown"
        self._apply_width(self.size.width)

    def action_export(self, fmt: str = "md") -> None:
        self.session.export(fmt)

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """The palette's Screenshot, where the exports go: Textual's own wrote to
        ~/Downloads and said only "Failed to save screenshot" where there is none."""
        from chatterm.core.config import paths
        from chatterm.core.metrics.format import home_short

        folder = Path(path) if path else paths.exports_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            saved = Path(self.save_screenshot(filename, str(folder)))
        except OSError as exc:
            notify_plain(self, f"{home_short(folder)}: {exc.strerror or exc}", title="Screenshot not saved",
                         severity="error")
            return
        notify_saved(self, saved, title="Screenshot saved")

    # The selected turn's actions (ui/transcript.py binds the letters and ← → to them).
    async def action_regenerate(self) -> None:
        await self.chat.regenerate()

    def action_edit_message(self) -> None:
        self.chat.edit_message()

    async def action_branch(self, delta: int) -> None:
        await self.chat.switch_branch(delta)

    async def action_fork(self) -> None:
        reply = self.chat.messages.current_reply()
        if reply is not None and reply.turn_id is None and self.chat.phase in (TurnPhase.STREAMING,
                                                                               TurnPhase.STOPPING):
            # The reply still streaming, marked: stopped and stored first, so the
            # fork holds it (forking the turn before it surprised a user).
            if not await self.chat.end_turn():
                return
            if reply.turn_id is None:  # not stored (a full disk): forking the turn before would surprise
                notify_plain(self, "That reply was not stored: it cannot be forked.", severity="warning")
                return
        self.session.fork(reply.turn_id if reply is not None else None)

    def action_copy_reply(self) -> None:
        copy_reply(self, self.chat.messages.copy_source())

    def action_copy_code(self) -> None:
        copy_code(self, self.chat.messages.copy_source())

    def action_models(self) -> None:
        from chatterm.ui.models_screen import open_model_picker

        open_model_picker(self)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Ctrl+N and Ctrl+S are priority bindings (the prompt would take them
        # otherwise), so they reached past a dialog: Ctrl+N on the sessions
        # screen started a new conversation unseen beneath it. Over a dialog
        # they do nothing; the palette closes the dialog first.
        if action in ("new_conversation", "export") and len(self.screen_stack) > 1:
            return False
        return True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title == "Screenshot":  # taken once the palette has closed, as Textual's own
                command = command._replace(callback=lambda: self.set_timer(0.1, self.action_screenshot))
            if command.title not in TEXTUAL_HIDDEN:
                yield command._replace(help=TEXTUAL_RETOLD.get(command.title, command.help))
        commands = chat_commands(self, self.workspace.personas, self.session.switch_persona, self.session.return_to)
        if screen is self.screen_stack[0]:
            yield from commands
            return
        # Opened over a dialog (sessions, models, help...): a chat command acts on
        # the chat, so the dialogs close first, as Esc would; else a Models picker
        # chosen from the sessions screen opened on top of it.
        for command in commands:
            yield command._replace(callback=partial(self._on_chat_screen, command.callback))

    async def _on_chat_screen(self, callback: Callable[[], object]) -> None:
        while len(self.screen_stack) > 1:
            await self.pop_screen()
        result = callback()  # app.run_action gives a coroutine
        if isawaitable(result):
            await result
