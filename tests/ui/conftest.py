"""Fixtures for the Pilot tests: a workspace in tmp_path and an app on a FakeEngine."""

from __future__ import annotations

import asyncio
import time

import pytest
from fake_engine import FakeEngine

from chatterm.core.workspace import Workspace
from chatterm.ui.chat_view import TurnPhase
from chatterm.ui.launch import make_app


@pytest.fixture
def workspace(isolated_dirs, tmp_path) -> Workspace:
    return Workspace.load(db_path=tmp_path / "data" / "chatterm.db")


@pytest.fixture
def build(workspace):
    """build(replies=..., **make_app_kwargs) -> (app, engine)."""

    def _build(replies=(), *, engine_kwargs=None, load_gate=None, **kwargs):
        engines: list[FakeEngine] = []

        def factory(spec):
            engine = FakeEngine(spec, workspace.catalog.price(spec.price_profile), replies,
                                **(engine_kwargs or {}))
            engine.load_gate = load_gate
            engines.append(engine)
            return engine

        kwargs.setdefault("gpu_status", lambda: None)
        app = make_app(workspace, engine_factory=factory, **kwargs)
        return app, engines

    return _build


async def wait_for(pilot, predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until `predicate()` holds (never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
        await asyncio.sleep(0)


async def loaded(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.conversation is not None, what="the model to load")
    await pilot.pause()  # let the layout catch up with what loading filled in


async def send(pilot, text: str) -> None:
    """Type `text` into the prompt, press Enter, wait for the turn to end."""
    app = pilot.app
    before = len(app.conversation.turns)
    app.query_one("#prompt").focus()
    app.query_one("#prompt").insert(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: len(app.conversation.turns) > before and app.chat.phase is TurnPhase.IDLE,
                   what="the reply to finish")


async def wait_for_palette_hit(pilot, text: str) -> None:
    """Wait until the command palette's first (highlighted) hit contains `text`:
    the palette publishes hits in batches, so a fixed pause races it."""
    from textual.widgets import OptionList

    def first_hit_matches() -> bool:
        try:
            hits = pilot.app.screen.query_one(OptionList)
        except Exception:  # noqa: BLE001 - the palette is not open yet
            return False
        return hits.option_count > 0 and text.lower() in str(hits.get_option_at_index(0).prompt).lower()

    await wait_for(pilot, first_hit_matches, what=f"a palette hit for {text!r}")
