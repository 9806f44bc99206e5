"""Pilot tests of `chatterm launch`'s app on a scripted engine (layout and behaviour).

The engine is fake (tests/ui/fake_engine.py); the store, the settings file,
the theme files and the export are real files in tmp_path.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from pilot_steps import loaded, send, wait_for, wait_for_palette_hit
from textual.geometry import Region
from textual.widgets import DataTable, Footer, Markdown, OptionList, Static
from textual.widgets._footer import FooterKey  # the keys' regions: what fits on screen

from chatterm.core.engine.interface import EngineCapabilities
from chatterm.core.metrics.format import home_short
from chatterm.core.metrics.timeline import PART_GLYPHS
from chatterm.core.metrics.turn_metrics import TurnMetrics
from chatterm.core.store.session_store import SessionStore
from chatterm.errors import ChattermError
from chatterm.ui.app import ChatApp
from chatterm.ui.chat_view import TurnPhase
from chatterm.ui.dashboard import BAR_WIDTH, Dashboard
from chatterm.ui.prompt import PLACEHOLDERS
from chatterm.ui.rows import LABEL_WIDTH
from chatterm.ui.screens import HELP_KEYS, HelpScreen, PersonaPicker
from chatterm.ui.sessions_screen import SessionsScreen
from chatterm.ui.transcript import AssistantReply, ConversationView, Notice, UserMessage

SIZE = (120, 40)


def rendered(widget) -> str:
    """The text a widget draws on screen (what the user sees, styles dropped)."""
    width, height = widget.size
    return "\n".join(strip.text for strip in widget.render_lines(Region(0, 0, width, height)))


def strips(widget):
    width, height = widget.size
    return widget.render_lines(Region(0, 0, width, height))


def reply_text(reply) -> str:
    """What a reply shows of its text: finished blocks and the block still streaming."""
    return reply.body_text


def all_text(app) -> str:
    return "\n".join(rendered(w) for w in app.screen.query(Static) if w.size.area)


@pytest.mark.parametrize("columns", [40, 60])
async def test_a_narrow_reply_footer_breaks_only_between_its_figures(build, columns):
    """At 80 columns "cold prefill 161 ms" was split before its "ms"."""
    from chatterm.core.metrics.format import SEP, footer_parts

    app, _ = build(["Fine."], store=None)
    async with app.run_test(size=(columns, 24)) as pilot:
        await loaded(pilot)
        await send(pilot, "Hi")
        reply = app.query_one(AssistantReply)
        parts = footer_parts(app.conversation.turns[0])
        lines = [line.strip() for line in reply.footer_text.splitlines()]
        assert len(lines) > 1  # too long for one line at these widths
        assert SEP.join(lines) == SEP.join(parts)
        assert all(line.split(SEP)[0] in parts and line.split(SEP)[-1] in parts for line in lines)


async def test_reply_streams_and_dashboard_fills(build):
    app, engines = build(["Hello **there**, general Kenobi.\n\n- one\n- two"], store=None)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hi")
        engine = engines[0]
        assert engine.received[0][2] == "Hi"
        reply = app.query_one(AssistantReply)
        body = reply.body_text
        assert "Hello there, general Kenobi." in body and "• one" in body
        # Collapsed: no Markdown widget tree stays behind once the reply ended.
        assert not reply.query(Markdown)
        footer = reply.footer_text
        assert "TTFT" in footer and "tok/s" in footer and "(30 cached)" in footer
        assert "restored 12 ms" in footer
        m = app.conversation.turns[0]
        dash = app.query_one(Dashboard)
        turn_text = rendered(dash.query_one("#dash-turn"))
        assert f"generated   {m.generated_tokens}" in turn_text
        assert "restored 12 ms" in turn_text and "done" in turn_text
        session_text = rendered(dash.query_one("#dash-session"))
        assert "turns       1" in session_text and "TTFT p50" in session_text
        model_text = rendered(dash.query_one("#dash-model"))
        assert "Fake CPU 9000" in model_text
        # The context figure is the headline's, and it describes this conversation.
        now_text = rendered(dash.query_one("#dash-now"))
        assert f"{m.prompt_tokens + m.generated_tokens:,} / 8,192" in now_text
        assert "GPU mem     n/a" in model_text
        assert [msg.role for msg in app.conversation.history] == ["user", "assistant"]
        # A second turn carries the history to the engine.
        await send(pilot, "And?")
        assert [msg.content for msg in engine.received[1][1]][0] == "Hi"
        assert "turns       2" in rendered(dash.query_one("#dash-session"))


async def test_a_paste_ending_in_a_line_break_is_sent_without_it(build):
    app, engines = build(store=None)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "  indented first line\nsecond line\n\n  ")
        assert engines[0].received[0][2] == "  indented first line\nsecond line"
        assert app.query(UserMessage).last().text == "  indented first line\nsecond line"


async def test_dashboard_values_wrap_under_the_value_and_are_never_cut(build):
    app, _ = build(["Fine."], store=None)
    async with app.run_test(size=(150, 45)) as pilot:
        await loaded(pilot)
        await send(pilot, "Hi")
        dash = app.query_one(Dashboard)
        state = "prefilled cold in 1,726 ms (54 tokens) — state saved for next time, with more words to wrap"
        dash.show_persona("A persona with a name long enough to wrap in the panel", state)
        await pilot.pause()
        lines = rendered(dash.query_one("#dash-persona")).splitlines()
        assert len(lines) > 2 and lines[0].startswith("persona     A persona")
        label_width = len("persona     ")
        for line in lines:  # a continuation line starts under the value, never at the left edge
            label, value = line[:label_width], line[label_width:]
            assert label.strip() in ("", "persona", "prefix") and value.strip(), line
        words = " ".join(line[label_width:].strip() for line in lines).split()
        assert words == ("A persona with a name long enough to wrap in the panel " + state).split()
        # With the scrollbar shown, a long value still wraps under itself instead of being cut.
        assert dash.show_vertical_scrollbar
        costs = "in 6.70 ms · out 18.9 ms · 2.8x · and a few more words that cannot fit on one line"
        dash.show_persona("Assistant", costs)
        await pilot.pause()
        shown = rendered(dash.query_one("#dash-persona")).splitlines()[1:]
        assert shown[0].startswith("prefix      in 6.70 ms") and len(shown) > 1
        assert " ".join(line[label_width:].strip() for line in shown) == costs


@pytest.mark.parametrize("used, alone, shown", [
    (6_000, False, "6,000 / 8,192 · 73 %"),
    (7_900, False, "7,900 / 8,192 · 96 % · nearly full: the oldest turns leave next"),
    # A reply that ran to the end of the context: not "100 % · nearly full".
    (8_192, False, "8,192 / 8,192 · full: the oldest turns leave next"),
    # A persona larger than the model's context: not "231 %", nor "nearly full".
    (18_944, True, "18,944 / 8,192 · more than the context holds"),
    (8_192, True, "8,192 / 8,192 · more than the context holds"),  # no room left for a turn: no "full"
    # Turns counted on a model with a larger context: they are cut to fit, no error.
    (9_000, False, "9,000 / 8,192 · full: the oldest turns leave next"),
])
async def test_the_context_headline_says_how_full_and_when_a_persona_does_not_fit(build, used, alone, shown):
    app, _ = build(store=None)
    async with app.run_test(size=(150, 45)) as pilot:
        await loaded(pilot)
        dash = app.query_one(Dashboard)
        dash.show_context(used, persona_alone=alone)
        await pilot.pause()
        assert " ".join(rendered(dash.query_one("#dash-now")).split()).startswith("context " + shown)


async def test_history_sparklines_are_to_scale_from_zero(build):
    app, _ = build(store=None)
    async with app.run_test(size=(150, 45)) as pilot:
        await loaded(pilot)
        # TTFTs 16 % apart and decode rates of 20, 30 and 40 tok/s.
        turns = [TurnMetrics(engine="local", model_id="m", persona_id="assistant", submitted_at=1.7e9 + i,
                             ttft_ms=ttft, generated_tokens=tokens, decode_ms=1000.0)
                 for i, (ttft, tokens) in enumerate([(189.0, 21), (199.0, 41), (219.0, 31)])]
        dash = app.query_one(Dashboard)
        dash.show_session(turns, len(turns))
        await pilot.pause()
        ttft = rendered(dash.query_one("#spark-ttft")).strip()
        rate = rendered(dash.query_one("#spark-rate")).strip()
        # Scaled from the lowest value these read ▁▃█ and ▁█▄: near-equal TTFTs
        # looked tenfold apart. From zero, 189 and 199 ms are nearly full bars,
        # and 20 tok/s is half the height of 40.
        assert set(ttft) == {"▇", "█"} and ttft.startswith("▇") and ttft.endswith("█")
        assert rate.startswith("▄") and "█" in rate and rate.endswith("▆") and "▁" not in rate


async def test_turns_are_stored_and_exported_with_the_key(build, workspace, isolated_dirs):
    store = SessionStore(workspace.db_path)
    app, _ = build(["Stored reply."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Keep this")
        session_id = app.conversation.session_id
        assert session_id is not None
        assert [r.user_text for r in store.turns(session_id)] == ["Keep this"]
        await pilot.press("ctrl+s")
        target = isolated_dirs["CHATTERM_DATA_DIR"] / "exports" / f"session-{session_id}.md"
        await wait_for(pilot, target.exists, what="the export file")
        # The file's name on a line of its own (a toast wraps a long path anywhere).
        shown = f"{target.name}\nin {home_short(target.parent)}"
        await wait_for(pilot, lambda: any(n.message == shown for n in app._notifications),
                       what="the export notification")
        assert "Keep this" in target.read_text()
        # Again: the same file, replaced, and the toast says so.
        await pilot.press("ctrl+s")
        again = f"{target.name} (replacing the earlier export)\nin {home_short(target.parent)}"
        await wait_for(pilot, lambda: any(n.message == again for n in app._notifications),
                       what="the second export's notification")
    store.close()


async def test_escape_stops_a_reply_and_keeps_the_partial_text(build):
    app, engines = build(["one two three four five six seven eight"])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        engines[0].hold_after = 3
        app.query_one("#prompt").insert("count")
        await pilot.press("enter")
        await wait_for(pilot, engines[0].held.is_set, what="the stream to be held")
        await pilot.press("escape")
        engines[0].gate.set()
        await wait_for(pilot, lambda: app.conversation.turns and app.chat.phase is TurnPhase.IDLE,
                       what="the stopped turn")
        m = app.conversation.turns[0]
        assert m.stop_reason == "cancelled" and m.generated_tokens == 3
        reply = app.query_one(AssistantReply)
        assert reply.has_class("-stopped")
        assert "one two three" in reply.body_text
        assert "four" not in reply.body_text
        assert "stopped" in reply.footer_text
        # The partial reply is part of the history the next turn sees.
        assert app.conversation.history[-1].content == "one two three"


async def test_persona_switch_starts_a_new_conversation_and_shows_restore(build):
    app, engines = build(["First reply."])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_for(pilot, lambda: engines[0].prepared == ["assistant"], what="the first prepare")
        await send(pilot, "Hello")
        old = app.conversation
        scans = engines[0].cache_scans
        engines[0].cached["shop-support"] = "ram"
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, PersonaPicker), what="the picker")
        assert engines[0].cache_scans == scans + 1  # one look at the cache for every persona
        picker = app.screen
        assert isinstance(picker, PersonaPicker)
        options = picker.query_one(OptionList)
        texts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        # The current persona's prefix is in the context: in use, not something to load from disk.
        assert any("Assistant" in t and "KV state in use (a copy on disk)" in t for t in texts)
        assert any("Terse coder" in t and "not cached" in t for t in texts)
        assert any("shop-support" in t and "KV state cached in RAM" in t for t in texts)
        index = next(i for i, t in enumerate(texts) if "terse-coder" in t)
        options.highlighted = index
        engines[0].capabilities = EngineCapabilities(persona_cache=True)  # the status names the tier
        engines[0].cached["terse-coder"] = "ram"
        engines[0].prepare_gate = gate = threading.Event()
        await pilot.press("enter")
        status = app.query_one("#status", Static)
        await wait_for(pilot, lambda: "restoring Terse coder from memory…" in str(status.content),
                       what="the status naming the RAM tier")
        gate.set()
        await wait_for(pilot, lambda: engines[0].prepared[-1:] == ["terse-coder"], what="the prepare")
        await wait_for(pilot, lambda: "restored from disk" in rendered(app.query_one("#dash-persona")),
                       what="the persona line")
        assert app.persona.id == "terse-coder"
        assert app.conversation is not old and app.conversation.turns == []
        assert not app.query(UserMessage)
        assert "New conversation with Terse coder" in rendered(app.query_one(Notice))
        persona_text = rendered(app.query_one("#dash-persona"))
        assert "Terse coder" in persona_text and "12 ms" in persona_text
        assert "turns       0" in rendered(app.query_one("#dash-session"))
        await send(pilot, "Code?")
        assert engines[0].received[-1][0] == "terse-coder" and engines[0].received[-1][1] == []
        # The cache folder is scanned in worker threads, never on the UI thread.
        assert engines[0].cache_scan_threads and threading.main_thread() not in engines[0].cache_scan_threads


async def test_theme_switch_through_the_palette_is_remembered(build, isolated_dirs):
    settings = isolated_dirs["CHATTERM_CONFIG_DIR"] / "settings.toml"
    settings.parent.mkdir(parents=True)
    settings.write_text('[other]\nkeep = "me"\n')
    app, _ = build()
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "chatterm-dark"
        background_before = app.screen.styles.background
        await pilot.press("ctrl+p")
        await pilot.press(*"theme")
        await wait_for_palette_hit(pilot, "theme")
        await pilot.press("enter")
        await pilot.pause(0.3)  # the theme picker replaces the palette's list
        await pilot.press(*"chatterm-light")
        await wait_for_palette_hit(pilot, "chatterm-light")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.theme == "chatterm-light", what="the theme to change")
        await pilot.pause(0.1)
        assert app.screen.styles.background != background_before
    text = settings.read_text()
    assert 'theme = "chatterm-light"' in text and 'keep = "me"' in text
    again, _ = build()
    assert again.theme == "chatterm-light"
    # An explicit --theme wins for that run (and is not saved).
    explicit, _ = build(theme="chatterm-high-contrast")
    assert explicit.theme == "chatterm-high-contrast"


def startup_problems(app) -> list[str]:
    """The configuration problems found at start, as the conversation shows
    them (where they stay to be read); one toast says they are there."""
    shown = [str(n.render()) for n in app.query(Notice) if n.has_class("-warning")]
    toasts = [n.message for n in app._notifications]
    assert sum("configuration problem" in t and "shown in the conversation" in t for t in toasts) == 1, toasts
    assert not any(problem in toasts for problem in shown)  # not stacked as toasts too
    return shown


async def test_broken_theme_file_is_reported_once_and_skipped(build, isolated_dirs):
    folder = isolated_dirs["CHATTERM_CONFIG_DIR"] / "themes"
    folder.mkdir(parents=True)
    # A file name is anyone's text: its escape sequence is shown, not sent to the terminal.
    (folder / "bad\x1b[31m.toml").write_text('name = "bad"\nprimary = "#12345G"\n')
    (folder / "mine.toml").write_text('name = "mine"\nprimary = "#FF8800"\ndark = false\n')
    app, _ = build()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        messages = startup_problems(app)
        assert sum("skipped: " in m and "bad␛[31m.toml" in m for m in messages) == 1
        assert not any("\x1b" in m for m in messages)
        assert "bad" not in app.available_themes and "mine" in app.available_themes
        app.theme = "mine"
        await pilot.pause(0.1)
    # Asked for by name, the skipped theme gives its file's reason, not "unknown theme".
    with pytest.raises(ChattermError, match=r"bad\x1b\[31m\.toml: primary = '#12345G' is not a colour"):
        build(theme="bad")
    with pytest.raises(ChattermError, match="unknown theme 'nosuch'"):
        build(theme="nosuch")


async def test_broken_persona_file_is_reported_once_and_skipped(isolated_dirs, tmp_path):
    from fake_engine import FakeEngine

    from chatterm.core.workspace import Workspace
    from chatterm.ui.launch import make_app

    folder = isolated_dirs["CHATTERM_CONFIG_DIR"] / "personas"
    folder.mkdir(parents=True)
    (folder / "broken.toml").write_text('system_prompt = "x"\n[sampling]\ntemperature = "hot"\n')
    ws = Workspace.load(db_path=tmp_path / "db.sqlite")
    app = make_app(ws, gpu_status=lambda: None,
                   engine_factory=lambda spec: FakeEngine(spec, ws.catalog.price(spec.price_profile)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        messages = startup_problems(app)
        assert sum("skipped: " in m and "broken.toml" in m and "temperature" in m for m in messages) == 1
        assert "broken" not in ws.personas.personas and "assistant" in ws.personas.personas


async def test_a_persona_too_large_for_the_model_is_said_at_the_switch(workspace):
    """On the real default model at n_ctx 1,024: the switch to shop-support said
    "ready" and showed the old persona's context, and the first message failed
    inside llama_decode."""
    from dataclasses import replace

    from chatterm.ui.launch import make_app

    small = replace(workspace.catalog.get(None), id="small", n_ctx=1024)
    workspace.catalog.models[small.id] = small
    app = make_app(workspace, model_id="small", gpu_status=lambda: None, store=None)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("f2")  # F2 says so before it is chosen
        await wait_for(pilot, lambda: isinstance(app.screen, PersonaPicker), what="the persona picker")
        await pilot.pause()
        listed = " ".join(rendered(app.screen.query_one(OptionList)).replace("▊", " ").split())
        assert "Shop support (shop-support) does not fit this model: 2,3" in listed, listed
        assert "tokens: more than the 1,024-token context holds" in listed
        assert listed.count("does not fit this model") == 1
        await pilot.press("escape")
        app.session.switch_persona("shop-support")
        await wait_for(pilot, lambda: app.session.persona_state.startswith("not prepared"), timeout=30,
                       what="the persona's refusal")
        await pilot.pause(0.2)
        size = f"{len(app.conversation.engine.prefix_tokens(app.session.persona)):,}"
        assert f"persona 'shop-support' is {size} tokens" in app.session.persona_state
        now = " ".join(rendered(app.query_one(Dashboard).query_one("#dash-now")).split())
        assert now.startswith(f"context {size} / 1,024 · more than the context holds"), now
        assert "ready" not in str(app.query_one("#status").render())
        await pilot.press("ctrl+n")  # a new conversation with it said "ready" again
        await pilot.pause(0.3)
        assert str(app.query_one("#status").render()) == "the persona is not prepared: see the dashboard"


async def test_a_broken_models_toml_entry_is_said_to_be_skipped(isolated_dirs, tmp_path):
    from fake_engine import FakeEngine

    from chatterm.core.workspace import Workspace
    from chatterm.ui.launch import make_app

    models = isolated_dirs["CHATTERM_CONFIG_DIR"] / "models.toml"
    models.parent.mkdir(parents=True, exist_ok=True)
    models.write_text('[models.mine]\nsource = "mine.gguf"\nn_ctx = "big"\n')
    ws = Workspace.load(db_path=tmp_path / "db.sqlite")
    app = make_app(ws, gpu_status=lambda: None,
                   engine_factory=lambda spec: FakeEngine(spec, ws.catalog.price(spec.price_profile)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        (message,) = [m for m in startup_problems(app) if "models.toml" in m]
        assert "skipped: " in message and "[models.mine]" in message and "n_ctx" in message


async def test_ctrl_n_mid_reply_stores_the_stopped_turn_and_shows_none_of_its_figures(build, workspace):
    """The stopped turn's end used to be drawn after the new conversation was
    shown: its TTFT, context and Turn section stayed on the new one's dashboard."""
    import threading

    from chatterm.core.store.session_store import SessionStore

    with SessionStore(workspace.db_path) as store:
        app, engines = build(["one two three four five six seven eight"], store=store)
        async with app.run_test(size=(SIZE[0] + 40, SIZE[1])) as pilot:
            await loaded(pilot)
            engines[0].hold_after = 3
            app.query_one("#prompt").insert("count")
            await pilot.press("enter")
            await wait_for(pilot, engines[0].held.is_set, what="the stream to be held")
            # From a thread, once Ctrl+N has begun (a Pilot pause would wait for
            # that handler, which waits for this turn to end).
            threading.Timer(0.3, engines[0].gate.set).start()
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: app.chat.phase is TurnPhase.IDLE and not app.query(AssistantReply),
                           what="the new conversation")
            await pilot.pause(0.3)
            turn_text = rendered(app.query_one(Dashboard).query_one("#dash-turn"))
            assert "no turn yet" in turn_text and "generated" not in turn_text
            (session,) = store.sessions()
            (record,) = store.turns(session.id)
            assert record.user_text == "count" and record.metrics.stop_reason == "cancelled"


