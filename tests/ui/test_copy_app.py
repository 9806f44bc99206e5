"""Copying a reply or one of its code blocks (Pilot, scripted engine): what lands on
the clipboard is the reply as shown, a picker chooses among several blocks, and
nothing to copy is one notification. tests/ui/test_tmux_copy.py checks the OSC 52
sequence in a real terminal."""

from __future__ import annotations

from pilot_steps import loaded, send, wait_for, wait_for_palette_hit
from textual.widgets import OptionList

from chatterm.ui.copy_actions import CodeBlockPicker, code_blocks

SIZE = (120, 40)
TWO_BLOCKS = "Try this:\n\n```python\nprint('hi')\n```\n\nor this:\n\n```sh\necho hi\nls\n```\n"


def notifications(app) -> list[str]:
    return [n.message for n in app._notifications]


def test_code_blocks_are_listed_without_their_fences():
    assert code_blocks(TWO_BLOCKS) == ["print('hi')\n", "echo hi\nls\n"]
    assert code_blocks("    indented\n") == ["indented\n"]
    assert code_blocks("no code, `inline` only") == []


async def test_copy_the_reply_and_a_code_block(build):
    app, _ = build(["Plain \x1b[31mred\x1b[0m answer.", TWO_BLOCKS])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("f9")
        await wait_for(pilot, lambda: "No reply to copy yet." in notifications(app), what="the refusal")
        await pilot.press("f10")  # nothing to look for a code block in: not "this reply has none"
        await wait_for(pilot, lambda: notifications(app).count("No reply to copy yet.") == 2, what="the refusal")
        await send(pilot, "first")
        await pilot.press("f9")
        # The reply as shown: the escape sequence is inert text, never a live one.
        assert app.clipboard == "Plain ␛[31mred␛[0m answer."
        assert any("Copied the reply (1 line)" in n and "if nothing pastes" in n for n in notifications(app))
        await pilot.press("f10")
        await wait_for(pilot, lambda: "This reply has no code block." in notifications(app), what="no block")

        await send(pilot, "second")
        await pilot.press("f10")  # two blocks: a picker
        await wait_for(pilot, lambda: isinstance(app.screen, CodeBlockPicker), what="the picker")
        options = app.screen.query_one(OptionList)
        assert [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)] == [
            "1. print('hi')  (1 line)", "2. echo hi  (2 lines)"]
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.clipboard == "echo hi\nls\n", what="the second block")
        assert any("Copied code block 2 of 2 (2 lines)" in n for n in notifications(app))

        # The selected turn's reply: y in the focused conversation after Shift+↑.
        app.query_one("#conversation").focus()
        await pilot.press("shift+up", "shift+up", "y")  # the last turn, then the first
        assert app.clipboard == "Plain ␛[31mred␛[0m answer."
        await pilot.press("ctrl+p")
        await pilot.press(*"Copy code block")
        await wait_for_palette_hit(pilot, "Copy code block")
        await pilot.press("enter")
        await wait_for(pilot, lambda: notifications(app).count("This reply has no code block.") == 2,
                       what="the palette's copy of the selected reply")


async def test_while_a_reply_is_written_the_copy_keys_take_the_last_finished_one(build):
    """They said "No reply to copy yet." beside ten replies on screen."""
    app, engines = build(["Finished answer.", "one two three four five six"])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "first")
        engine = engines[0]
        engine.hold_after = 2
        app.query_one("#prompt").insert("second")
        await pilot.press("enter")
        await wait_for(pilot, engine.held.is_set, what="the reply held mid-stream")
        await pilot.press("f9")
        await wait_for(pilot, lambda: app.clipboard == "Finished answer.", what="the finished reply copied")
        engine.gate.set()
