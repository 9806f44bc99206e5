"""Getting conversations back (Pilot, scripted engine, real SQLite store): switching
back to a persona returns to its last conversation and the picker says so; the
sessions screen lists titles and previews newest activity first, searches,
renames, deletes (never the session in use) and forks; a fork continues with the
history up to its turn."""

from __future__ import annotations

import re

import pytest
from pilot_steps import loaded, send, wait_for, wait_for_palette_hit
from textual import events
from textual.geometry import Region
from textual.widgets import DataTable, Input, OptionList

from chatterm.core.store.session_store import SessionStore
from chatterm.errors import ChattermError
from chatterm.ui.chat_view import TurnPhase
from chatterm.ui.prompt import PromptArea
from chatterm.ui.screens import PersonaPicker
from chatterm.ui.sessions_screen import TITLE_CELL, ConfirmScreen, RenameScreen, SessionsScreen
from chatterm.ui.transcript import AssistantReply, Notice, UserMessage
from tests.core.store.test_store import full_metrics, new_session

SIZE = (120, 40)


def users(app) -> list[str]:
    return [u.text for u in app.query(UserMessage)]


def notifications(app) -> list[str]:
    return [n.message for n in app._notifications]


def cells(table: DataTable, column: int) -> list[str]:
    return [table.get_row_at(i)[column].plain for i in range(table.row_count)]


@pytest.fixture
def store(workspace):
    with SessionStore(workspace.db_path) as store:
        yield store


async def open_sessions(pilot, rows: int | None = None) -> DataTable:
    """F3, and the sessions table once the screen is up (with `rows` rows)."""
    app = pilot.app
    await pilot.press("f3")
    await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), what="the sessions screen")
    table = app.screen.query_one(DataTable)
    if rows is not None:
        await wait_for(pilot, lambda: table.row_count == rows, what="the rows")
    return table


async def pick_persona(pilot, persona_id: str) -> PersonaPicker:
    app = pilot.app
    await pilot.press("f2")
    await wait_for(pilot, lambda: isinstance(app.screen, PersonaPicker), what="the picker")
    picker = app.screen
    options = picker.query_one(OptionList)
    texts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
    options.highlighted = next(i for i, t in enumerate(texts) if f"({persona_id})" in t)
    return picker


def option_text(picker: PersonaPicker, persona_id: str) -> str:
    options = picker.query_one(OptionList)
    texts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
    return next(t for t in texts if f"({persona_id})" in t)


async def test_switching_back_to_a_persona_returns_to_its_last_conversation(build, store):
    app, engines = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "hello assistant")
        first = app.conversation.session_id
        picker = await pick_persona(pilot, "terse-coder")
        assert "→ new conversation" in option_text(picker, "terse-coder")
        assert "→ current conversation" in option_text(picker, "assistant")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.persona.id == "terse-coder" and app.conversation is not None,
                       what="the switch")
        assert users(app) == []
        await send(pilot, "hello coder")
        coder = app.conversation.session_id

        picker = await pick_persona(pilot, "assistant")
        assert f"→ back to session {first}" in option_text(picker, "assistant")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.conversation is not None and app.conversation.session_id == first,
                       what="the first conversation")
        assert app.persona.id == "assistant" and users(app) == ["hello assistant"]
        assert any(f"Back to your conversation with Assistant: session {first}, 1 turn." in str(n.render())
                   for n in app.query(Notice))
        await wait_for(pilot, lambda: app.chat.phase is TurnPhase.IDLE and len(app.conversation.history) == 2,
                       what="its history")
        await send(pilot, "still there?")
        assert [m.content for m in engines[0].received[-1][1]] == ["hello assistant", "Echo: hello assistant"]
        # Ctrl+N is a new conversation; the persona's last one is then that new one.
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: users(app) == [], what="the new conversation")
        picker = await pick_persona(pilot, "terse-coder")
        assert f"→ back to session {coder}" in option_text(picker, "terse-coder")
        await pilot.press("escape")