MARKUP = (
    "[bold]not bold[/] and [/] and [link=https://example.com]not a link[/link] "
    "[@click=app.quit]quit[/] \x1b[31mnot red\x1b[0m end"
)


async def test_markup_and_escapes_in_model_output_are_literal(build):
    app, engines = build([MARKUP, MARKUP])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        # Held mid-stream: the live reply shows it literally too.
        engines[0].hold_after = 6
        app.query_one("#prompt").insert("[bold]user[/] [/]")
        await pilot.press("enter")
        await wait_for(pilot, engines[0].held.is_set, what="the stream to be held")
        await wait_for(pilot, lambda: "[/] and" in reply_text(app.query_one(AssistantReply)),
                       what="streamed text")
        engines[0].gate.set()
        await wait_for(pilot, lambda: app.conversation.turns and app.chat.phase is TurnPhase.IDLE, what="the turn")
        assert app.is_running
        body = app.query_one(AssistantReply)  # drawn as the user sees it: name, text, footer
        text = " ".join(rendered(body).split())  # undo the wrapping
        assert "[bold]not bold[/] and [/]" in text
        assert "[link=https://example.com]not a link[/link]" in text
        assert "[@click=app.quit]quit[/]" in text
        assert "␛[31mnot red␛[0m" in text and "\x1b" not in text
        for strip in strips(body):
            for segment in strip:
                style = segment.style
                assert style is None or (not style.link and "@click" not in (style.meta or {}))
        assert "[bold]user[/] [/]" in rendered(app.query_one(UserMessage))
        # Stored and shown again after a persona-less restart: still literal.
        await send(pilot, "again")
        assert app.is_running


