"""Regenerate, edit and branches in the app (Pilot, scripted engine, real SQLite store):
the old reply or message is kept as a sibling in the store, the new one is current,
← → switch between them, and the model's history is the current path. Bad input
(an empty edit, nothing stored yet) is one notification and loses nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
from fake_engine import FakeEngine
from pilot_steps import loaded, send, wait_for, wait_for_palette_hit
from textual import events
from textual.geometry import Region
from textual.widgets import DataTable

from chatterm.core.engine.interface import ChatMessage, EngineCapabilities
from chatterm.core.store.session_store import SessionStore
from chatterm.ui.chat_view import TurnPhase
from chatterm.ui.launch import make_app
from chatterm.ui.sessions_screen import SessionsScreen
from chatterm.ui.transcript import AssistantReply, Notice, UserMessage
from tests.core.store.test_store import full_metrics

SIZE = (120, 40)


def rendered(widget) -> str:
    width, height = widget.size
    return "\n".join(strip.text for strip in widget.render_lines(Region(0, 0, width, height)))


def replies(app) -> list[str]:
    return [r.source for r in app.query(AssistantReply)]


def users(app) -> list[str]:
    return [u.text for u in app.query(UserMessage)]


def notifications(app) -> list[str]:
    return [n.message for n in app._notifications]


def dashboard_row(app, section: str, label: str) -> str:
    """The value of the dashboard's row `label` in `section` (a widget id)."""
    lines = [line.strip() for line in rendered(app.query_one(f"#{section}")).splitlines()]
    return next(line[len(label):].strip() for line in lines if line.startswith(label + " "))


def session_row(app, label: str) -> str:
    return dashboard_row(app, "dash-session", label)


def context_used(app) -> int:
    """The dashboard's context figure: tokens held, before the " / n_ctx"."""
    return int(dashboard_row(app, "dash-now", "context").split(" /")[0].replace(",", ""))


async def idle(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.chat.phase is TurnPhase.IDLE, what="the reply to finish")


@pytest.fixture
def store(workspace):
    with SessionStore(workspace.db_path) as store:
        yield store


