"""The chat: conversation pane, status line and prompt, and the turn loop that joins them.

Contract:
- `ChatView` owns the `Conversation` it shows, the turn worker, the one
  `TurnPhase` that says what the chat is doing, and the status line. Its
  owner (ui/chat_session.py) hands it a conversation once the model is loaded
  (`attach`, `start_over`), tells it when the model failed (`no_model`) and
  how the persona's prefix is coming along (`prefix_*`: a message sent before
  the prefix is ready waits for it, and the status says so); everything else
  happens here.
- What happens when the user presses Enter, in order:
  1. `_submitted` (PromptArea.Submitted): refused with a notification unless the
     phase is IDLE (while the model loads, the prompt is sent once `attach`
     says it has loaded; it stays in the prompt and can be edited meanwhile);
     otherwise the user message and an empty streaming reply are
     mounted, the phase becomes STREAMING, the collector's full passes stop
     (`gc_policy`), the timers start, `_run_turn` starts.
  2. `_run_turn` (thread worker): `Conversation.send` starts the engine's turn,
     and each delta goes onto `_unshown`, a deque (nothing runs on the UI thread
     per token, so the stream's rate does not depend on the event loop's).
  3. `_flush_tick` (timer): everything on `_unshown` goes to the reply in ONE
     write. The timer's period adapts to what a frame costs (`FrameBudget`):
     when the stream outruns the screen, writes get fewer and larger instead of
     queueing. `_dashboard_tick` shows the live `TurnMetrics` at 5 Hz.
     A turn's notices (a cut to fit, the cache's word on its prompt) are all
     given before its first token: each is shown as soon as a tick sees it,
     between the user's message and the reply, where it is read while the
     reply is awaited (`_show_notices`).
  4. `TurnEnded` (posted by the worker): the phase becomes ENDING, the rest of
     `_unshown` is written, the reply is finished with its footer, the notices
     not shown yet and errors are added, the dashboard gets the turn, the
     phase becomes IDLE.
     Two seconds later, if still IDLE, garbage is collected and full passes
     are allowed again.
  Esc (`stop`) moves STREAMING to STOPPING and cancels the turn; the engine
  stops at its next token and step 4 follows.
- Type-ahead: while the prompt is edited (and the chat is IDLE), the draft is
  prefilled in a thread worker (`Engine.prefill_ahead`) shortly after each
  change (`AHEAD_DELAY_S`, one prefill at a time), at once after a paste; the
  dashboard shows how much of the draft's prompt is ready. Enter needs
  nothing from it: the engine's turn
  preempts a prefill in progress and reuses whatever matches. With nothing
  typed, the same prefill runs with an empty draft whenever the conversation
  changes at idle (`prefill_history`: attached, its prefix ready, ← →): the
  history goes in before the first key. A request made while one runs is
  done after it (`_ahead_again`). Esc in an empty
  prompt, a persona switch or a new conversation drop it (`drop_ahead`). Off
  when `type_ahead` is False or the engine cannot (served models).
- Turn actions (ui/branches.py asks the store): `regenerate` resends the selected
  (else the last) turn's message after the history before it, its old reply and
  the turns under it removed from the screen (kept in the store as a sibling); `edit_message` puts the selected turn's
  message in the prompt (↑ in an empty prompt: the last one), and Enter then
  removes that turn and what follows from the screen and sends the new text as
  its sibling; `switch_branch` shows a reply's sibling and the path under it.
  Each sets `Conversation.history` to the path before the turn it starts, so
  the engine reuses the live context up to there. A finished reply learns its
  stored turn and its siblings' label. They need an idle chat and a stored
  turn; otherwise, and for an empty edit, one notification and no change.
- Errors in drawing never kill the app (logged); engine errors become notices;
  notifications show their text literally (ui/notices.py).
- The dashboard is given, not looked up; the app learns about status changes
  and finished turns through `StatusChanged` and `TurnFinished`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Sequence

from textual import events, on, work
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.widget import AwaitMount
from textual.widgets import ProgressBar, Static

from chatterm.core.engine.conversation import Conversation
from chatterm.core.metrics.format import SEP, fmt_ms, fmt_tok_s, prefill_progress_line, printable
from chatterm.core.metrics.turn_metrics import StopReason, TurnMetrics
from chatterm.core.store.resume import history_of
from chatterm.errors import ChattermError
from chatterm.ui import branches, gc_policy
from chatterm.ui.engine_lease import EngineClosing, EngineLease
from chatterm.ui.notices import notify_plain
from chatterm.ui.prompt import BOX_ID, PromptArea
from chatterm.ui.transcript import AssistantReply, ConversationView, Notice, OlderTurns, UserMessage
from chatterm.ui.worker_errors import reported

if TYPE_CHECKING:
    from textual.timer import Timer

    from chatterm.core.engine.interface import PrefillProgress, Turn
    from chatterm.core.store.session_store import SessionStore, TurnRecord
    from chatterm.ui.dashboard import Dashboard

log = logging.getLogger(__name__)


END_TURN_WAIT_S = 10.0
"""How long a switch waits for the cancelled turn to end (`ChatView.end_turn`);
the engine checks for a cancel after every token and between prefill batches."""


class TurnPhase(Enum):
    """What the chat is doing; the only state the turn loop keeps."""

    NO_MODEL = "no model"
    """No conversation yet: the model loads (or failed to). Enter keeps the text."""
    IDLE = "idle"
    """Enter sends."""
    STREAMING = "streaming"
    """A turn's worker runs; its deltas flow to the screen."""
    STOPPING = "stopping"
    """A cancel was asked; the worker ends at the engine's next token."""
    ENDING = "ending"
    """The worker ended; the final reply is being drawn (no new turn until it is)."""