async def test_engine_errors_are_shown_not_raised(build):
    app, engines = build(engine_kwargs={"fail_load": "model [/] file [bold]broken[/bold]: bad magic"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session.engine_error is not None, what="the load failure")
        await pilot.pause(0.05)
        assert any("model [/] file [bold]broken[/bold]: bad magic" in rendered(n) for n in app.query(Notice))
        assert any("bad magic" in n.message for n in app._notifications)
        app.query_one("#prompt").insert("hello?")
        await pilot.press("enter")
        await pilot.pause(0.05)
        assert app.is_running and not app.query(UserMessage)
        assert app.query_one("#prompt").text == "hello?"  # kept for later


async def test_generation_error_appears_in_the_conversation(build):
    app, engines = build()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        engines[0].fail_turn = "context [/] exploded"
        await send(pilot, "boom")
        m = app.conversation.turns[0]
        assert m.stop_reason == "error"
        errors = [rendered(n) for n in app.query(Notice) if n.has_class("-error")]
        assert any("Generation failed: context [/] exploded" in e for e in errors)
        assert app.query_one(AssistantReply).has_class("-error")
        engines[0].fail_turn = None
        await send(pilot, "better?")
        assert app.conversation.turns[1].stop_reason == "eos"


async def test_turn_notices_are_shown_above_the_reply_while_it_streams(build):
    """They describe the prompt, and were shown under the reply once it had ended."""
    app, engines = build(["one two three four five six"])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        engine = engines[0]
        engine.turn_notices = ["Context full (8192 tokens): dropped the oldest 2 turns from the prompt."]
        engine.hold_after = 2
        app.query_one("#prompt").insert("hi")
        await pilot.press("enter")
        await wait_for(pilot, engine.held.is_set, what="the reply held mid-stream")

        def order() -> list[str]:
            shown = [type(w).__name__ for w in app.query_one("#conversation").children
                     if isinstance(w, (UserMessage, Notice, AssistantReply))]
            return shown[shown.index("UserMessage"):] if "UserMessage" in shown else shown

        await wait_for(pilot, lambda: order() == ["UserMessage", "Notice", "AssistantReply"],
                       what=f"the notice above the streaming reply ({order()})")
        engine.gate.set()
        await wait_for(pilot, lambda: app.conversation.turns, what="the turn's end")
        await pilot.pause(0.1)
        assert order() == ["UserMessage", "Notice", "AssistantReply"]  # shown once
        assert "dropped the oldest 2 turns" in rendered(list(app.query(Notice))[-1])


async def test_empty_message_is_ignored_and_huge_paste_is_accepted(build):
    app, engines = build()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.query_one("#prompt").insert("   \n  ")
        await pilot.press("enter")
        await pilot.pause(0.05)
        assert not app.query(UserMessage) and engines[0].received == []
        app.query_one("#prompt").clear()
        huge = ("word " * 20_000)[:100_000]
        app.query_one("#prompt").insert(huge)
        await send(pilot, "!")
        assert engines[0].received[0][2] == huge + "!"
        message = app.query_one(UserMessage)
        shown = rendered(message)
        # Its beginning and its end: the question typed after a paste stays in view.
        assert "characters not shown (x or click: show all)" in shown
        assert shown.rstrip().endswith("!")
        message.scroll_visible(top=True, animate=False)
        await pilot.pause()
        await pilot.click(UserMessage)
        assert message.expanded and "not shown" not in rendered(message)
        await pilot.click(UserMessage)
        assert not message.expanded and "not shown" in rendered(message)
        # From the keyboard: x in the conversation, on the selected (here the last) turn.
        app.query_one(ConversationView).focus()
        await pilot.press("shift+up", "x")
        assert message.expanded and "not shown" not in rendered(message)
        await pilot.press("x")
        assert not message.expanded


async def test_newline_key_inserts_a_line_and_enter_sends(build):
    app, engines = build()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("a", "ctrl+j", "b")
        assert app.query_one("#prompt").text == "a\nb"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.conversation.turns and app.chat.phase is TurnPhase.IDLE, what="the turn")
        assert engines[0].received[0][2] == "a\nb"
        assert app.query_one("#prompt").text == ""