async def test_switching_back_after_selecting_a_turn_elsewhere_shows_the_conversations_end(build, store):
    """A turn selected (scrolled to) in the conversation left: the one switched
    back to opened at its top, its newest turns and the "Back to" notice below."""
    app, _ = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for i in range(5):
            await send(pilot, f"message {i}: " + "a long line of words to fill the screen " * 12)
        await pick_persona(pilot, "terse-coder")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.persona.id == "terse-coder" and app.conversation is not None,
                       what="the switch")
        for i in range(3):
            await send(pilot, f"coder {i}: " + "a long line of words to fill the screen " * 12)
        view = app.chat.messages
        view.focus()
        await pilot.press("shift+up", "shift+up", "shift+up")
        await wait_for(pilot, lambda: view.query(AssistantReply).first().has_class("-selected")
                       and view.scroll_y < view.max_scroll_y, what="the first turn selected, in view")
        await pick_persona(pilot, "assistant")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.persona.id == "assistant" and len(users(app)) == 5, what="the way back")
        await pilot.pause(0.3)
        await wait_for(pilot, lambda: view.max_scroll_y > 0 and view.scroll_y == view.max_scroll_y,
                       what=f"the end in view ({view.scroll_y} of {view.max_scroll_y})")


async def test_a_persona_file_added_while_the_app_runs_is_offered_by_f2(build, store, isolated_dirs, monkeypatch):
    """It needed a restart, though models.toml is read again by the models picker."""
    app, _ = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        folder = isolated_dirs["CHATTERM_CONFIG_DIR"] / "personas"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "echo.toml").write_text('name = "Echo"\nsystem_prompt = "Repeat the message."\n')
        (folder / "broken.toml").write_text('name = \n')
        picker = await pick_persona(pilot, "echo")
        assert "→ new conversation" in option_text(picker, "echo")
        assert any("broken.toml" in n and "skipped" in n for n in notifications(app))
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.persona.id == "echo", what="the switch to the new persona")
        (folder / "echo.toml").unlink()  # the persona in use stays, its conversation goes on
        picker = await pick_persona(pilot, "echo")
        assert "→ current conversation" in option_text(picker, "echo")
        await pilot.press("escape")

        def unreadable(*_args):
            raise PermissionError("personas: permission denied")

        # The folder unreadable now: F2 still opens, with the personas read before.
        monkeypatch.setattr("chatterm.core.workspace.load_personas", unreadable)
        picker = await pick_persona(pilot, "terse-coder")
        assert "→ new conversation" in option_text(picker, "terse-coder")
        await pilot.press("escape")


async def test_a_deleted_session_is_not_offered_to_go_back_to(build, store, workspace):
    app, _ = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "hello assistant")
        first = app.conversation.session_id
        picker = await pick_persona(pilot, "terse-coder")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.persona.id == "terse-coder" and app.conversation is not None,
                       what="the switch")
        with SessionStore(workspace.db_path) as other:  # as `chatterm sessions delete` does
            other.delete_session(first)
        picker = await pick_persona(pilot, "assistant")
        assert "→ new conversation" in option_text(picker, "assistant")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.persona.id == "assistant" and app.conversation is not None,
                       what="the new conversation")
        assert users(app) == [] and notifications(app) == []


async def test_another_chatterm_cannot_delete_the_session_open_in_the_app(build, store, workspace):
    app, _ = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "hello assistant")
        first = app.conversation.session_id
        with SessionStore(workspace.db_path) as other:
            with pytest.raises(ChattermError, match=f"session {first} is open in another chatterm"):
                other.delete_session(first)
            await pilot.press("ctrl+n")  # a new conversation: the first is no longer open
            await wait_for(pilot, lambda: users(app) == [], what="the new conversation")
            assert other.delete_session(first) == 1


async def test_d_on_a_session_open_in_another_chatterm_is_refused_before_the_question(build, store, workspace):
    held = new_session(store)
    store.record_turn(held, "kept", "safe", full_metrics())
    app, _ = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        with SessionStore(workspace.db_path) as other:
            other.hold(held)  # another chatterm has it on screen
            table = await open_sessions(pilot, 1)
            table.focus()
            await pilot.press("d")
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen)
            note = str(app.screen.query_one("#sessions-note").render())
            assert f"Session {held} is open in another chatterm" in note
            other.hold(None)  # closed there: now it asks, and the refusal is gone from under it
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
            assert "open in another chatterm" not in str(app.screen_stack[-2].query_one("#sessions-note").render())


