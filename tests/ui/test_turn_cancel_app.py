"""Esc while a turn waits for a first-use persona prefill, in the real app on the real
default model (Pilot): the turn stops while the prefill still runs, claims no cache
outcome, and the prefill goes on to be reused by the next turn."""

from __future__ import annotations

import threading

from pilot_steps import loaded, wait_for

from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.workspace import Workspace
from chatterm.ui.chat_view import TurnPhase
from chatterm.ui.launch import make_app
from chatterm.ui.transcript import AssistantReply


def gate_persona_prefill(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """(in progress, release): the real persona prefill is held after its first
    batch until `release` is set, so "it is still running" is a fact, not a race."""
    in_progress, release = threading.Event(), threading.Event()
    prepare = LocalEngine.prepare_persona

    def gated(self, persona, progress=None):
        def held(p):
            in_progress.set()
            release.wait(timeout=300)
            if progress is not None:
                progress(p)

        return prepare(self, persona, held)

    monkeypatch.setattr(LocalEngine, "prepare_persona", gated)
    return in_progress, release


async def test_esc_while_waiting_for_the_persona_prefill_stops_at_once(isolated_dirs, tmp_path, monkeypatch):
    in_progress, release = gate_persona_prefill(monkeypatch)
    workspace = Workspace.load(db_path=tmp_path / "data" / "chatterm.db")  # nothing cached
    app = make_app(workspace, persona_id="shop-support", gpu_status=lambda: None)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot)
            await wait_for(pilot, in_progress.is_set, timeout=120, what="the persona prefill")
            prompt = app.query_one("#prompt")
            prompt.focus()
            prompt.insert("Do you sell tents?")
            await pilot.press("enter")
            assert app.chat.phase is TurnPhase.STREAMING
            await pilot.press("escape")
            await wait_for(pilot, lambda: len(app.conversation.turns) == 1 and app.chat.phase is TurnPhase.IDLE,
                           timeout=30, what="the stopped turn")
            assert app.chat.prefix_pending and not release.is_set()  # the prefill is still held
            m = app.conversation.turns[0]
            assert m.stop_reason == "cancelled" and m.cache_outcome == "none"
            footer = app.query_one(AssistantReply).footer_text
            assert "stopped while waiting" in footer and "prefill" not in footer

            release.set()
            await wait_for(pilot, lambda: not app.chat.prefix_pending, timeout=120, what="the persona prefix")
            assert app.session.persona_state.startswith("prefilled cold")
            prompt.insert("Do you sell tents?")
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(app.conversation.turns) == 2 and app.chat.phase is TurnPhase.IDLE,
                           timeout=120, what="the second reply")
            second = app.conversation.turns[1]
            assert second.cache_outcome == "switch" and second.cached_tokens > 1000
    finally:
        release.set()