async def test_small_terminal_hides_the_dashboard_and_f4_toggles_it(build):
    app, _ = build()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        dashboard = app.query_one(Dashboard)
        assert not dashboard.display
        prompt = app.query_one("#prompt")
        # The box (its border included) is at least three rows, the text inside it a row.
        assert prompt.region.width >= 70 and app.query_one("#prompt-box").region.height >= 3
        assert prompt.region.height >= 1
        assert app.query_one("#conversation").region.height >= 10
        assert prompt.placeholder == PLACEHOLDERS[0]
        await pilot.press("f4")
        await pilot.pause(0.05)
        assert dashboard.display and dashboard.region.width > 0
        assert prompt.region.width > 20
        # The narrower prompt says the shorter thing whole, rather than cut.
        assert prompt.placeholder == PLACEHOLDERS[1] and len(PLACEHOLDERS[1]) <= prompt.content_size.width
        await pilot.press("f4")
        await pilot.pause(0.05)
        assert not dashboard.display
        assert prompt.placeholder == PLACEHOLDERS[0]
        await pilot.resize_terminal(140, 40)
        await pilot.pause(0.05)
        assert not dashboard.display  # the user's choice holds after a resize


async def test_every_footer_key_is_on_screen_at_80_columns(build):
    def keys_in_view(app) -> set[str]:
        width = app.size.width
        return {key.description for key in app.query_one(Footer).query(FooterKey)
                if key.region.width and key.region.right <= width}

    shown = {b.description for b in ChatApp.BINDINGS if b.show}
    app, _ = build()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        assert keys_in_view(app) >= shown
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: "palette" in keys_in_view(app), what="the palette key at 120 columns")
        assert keys_in_view(app) >= shown