async def test_the_rename_box_shows_a_titles_escape_sequence_as_symbols(build, store):
    sid = new_session(store)
    store.record_turn(sid, "build log \x1b[31mfailed\x1b[0m", "r", full_metrics())  # `cat log | chatterm ask`
    app, _ = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        table = await open_sessions(pilot, 1)
        table.focus()
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, RenameScreen), what="the rename box")
        assert app.screen.query_one(Input).value == "build log ␛[31mfailed␛[0m"


async def test_home_and_end_go_to_the_first_and_last_session_at_80_columns(build, store):
    for n in range(4):
        store.record_turn(new_session(store), f"question {n}", "answer", full_metrics())
    app, _ = build(store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        table = await open_sessions(pilot, 4)
        table.focus()
        await pilot.press("end")
        # The last row, and the table not scrolled sideways (it hid the ids).
        assert table.cursor_row == 3 and table.scroll_x == 0
        await pilot.press("home")
        assert table.cursor_row == 0


async def test_at_80_columns_the_persona_and_model_are_named_for_the_highlighted_row(build, store):
    """Under the width that holds them, the persona and model columns are
    left out (scrolled to sideways, they hid the ids) and the title line names
    them for the highlighted session; wide enough, they are columns again."""
    for persona in ("shop-support", "terse-coder"):
        store.record_turn(new_session(store, persona), f"question for {persona}", "answer", full_metrics())
    app, _ = build(store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        table = await open_sessions(pilot, 2)
        table.focus()
        title = app.screen.query_one("#sessions-title")
        await wait_for(pilot, lambda: "terse-coder" in str(title.render()), what="the first row's persona")
        assert [str(c.label) for c in table.columns.values()] == ["id", "title · last exchange", "turns",
                                                                  "active", "cost"]
        assert str(title.render()) == "Sessions · session 2: terse-coder on smollm2-135m"
        assert table.virtual_size.width <= table.scrollable_content_region.width  # nothing to scroll to
        await pilot.press("down")
        await wait_for(pilot, lambda: "session 1: shop-support" in str(title.render()), what="the second row's")
        await pilot.resize_terminal(160, 40)
        await wait_for(pilot, lambda: len(table.columns) == 7, what="all the columns")
        assert str(title.render()) == "Sessions" and cells(table, 5) == ["terse-coder", "shop-support"]
        assert table.cursor_row == 1  # the highlight kept on its row


async def test_a_resumed_session_is_marked_open_while_the_model_still_loads(build, store, workspace):
    import threading

    sid = new_session(store)
    store.record_turn(sid, "kept", "safe", full_metrics())
    gate = threading.Event()
    app, engines = build(store=store, resume=sid, load_gate=gate)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engines and engines[0].loading.is_set(), what="the load to start")
        with SessionStore(workspace.db_path) as other:
            with pytest.raises(ChattermError, match=f"session {sid} is open in another chatterm"):
                other.delete_session(sid)
        gate.set()
        await loaded(pilot)


async def test_a_late_first_turn_does_not_take_the_mark_from_the_session_opened_since(build, store, workspace):
    opened = new_session(store)
    store.record_turn(opened, "opened later", "yes", full_metrics())
    app, engines = build(["slow reply " * 20], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        engines[0].hold_after = 2  # the first reply stops there until the gate opens
        prompt = app.query_one("#prompt")
        prompt.insert("a new conversation's first message")
        await pilot.press("enter")
        await wait_for(pilot, engines[0].held.is_set, what="the reply to start")
        app.session.open_session(opened)  # as F3 does, while the first reply streams
        await wait_for(pilot, lambda: app.conversation is not None and app.conversation.session_id == opened,
                       what="the opened session")
        engines[0].gate.set()  # the stopped turn ends now, after the session was opened
        await wait_for(pilot, lambda: len(store.sessions()) == 2, what="the stopped turn's new session")
        await pilot.pause(0.2)
        late = max(s.id for s in store.sessions())
        with SessionStore(workspace.db_path) as other:
            with pytest.raises(ChattermError, match=f"session {opened} is open"):
                other.delete_session(opened)
            assert other.delete_session(late) == 1  # the session left behind is not the one on screen


async def test_sessions_screen_title_preview_search_rename_delete(build, store):
    app, engines = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Tell me about [bold]otters[/] please")
        older = app.conversation.session_id
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: users(app) == [], what="the new conversation")
        await send(pilot, "What do beavers build?")
        current = app.conversation.session_id

        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), what="the sessions screen")
        screen = app.screen
        table = screen.query_one(DataTable)
        await wait_for(pilot, lambda: table.row_count == 2, what="the rows")
        assert cells(table, 0) == [f"{current} ●", str(older)]  # newest activity first
        titles = cells(table, 1)
        title, preview = titles[0].splitlines()
        assert title == "What do beavers build?"
        # One exchange, untitled: the title is its message, the preview its reply only.
        assert preview.startswith("→ Echo: What do beavers build?") and len(preview) <= TITLE_CELL
        assert titles[1].splitlines()[0] == "Tell me about [bold]otters[/] please"  # literal

        # Deleting the session in use is refused before any question.
        table.focus()
        await pilot.press("d")
        await wait_for(pilot, lambda: f"Session {current} is open" in str(screen.query_one("#sessions-note").render()),
                       what="the refusal, under the list")
        assert app.screen is screen and table.row_count == 2

        # Rename the older one; an empty title is refused and the old one kept.
        await pilot.press("down", "r")
        await wait_for(pilot, lambda: isinstance(app.screen, RenameScreen), what="the rename box")
        rename = app.screen.query_one(Input)
        rename.value = "   "
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("A title cannot be empty" in n for n in notifications(app)),
                       what="the refusal")
        assert store.session(older).title == "Tell me about [bold]otters[/] please"
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, RenameScreen), what="the rename box")
        app.screen.query_one(Input).value = "Otters"
        await pilot.press("enter")
        await wait_for(pilot, lambda: cells(table, 1)[1].startswith("Otters\n"), what="the new title")
        assert store.session(older).title == "Otters"
        # The highlight stays on the renamed row: the next key acts on it, not on the first row.
        assert table.cursor_row == 1

        # Search: any characters are safe; a hit opens its session at its turn.
        search = screen.query_one(Input)
        search.focus()
        search.value = 'otters" OR ('
        await wait_for(pilot, lambda: screen._hits is not None, what="the search")
        search.value = "otters"
        await wait_for(pilot, lambda: screen._hits and table.row_count >= 1, what="the hits")
        assert cells(table, 0)[0] == str(older) and "otters" in cells(table, 1)[0].lower()
        search.value = "zzzz-nothing"
        await wait_for(pilot, lambda: screen._hits == [], what="no hits")
        search.value = "otters"
        await wait_for(pilot, lambda: bool(screen._hits), what="the hits")
        await pilot.press("down")  # from the search box to the hits, as Enter does
        assert app.focused is table
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.conversation is not None and app.conversation.session_id == older,
                       what="the hit's session")
        reply = app.query(AssistantReply).last()
        assert reply.has_class("-selected") and reply.turn_id == 1
        # What is typed next is a message: in the focused conversation an `e` edited the hit.
        await wait_for(pilot, lambda: isinstance(app.focused, PromptArea), what="the prompt's focus")
        assert any("Turn 1 selected" in n for n in notifications(app))
        await pilot.press("e")
        assert app.query_one(PromptArea).text == "e" and not app.query_one(PromptArea).editing
        app.query_one(PromptArea).clear()
        # The notice's way to the turn keys: Shift+Tab, with the hit still selected.
        await pilot.press("shift+tab")
        assert app.focused is app.query_one("#conversation") and reply.has_class("-selected")

        # Delete the other session after the confirmation.
        table = await open_sessions(pilot)
        table.focus()
        table.move_cursor(row=cells(table, 0).index(str(current)))
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("n")
        assert {s.id for s in store.sessions()} == {older, current}  # n: nothing deleted
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("y")
        await wait_for(pilot, lambda: table.row_count == 1, what="the row to go")
        assert [s.id for s in store.sessions()] == [older]
        # Said under the list: a toast covered the screen's key hint.
        assert f"Deleted session {current}: 1 turn" in str(app.screen.query_one("#sessions-note").render())
        assert not any("Deleted session" in n for n in notifications(app))


