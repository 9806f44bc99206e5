"""Continuing a stored session: the one rule, for every way back in.

Contract:
- `plan_resume(store, workspace, session, model_id=, persona_id=)` decides what a
  stored session continues with; `chatterm ask --session` / `--fork`,
  `chatterm launch --resume` and the TUI's sessions screen all call it.
  "latest" is the first session `chatterm sessions` lists (newest activity,
  `SessionStore.latest_session_id`). The rule:
  * a session continues with its own persona. A different persona asked for
    explicitly, or a persona that no longer exists, is refused with one line
    naming both (the persona's system prompt is part of the conversation);
  * it continues on the model asked for (a flag, or the model the TUI has
    loaded), else on its own model, which must then still be in the catalog.
    Another model than the recorded one works (the history is text) and gives
    a warning that the recorded model's cached states carry over only to the
    same file and KV settings.
- `resume_conversation(plan, store, engine)` gives back a `Conversation` that
  carries on the session: its id, its turns' metrics (every computed turn,
  for the session figures) and the history sent to the model: the session's
  current path (`read_continuation`, which a UI may run in a worker first).
  Only the newest turns that could fit the model's context are read with
  their texts (`max_history_turns`), so opening a session costs the same
  whatever its length; the engine then trims to the exact budget.
- Which stored turns join the history is `conversation.turn_messages`, the same rule the
  live `Conversation` applies when a turn ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chatterm.core.config.catalog import ModelSpec
from chatterm.core.config.personas import Persona
from chatterm.core.engine.conversation import Conversation, EnergyMeter, turn_messages
from chatterm.core.engine.interface import ChatMessage, Engine
from chatterm.core.metrics.turn_metrics import TurnMetrics
from chatterm.core.store.session_store import SessionInfo, SessionStore, TurnRecord
from chatterm.errors import ChattermError

if TYPE_CHECKING:
    from chatterm.core.workspace import Workspace

MIN_TOKENS_PER_TURN = 8
"""A stored turn costs at least this many prompt tokens (two messages with their
role markers), so no more than n_ctx / 8 turns can ever fit a context."""


@dataclass
class SessionPlan:
    """What a stored session continues with."""

    info: SessionInfo
    spec: ModelSpec
    persona: Persona
    warnings: list[str] = field(default_factory=list)

    @property
    def session_id(self) -> int:
        return self.info.id


def plan_resume(
    store: SessionStore,
    workspace: "Workspace",
    session: int | str,
    *,
    model_id: str | None = None,
    persona_id: str | None = None,
) -> SessionPlan:
    """Apply the rule (see the module contract). `session` is an id or "latest"."""
    if session == "latest":
        session_id = store.latest_session_id()
        if session_id is None:
            raise ChattermError(f"no stored session to resume in {store.path}")
    else:
        session_id = int(session)
    info = store.session(session_id)  # unknown id: ChattermError naming it
    if persona_id is not None and persona_id != info.persona_id:
        raise ChattermError(
            f"session {session_id} is a conversation with persona {info.persona_id!r}, not {persona_id!r}"
        )
    if info.persona_id not in workspace.personas.personas:
        raise ChattermError(
            f"session {session_id} used persona {info.persona_id!r}, which no longer exists "
            f"(personas: {', '.join(sorted(workspace.personas.personas))})"
        )
    persona = workspace.personas.get(info.persona_id)
    warnings = []
    if model_id is None:
        if info.model_id not in workspace.catalog.models:
            raise ChattermError(
                f"session {session_id} used model {info.model_id!r}, which is not in the "
                "catalog; pass --model ID"
            )
        model_id = info.model_id
    elif model_id != info.model_id:
        # Said before the turn: another file or KV type prefills the whole
        # history again (`PromptCache.lookup` shares states only where they match).
        warnings.append(f"session {session_id} was recorded with {info.model_id}; continuing with {model_id} "
                        f"({info.model_id}'s cached states carry over only to the same file and KV settings)")
    return SessionPlan(info, workspace.catalog.get(model_id), persona, warnings)


def max_history_turns(spec: ModelSpec) -> int:
    """The most stored turns that could fit the model's context."""
    return max(spec.n_ctx // MIN_TOKENS_PER_TURN, 1)


def history_of(records: list[TurnRecord]) -> list[ChatMessage]:
    """The messages the stored turns contribute to the model's history."""
    messages: list[ChatMessage] = []
    for record in records:
        messages += turn_messages(record.user_text, record.reply, record.metrics, record.reply_tokens)
    return messages


@dataclass
class Continuation:
    """What carrying on a session needs from the store."""

    history: list[ChatMessage]
    """The newest turns that could fit the context, as messages for the model."""
    turns: list[TurnMetrics]
    """Every turn's metrics, oldest first (the session figures)."""
    leaf: int = 0
    """The turn the history ends at (0: none), the next turn's parent."""


def read_continuation(store: SessionStore, plan: SessionPlan) -> Continuation:
    """Read the history and metrics of a planned session (bounded, see the contract)."""
    records = store.turns_page(plan.session_id, None, max_history_turns(plan.spec))
    return Continuation(history_of(records), store.turn_metrics(plan.session_id),
                        records[-1].index if records else 0)


def resume_conversation(
    plan: SessionPlan,
    store: SessionStore,
    engine: Engine,
    *,
    energy: EnergyMeter | None = None,
    continuation: Continuation | None = None,
) -> Conversation:
    """A Conversation that carries on the planned session on `engine`
    (`continuation`: already read, e.g. by a UI worker)."""
    continuation = continuation or read_continuation(store, plan)
    return Conversation(
        engine,
        plan.persona,
        store=store,
        session_id=plan.session_id,
        history=continuation.history,
        turns=continuation.turns,
        energy=energy,
        path_turns=plan.info.path_turns,
        leaf=continuation.leaf,
    )