async def test_timeline_bar_fits_the_dashboard_on_one_line_at_80_columns(build):
    app, _ = build(["Fine."])
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("f4")
        await send(pilot, "Hi")
        await pilot.pause()
        turn = app.query_one("#dash-turn", Static)

        def bar_and_next() -> tuple[str, str]:
            lines = rendered(turn).splitlines()
            row = next(i for i, line in enumerate(lines) if line.startswith("timeline"))
            return lines[row][LABEL_WIDTH:].rstrip(), lines[row + 1].strip()

        # The panel is 40 columns here: the bar shrinks to its column instead of
        # wrapping its last cells onto a second line, which would not be to scale.
        bar, after = bar_and_next()
        assert set(bar) <= set(PART_GLYPHS.values())
        assert len(bar) == turn.content_size.width - LABEL_WIDTH < BAR_WIDTH
        assert after.endswith(" ms") and after[0] in PART_GLYPHS.values()  # the legend
        # Where the panel has room, the bar has its full width again.
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert len(bar_and_next()[0]) == BAR_WIDTH


async def test_the_dashboard_scrolls_from_the_keyboard_at_80x24(build):
    from chatterm.ui.dashboard import Dashboard

    app, _ = build(["Fine."])
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("f4")
        await send(pilot, "Hi")
        dashboard = app.query_one(Dashboard)
        assert dashboard.max_scroll_y > 0  # most of it is below the fold here
        for _ in range(3):  # prompt -> dashboard
            if app.focused is dashboard:
                break
            await pilot.press("tab")
        assert app.focused is dashboard
        await pilot.press("end")
        await pilot.pause()
        assert dashboard.scroll_y == dashboard.max_scroll_y > 0