async def test_fork_from_a_turn_continues_with_its_history(build, store):
    app, engines = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for text in ("one", "two", "three"):
            await send(pilot, text)
        parent = app.conversation.session_id
        app.query_one("#conversation").focus()
        await pilot.press("shift+up", "shift+up", "f")  # fork at turn 2
        await wait_for(pilot, lambda: app.conversation is not None and app.conversation.session_id != parent,
                       what="the fork")
        await wait_for(pilot, lambda: len(app.conversation.history) == 4, what="its history")
        assert users(app) == ["one", "two"]
        # What the user types next goes to the prompt, not to the conversation's letter keys.
        await wait_for(pilot, lambda: isinstance(app.focused, PromptArea), what="the prompt's focus")
        await send(pilot, "four")
        assert [m.content for m in engines[0].received[-1][1]] == ["one", "Echo: one", "two", "Echo: two"]
        assert [r.user_text for r in store.turns(parent)] == ["one", "two", "three"]
        fork = app.conversation.session_id
        assert [r.user_text for r in store.turns(fork)] == ["one", "two", "four"]
        # From the sessions screen: f forks the highlighted session at its current turn,
        # once: with the conversation focused behind the screen, its own `f` forked too.
        app.query_one("#conversation").focus()
        table = await open_sessions(pilot)
        table.focus()
        table.move_cursor(row=cells(table, 0).index(str(parent)))
        await pilot.press("f")
        await wait_for(pilot, lambda: app.conversation is not None
                       and app.conversation.session_id not in (parent, fork), what="the second fork")
        await wait_for(pilot, lambda: len(app.conversation.history) == 6, what="its history")
        assert users(app) == ["one", "two", "three"]
        await pilot.pause(0.3)
        assert len(store.sessions()) == 3


