"""Reading a stored session to continue it in the app (`--resume`, F3).

Contract:
- `read_resume(store, workspace, session_id, model)` reads what the screen
  needs to show a session: its last `TAIL_TURNS` turns and its turn count.
  Older turns stay in the store; the conversation pane pages them in with
  `SessionStore.turns_page` as the user scrolls up, so opening a 5,000-turn
  session mounts what a 5-turn one does.
- `read_history(store, resume)` reads what continuing it needs: the history
  for the model and every turn's metrics (the dashboard's session figures).
  It reads the whole session, so the app runs it in a thread worker while the
  tail is already on screen.
- `resolve_resume(...)` is `make_app`'s rule for `--resume [ID]`: which session,
  and which model and persona it implies. Bad ids raise `ChattermError`.
- The rules for refusing, adopting or warning about a session's model and
  persona live here and only here in the UI (one `core/sessions.py` will take
  them over for the CLI and the UI alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatterm.core.engine import ChatMessage
from chatterm.core.errors import ChattermError
from chatterm.core.metrics import TurnMetrics
from chatterm.core.personas import Persona

if TYPE_CHECKING:
    from chatterm.core.store import SessionStore, TurnRecord
    from chatterm.core.workspace import Workspace

TAIL_TURNS = 6
"""Turns shown when a session opens: a screenful of ~250-word replies and some
more; older ones load as the user scrolls up."""


@dataclass
class Resume:
    """A stored session to continue, read before it is shown."""

    session_id: int
    tail: list["TurnRecord"]
    """The last turns, oldest first: what the screen shows at first."""
    turn_count: int
    history: list[ChatMessage] | None = None
    """What the model is given (None until `read_history`)."""
    turns: list[TurnMetrics] | None = None
    """Every turn's metrics, oldest first (None until `read_history`)."""

    @property
    def history_read(self) -> bool:
        return self.history is not None


def resumed_notice(resume: Resume) -> str:
    n = resume.turn_count
    return f"Resumed session {resume.session_id} ({n} turn{'' if n == 1 else 's'})."


def read_resume(
    store: "SessionStore", workspace: "Workspace", session_id: int, current_model: str | None
) -> tuple[Resume, Persona | None, str | None]:
    """Read a stored session: (resume data, its persona or None, a warning or None)."""
    info = store.session(session_id)
    tail = store.turns_page(session_id, None, TAIL_TURNS)
    warnings = []
    try:
        persona = workspace.personas.get(info.persona_id)
    except ChattermError:
        persona = None
        warnings.append(f"session {session_id} used persona {info.persona_id!r}, which no longer exists")
    if current_model is not None and info.model_id != current_model:
        warnings.append(f"session {session_id} was recorded with {info.model_id}; continuing with {current_model}")
    return Resume(session_id, tail, info.turns), persona, "; ".join(warnings) or None


def read_history(store: "SessionStore", resume: Resume) -> Resume:
    """Fill in `resume.history` and `resume.turns` (reads every stored turn)."""
    resume.turns = [record.metrics for record in store.turns(resume.session_id)]
    resume.history = store.history(resume.session_id)
    return resume


def resolve_resume(
    store: "SessionStore | None",
    workspace: "Workspace",
    resume: int | str,
    model_id: str | None,
    persona_id: str | None,
) -> tuple[int, str | None, str | None]:
    """`--resume` (a session id or "latest"): (session id, model id, persona id) to launch with."""
    if store is None:
        raise ChattermError("--resume needs the session database")
    session_id = store.latest_session_id() if resume == "latest" else int(resume)
    if session_id is None:
        raise ChattermError(f"no stored session to resume in {store.path}")
    info = store.session(session_id)  # unknown id: ChattermError naming it
    if model_id is None:
        if info.model_id not in workspace.catalog.models:
            raise ChattermError(
                f"session {session_id} used model {info.model_id!r}, which is not in the "
                "catalog; pass --model ID"
            )
        model_id = info.model_id
    if persona_id is None and info.persona_id in workspace.personas.personas:
        persona_id = info.persona_id
    return session_id, model_id, persona_id