async def test_a_resumed_launch_shows_the_context_of_the_branch_it_continues(build, store):
    app, _ = build(["Paris.", "Rome.", "It is Paris."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Capital of France?")
        await send(pilot, "And of Italy?")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 3, what="the regenerated turn")
        await idle(pilot)
        sid = app.conversation.session_id
    store.select_turn(sid, 2)  # the first version is the branch the session goes on from
    shown, other = store.turn(sid, 2).metrics, store.turn(sid, 3).metrics
    assert shown.generated_tokens != other.generated_tokens
    app, _ = build(["Rome, still."], store=store, resume=sid)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_for(pilot, lambda: context_used(app) == shown.prompt_tokens + shown.generated_tokens,
                       what="the context of the branch continued, not of the turn computed last")


async def test_regenerate_keeps_the_old_reply_and_arrows_switch_between_them(build, store):
    app, engines = build(["Paris.", "Rome.", "It is Paris.", "Lyon is second."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        # The title follows the status the session sets too (the persona's prefix is ready).
        await wait_for(pilot, lambda: str(app.query_one("#title-bar").render()).endswith("· ready"),
                       what="the title to say ready")
        await send(pilot, "Capital of France?")
        await send(pilot, "And of Italy?")
        sid = app.conversation.session_id
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 3, what="the regenerated turn")
        await idle(pilot)
        # The model got the path before the turn, and the same question again.
        assert engines[0].received[-1][1:] == (
            [ChatMessage("user", "Capital of France?"), ChatMessage("assistant", "Paris.")], "And of Italy?")
        assert replies(app) == ["Paris.", "It is Paris."] and users(app) == ["Capital of France?", "And of Italy?"]
        assert not any("likely match" in n for n in notifications(app))  # it samples anew
        last = app.query(AssistantReply).last()
        assert last.branch_text == "‹ 2/2 ›" and "‹ 2/2 ›" in rendered(last)
        # Its title names the store's turn number, the one F3 and forks use: 3, with 2 shown.
        assert last.turn_id == 3 and "turn 3" in last.title_text
        assert [r.reply for r in store.turns(sid)] == ["Paris.", "It is Paris."]
        assert [store.turn(sid, i).reply for i in store.siblings(sid, last.turn_id)] == ["Rome.", "It is Paris."]
        # The dashboard counts the turns computed as the listings do: 2 shown, 1 on another branch.
        assert session_row(app, "turns") == "2 (+1 on other branches)"

        # ← in the focused conversation: the old reply is back, and it is the history.
        app.query_one("#conversation").focus()
        await pilot.press("left")
        await wait_for(pilot, lambda: replies(app) == ["Paris.", "Rome."], what="the first branch")
        assert app.query(AssistantReply).last().branch_text == "‹ 1/2 ›"
        assert "turn 2" in app.query(AssistantReply).last().title_text
        # The context figure is the branch shown, not the turn computed last (on the other one).
        shown, other = store.turn(sid, 2).metrics, store.turn(sid, 3).metrics
        assert shown.generated_tokens != other.generated_tokens
        await wait_for(pilot, lambda: context_used(app) == shown.prompt_tokens + shown.generated_tokens,
                       what="the context of the branch shown")
        assert [m.content for m in app.conversation.history][-2:] == ["And of Italy?", "Rome."]
        # The Turn section shows that branch's last turn, stored, not the regenerated one.
        assert "stored turn" in dashboard_row(app, "dash-turn", "state")
        assert dashboard_row(app, "dash-turn", "generated") == f"{shown.generated_tokens:,}"
        await pilot.press("left")  # no earlier branch: one line, nothing changes
        await wait_for(pilot, lambda: any("No earlier branch" in n for n in notifications(app)),
                       what="the notice")
        assert replies(app) == ["Paris.", "Rome."]
        await send(pilot, "Second city?")
        assert [m.content for m in engines[0].received[-1][1]] == [
            "Capital of France?", "Paris.", "And of Italy?", "Rome."]
        assert [r.reply for r in store.turns(sid)] == ["Paris.", "Rome.", "Lyon is second."]
        # → goes to the regenerated branch again (its path has no third turn).
        app.query_one("#conversation").focus()
        await pilot.press("shift+up", "shift+up")  # the last turn, then turn 1
        await pilot.press("right")
        await wait_for(pilot, lambda: replies(app) == ["Paris.", "It is Paris."], what="the second branch")
        assert len(app.conversation.history) == 4
        assert session_row(app, "turns") == "2 (+2 on other branches)"
        # The sessions screen counts the two exchanges shown, and the two turns on the other branch.
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), what="the sessions screen")
        table = app.screen.query_one(DataTable)
        await wait_for(pilot, lambda: table.row_count == 1, what="the row")
        assert table.get_row_at(0)[2].plain == "2 +2"
        await pilot.press("escape")