async def test_a_first_turn_that_failed_makes_no_session_and_ctrl_r_sends_it_again(build, store):
    """It made a session of one turn with no text (F3, `chatterm sessions`);
    then, not stored, Ctrl+R must still retry it (a server that was down)."""
    app, engines = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        engines[0].fail_turn = "the server is down"
        app.query_one("#prompt").insert("hello")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.query(AssistantReply) and app.query_one(AssistantReply).has_class("-error")
                       and app.chat.phase is TurnPhase.IDLE, what="the failed turn")
        assert store.sessions() == [] and app.conversation.turns == []
        engines[0].fail_turn = None
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.conversation.turns and app.chat.phase is TurnPhase.IDLE, what="the retry")
        assert users(app) == ["hello"] and len(app.query(AssistantReply)) == 1
        (session,) = store.sessions()
        assert [r.user_text for r in store.turns(session.id)] == ["hello"]
        assert app.conversation.session_id == session.id


@pytest.mark.parametrize("stored", [True, False])
async def test_f_on_the_reply_still_streaming_stops_it_and_forks_with_it(build, store, monkeypatch, stored):
    """The streaming reply was marked by Shift+Up, but `f` forked at the turn
    before it, without saying so; so it still did when the stopped turn could
    not be stored."""
    import threading

    app, engines = build(["Echo: one", "a long reply still streaming"], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "one")
        parent = app.conversation.session_id
        if not stored:
            def refused(*args, **kwargs):  # as a write the database refuses (a full disk)
                store.write_error = "database or disk is full"

            monkeypatch.setattr(store, "record_turn", refused)
        engines[0].hold_after = 2
        app.query_one("#prompt").insert("two")
        await pilot.press("enter")
        await wait_for(pilot, engines[0].held.is_set, what="the stream to be held")
        app.query_one("#conversation").focus()
        await pilot.press("shift+up")  # the streaming reply
        threading.Timer(0.3, engines[0].gate.set).start()  # the handler waits for the turn's end
        await pilot.press("f")
        if not stored:
            await wait_for(pilot, lambda: "That reply was not stored: it cannot be forked." in notifications(app),
                           what="the refusal")
            await pilot.pause(0.2)
            assert app.conversation.session_id == parent and len(store.sessions()) == 1
            return
        await wait_for(pilot, lambda: app.conversation is not None and app.conversation.session_id != parent,
                       what="the fork")
        await wait_for(pilot, lambda: len(app.conversation.history) == 4, what="its history")
        assert users(app) == ["one", "two"]
        (stopped,) = [r for r in store.turns(app.conversation.session_id) if r.user_text == "two"]
        assert stopped.metrics.stop_reason == "cancelled"


