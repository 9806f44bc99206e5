"""A conversation: one persona on one engine, its history, and its record.

Contract:
- `Conversation.send(text)` starts a turn on the engine with the history so far
  and returns the `Turn`; whoever drives `Turn.stream()` (a TUI worker, the
  `ask` command, a test) gets the same bookkeeping: when the turn ends the user
  message and the reply (partial when cancelled) join the history, and the
  turn with its metrics is committed to the store, failed turns included.
- The session row is created on the first turn, so an opened-and-closed app
  leaves no empty session behind (nor does a first turn that failed or was
  abandoned, `Turn.abandon`, before any text; a later one is recorded); a
  resumed conversation passes its id. The
  engine hears of the conversation at once (`note_conversation`: its id, or
  None for a new one), so a local engine readies the memory a stored
  state restores into while the user types, and looks for the right one.
- The store holds the newest conversation's session as open (`hold`), so
  another chatterm does not delete it meanwhile.
- Energy per turn comes from an optional `EnergyMeter` (GPU power readings).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

from chatterm.core.config.personas import Persona
from chatterm.core.engine.interface import ChatMessage, Engine, ReplyTokens, Turn
from chatterm.core.metrics.cost import energy_cost_usd
from chatterm.core.metrics.turn_metrics import SessionSummary, StopReason, TurnMetrics
from chatterm.errors import ChattermError

log = logging.getLogger(__name__)


class TurnStore(Protocol):
    def create_session(
        self, *, model_id: str, model_identity: str, engine: str, device: str, persona_id: str
    ) -> int: ...

    def move_session(
        self, session_id: int, *, model_id: str, model_identity: str, engine: str, device: str
    ) -> None: ...

    def record_turn(
        self, session_id: int, user_text: str, reply: str, metrics: TurnMetrics, after: int | None = None,
        reply_tokens: ReplyTokens | None = None,
    ) -> int | None: ...

    def take_write_notice(self) -> str | None: ...

    def hold(self, session_id: int | None, holder: object = None, *, only_if_holder: bool = False) -> None: ...

    def turn_metrics(self, session_id: int) -> list[TurnMetrics]: ...


class EnergyMeter(Protocol):
    usd_per_kwh: float

    def start(self) -> object: ...

    def stop(self, handle: object) -> float | None:
        """Energy in Wh since `start`, or None when the device reports no power."""


def turn_messages(
    user_text: str, reply: str, metrics: TurnMetrics, tokens: ReplyTokens | None = None
) -> list[ChatMessage]:
    """What a finished turn adds to the history: the user message and the reply
    (partial when cancelled) with the tokens sampled for it; nothing for a turn
    that failed before any text."""
    if metrics.stop_reason == StopReason.ERROR and not reply:
        return []
    return [ChatMessage("user", user_text), ChatMessage("assistant", reply, tokens)]


class Conversation:
    def __init__(
        self,
        engine: Engine,
        persona: Persona,
        store: TurnStore | None = None,
        session_id: int | None = None,
        history: list[ChatMessage] | None = None,
        turns: list[TurnMetrics] | None = None,
        energy: EnergyMeter | None = None,
        path_turns: int | None = None,
        leaf: int | None = None,
    ):
        self.engine = engine
        self.persona = persona
        self.store = store
        self.session_id = session_id
        self.history: list[ChatMessage] = list(history or [])
        self.turns: list[TurnMetrics] = list(turns or [])
        self.path_turns = len(self.turns) if path_turns is None else path_turns
        """The turns on the path shown, as the store counts them (failed ones too; `turns`
        also holds those on other branches). Whoever sets `history` to a path sets this."""
        self.leaf = leaf
        """The stored turn `history` ends at (0: none; None: the store's current
        leaf), which the next turn is recorded under: a turn another process adds
        to the session meanwhile is not in this history, so it must not become
        this one's parent. Whoever sets `history` to a path sets this too."""
        self.energy = energy
        self.store_error: str | None = None
        self._moved = session_id is None
        """The session is on this engine's model in the store (a new one is created there)."""
        engine.note_conversation(session_id)
        if store is not None:
            store.hold(session_id, self)  # the store's open session is the newest conversation's

    def _model_fields(self) -> dict[str, str]:
        """What the store records of the model a session is on."""
        engine = self.engine
        return dict(model_id=engine.spec.id, model_identity=engine.model_identity, engine=engine.kind,
                    device=engine.device().name)

    def summary(self) -> SessionSummary:
        return SessionSummary.of(self.turns)

    def send(self, text: str) -> Turn:
        self.engine.note_conversation(self.session_id)
        turn = self.engine.start_turn(self.persona, self.history, text)
        meter = self.energy.start() if self.energy is not None else None
        turn.on_finished(lambda t: self._finished(t, text, meter))
        return turn

    def _finished(self, turn: Turn, text: str, meter: object) -> None:
        m = turn.metrics
        if self.energy is not None:
            wh = self.energy.stop(meter)
            if wh is not None:
                m.energy_wh = wh
                m.energy_cost_usd = energy_cost_usd(wh, self.energy.usd_per_kwh)
        tokens = turn.reply_tokens
        added = turn_messages(text, turn.reply, m, tokens)
        if (self.store is not None and self.session_id is None and not turn.reply
                and (m.stop_reason == StopReason.ERROR or turn.abandoned)):
            # No session is made for a first turn that failed or was given up
            # before any text (a persona too large, a server down, Ctrl+C in
            # `ask`): it would be an empty one. Nor is it counted: the figures
            # are the stored session's. A stop by Esc or a switch is stored:
            # the message stays on screen, and a switch back finds it.
            return
        self.history += added
        self.turns.append(m)
        self.path_turns += 1
        if self.store is None:
            return
        stored = False
        try:
            if self.session_id is None:
                self.session_id = self.store.create_session(
                    **self._model_fields(), persona_id=self.persona.id,
                    started_at=m.submitted_at,  # the session began with its first message
                )
                # Unless something was opened since (this turn ran on after it).
                self.store.hold(self.session_id, self, only_if_holder=True)
            elif not self._moved:
                # A stored session carried on, maybe on another model: a resume
                # must come back to the model its last turn ran on.
                self.store.move_session(self.session_id, **self._model_fields())
                self._moved = True
            if self.session_id is not None:  # None: the database refused the write
                index = self.store.record_turn(self.session_id, text, turn.reply, m, after=self.leaf,
                                               reply_tokens=tokens)
                if index is not None:
                    self.leaf = index
                    if index != len(self.turns):
                        # Another process recorded turns in the session meanwhile
                        # (indexes count every computed turn): the session figures
                        # take them in, as the listings and exports do.
                        with contextlib.suppress(ChattermError):  # the turn is stored: figures can wait
                            self.turns = self.store.turn_metrics(self.session_id)
                stored = True
        except Exception as exc:  # noqa: BLE001 - chat goes on; the UI shows store_error
            log.debug("could not store turn", exc_info=True)
            self.store_error = f"session not saved: {exc}"
        # The store tells once that turns are no longer stored (read-only, disk full).
        self.store_error = self.store.take_write_notice() or self.store_error
        if stored:
            # The history is in SQLite: now the engine may keep the KV state it matches.
            self.engine.keep_conversation(self.session_id)