async def test_tab_moves_the_focus_in_the_order_the_help_gives(build):
    from chatterm.ui.dashboard import Dashboard
    from chatterm.ui.prompt import PromptArea
    from chatterm.ui.screens import HELP_KEYS

    app, _ = build(["Fine."])
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        app.query_one(PromptArea).focus()
        seen = []
        for _ in range(3):
            await pilot.press("tab")
            seen.append(app.focused)
        assert seen == [app.query_one(Dashboard), app.query_one("#conversation"), app.query_one(PromptArea)]
        assert "prompt → dashboard → conversation" in dict(HELP_KEYS)["Tab / Shift+Tab"]


async def test_a_message_waiting_for_the_persona_prefill_shows_its_progress(build):
    from chatterm.core.engine.interface import PrefillProgress
    from chatterm.ui.engine_setup import EngineSetup

    gate = threading.Event()
    app, engines = build(["Fine."], engine_kwargs={"prepare_gate": gate})
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.conversation is not None and app.chat.prefix_pending,
                           what="the persona prepare to hold the engine")
            app.query_one("#prompt").insert("Hi")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.chat.phase is TurnPhase.STREAMING, what="the send")
            app.session.post_message(EngineSetup.PersonaProgressed(app.persona, PrefillProgress(512, 2365, 2.0)))
            status = app.query_one("#status", Static)
            await wait_for(pilot, lambda: "your message is next · prefilling 512 / 2,365 tokens"
                           in str(status.content), what="the progress in the status")
            gate.set()
            await wait_for(pilot, lambda: len(app.conversation.turns) == 1 and app.chat.phase is TurnPhase.IDLE,
                           what="the reply")
    finally:
        gate.set()


async def test_help_screen_lists_every_binding(build):
    app, _ = build()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        text = " ".join(rendered(app.screen.query_one("#help-keys")).split())  # wrapped lines rejoined
        documented = " ".join(key for key, _ in HELP_KEYS).lower()
        for binding in ChatApp.BINDINGS:
            for key in binding.key.split(","):
                name = {"question_mark": "?", "escape": "esc"}.get(key, key)
                assert name in documented, key
        assert "Ctrl+J" in text and "drop the type-ahead" in text
        assert "F8" in text and "the last turn" in text  # not in the footer: it is full at 80 columns
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        # `?` opens help when the prompt is not focused, and types `?` when it is.
        await pilot.press("?")
        assert app.query_one("#prompt").text == "?"
        app.query_one("#conversation").focus()
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)


def visible_help(screen) -> str:
    """The help's key rows inside its scroll's viewport (what the user sees)."""
    scroll = screen.query_one("#help-scroll")
    assert screen.region.contains_region(scroll.region)
    lines = rendered(screen.query_one("#help-keys")).splitlines()
    top = round(scroll.scroll_y)
    return "\n".join(lines[top:top + scroll.scrollable_content_region.height])


async def test_help_shows_every_key_at_80x24_and_scrolls_with_the_keys_when_shorter(build):
    app, _ = build()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        screen = app.screen
        # At 80 columns the footer drops F8, Ctrl+S and Ctrl+N: the help is where
        # they are found, so every key is on screen without scrolling.
        shown = visible_help(screen)
        for key, _ in HELP_KEYS:
            assert key in shown, key
        scroll, hint = screen.query_one("#help-scroll"), screen.query_one("#help-hint", Static)
        assert scroll.max_scroll_y == 0 and rendered(hint).strip() == "Esc closes this help."
        # The keys have the focus, so ↓ PgDn End scroll at once (no Tab first),
        # and the hint says when keys are hidden below.
        assert app.focused is scroll
        await pilot.resize_terminal(80, 16)
        await wait_for(pilot, lambda: scroll.max_scroll_y > 0 and hint.has_class("-more"), what="overflow")
        assert "More keys below" in rendered(hint) and "Ctrl+Q" not in visible_help(screen)
        await pilot.press("down")
        await wait_for(pilot, lambda: scroll.scroll_y >= 1, what="a scroll down")
        await pilot.press("end")
        await wait_for(pilot, lambda: scroll.is_vertical_scroll_end, what="the end of the keys")
        assert "Ctrl+Q" in visible_help(screen)
        await wait_for(pilot, lambda: "scroll back" in rendered(hint) and not hint.has_class("-more"),
                       what="the hint to follow the scroll")


def _stored_session(store: SessionStore) -> int:
    sid = store.create_session(model_id="smollm2-135m", model_identity="abc", engine="local",
                               device="CPU", persona_id="terse-coder")
    for i, (question, answer) in enumerate([("What is 2+2?", "4."), ("And 3+3?", "6.")]):
        m = TurnMetrics(engine="local", model_id="smollm2-135m", persona_id="terse-coder",
                        submitted_at=1.7e9 + i, ttft_ms=100.0 + i, generated_tokens=3,
                        decode_ms=40.0, stop_reason="eos")
        store.record_turn(sid, question, answer, m)
    return sid