async def test_enter_the_moment_the_sessions_screen_opens_opens_the_first_row(build, store):
    """The list is drawn once the screen is laid out: an Enter before that was lost."""
    app, _ = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "here")
        shown = app.conversation.session_id
        other = new_session(store)  # newer: the first row
        store.record_turn(other, "elsewhere", "Elsewhere.", full_metrics())
        app.action_sessions()
        app.post_message(events.Key("enter", "\r"))
        await wait_for(pilot, lambda: app.conversation is not None and app.conversation.session_id == other,
                       what="the first row opened")
        assert shown != other and not isinstance(app.screen, SessionsScreen)


@pytest.mark.parametrize("columns", [120, 160])
async def test_the_sessions_table_fits_its_box_without_scrolling_sideways_from_120_columns(build, store, columns):
    # Narrower, it scrolls sideways (the cost is the last column); wider, the
    # title column takes the room, then shows this title whole.
    message = "A first message, long enough to fill the title column of the table"
    for n in range(12):  # more rows than the table shows: its scrollbar must not cover the last column
        store.record_turn(new_session(store, started_at=1000.0 + n), f"older {n}", "ok", full_metrics())
    app, _ = build(store=store)
    async with app.run_test(size=(columns, 40)) as pilot:
        await loaded(pilot)
        await send(pilot, message)
        table = await open_sessions(pilot, 13)
        await pilot.pause()
        assert table.virtual_size.width <= table.scrollable_content_region.width, (
            table.virtual_size.width, table.scrollable_content_region.width)
        title, preview = cells(table, 1)[0].splitlines()
        assert table.show_vertical_scrollbar
        info = store.sessions()[0]
        if columns == 160:  # the store's title and preview, uncut
            assert (title, preview) == (info.title, info.preview)
        else:  # cut where the room ends, beyond the least width
            assert title.endswith("…") and info.title.startswith(title[:-1]) and len(title) > TITLE_CELL
        # Back to 120 columns: the title column narrows again.
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: cells(table, 1)[0].splitlines()[0].endswith("…"),
                       what="the title cut at 120 columns")
        assert table.virtual_size.width <= table.scrollable_content_region.width


async def test_chat_keys_and_palette_commands_over_the_sessions_screen(build, store):
    from textual.command import CommandPalette

    from chatterm.ui.latency_screen import LatencyScreen

    app, _ = build(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), what="the sessions screen")
        session_id = app.conversation.session_id
        await pilot.press("ctrl+n", "ctrl+s")  # priority keys: they reached past the dialog
        await pilot.pause(0.3)
        assert app.conversation.session_id == session_id and len(app.conversation.turns) == 1
        assert notifications(app) == []
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
        await pilot.press(*"Latency")
        await wait_for_palette_hit(pilot, "Latency")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LatencyScreen), what="the latency screen")
        # The latency screen stands on the chat, not on the sessions screen.
        assert [type(s).__name__ for s in app.screen_stack[1:]] == ["LatencyScreen"]
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(app.screen_stack) == 1, what="the chat screen")
        assert app.focused is not None and app.focused.id == "prompt"


def test_the_resume_notice_counts_the_exchanges_shown_and_names_the_other_branches(workspace, store):
    from chatterm.core.metrics.turn_metrics import TurnMetrics
    from chatterm.ui.resume import read_resume, resumed_notice

    sid = store.create_session(model_id="smollm2-135m", model_identity="x", engine="local", device="CPU",
                               persona_id="assistant")
    metrics = TurnMetrics(engine="local", model_id="smollm2-135m", persona_id="assistant", submitted_at=1.0)
    store.record_turn(sid, "Name a color.", "Red.", metrics)
    assert resumed_notice(read_resume(store, workspace, sid, None)) == f"Resumed session {sid} (1 turn)."
    store.record_turn(sid, "Name a color.", "Blue.", metrics, after=0)  # regenerated: one exchange shown
    assert resumed_notice(read_resume(store, workspace, sid, None)) == (
        f"Resumed session {sid} (1 turn, 1 more on other branches).")