class FrameBudget:
    """How often to write the stream to the screen: as often as `max_hz`, but
    never spending more than `share` of the loop on those writes.

    Each flush measures what it cost (the write plus the frame it caused);
    the next flush waits long enough that flushes take at most `share` of the
    time. A stream that outruns the screen gets fewer, larger writes, so the
    backlog at the end stays one write's worth whatever the token rate.
    """

    def __init__(self, max_hz: float = 30.0, min_hz: float = 4.0, share: float = 0.35):
        self.min_interval = 1.0 / max_hz
        self.max_interval = 1.0 / min_hz
        self.share = share
        self.interval = self.min_interval

    def spent(self, seconds: float) -> None:
        wanted = seconds / self.share
        # Smooth upwards quickly, downwards slowly: one cheap frame after a
        # costly one says little.
        if wanted > self.interval:
            self.interval = wanted
        else:
            self.interval = 0.7 * self.interval + 0.3 * wanted
        self.interval = min(max(self.interval, self.min_interval), self.max_interval)


class ChatView(Vertical):
    DASHBOARD_HZ = 5
    AHEAD_DELAY_S = 0.05
    """A change to the draft is prefilled this long after it (one prefill at a
    time; a burst of keys is taken up together), so the prefill keeps pace
    with typing and Enter finds all but the last keystrokes ready."""
    PASTE_CHARS = 16
    """A change that adds at least this many characters at once is a paste:
    prefilled at once, not after the pause."""

    @dataclass
    class AheadProgressed(Message):
        """Posted by the type-ahead worker after each batch."""

        ready: int
        total: int

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, ChatView.AheadProgressed)

    @dataclass
    class AheadDone(Message):
        """Posted by the type-ahead worker when it stops, with the draft it did."""

        draft: str

    @dataclass
    class StatusChanged(Message):
        text: str

    @dataclass
    class TurnFinished(Message):
        metrics: TurnMetrics

    @dataclass
    class TurnEnded(Message):
        """Posted by the turn worker (from its thread) when the turn is over."""

        reply: AssistantReply
        turn: "Turn | None"
        conversation: Conversation
        error: str | None = None

    def __init__(
        self, persona_name: str, dashboard: "Dashboard", lease: EngineLease, *, type_ahead: bool = True, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.type_ahead = type_ahead
        """Prefill the draft while it is typed (settings `[tui] type_ahead`, `--no-type-ahead`)."""
        self._ahead_timer: "Timer | None" = None
        self._ahead_running = False
        self._ahead_again = False
        """A prefill was asked for while one ran: `_ahead_done` starts it."""
        self._ahead_last = ""
        """The draft the last type-ahead prefill was given."""
        self.persona_name = persona_name
        """Title of the replies shown from now on."""
        self._prefix_pending = False
        self._prefix_failed = False
        """Preparing the persona's prefix failed (it does not fit the model, say)."""
        self._dashboard = dashboard
        self._lease = lease
        self._conversation: Conversation | None = None
        self._phase = TurnPhase.NO_MODEL
        self._turn_over = asyncio.Event()
        """Set while no turn runs (`end_turn` waits for it)."""
        self._turn_over.set()
        self._letting_go = False
        """The app quits (`let_go`)."""
        self._no_model_reason: str | None = None
        self._send_when_ready = False
        """Enter was pressed while the model loaded: send the prompt once it has."""
        self._unshown: deque[str] = deque()
        """Deltas the worker produced that are not on screen yet."""
        self._reply: AssistantReply | None = None
        self._turn: "Turn | None" = None
        self._notices_shown = 0
        """Of the running turn's notices, those mounted above its reply."""
        self._path_shown: list[TurnMetrics] | None = None
        """The metrics of the stored path the conversation goes on from, set
        where it was chosen (a resume, ← →, a regenerate or edit) and dropped when
        the next turn starts: until then the context figure is that path's, not
        the last turn computed (which may be on another branch)."""
        self._budget = FrameBudget()
        self._flush_timer: "Timer | None" = None
        self._store_error_shown: str | None = None
        self._editing: AssistantReply | None = None
        """The reply whose message the prompt holds for an edit (None: not editing)."""

    # -- layout and public state ------------------------------------------------
    def compose(self):
        yield ConversationView(id="conversation")
        with Horizontal(id="status-line"):
            yield ProgressBar(total=1.0, show_eta=False, id="load-progress")
            yield Static(Content("starting…"), id="status")
        # The box's border is its own widget, not the text area's: Textual places
        # each widget's part of a line with a cursor move of its own, so the right
        # border stays in its column where the terminal counts an emoji sequence
        # wider or narrower than rich does (docs/tui.md, "Wide characters").
        with Vertical(id=BOX_ID):
            yield PromptArea(id="prompt")

    def on_mount(self) -> None:
        self._dash_timer = self.set_interval(1 / self.DASHBOARD_HZ, self._dashboard_tick, pause=True)

    @property
    def phase(self) -> TurnPhase:
        return self._phase

    @property
    def conversation(self) -> Conversation | None:
        return self._conversation

    @property
    def messages(self) -> ConversationView:
        return self.query_one(ConversationView)

    def set_status(self, text: str) -> None:
        # With a layout: with `layout=False` an update in the same frame as the
        # prompt's layout (↑ filling it, Esc clearing it) never reached the
        # terminal, and the line said "editing" long after (tests/ui/test_tmux_e2e.py).
        self.query_one("#status", Static).update(Content(printable(text)))
        # Sent by this view, whoever calls: a message stops bubbling at its sender,
        # and the owner's handlers (a persona prepared) call this too.
        self.post_message(self.StatusChanged(text).set_sender(self))

    def show_load_progress(self, fraction: float | None) -> None:
        """Progress of the model load (0..1); None hides the bar."""
        bar = self.query_one("#load-progress", ProgressBar)
        if fraction is None:
            bar.display = False
        else:
            bar.update(progress=max(0.0, min(fraction, 1.0)))

    # -- the conversation shown ---------------------------------------------------
    def attach(self, conversation: Conversation) -> None:
        """The model is loaded: `conversation` continues what is on screen."""
        self._conversation = conversation
        if self._phase is TurnPhase.NO_MODEL:
            self._phase = TurnPhase.IDLE
        self._show_context()
        self.prefill_history()
        if self._send_when_ready and self._phase is TurnPhase.IDLE:
            self._send_when_ready = False
            prompt = self.query_one(PromptArea)
            if prompt.text.strip():
                prompt.post_message(PromptArea.Submitted(prompt, prompt.text))

    async def no_model(self, reason: str) -> None:
        """The model failed to load: the conversation says why, and so does Enter."""
        self._no_model_reason = reason
        self._send_when_ready = False
        self.show_load_progress(None)
        self.set_status("model failed to load")
        await self.messages.add_notice(f"Model failed to load: {reason}", "error")

    async def start_over(
        self,
        conversation: Conversation | None,
        notice: str,
        tail: Sequence["TurnRecord"] = (),
        older: OlderTurns | None = None,
    ) -> None:
        """Replace what is shown: cancel the running turn, show `tail` (a resumed
        session's last turns; `older` pages in the rest) and `notice`."""
        self.cancel()
        self.cancel_edit()  # the message being edited belongs to the conversation leaving
        self.drop_ahead()
        view = self.messages
        await view.clear()
        self._reply = None
        await view.show_records(self.persona_name, tail, older)
        self.show_last_stored(tail)
        self._conversation = None
        if self._phase is TurnPhase.IDLE:
            self._phase = TurnPhase.NO_MODEL
        if conversation is not None:
            self.attach(conversation)
        await view.add_notice(notice)
        self._show_context()
        self.show_session()
        self.set_status(self._ready if self._conversation is not None else "loading…")
        self.call_after_refresh(self.collect_garbage, True)

    def show_last_stored(self, tail: Sequence["TurnRecord"]) -> None:
        """The dashboard's turn: a resumed session's last stored one (none: no turn
        yet); the context figure follows the path `tail` ends."""
        self._dashboard.show_turn(tail[-1].metrics if tail else None, stored=True)
        self._path_shown = [r.metrics for r in tail]

    def show_session(self, turns: list[TurnMetrics] | None = None, path_turns: int = 0) -> None:
        """The session figures on the dashboard (from the conversation, or `turns`
        and the `path_turns` shown of them before it exists)."""
        if turns is None:
            if self._conversation is None:
                return
            turns, path_turns = self._conversation.turns, self._conversation.path_turns
        self._dashboard.show_session(turns, path_turns)

    def collect_garbage(self, everything: bool = False) -> None:
        """Collect garbage now unless a turn is on its way (see `gc_policy`)."""
        if self._phase in (TurnPhase.IDLE, TurnPhase.NO_MODEL):
            gc_policy.collect_all() if everything else gc_policy.collect_recent()
            # Only now: re-enabled at the end of the reply, the collector
            # would start its own full pass at once (the gen-1 passes of a
            # long reply are counted towards one).
            gc_policy.allow_full_passes(True)

    # -- the persona's prefix (made ready by ui/engine_setup.py) ------------------------
    @property
    def prefix_pending(self) -> bool:
        """The persona's prefix is being made ready: a message sent now waits for it."""
        return self._prefix_pending

    def prefix_started(self) -> None:
        """A persona's prefix is being made ready (the model loaded, the persona changed)."""
        self._prefix_pending = True
        self._prefix_failed = False

    def prefix_preparing(self, how: str) -> None:
        """Say how the pending prefix is made ready (a streaming message's status stays)."""
        if self._prefix_pending and self._phase is not TurnPhase.STREAMING:
            self.set_status(how)

    def prefix_progressed(self, progress: "PrefillProgress") -> None:
        """A long prefill's progress, for the user waiting to type or for the message waiting for it
        (the title bar names the persona it is for)."""
        line = prefill_progress_line(progress)
        if self._phase is TurnPhase.IDLE:
            self.set_status(line)
        elif self._phase is TurnPhase.STREAMING and self._prefix_pending:
            self.set_status(f"your message is next · {line}")

    def prefix_done(self, failed: bool = False) -> None:
        """The prefix is ready, or preparing it `failed` (the dashboard says why:
        the status line does not say "ready" then, and the context line shows
        the persona's size, which may be what does not fit)."""
        self._prefix_pending = False
        self._prefix_failed = failed
        self._show_context()
        self.show_ready()
        self.prefill_history()

    def show_ready(self) -> None:
        """Say "ready" when Enter would send at once: idle, no prefix pending;
        not while the persona's prefix failed (a new conversation with it, or
        a turn's end, said "ready" again)."""
        if self._phase is TurnPhase.IDLE and not self._prefix_pending:
            self.set_status(self._ready)

    @property
    def _ready(self) -> str:
        return "the persona is not prepared: see the dashboard" if self._prefix_failed else "ready"

    # -- Enter: sending and streaming -----------------------------------------------
    @on(PromptArea.Submitted)
    async def _submitted(self, event: PromptArea.Submitted) -> None:
        event.stop()
        if self._phase is TurnPhase.NO_MODEL or self._conversation is None:
            if self._no_model_reason:
                notify_plain(self.app, f"No model: {self._no_model_reason}", severity="error")
            else:
                self._send_when_ready = True
                notify_plain(self.app, "The model is still loading: your message is sent as soon as it is ready.")
            return
        if self._phase is not TurnPhase.IDLE:
            notify_plain(self.app, "A reply is streaming: Esc stops it.")
            return
        # A paste that ended with a line break (or trailing spaces) sent a blank last line.
        text = event.text.rstrip()
        editing, self._editing = self._editing, None
        event.prompt.editing = False
        if editing is not None:
            if not text.strip():
                notify_plain(self.app, "An empty message cannot replace the one you edited: it is kept as it was.",
                             severity="warning")
                self.show_ready()
                return
            if not await self._branch_at(editing, edit=True):
                return
        else:
            await self._say_if_continued_elsewhere()
        self._stop_ahead_timer()
        event.prompt.clear()
        user = await self.messages.add_user(text)
        await self._start_turn(text, user)

    async def _say_if_continued_elsewhere(self) -> None:
        """Say so when another process (`chatterm ask --session`, a second
        window) moved this session on since it was shown: the message goes on
        from the conversation on screen, so it becomes a branch beside that
        turn, which would otherwise appear as `‹ 1/2 ›` unexplained. Also in
        the conversation: a toast is gone before the reply is read."""
        conversation = self._conversation
        if conversation is None or conversation.store is None or conversation.session_id is None:
            return
        try:
            current = conversation.store.continued_elsewhere(conversation.session_id)
        except ChattermError:
            return  # the record after the reply says what is wrong with the store
        if current is not None:
            text = (f"Session {conversation.session_id} was continued elsewhere (turn {current}): this "
                    "message goes on from the conversation shown, as a branch beside it; ← in the conversation "
                    "shows the other.")
            notify_plain(self.app, text, severity="warning")
            await self.messages.add_notice(text, "warning")

    async def _start_turn(self, text: str, user: UserMessage) -> None:
        """Mount a streaming reply under `user` and run the turn that sends `text`."""
        assert self._conversation is not None
        self.messages.select(None)  # a new turn: the actions apply to the last one again
        self._reply = await self.messages.add_reply(self.persona_name, streaming=True, user=user)
        self._turn = None
        self._notices_shown = 0
        self._path_shown = None
        self._phase = TurnPhase.STREAMING
        self._turn_over.clear()
        self.set_status(
            "waiting for the persona's prompt…"
            if self._prefix_pending
            else "waiting for the first token…"
        )
        self._budget = FrameBudget()
        gc_policy.allow_full_passes(False)
        self._schedule_flush()
        self._dash_timer.resume()
        self._run_turn(self._conversation, text, self._reply)

    @work(thread=True, group="turn", exit_on_error=False)
    def _run_turn(self, conversation: Conversation, text: str, reply: AssistantReply) -> None:
        unshown = self._unshown
        turn: "Turn | None" = None
        # stream() never raises; send() might, and then `turn` is still None.
        with reported(self, lambda error: self.TurnEnded(reply, turn, conversation, error), "starting the turn"):
            with self._lease.use():
                # send() may tokenize a long prompt: off the UI thread too.
                turn = conversation.send(text)
                self._turn = turn
                if self._phase is TurnPhase.STOPPING:
                    turn.cancel()
                for delta in turn.stream():
                    unshown.append(delta)
            self.post_message(self.TurnEnded(reply, turn, conversation))

    async def _flush_tick(self) -> None:
        started = time.perf_counter()
        try:
            wrote = await self._show_unshown()
        except Exception:  # noqa: BLE001 - a display glitch must not kill the app
            log.exception("flush failed")
            wrote = False
        if self._phase not in (TurnPhase.STREAMING, TurnPhase.STOPPING):
            return
        if wrote:
            # The frame this write causes is painted after this callback:
            # measure it there, then schedule the next flush.
            self.call_after_refresh(self._frame_painted, started)
        else:
            self._schedule_flush()

    def _frame_painted(self, started: float) -> None:
        self._budget.spent(time.perf_counter() - started)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._phase in (TurnPhase.STREAMING, TurnPhase.STOPPING):
            self._flush_timer = self.set_timer(self._budget.interval, self._flush_tick)

    async def _show_unshown(self) -> bool:
        """Move every delta that arrived into the streaming reply in one write."""
        unshown = self._unshown
        if not unshown:
            return False
        chunks = []
        while unshown:
            chunks.append(unshown.popleft())
        if self._reply is None:
            return False
        await self._reply.write("".join(chunks))
        return True

    def _dashboard_tick(self) -> None:
        try:
            turn = self._turn
            if turn is None:
                return
            m = turn.metrics
            self._show_notices(turn, self._reply)
            self._dashboard.show_turn(m, running=not turn.done)
            self._show_context()
            if m.ttft_ms is None and turn.prefill_progress is not None and self._phase is TurnPhase.STREAMING:
                self.set_status(prefill_progress_line(turn.prefill_progress))
            if m.ttft_ms is not None and self._phase is TurnPhase.STREAMING:
                self.set_status(f"streaming{SEP}TTFT {fmt_ms(m.ttft_ms)}{SEP}{fmt_tok_s(m.decode_tok_s)}")
        except Exception:  # noqa: BLE001
            log.exception("dashboard update failed")

    def _show_notices(self, turn: "Turn", reply: AssistantReply | None) -> AwaitMount | None:
        """Mount the turn's notices not shown yet above its reply: they describe
        its prompt (what was cut, what the cache could not give), and under a
        long reply they were read only once it had finished."""
        notices = list(turn.notices)  # the engine's thread may still append
        new, self._notices_shown = notices[self._notices_shown:], len(notices)
        if not new or reply is None or not reply.is_attached:
            return None
        return self.messages.mount(*(Notice(text, "warning") for text in new), before=reply)

    @on(TurnEnded)
    async def _turn_ended(self, event: TurnEnded) -> None:
        event.stop()
        self._phase = TurnPhase.ENDING
        if self._flush_timer is not None:
            self._flush_timer.stop()
        self._dash_timer.pause()
        self._turn = None
        try:
            await self._show_unshown()
            await self._show_turn_end(event)
        except Exception:  # noqa: BLE001 - a display glitch must not kill the app
            log.exception("showing the end of a turn failed")
        finally:
            # Only now: a new turn must not start while this one is being drawn.
            self._phase = TurnPhase.IDLE if self._conversation is not None else TurnPhase.NO_MODEL
            self._turn_over.set()
        self.collect_garbage_later()

    @on(ConversationView.OlderShown)
    def _older_shown(self) -> None:
        self.collect_garbage_later()

    IDLE_COLLECT_S = 2.0
    """A collection waits this long after a reply: a pause then is one the
    user reading the reply does not notice, and one right at the end of a
    reply would delay its last frame or the next keystroke."""

    def collect_garbage_later(self) -> None:
        """Collect once the finished reply is on screen and the user reads it."""
        self.set_timer(self.IDLE_COLLECT_S, self.collect_garbage)

    async def _show_turn_end(self, event: TurnEnded) -> None:
        reply, turn = event.reply, event.turn
        if not (event.conversation is self._conversation and reply.is_attached):
            # The conversation was replaced (persona switch, resume) mid-turn.
            if turn is not None and reply.is_attached:
                await reply.finish(turn.reply, turn.metrics)
            return
        view = self.messages
        if turn is None:
            await reply.remove()
            await view.add_notice(f"Could not start the reply: {event.error}", "error")
            self.set_status(self._ready)
            return
        m = turn.metrics
        await reply.finish(turn.reply, m)
        shown = self._show_notices(turn, reply)
        if shown is not None:
            await shown
        if m.stop_reason == StopReason.ERROR:
            await view.add_notice(f"Generation failed: {m.error}", "error")
        if m.dropped_turns:
            # The turns before this one in the history, less those the prompt left out, plus this one.
            history_turns = sum(1 for msg in event.conversation.history if msg.role == "user") - 1
            await view.mark_memory_start(history_turns - m.dropped_turns + 1)
        store_error = event.conversation.store_error
        if store_error and store_error != self._store_error_shown:
            self._store_error_shown = store_error
            notify_plain(self.app, store_error, title="Session store", severity="warning")
        self._show_branch(reply, event.conversation)
        self._dashboard.show_turn(m)
        self._show_context()
        self._dashboard.show_type_ahead(None, None)
        self._ahead_last = ""
        self.show_session()
        self.post_message(self.TurnFinished(m))
        self.set_status({StopReason.CANCELLED: "stopped", StopReason.ERROR: "error"}.get(m.stop_reason, self._ready))

    # -- turn actions: regenerate, edit, branches (the tree: ui/branches.py) ---------------
    def to_prompt(self, event: events.Key | events.Paste) -> None:
        """Focus the prompt and hand it `event`, typed elsewhere (ui/typing_to_prompt.py)."""
        prompt = self.query_one(PromptArea)
        prompt.focus()
        # Forwarded as Textual forwards input (marked, so the app does not take
        # it again when it bubbles up), into the queue the next keys join.
        prompt._forward_event(event)

    @on(PromptArea.EditLastAsked)
    def _edit_last_asked(self, event: PromptArea.EditLastAsked) -> None:
        event.stop()
        if (self._phase is TurnPhase.IDLE and self._conversation is not None
                and self._conversation.session_id is not None):
            self.messages.select(None)
            self.edit_message()

    def _stored(self, what: str) -> tuple["SessionStore", int] | None:
        """The store and session the branch actions work on, or None after saying why not."""
        conversation = self._conversation
        if self._phase is not TurnPhase.IDLE or conversation is None:
            notify_plain(self.app, f"Cannot {what} now: wait for the reply (Esc stops it) or the model.")
            return None
        if conversation.store is None or conversation.session_id is None:
            notify_plain(self.app, f"Cannot {what} yet: this conversation has no stored turn.")
            return None
        return conversation.store, conversation.session_id  # type: ignore[return-value]

    async def regenerate(self) -> None:
        """Ask for the selected (else the last) reply again: the old one stays,
        as a sibling with the turns under it, and the new one is current."""
        reply = self.messages.current_reply()
        conversation = self._conversation
        if (reply is not None and reply.turn_id is None and reply.user is not None and self._phase is TurnPhase.IDLE
                and conversation is not None and conversation.session_id is None and not conversation.history):
            # A first turn that failed before any text is not stored (no empty
            # session): asked again, it is sent again (the retry after a server
            # was down), in its place.
            await self.messages.remove_after(reply.user)  # its notices too: the new turn has its own
            await self._start_turn(reply.user.text, reply.user)
            return
        if self._stored("regenerate") is None or reply is None:
            return
        if reply.turn_id is None or reply.user is None:
            notify_plain(self.app, "That reply was not stored: it cannot be regenerated.", severity="warning")
            return
        if await self._branch_at(reply, edit=False):
            if why := self._conversation.persona.sampling.repeats_itself():
                notify_plain(self.app, f"The persona's {why}: the new reply will likely match the old one.")
            await self._start_turn(reply.user.text, reply.user)

    def edit_message(self) -> None:
        """Put the selected turn's message in the prompt; Enter sends it as a new branch."""
        reply = self.messages.current_reply()
        if self._stored("edit a message") is None or reply is None or reply.user is None:
            return
        if reply.turn_id is None:
            notify_plain(self.app, "That message was not stored: it cannot be edited.", severity="warning")
            return
        prompt = self.query_one(PromptArea)
        if prompt.text.strip() and self._editing is None:
            notify_plain(self.app, "Send or clear the message you are writing first: the edit would replace it.")
            return
        self._editing = reply
        prompt.editing = True
        prompt.text = printable(reply.user.text)  # the text area writes it out as it is
        prompt.move_cursor(prompt.document.end)
        prompt.focus()
        self.set_status("editing: Enter sends a new branch, Esc cancels")  # whole in a 48-column pane

    def focus_prompt(self) -> None:
        """Put the focus in the prompt: a view change the user did not type
        into (a fork, another model, another session) would otherwise leave
        the conversation's single-letter keys to take what they type next."""
        self.query_one(PromptArea).focus()

    def cancel_edit(self) -> bool:
        """Esc while editing: drop the edit (the message stays as it was). False when not editing."""
        if self._editing is None:
            return False
        self._editing = None
        prompt = self.query_one(PromptArea)
        prompt.editing = False
        prompt.clear()
        # Not left saying "editing" while a prefill keeps "ready" back.
        self.set_status("edit cancelled")
        self.show_ready()
        return True

    async def _branch_at(self, reply: AssistantReply, *, edit: bool) -> bool:
        """Make the history the path before `reply`'s turn, the store ready to
        record its sibling, and the screen end above it (its reply removed;
        for an edit, its message too). False (with a notification) on a store error."""
        stored = self._stored("branch")
        assert reply.turn_id is not None and reply.user is not None
        if stored is None:
            return False
        store, session_id = stored
        try:
            path = branches.prepare(store, session_id, reply.turn_id)
        except ChattermError as exc:
            notify_plain(self.app, str(exc), severity="error")
            return False
        self._follow(path)
        self.messages.select(None)
        if edit:
            await self.messages.remove_from(reply.user)
        else:  # the message stays; the old reply's notices above it go with it
            await self.messages.remove_after(reply.user)
        return True

    def _follow(self, path: list["TurnRecord"]) -> None:
        """The conversation goes on from the end of the stored `path`: its history, its count, its leaf."""
        assert self._conversation is not None
        self._conversation.history, self._conversation.path_turns = history_of(path), len(path)
        self._conversation.leaf = path[-1].index if path else 0
        self._path_shown = [r.metrics for r in path]

    async def switch_branch(self, delta: int) -> None:
        """Show the selected reply's previous (-1) or next (+1) sibling and the path under it."""
        reply = self.messages.current_reply()
        stored = self._stored("switch branches")
        if stored is None or reply is None or reply.turn_id is None or reply.user is None:
            return
        store, session_id = stored
        try:
            switched = branches.switch(store, session_id, reply.turn_id, delta)
        except ChattermError as exc:
            notify_plain(self.app, str(exc), severity="error")
            return
        if switched is None:
            notify_plain(self.app, f"No {'earlier' if delta < 0 else 'later'} branch here.")
            return
        turn, path = switched
        self._follow(path)
        self.show_last_stored(path)  # the Turn section: this path's last turn, not the one left
        start = next(i for i, record in enumerate(path) if record.index == turn)
        view = self.messages
        await view.remove_from(reply.user)
        view.select(await view.show_path(self.persona_name, path[start:]))
        self.drop_ahead()
        self.prefill_history()
        self._show_context()
        self.show_session()  # the exchanges shown changed, and with them the turns row

    def _show_branch(self, reply: AssistantReply, conversation: Conversation) -> None:
        """Give a finished reply its stored turn and its siblings' label."""
        store, session_id = conversation.store, conversation.session_id
        if store is None or session_id is None or conversation.store_error:
            return
        try:
            record = branches.recorded(store, session_id, conversation.leaf)  # type: ignore[arg-type]
        except ChattermError:
            return  # the store error was shown already; the reply just has no branch actions
        if record is not None:
            reply.set_turn(record)

    # -- the context figure ----------------------------------------------------------------
    def _show_context(self) -> None:
        """The dashboard's context figure, for the conversation on screen."""
        used, persona_alone = context_tokens(self._conversation, self._turn, self._path_shown)
        self._dashboard.show_context(used, persona_alone=persona_alone)

    # -- type-ahead ----------------------------------------------------------------------
    @on(PromptArea.Changed)
    def _draft_changed(self, event: PromptArea.Changed) -> None:
        draft = event.text_area.text
        grew = len(draft) - len(self._ahead_last)
        if not draft.strip() and self._ahead_last:
            # The draft prefilled ahead was deleted: the row stops counting it,
            # and the context goes back to the history alone.
            self._stop_ahead_timer()
            self._dashboard.show_type_ahead(None, None)
            self.prefill_history()
            return
        if not self._can_prefill_ahead() or not draft.strip() or draft == self._ahead_last:
            return
        if grew >= self.PASTE_CHARS:
            self._stop_ahead_timer()
            self._start_ahead()
        elif self._ahead_timer is None:
            # Not restarted by every key: a steady typist still gets prefilled.
            self._ahead_timer = self.set_timer(self.AHEAD_DELAY_S, self._start_ahead)

    def _can_prefill_ahead(self) -> bool:
        engine = self._lease.engine
        return (
            self.type_ahead
            and self._phase is TurnPhase.IDLE
            and self._conversation is not None
            and self._editing is None  # the draft would be prefilled after the wrong history
            and engine is not None
            and engine.capabilities.prefill_ahead
        )

    def prefill_history(self) -> None:
        """With nothing typed yet, make the context hold what the next prompt
        has before the message: a resumed session's stored state is restored, a
        history no state holds (after a model switch, a fork, a branch switch)
        is prefilled, so the first Enter pays for its message only. The engine
        does nothing while the persona's prefix is being prepared (this runs
        again when it is done), and a turn stops it within one batch."""
        self._run_ahead(idle=True)

    def _start_ahead(self) -> None:
        self._ahead_timer = None
        self._run_ahead(idle=False)

    def _run_ahead(self, *, idle: bool) -> None:
        """Prefill the draft ahead; `idle`: an empty one too (the history alone)."""
        if self._ahead_running:
            # Asked for again meanwhile (a branch switch, a prefix made ready, more
            # typing): done when the running prefill ends, for what is then current.
            self._ahead_again = True
            return
        if not self._can_prefill_ahead() or (idle and self._prefix_pending):
            return
        draft = self.query_one(PromptArea).text
        if not draft.strip() and not idle:
            return
        draft = draft if draft.strip() else ""
        self._ahead_running = True
        self._ahead_last = draft
        conversation = self._conversation
        assert conversation is not None
        self._prefill_ahead(conversation, draft)

    @work(thread=True, group="type-ahead", exit_on_error=False)
    def _prefill_ahead(self, conversation: Conversation, draft: str) -> None:
        try:
            with self._lease.use() as engine:
                engine.prefill_ahead(
                    conversation.persona,
                    conversation.history,
                    draft.rstrip(),  # as it will be sent
                    lambda ready, total: self.post_message(self.AheadProgressed(ready, total)),
                    session_id=conversation.session_id,  # this history's, whatever is opened meanwhile
                )
        except EngineClosing:
            pass
        except Exception:  # noqa: BLE001 - type-ahead is an optimisation: never an error for the user
            log.exception("type-ahead prefill failed")
        finally:
            self.post_message(self.AheadDone(draft))

    @on(AheadProgressed)
    def _ahead_progressed(self, event: AheadProgressed) -> None:
        event.stop()
        if self._phase is TurnPhase.IDLE:
            self._dashboard.show_type_ahead(event.ready, event.total)

    @on(AheadDone)
    def _ahead_done(self, event: AheadDone) -> None:
        event.stop()
        self._ahead_running = False
        if event.draft and not self.query_one(PromptArea).text.strip():
            # The draft was deleted while it was being prefilled: its last
            # progress report came after the row was hidden.
            self._dashboard.show_type_ahead(None, None)
        if self._ahead_again:
            self._ahead_again = False
            self.prefill_history()
        elif self.query_one(PromptArea).text != event.draft and self._ahead_timer is None:
            self._ahead_timer = self.set_timer(self.AHEAD_DELAY_S, self._start_ahead)

    def drop_ahead(self) -> None:
        """Forget the type-ahead prefill (persona switch, new conversation, Esc)."""
        self._stop_ahead_timer()
        self._ahead_last = ""
        self._ahead_again = False
        engine = self._lease.engine
        if engine is not None:
            engine.drop_ahead()
        self._dashboard.show_type_ahead(None, None)

    def _stop_ahead_timer(self) -> None:
        if self._ahead_timer is not None:
            self._ahead_timer.stop()
            self._ahead_timer = None

    # -- stopping ----------------------------------------------------------------------
    def cancel(self) -> None:
        """Cancel the running turn, if any (its end is still drawn when it comes)."""
        if self._phase is TurnPhase.STREAMING:
            self._phase = TurnPhase.STOPPING
        if self._phase is TurnPhase.STOPPING:
            turn = self._turn
            if turn is not None:
                turn.cancel()

    async def end_turn(self) -> bool:
        """Cancel the running turn, if any, and wait until it has ended: stored
        (a stopped reply is a turn of its session) and drawn. A switch to
        another conversation, or to another model continuing this one, comes
        after it: read before, the session lacked the stopped turn (it then
        hid from the screen, though the next prompt held it), and the turn's
        end, drawn after the switch, put its figures on the new conversation's
        dashboard. A worker that does not end within `END_TURN_WAIT_S` (an
        engine that does not answer its cancel) is not waited for longer, by
        this switch or the next; nor is any once the app quits (`let_go`).
        False once the app quits: the switch is not to go on."""
        self.cancel()
        if self._turn_over.is_set():
            return not self._letting_go
        self.set_status("stopping…")
        try:
            await asyncio.wait_for(self._turn_over.wait(), END_TURN_WAIT_S)
        except TimeoutError:
            log.warning("the turn did not end within %s s of its cancel", END_TURN_WAIT_S)
            self._turn_over.set()  # given up on: its end is still drawn when it comes
        return not self._letting_go

    def let_go(self) -> None:
        """The app quits: a switch waiting for the turn to end waits no more."""
        self._letting_go = True
        self.cancel()
        self._turn_over.set()

    def stop(self) -> None:
        """Esc: stop the reply that is streaming; cancel an edit; unselect the
        selected turn (Ctrl+R and ← → go back to the last reply, the letter
        keys are text again); in an empty prompt, drop the type-ahead."""
        if self.cancel_edit():
            return
        if self._phase in (TurnPhase.STREAMING, TurnPhase.STOPPING):
            self.cancel()
            self.set_status("stopping…")
        elif self.messages.has_selection:
            self.messages.select(None)
        elif not self.query_one(PromptArea).text.strip():
            self.drop_ahead()


def context_tokens(
    conversation: Conversation | None, turn: "Turn | None", path: Sequence[TurnMetrics] | None = None
) -> tuple[int | None, bool]:
    """(tokens `conversation` holds in the context, whether that is its persona's
    prompt alone): the running turn's prompt and what it generated so far, else
    the last turn's on `path` (the stored path it goes on from; None: the last
    turn computed), else the persona's prompt alone (None where the engine has
    not measured it, or no conversation)."""
    if conversation is None:
        return None, False
    if turn is not None and turn.metrics.prompt_tokens:
        return turn.metrics.prompt_tokens + turn.metrics.generated_tokens, False
    for m in reversed(conversation.turns if path is None else path):
        if m.prompt_tokens:  # a turn that failed before its prompt left nothing
            return m.prompt_tokens + m.generated_tokens, False
    return conversation.engine.persona_tokens(conversation.persona), True
