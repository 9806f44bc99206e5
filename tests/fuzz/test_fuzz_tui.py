"""Hostile text in the TUI stays literal: no escape reaches the terminal, no markup, link or action.

The real app runs under Pilot on the scripted engine (tests/ui/fake_engine.py),
with a real session store. Generated text — C0/C1 control characters, terminal
escape sequences (CSI, OSC 8 hyperlinks, bell), bidi overrides, Rich/Textual
markup (`[bold]`, `[link=...]`, `[@click=app.quit]`) — goes in as the model's
reply, an error message, the persona's name, the user's message and a stored
session's persona and model ids (the sessions screen). Afterwards:
- no segment the app renders carries a raw control character;
- each text is on screen literally (control characters as their visible
  symbols, `chatterm.core.metrics.format.printable`); the sessions table's cells hold
  the ids literally (wide cells scroll out of view);
- no segment in the conversation, title, dashboard or sessions table has a
  link or a click action (Markdown links in the reply included), and the app is still running (markup would have
  quit it or raised a MarkupError).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from pathlib import Path

from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st
from pilot_steps import send, wait_for
from textual.geometry import Region
from textual.widgets import DataTable

from chatterm.core.config import paths
from chatterm.core.metrics.format import printable
from chatterm.core.store.session_store import SessionStore
from chatterm.core.workspace import Workspace
from chatterm.ui.launch import make_app
from chatterm.ui.sessions_screen import SessionsScreen

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ui"))
from fake_engine import FakeEngine  # noqa: E402 - the scripted engine of the UI tests

SIZE = (200, 60)
PIECES = [
    "\x1b[31m", "\x1b[2J", "\x1b]8;;https://evil.example/\x1b\\", "\x1b]0;title\x07", "\x07", "\x00", "\x9b1m",
    "\x85", "\r", "\u202e", "\u2066", "\u200f", "\ufeff", "[bold red]", "[/]", "[link=https://evil.example]",
    "[/link]", "[@click=app.quit]", "[b]", "[reverse]", "[on red]", "$var", "\U0001f600",
]
# Markdown-neutral filler (the reply is rendered as Markdown: *, _, #, ` and friends
# are formatting there, not hostility).
FILLER = st.text(st.sampled_from("abcXYZ =:;.'\"@/[]"), min_size=1, max_size=5)
HOSTILE = st.lists(st.sampled_from(PIECES) | FILLER, min_size=1, max_size=6).map(
    lambda parts: "w" + "".join(parts) + "z"
)
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_run = itertools.count()


def squash(text: str) -> str:
    """Text without whitespace (wrapping may split a line anywhere)."""
    return "".join(text.split())


def segments(widget):
    width, height = widget.size
    for strip in widget.render_lines(Region(0, 0, width, height)):
        yield from strip


def screen_state(app, roots) -> tuple[str, list]:
    """(all text drawn by the screen's widgets, the segments under `roots`)."""
    texts, guarded = [], []
    for widget in app.screen.query("*"):
        if not widget.size.area:
            continue
        segs = list(segments(widget))
        texts.append("".join(seg.text for seg in segs))
        if any(widget is root or root in widget.ancestors for root in roots):
            guarded += segs
    return "\n".join(texts), guarded


def assert_inert(app, roots) -> str:
    text, guarded = screen_state(app, roots)
    assert not RAW_CONTROL.search(text), repr(RAW_CONTROL.search(text).group())
    for seg in guarded:
        style = seg.style
        if style is None:
            continue
        assert not style.link, (seg.text, style.link)
        assert "@click" not in (style.meta or {}), (seg.text, style.meta)
    return squash(text)


async def scenario(tmp_path: Path, reply: str, name: str, error: str, user: str, ids: tuple[str, str]) -> None:
    run = next(_run)
    personas = paths.user_personas_dir()
    personas.mkdir(parents=True, exist_ok=True)
    (personas / "hostile.toml").write_text(
        f"name = {json.dumps(name, ensure_ascii=False)}\nsystem_prompt = \"Be nice.\"\n".replace("\x7f", "\\u007f")
    )
    workspace = Workspace.load(db_path=tmp_path / f"run{run}.db")
    assert "hostile" in workspace.personas.personas, workspace.personas.errors
    store = SessionStore(workspace.db_path)
    store.create_session(model_id=ids[1], model_identity="x", engine="fake", device="cpu", persona_id=ids[0])
    engines: list[FakeEngine] = []

    def factory(spec):
        # Markdown links too: shown as text, never as a terminal hyperlink.
        markdown_links = "\n\n[click](https://evil.example/) <https://evil.example/a> https://evil.example/b"
        engine = FakeEngine(spec, workspace.catalog.price(spec.price_profile), [reply + markdown_links, "second"])
        engines.append(engine)
        return engine

    app = make_app(workspace, persona_id="hostile", store=store, engine_factory=factory, gpu_status=lambda: None)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.conversation is not None)
            await send(pilot, user)
            engines[0].fail_turn = error
            await send(pilot, "again")
            await pilot.pause()
            roots = [app.query_one("#conversation"), app.query_one("#title-bar"), app.query_one("#dashboard")]
            shown = assert_inert(app, roots)
            # The prompt turns line separators (NEL, U+2028) into line breaks like
            # str.splitlines does: the user's message is what the engine received.
            sent = engines[0].received[0][2]
            assert sent.splitlines() == user.splitlines()
            for text in (name, error, sent):
                # Line by line: a message's border is drawn between its lines.
                assert all(squash(line) in shown for line in printable(text).splitlines()), text
            # The reply is Markdown: a backslash escapes the next character ("␛\[" shows "␛[").
            unescaped = shown.replace("\\", "")
            assert all(squash(line).replace("\\", "") in unescaped for line in printable(reply).splitlines()), reply
            await pilot.press("f3")
            await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen))
            await pilot.pause()
            assert_inert(app, [app.screen])
            # Cells wider than the modal scroll sideways out of view: check the table's
            # cells themselves: the literal text, no style that could carry a link.
            table = app.screen.query_one(DataTable)
            rows = [table.get_row_at(i) for i in range(table.row_count)]
            columns = SessionsScreen.COLUMNS
            # The stored session: the oldest.
            persona_cell, model_cell = rows[-1][columns.index("persona")], rows[-1][columns.index("model")]
            assert (persona_cell.plain, model_cell.plain) == (printable(ids[0]), printable(ids[1]))
            assert not persona_cell.spans and not model_cell.spans and not persona_cell.style
            assert app.is_running
    finally:
        store.close()


def test_fixed_hostile_corpus_stays_literal(tmp_path):
    everything = "".join(PIECES)
    asyncio.run(scenario(
        tmp_path,
        reply=f"w{everything} [link=https://evil.example]click me[/link] z",
        name="Evil\x1b[31m[bold]Name\u202e[@click=app.quit]",
        error="server said \x1b]8;;https://evil.example/\x1b\\[b]boom[/b]\x07",
        user="user \x1b[2J [red]text[/red] \u2066",
        ids=("persona\x1b[31m[b]", "model[@click=app.quit]\x9b"),
    ))


@fuzz(4, deadline_s=60)
@given(reply=HOSTILE, name=HOSTILE, error=HOSTILE, user=HOSTILE, persona_id=HOSTILE, model_id=HOSTILE)
def test_generated_hostile_text_stays_literal(tmp_path, reply, name, error, user, persona_id, model_id):
    asyncio.run(scenario(tmp_path, reply, name, error, user.replace("\r", ""), (persona_id, model_id)))