async def test_the_sessions_screen_keeps_its_hint_and_the_turns_column_in_view_at_80x24(build, store):
    from chatterm.core.metrics.turn_metrics import TurnMetrics

    metrics = TurnMetrics(engine="local", model_id="smollm2-135m", persona_id="assistant", submitted_at=1.0)
    for n in range(8):
        sid = store.create_session(model_id="smollm2-135m", model_identity="x", engine="local", device="CPU",
                                   persona_id="assistant")
        store.record_turn(sid, f"Question number {n}", "An answer.", metrics)
    store.record_turn(sid, "Question number 7", "Another answer.", metrics, after=0)  # "1 +1", explained by the note
    store.fork_session(sid)  # its title, "Question number 7 (fork of …)", is wider than the column
    app, _ = build(store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), what="the sessions screen")
        await pilot.pause()
        screen = app.screen
        table = screen.query_one(DataTable)
        for part in (screen.query_one(".modal-hint"), screen.query_one("#sessions-note"), table):
            assert part.region.height and part.region.bottom <= 23, (part, part.region)  # above the footer
        width, height = table.scrollable_content_region.size
        shown = "\n".join(strip.text for strip in table.render_lines(Region(0, 0, width, height)))
        assert "turns" in shown and "1 +1" in shown
        # The text is cut, not where it came from.
        assert re.search(rf"Question[\w ]*… \(fork of session {sid}, turn 2\)", shown), shown
        assert "Turns such as 1 +1:" in str(screen.query_one("#sessions-note").render())


async def test_a_frame_drawn_before_the_table_measures_its_columns_keeps_the_cost_whole(build, store):
    """In a real terminal (tmux, 80x24) a frame could be painted after a delete
    redrew the table and before DataTable's Idle measured its auto-width
    columns: the cells were cached at their labels' widths (the cost cut to
    "$0.0" over "0169"), and ↓ redrew only the rows whose highlight changed,
    at the new widths. Pilot waits for that Idle, so the early frame is drawn
    here on purpose."""
    from chatterm.core.metrics.format import fmt_usd

    for n in range(5):
        store.record_turn(new_session(store), f"question {n}", "answer", full_metrics(n))
    cost = fmt_usd(store.sessions()[0].cost_usd)
    app, _ = build(store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        table = await open_sessions(pilot, 5)
        table.focus()
        screen = app.screen

        def shown() -> list[str]:
            width, height = table.scrollable_content_region.size
            lines = [strip.text for strip in table.render_lines(Region(0, 0, width, height))]
            return [line for line in lines if re.match(r" \d ", line)]  # the rows' first lines

        fill = screen._fill

        def fill_and_paint(table_shown) -> None:
            fill(table_shown)
            shown()  # as the compositor did, before the table's Idle

        screen._fill = fill_and_paint
        await pilot.press("down", "d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("y")
        await wait_for(pilot, lambda: table.row_count == 4, what="the rows left")
        await pilot.pause()
        for step in range(3):
            rows = shown()
            assert len(rows) == 4 and all(line.rstrip().endswith(cost) for line in rows), (step, rows)
            assert len({line.index(cost) for line in rows}) == 1, (step, rows)  # one width for every row
            await pilot.press("down")
            await pilot.pause()


@pytest.mark.parametrize("title, shown", [
    ("Question 7 about the weather (fork of session 12, turn 2)", "Questi… (fork of session 12, turn 2)"),
    ("猫についての長い質問です猫についての長い質問です (fork of session 3, turn 1)",
     "猫につ… (fork of session 3, turn 1)"),  # cut in cells: each of these is two
    ("A title (with a note that is far too long to keep whole)", "A title (with a note that is far to…"),
])
def test_a_cut_title_keeps_its_closing_note_while_it_fits_in_cells(title, shown):
    from rich.cells import cell_len

    from chatterm.ui.sessions_screen import _cut_keeping_note

    assert _cut_keeping_note(title, TITLE_CELL) == shown and cell_len(shown) <= TITLE_CELL