async def test_sessions_screen_opens_a_past_session_and_continues_it(build, workspace):
    store = SessionStore(workspace.db_path)
    sid = _stored_session(store)
    app, engines = build(["8."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("f3")
        screen = app.screen
        assert isinstance(screen, SessionsScreen)
        table = screen.query_one(DataTable)
        assert table.row_count == 1
        assert str(table.get_row_at(0)[SessionsScreen.COLUMNS.index("persona")]) == "terse-coder"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.conversation.session_id == sid, what="the resumed session")
        users = [rendered(u) for u in app.query(UserMessage)]
        assert any("What is 2+2?" in u for u in users) and any("And 3+3?" in u for u in users)
        assert app.persona.id == "terse-coder"
        await wait_for(pilot, lambda: engines[0].prepared[-1:] == ["terse-coder"], what="the restore")
        assert "turns       2" in rendered(app.query_one("#dash-session"))
        assert "stored turn from" in rendered(app.query_one("#dash-turn"))
        await send(pilot, "And 4+4?")
        assert "stored turn from" not in rendered(app.query_one("#dash-turn"))
        assert [m.content for m in engines[0].received[-1][1]] == ["What is 2+2?", "4.", "And 3+3?", "6."]
        assert [r.user_text for r in store.turns(sid)][-1] == "And 4+4?"
    store.close()


async def test_a_plain_launch_says_where_the_earlier_sessions_are_or_where_to_start(build, workspace):
    store = SessionStore(workspace.db_path)
    for present in (False, True):
        if present:
            _stored_session(store)
        app, _ = build(store=store)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            notices = [rendered(n) for n in app.query(Notice)]
            assert any("F3 lists and searches them" in n for n in notices) is present, notices
            # A first launch says where to start instead.
            assert any("Type a message and press Enter" in n for n in notices) is not present, notices
            assert len(app.query(UserMessage)) == 0
    store.close()


async def test_resume_latest_at_launch_and_bad_ids(build, workspace):
    store = SessionStore(workspace.db_path)
    with pytest.raises(ChattermError, match="no stored session"):
        build(resume="latest", store=store)
    sid = _stored_session(store)
    app, engines = build(resume="latest", store=store)
    assert app.persona.id == "terse-coder"
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert len(app.query(UserMessage)) == 2
        assert app.conversation.session_id == sid and len(app.conversation.history) == 4
        assert any("Resumed session" in rendered(n) for n in app.query(Notice))
        footers = [r.footer_text for r in app.query(AssistantReply)]
        assert footers[0].strip().startswith("TTFT 100 ms · 50.0 tok/s")
        # The dashboard shows the last stored turn, said to be one, not "no turn yet".
        assert "TTFT        101 ms" in rendered(app.query_one("#dash-now"))
        turn = rendered(app.query_one("#dash-turn"))
        assert "done · stored turn from" in turn and "generated   3" in turn, turn
    with pytest.raises(ChattermError, match="unknown session 999"):
        build(resume=999, store=store)
    store.close()


async def test_quit_mid_reply_cancels_and_closes_the_engine(build):
    app, engines = build(["a b c d e f g h i j"])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        engines[0].hold_after = 2
        app.query_one("#prompt").insert("go")
        await pilot.press("enter")
        await wait_for(pilot, engines[0].held.is_set, what="the stream to be held")
        await pilot.press("ctrl+q")
        engines[0].gate.set()
    assert not app.is_running
    # The turn thread saw the cancel; whoever was last closed the engine.
    await wait_for_thread(lambda: engines[0].closed)
    await wait_for_thread(lambda: app.conversation.turns)
    (m,) = app.conversation.turns
    assert m.stop_reason == "cancelled" and m.generated_tokens == 2


async def test_quit_with_a_message_typed_says_so_then_quits_on_the_second_press(build):
    app, _ = build()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.query_one("#prompt").insert("half typed text")
        await pilot.press("ctrl+q")
        await pilot.pause(0.05)
        assert app.is_running
        assert any("(15 characters) is not kept: Ctrl+Q again quits" in n.message for n in app._notifications)
        await pilot.press("ctrl+q")
    assert not app.is_running


async def test_quit_while_the_model_loads(build):
    import threading

    gate = threading.Event()
    app, engines = build(load_gate=gate)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engines and engines[0].loading.is_set(), what="the load to start")
        assert "loading model" in rendered(app.query_one("#status"))
        await pilot.press("ctrl+q")
        assert app._exit
        assert app.model_loading  # the CLI ends the process without waiting for it
        gate.set()  # the load finishes after the app has quit...
    assert not app.is_running
    await wait_for_thread(lambda: engines[0].closed)  # ...and the engine it made is closed
    await wait_for_thread(lambda: not app.model_loading)


async def wait_for_thread(predicate, timeout: float = 10.0) -> None:
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "engine was not closed"
        await asyncio.sleep(0.02)


def test_importing_the_app_loads_no_model():
    code = (
        "import sys, chatterm.ui.app, chatterm.ui.launch, chatterm.cli.launch_cmd; "
        "print('llama_cpp' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_palette_entries_do_not_import_the_app():
    code = "import sys, chatterm.ui.palette; print('chatterm.ui.app' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


async def test_the_palette_leaves_out_textuals_key_panel_and_maximize(build):
    from textual.app import App

    from chatterm.ui.prompt import PromptArea

    app, _ = build()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.query_one(PromptArea).focus()
        await pilot.pause()
        assert {"Keys", "Maximize"} <= {c.title for c in App.get_system_commands(app, app.screen)}
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Theme" in titles and "Quit" in titles and "Help" in titles
        assert not {"Keys", "Maximize", "Minimize"} & set(titles), titles


async def test_the_palette_screenshot_goes_to_the_exports_folder_and_says_where(build, isolated_dirs, monkeypatch):
    """Textual's own wrote to ~/Downloads, and in a HOME without one said only
    "Failed to save screenshot"."""
    monkeypatch.setenv("HOME", str(isolated_dirs["CHATTERM_DATA_DIR"].parent / "empty-home"))
    app, _ = build()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        helps = {c.title: c.help for c in app.get_system_commands(app.screen)}
        assert helps["Screenshot"] == "Save an SVG picture of the screen to the data folder's exports"
        await pilot.press("ctrl+p")
        await pilot.press(*"Screenshot")
        await wait_for_palette_hit(pilot, "Screenshot")
        await pilot.press("enter")
        exports = isolated_dirs["CHATTERM_DATA_DIR"] / "exports"
        await wait_for(pilot, lambda: list(exports.glob("*.svg")), what="the screenshot")
        (svg,) = exports.glob("*.svg")
        assert svg.read_text().lstrip().startswith("<svg")
        toasts = [str(n.message) for n in app._notifications]
        assert any(t.startswith(svg.name) and "exports" in t for t in toasts), toasts


async def test_command_palette_switches_persona_and_exports_csv(build, workspace, isolated_dirs):
    store = SessionStore(workspace.db_path)
    app, engines = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Persona: Terse")
        await wait_for_palette_hit(pilot, "Persona: Terse")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.persona.id == "terse-coder", what="the persona switch")
        await wait_for(pilot, lambda: engines[0].prepared[-1:] == ["terse-coder"], what="the prepare")
        await send(pilot, "hello")
        await pilot.press("ctrl+p")
        await pilot.press(*"Export session: CSV")
        await wait_for_palette_hit(pilot, "CSV")
        await pilot.press("enter")
        target = isolated_dirs["CHATTERM_DATA_DIR"] / "exports" / f"session-{app.conversation.session_id}.csv"
        await wait_for(pilot, target.exists, what="the CSV export")
        assert "terse-coder" in target.read_text()
    store.close()