async def test_a_message_with_an_escape_sequence_is_edited_as_visible_symbols(build, store):
    app, _ = build(["One."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "clear \x1b[2J this")  # as `ask` or a script may have sent it
        app.query_one("#conversation").focus()
        await pilot.press("shift+up", "e")
        prompt = app.query_one("#prompt")
        assert prompt.text == "clear ␛[2J this"


async def test_a_regenerated_reply_shows_its_own_notices_not_the_old_ones(build, store):
    """The notices above a reply describe its prompt: regenerated, the new
    turn's replace them (they stayed, above the new reply's own)."""
    app, engines = build(["Paris.", "It is Paris."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        engines[0].turn_notices = ["Context full: the oldest turn left the prompt."]
        await send(pilot, "Capital of France?")
        cut = lambda: [n for n in app.query(Notice) if "oldest turn" in rendered(n)]  # noqa: E731
        await wait_for(pilot, lambda: len(cut()) == 1, what="the first turn's notice")
        engines[0].turn_notices = []
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 2, what="the regenerated turn")
        await idle(pilot)
        await pilot.pause(0.1)
        assert replies(app) == ["It is Paris."] and users(app) == ["Capital of France?"]
        assert cut() == []


async def test_edit_an_earlier_message_branches_there(build, store):
    app, engines = build(["One.", "Two.", "Three.", "Deux."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for text in ("first", "second", "third"):
            await send(pilot, text)
        sid = app.conversation.session_id
        conversation = app.query_one("#conversation")
        conversation.focus()
        await pilot.press("shift+up")  # the last turn is marked first
        assert app.query(AssistantReply)[2].has_class("-selected")
        await pilot.press("shift+up")  # turn 2 is selected
        assert app.query(AssistantReply)[1].has_class("-selected")
        await pilot.press("e")
        prompt = app.query_one("#prompt")
        assert prompt.text == "second" and app.focused is prompt
        prompt.clear()
        prompt.insert("second, edited")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 4, what="the edited turn")
        await idle(pilot)
        assert engines[0].received[-1][1:] == ([ChatMessage("user", "first"), ChatMessage("assistant", "One.")],
                                               "second, edited")
        assert users(app) == ["first", "second, edited"] and replies(app) == ["One.", "Deux."]
        assert [r.user_text for r in store.turns(sid)] == ["first", "second, edited"]
        assert app.query(AssistantReply).last().branch_text == "‹ 2/2 ›"
        assert [m.content for m in app.conversation.history] == ["first", "One.", "second, edited", "Deux."]
        # The old branch, third turn included, is one ← away.
        conversation.focus()
        await pilot.press("left")
        await wait_for(pilot, lambda: users(app) == ["first", "second", "third"], what="the old branch")
        assert replies(app) == ["One.", "Two.", "Three."]


async def test_r_regenerates_the_selected_earlier_reply_and_keeps_the_turns_under_it(build, store):
    app, engines = build(["One.", "Two.", "Three.", "Two again."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for text in ("first", "second", "third"):
            await send(pilot, text)
        sid = app.conversation.session_id
        conversation = app.query_one("#conversation")
        conversation.focus()
        await pilot.press("shift+up", "shift+up")  # turn 2 is selected
        await pilot.press("r")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 4, what="the regenerated turn")
        await idle(pilot)
        # The same message again, after the history before it: not the last turn's.
        assert engines[0].received[-1][1:] == ([ChatMessage("user", "first"), ChatMessage("assistant", "One.")],
                                               "second")
        assert users(app) == ["first", "second"] and replies(app) == ["One.", "Two again."]
        assert app.query(AssistantReply).last().branch_text == "‹ 2/2 ›"
        assert [m.content for m in app.conversation.history] == ["first", "One.", "second", "Two again."]
        assert len(store.turns(sid)) == 2  # the current path
        conversation.focus()
        await pilot.press("left")
        await wait_for(pilot, lambda: users(app) == ["first", "second", "third"], what="the old branch")
        assert replies(app) == ["One.", "Two.", "Three."]


async def test_a_sentence_typed_in_the_conversation_goes_to_the_prompt_and_esc_unselects(build, store):
    app, engines = build(["One.", "Two.", "Again."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for text in ("first", "second"):
            await send(pilot, text)
        sid = app.conversation.session_id
        conversation = app.query_one("#conversation")
        conversation.focus()
        await pilot.press("shift+up", "shift+up")  # turn 1 is selected
        # A Tab too many: "This" starts with no turn key, so it all goes to the prompt.
        await pilot.press(*"This")
        prompt = app.query_one("#prompt")
        assert prompt.text == "This" and app.focused is prompt
        assert len(store.turns(sid)) == 2 and len(store.sessions()) == 1  # no fork, no regenerate
        # Keys read in one go (a slow link) all reach the view before the focus
        # moves: the turn keys after the first character go to the prompt too,
        # and a selection there is replaced, as typing there does.
        prompt.select_all()
        conversation.focus()
        for character in "Tree":
            app.post_message(events.Key(character, character))
        await wait_for(pilot, lambda: prompt.text == "Tree", what="the burst in the prompt")
        assert len(store.turns(sid)) == 2 and len(store.sessions()) == 1
        prompt.clear()
        # Esc unselects: Ctrl+R goes back to the last reply.
        await pilot.press("escape")
        assert not app.chat.messages.has_selection
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 3, what="the regenerated turn")
        await idle(pilot)
        assert engines[0].received[-1][2] == "second"
        # With no turn selected, the turn keys are text too: "fine" forks nothing.
        conversation.focus()
        await pilot.press(*"fine")
        assert prompt.text == "fine" and len(store.sessions()) == 1
        prompt.clear()
        # With one, a burst that starts with a turn key runs it (the key was lost
        # before) and the rest is typed: a fork, then "ine" in the prompt.
        conversation.focus()
        await pilot.press("shift+up")
        for character in "fine":
            app.post_message(events.Key(character, character))
        await wait_for(pilot, lambda: len(store.sessions()) == 2 and prompt.text == "ine",
                       what="the fork and the rest of the burst")


async def test_keys_typed_beside_the_prompt_a_tick_apart_stay_in_order(build):
    """Keys that arrive while the focus is moving to the prompt: those sent to the
    conversation and those sent to the prompt come out in the order typed."""
    app, _ = build(["One."])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "first")
        app.query_one("#conversation").focus()
        await idle(pilot)
        # A typo taken back with Backspace in the same burst: that key went to
        # the conversation, and was lost, while the focus moved. (A binding
        # such as Backspace acts once the key has bubbled up to the app, after
        # the text keys behind it, as in any Textual text area: so it ends the burst.)
        keys = [*"stay in orderr", "backspace"]
        text = "stay in order"
        for key in keys:
            app.post_message(events.Key(key, key if len(key) == 1 else None))
            await asyncio.sleep(0)  # one scheduler tick: some went to the prompt ahead of others
        prompt = app.query_one("#prompt")
        await pilot.pause(0.2)
        assert prompt.text == text
        # A paste in the conversation goes to the prompt too (it was dropped).
        prompt.clear()
        app.query_one("#conversation").focus()
        await idle(pilot)
        app.post_message(events.Paste("pasted here"))
        await wait_for(pilot, lambda: prompt.text == "pasted here", what="the paste in the prompt")
        # A coloured log pasted in keeps its words, not its escape sequences
        # (the text area writes what it holds to the terminal as it is).
        prompt.clear()
        app.post_message(events.Paste("\x1b[31merror\x1b[0m: \x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\\x01"))
        await wait_for(pilot, lambda: prompt.text == "error: link␁", what="the cleaned paste")
        # Most terminals send a pasted line break as CR: lines stay lines.
        prompt.clear()
        app.post_message(events.Paste("one\rtwo\r\n\x1b[1mthree\x1b[0m\rfour"))
        await wait_for(pilot, lambda: prompt.text == "one\ntwo\nthree\nfour", what="the lines of the paste")


async def test_the_edit_status_is_whole_at_100_columns_beside_the_dashboard(build, store):
    """It read "editing your message: Enter sends it as a new bra…"."""
    app, _ = build(["Hello."], store=store)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        await send(pilot, "hi")
        app.query_one("#prompt").focus()
        await pilot.press("up")
        await pilot.pause()
        assert rendered(app.query_one("#status")).strip().endswith("Esc cancels")


async def test_empty_edit_and_actions_before_any_turn_are_one_line_and_lose_nothing(build, store):
    app, engines = build(["Hello."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("ctrl+r")
        refusal = "Cannot regenerate yet: this conversation has no stored turn."
        await wait_for(pilot, lambda: refusal in notifications(app), what="the refusal")
        await send(pilot, "hi")
        prompt = app.query_one("#prompt")
        prompt.focus()
        await pilot.press("up")  # ↑ in an empty prompt edits the last message
        assert prompt.text == "hi" and prompt.editing
        prompt.clear()
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("empty message cannot replace" in n for n in notifications(app)),
                       what="the refusal")
        assert len(engines[0].received) == 1 and users(app) == ["hi"] and replies(app) == ["Hello."]
        assert [r.user_text for r in store.turns(app.conversation.session_id)] == ["hi"]
        assert not prompt.editing
        # Esc cancels an edit: the prompt is emptied, the message is as it was.
        await pilot.press("up")
        assert prompt.text == "hi" and "editing: Enter sends" in rendered(app.query_one("#status"))
        app.chat.prefix_started()  # as while a resumed session's prefix loads: "ready" is held back
        await pilot.press("escape")
        assert prompt.text == "" and not prompt.editing and users(app) == ["hi"]
        assert "edit cancelled" in rendered(app.query_one("#status"))  # the status line says so too
        app.chat.prefix_done()
        # An edit never replaces a draft: one line, the draft stays.
        prompt.insert("a draft")
        app.query_one("#conversation").focus()
        await pilot.press("shift+up", "e")
        await wait_for(pilot, lambda: any("Send or clear the message" in n for n in notifications(app)),
                       what="the refusal")
        assert prompt.text == "a draft" and not prompt.editing
        assert app.is_running


async def test_a_failed_turn_is_on_the_path_not_on_another_branch(build, store):
    """The store keeps a failed turn on the path (it adds nothing to the model's history):
    the dashboard counts it as the listings do, not as a branch."""
    app, engines = build(["One.", "Three."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "one")
        engines[0].fail_turn = "context exploded"
        await send(pilot, "two")
        await idle(pilot)
        engines[0].fail_turn = None
        await send(pilot, "three")
        await idle(pilot)
        sid = app.conversation.session_id
        assert store.session(sid).turns_label == "3"
        assert session_row(app, "turns") == "3"


async def test_regenerate_and_branches_from_the_palette(build, store):
    app, engines = build(["A.", "B."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "q")
        await pilot.press("ctrl+p")
        await pilot.press(*"Regenerate")
        await wait_for_palette_hit(pilot, "Regenerate reply")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 2, what="the regenerated turn")
        await idle(pilot)
        assert replies(app) == ["B."]
        await pilot.press("ctrl+p")
        await pilot.press(*"Previous branch")
        await wait_for_palette_hit(pilot, "Previous branch")
        await pilot.press("enter")
        await wait_for(pilot, lambda: replies(app) == ["A."], what="the first branch")


class SlowTypeAhead(FakeEngine):
    """A FakeEngine that prefills ahead, each call taking a while: what it was asked."""

    capabilities = EngineCapabilities(prefill_ahead=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ahead: list[tuple[list[str], str]] = []

    def prefill_ahead(self, persona, history, draft, progress=None, session_id=None):
        self.ahead.append(([m.content for m in history], draft))
        time.sleep(0.3)
        return None


async def test_two_branch_switches_within_one_idle_prefill_prefill_the_branch_shown(workspace, store):
    engines: list[SlowTypeAhead] = []

    def factory(spec):
        engines.append(SlowTypeAhead(spec, workspace.catalog.price(spec.price_profile),
                                     ["Paris.", "Rome.", "It is Rome.", "Rome it is."]))
        return engines[-1]

    app = make_app(workspace, engine_factory=factory, store=store, gpu_status=lambda: None)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Capital of France?")
        await send(pilot, "And of Italy?")
        for _ in range(2):
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: app.chat.phase is TurnPhase.IDLE and not app.chat._ahead_running,
                           what="the regenerated turn")
        assert app.query(AssistantReply).last().branch_text == "‹ 3/3 ›"
        app.query_one("#conversation").focus()
        await pilot.press("left", "left")  # both within one 0.3 s prefill
        await wait_for(pilot, lambda: app.query(AssistantReply).last().branch_text == "‹ 1/3 ›",
                       what="the first branch")
        await wait_for(pilot, lambda: not app.chat._ahead_running and engines[0].ahead[-1][0][-1] == "Rome.",
                       timeout=10, what="an idle prefill of the branch shown")
        assert engines[0].ahead[-1] == (["Capital of France?", "Paris.", "And of Italy?", "Rome."], "")


async def test_the_path_under_a_branch_switched_to_is_in_view(build, store):
    # Few turns: they sit at the bottom of the view. Selecting one used to let go
    # of that placement, and the path mounted by ← then lay below the view, out
    # of reach until a resize.
    app, _ = build(["one.", "two.", "three.", "three again.", "two, edited."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for text in ("Hi there", "Tell me a fruit", "Another one"):
            await send(pilot, text)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 4, what="the regenerated turn")
        await idle(pilot)
        view = app.query_one("#conversation")
        view.focus()
        await pilot.press("shift+up", "shift+up", "e")
        prompt = app.query_one("#prompt")
        prompt.clear()
        prompt.insert("Tell me a vegetable")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 5, what="the edited turn")
        await idle(pilot)
        view.focus()
        await pilot.press("shift+up", "left")
        await wait_for(pilot, lambda: replies(app) == ["one.", "two.", "three again."], what="the first branch")
        await pilot.pause(0.2)
        last = app.query(AssistantReply).last()
        assert view.region.contains_region(last.region), (view.region, last.region)


async def test_a_session_continued_by_another_process_meanwhile_is_said_and_branched(build, store, workspace):
    app, engines = build(["One.", "Two.", "Three."], store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "first")
        sid = app.conversation.session_id
        # `chatterm ask --session` in another terminal: its own connection, its turn the leaf.
        with SessionStore(workspace.db_path) as other:
            other.record_turn(sid, "asked elsewhere", "Elsewhere.", full_metrics())
        await send(pilot, "second")
        assert any(f"Session {sid} was continued elsewhere (turn 2)" in n for n in notifications(app))
        # In the conversation too, above the message: the toast is gone before the reply is read.
        from chatterm.ui.transcript import Notice

        assert [str(n.render()).startswith(f"Session {sid} was continued elsewhere") for n in app.query(Notice)
                if n.has_class("-warning")] == [True]
        # The message went on from the conversation shown: a branch beside that turn.
        assert [r.user_text for r in store.turns(sid)] == ["first", "second"]
        assert store.siblings(sid, 3) == [2, 3]
        assert engines[0].received[-1][1][-1].content == "One."
        before = len(notifications(app))
        await send(pilot, "third")  # in step again: nothing to say
        assert not any("continued elsewhere" in n for n in notifications(app)[before:])
