"""Showing a stored session to continue it in the app (`--resume`, F3).

Contract:
- Which session, model and persona a resume continues with is core.sessions'
  one rule (`plan_resume`), shared with `chatterm ask --session`; bad ids and
  refused sessions raise `ChattermError` with one line.
- `read_resume(store, workspace, session, model_id, persona_id)` plans the
  resume and reads what the screen needs first: the last `TAIL_TURNS` turns
  and the turn count. Older turns stay in the store; the conversation pane
  pages them in with `SessionStore.turns_page` as the user scrolls up, so
  opening a 5,000-turn session mounts what a 5-turn one does.
- `read_history(store, resume)` reads what continuing needs (the bounded
  history for the model and every turn's metrics); the app runs it in a
  thread worker while the tail is already on screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatterm.core.metrics.format import counted
from chatterm.core.store.resume import Continuation, SessionPlan, plan_resume, read_continuation

if TYPE_CHECKING:
    from chatterm.core.store.session_store import SessionStore, TurnRecord
    from chatterm.core.workspace import Workspace

TAIL_TURNS = 6
"""Turns shown when a session opens: a screenful of ~250-word replies and some
more; older ones load as the user scrolls up."""


@dataclass
class Resume:
    """A stored session to continue, read before it is shown."""

    plan: SessionPlan
    tail: list["TurnRecord"]
    """The last turns, oldest first: what the screen shows at first."""
    continuation: Continuation | None = None
    """History and metrics (None until `read_history`)."""

    @property
    def session_id(self) -> int:
        return self.plan.session_id

    @property
    def turns_text(self) -> str:
        """The exchanges on screen, and those on other branches: `2 turns`,
        `1 turn, 1 more on other branches` (the listings' "1 +1")."""
        info = self.plan.info
        other = info.turns - info.path_turns
        more = f", {other} more on other branches" if other > 0 else ""
        return counted(info.path_turns, "turn") + more


def turns_phrase(resume: Resume) -> str:
    """`session 3, 2 turns`."""
    return f"session {resume.session_id}, {resume.turns_text}"


def resumed_notice(resume: Resume) -> str:
    return f"Resumed session {resume.session_id} ({resume.turns_text})."


def read_resume(
    store: "SessionStore",
    workspace: "Workspace",
    session: int | str,
    model_id: str | None,
    persona_id: str | None = None,
) -> Resume:
    """Plan a resume (`session`: an id or "latest") and read its tail."""
    plan = plan_resume(store, workspace, session, model_id=model_id, persona_id=persona_id)
    return Resume(plan, store.turns_page(plan.session_id, None, TAIL_TURNS))


def read_history(store: "SessionStore", resume: Resume) -> Resume:
    """Fill in `resume.continuation` (reads from the store: run it in a worker)."""
    resume.continuation = read_continuation(store, resume.plan)
    return resume
