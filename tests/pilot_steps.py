"""Steps the Pilot tests share (tests/ui, the TUI fuzz test): wait for a
condition, for the model, for a reply or a palette hit. A module of its own, not conftest: `from conftest import`
resolves to whichever conftest.py was imported last, so a subset of the suite
could fail to collect."""

from __future__ import annotations

import asyncio
import time

from chatterm.ui.chat_view import TurnPhase


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