class FixedMeter:
    """An EnergyMeter that reports a known energy per turn."""

    usd_per_kwh = 0.20

    def start(self):
        return object()

    def stop(self, handle):
        return 0.5


async def test_gpu_fields_and_energy_come_from_telemetry(build):
    from chatterm.core.system.gpu import GpuStatus

    status = GpuStatus(name="NVIDIA H200", memory_used_mb=1234.0, memory_total_mb=143771.0, power_w=215.0)
    app, _ = build(gpu_status=lambda: status, energy_meter=lambda: FixedMeter())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        model_text = rendered(app.query_one("#dash-model"))
        assert "NVIDIA H200" in model_text and "1,234 / 143,771 MiB" in model_text and "215 W" in model_text
        await send(pilot, "hi")
        m = app.conversation.turns[0]
        assert m.energy_wh == 0.5 and m.energy_cost_usd == pytest.approx(0.0001)
        assert "0.500 Wh" in app.query_one(AssistantReply).footer_text
        assert "energy      0.500 Wh" in rendered(app.query_one("#dash-session"))


async def test_persona_names_with_markup_are_literal_everywhere(isolated_dirs, tmp_path):
    from fake_engine import FakeEngine

    from chatterm.core.workspace import Workspace
    from chatterm.ui.launch import make_app

    folder = isolated_dirs["CHATTERM_CONFIG_DIR"] / "personas"
    folder.mkdir(parents=True)
    (folder / "evil.toml").write_text('name = "[bold]Evil[/] [link=x]y[/link] [/"\nsystem_prompt = "Be evil."\n')
    ws = Workspace.load(db_path=tmp_path / "db.sqlite")
    app = make_app(ws, persona_id="evil", gpu_status=lambda: None,
                   engine_factory=lambda spec: FakeEngine(spec, ws.catalog.price(spec.price_profile)))
    name = "[bold]Evil[/] [link=x]y[/link] [/"
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert name in rendered(app.query_one("#title-bar"))
        assert name in rendered(app.query_one("#dash-persona"))
        await pilot.press("ctrl+p")
        await pilot.press(*"Persona")
        await wait_for_palette_hit(pilot, "Persona")
        assert app.is_running
        hits = app.screen.query_one(OptionList)
        hit_texts = [str(hits.get_option_at_index(i).prompt) for i in range(hits.option_count)]
        assert any(f"Persona: {name}" in t for t in hit_texts), hit_texts
        await pilot.press("escape")
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, PersonaPicker), what="the picker")
        options = app.screen.query_one(OptionList)
        assert any(name in str(options.get_option_at_index(i).prompt) for i in range(options.option_count))
        await pilot.press("escape")
        await send(pilot, "hi")
        assert name in app.query_one(AssistantReply).title_text
    assert app.return_code in (None, 0)


async def test_persona_picker_indents_a_wrapped_description(isolated_dirs, tmp_path):
    from fake_engine import FakeEngine

    from chatterm.core.workspace import Workspace
    from chatterm.ui.launch import make_app

    folder = isolated_dirs["CHATTERM_CONFIG_DIR"] / "personas"
    folder.mkdir(parents=True)
    words = " ".join(f"word{i}" for i in range(60))
    (folder / "wordy.toml").write_text(f'name = "Wordy"\ndescription = "{words}"\nsystem_prompt = "Be wordy."\n')
    ws = Workspace.load(db_path=tmp_path / "db.sqlite")
    app = make_app(ws, persona_id="wordy", gpu_status=lambda: None,
                   engine_factory=lambda spec: FakeEngine(spec, ws.catalog.price(spec.price_profile)))
    async with app.run_test(size=(150, 45)) as pilot:
        await loaded(pilot)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, PersonaPicker), what="the picker")
        await pilot.pause()
        lines = rendered(app.screen.query_one(OptionList)).splitlines()
        first = next(i for i, line in enumerate(lines) if "● Wordy" in line)
        start = lines[first].index("Wordy")
        assert lines[first + 1][start:].startswith("→ current conversation")  # what Enter does, whole
        description = lines[first + 2:first + 5]
        assert "word0" in description[0] and "word59" not in description[0]  # it wraps
        for line in description:  # every line starts under the name, none at the left edge
            assert line[start:start + 4] == "word" and not line[:start].strip("▊▐▌ "), lines


async def test_the_title_keeps_the_state_in_view_in_a_narrow_terminal(build, workspace):
    store = SessionStore(workspace.db_path)
    app, _ = build(store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        await send(pilot, "Hi")
        bar = app.query_one("#title-bar")
        wide = str(bar.render())
        assert wide.startswith("chatterm · ") and wide.endswith(f"session {app.conversation.session_id} · ready")
        await pilot.resize_terminal(60, 24)
        await wait_for(pilot, lambda: bar.content_size.width == 58, what="the narrow layout")
        narrow = str(bar.render())
        assert len(narrow) <= 58 and narrow.endswith("· ready") and not narrow.startswith("chatterm"), narrow
        assert "session" in narrow
    store.close()
