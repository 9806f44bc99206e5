"""The model picker (Pilot): fake store folders in a temp HOME holding small
GGUFs written by the `gguf` package, a damaged one, and a hard link of the
real default model, which a switch must load and chat with."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from fake_engine import FakeEngine
from pilot_steps import loaded, send, wait_for, wait_for_palette_hit

from chatterm.core.config.catalog import load_catalog
from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.metrics.format import home_short
from chatterm.core.store.session_store import SessionStore
from chatterm.ui.launch import make_app
from chatterm.ui.models_screen import ModelPicker
from chatterm.ui.prompt import PromptArea
from tests.core.discovery.layouts import STORE_ENV_VARS, finish_gguf, link, smol_path

SIZE = (140, 40)
SMOL_ID = "lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
TINY_ID = "lmstudio:synthetic/[bold]tiny"
CUT_ID = "lmstudio:broken/cut"


def tiny_gguf(path):
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("[red]tiny[/red]")
    writer.add_block_count(2)
    writer.add_context_length(2048)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    finish_gguf(writer, np.zeros((32, 64), dtype=np.float16))
    return path


@pytest.fixture
def stores(tmp_path, monkeypatch):
    """A HOME whose LM Studio folder holds the real default model (a hard link),
    a synthetic GGUF under a name with markup, and a GGUF cut short."""
    home = tmp_path / "home"
    models = home / ".lmstudio" / "models"
    smol = link(smol_path(), models / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF" / smol_path().name)
    tiny_gguf(models / "synthetic" / "[bold]tiny" / "tiny.gguf")
    cut = models / "broken" / "cut" / "cut.gguf"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(b"GGUF\x03\x00\x00\x00")
    for name in STORE_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    return smol


@pytest.fixture
def app_on(workspace):
    """app_on(gate=None) -> (app, engines): a FakeEngine for the launch model and the
    synthetic GGUF (its load held by `gate`), the real LocalEngine for the default model's file."""

    def build(gate: threading.Event | None = None, store=None):
        engines = []

        def factory(spec):
            if spec.id == SMOL_ID:
                engine = workspace.make_engine(spec)
            else:
                engine = FakeEngine(spec, workspace.catalog.price(spec.price_profile), ["Hi from the fake."])
                engine.load_gate = gate if spec.id == TINY_ID else None
            engines.append(engine)
            return engine

        return make_app(workspace, engine_factory=factory, gpu_status=lambda: None, store=store), engines

    return build


async def open_picker(pilot) -> ModelPicker:
    await pilot.press("ctrl+p")
    await pilot.press(*"Models")
    await wait_for_palette_hit(pilot, "Models")
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ModelPicker), what="the model picker")
    picker = pilot.app.screen
    await wait_for(pilot, lambda: picker.query_one("#models-table").row_count >= 3,
                   what=f"the listing ({picker.query_one('#models-status').content})")
    return picker


async def choose(pilot, picker: ModelPicker, model_id: str) -> None:
    table = picker.query_one("#models-table")
    table.move_cursor(row=row_ids(table).index(model_id))
    await pilot.pause()
    await pilot.press("enter")


def row_ids(table) -> list[str]:
    """The listed ids, in order (the model in use without its mark)."""
    return [table.get_row_at(i)[0].plain.removeprefix("● ") for i in range(table.row_count)]


def row_of(table, model_id: str) -> list:
    return table.get_row_at(row_ids(table).index(model_id))


def detail(picker: ModelPicker) -> str:
    return str(picker.query_one("#models-detail").content)


async def test_picker_lists_the_models_with_their_facts_literally(stores, app_on):
    app, _ = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        picker = await open_picker(pilot)
        table = picker.query_one("#models-table")
        header = [str(c.label) for c in table.columns.values()]
        # "fits" first after the id: at 80 columns the last ones scroll out of view.
        assert header == ["id", "fits", "size", "quant", "params", "trained ctx", "KV/token", "arch"]
        smol = dict(zip(header, (cell.plain for cell in row_of(table, SMOL_ID)), strict=True))
        assert (smol["fits"], smol["quant"], smol["params"], smol["trained ctx"], smol["arch"]) == (
            "yes", "Q4_1", "135M", "8,192", "llama")
        tiny = dict(zip(header, (cell.plain for cell in row_of(table, TINY_ID)), strict=True))
        assert tiny["id"] == TINY_ID  # a folder name with markup, shown as it is
        assert (tiny["arch"], tiny["params"], tiny["quant"]) == ("llama", "2.05K", "F16")
        assert tiny["KV/token"] == f"{2 * 2 * (16 + 16) * 2:,} B"
        # Every column in view at 120 columns (the fit was cut at "yes: n_ctx 8,");
        # the fit in full and where the model was found are in the detail line.
        assert table.virtual_size.width <= table.scrollable_content_region.width
        assert "fits: n_ctx 8,192, " in detail(picker) and "found in" in detail(picker)
        ids = row_ids(table)
        assert ids.index(CUT_ID) == len(ids) - 1  # unusable ones last
        # The model in use, defined in models.toml, is listed first and marked.
        assert ids[0] == app.spec.id and row_of(table, app.spec.id)[0].plain == f"● {app.spec.id}"
        await choose(pilot, picker, CUT_ID)
        assert app.screen is picker  # an unusable model cannot be chosen, and Enter says so
        assert detail(picker).startswith(f"Not loaded: {CUT_ID} cannot be used (")
        assert "truncated or damaged (8 bytes" in detail(picker)
        await pilot.press("escape")
        assert not isinstance(app.screen, ModelPicker)


async def test_an_entry_skipped_at_launch_is_listed_as_unusable_with_its_reason(stores, app_on, workspace,
                                                                              isolated_dirs):
    """It was counted nowhere: "3 usable, 0 unusable" beside a models.toml with a typo."""
    user = isolated_dirs["CHATTERM_CONFIG_DIR"] / "models.toml"
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text(f'[models.typo]\nsource = "{stores}"\nn_ctxx = 2048\n')
    workspace.catalog = load_catalog()  # as the launch read it
    app, _ = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        picker = await open_picker(pilot)
        ids = row_ids(picker.query_one("#models-table"))
        assert ids[-2:] == ["typo", CUT_ID] or ids[-2:] == [CUT_ID, "typo"]  # with the unusable, last
        status = str(picker.query_one("#models-status").content)
        assert f"{len(ids) - 2} usable, 2 unusable" in status
        await pilot.press(*["down"] * ids.index("typo"))
        assert detail(picker) == f"typo cannot be used: [models.typo] unknown key 'n_ctxx' ({home_short(user)})"


async def test_an_id_found_twice_is_a_usable_row_and_a_shadowed_one(stores, app_on, monkeypatch):
    """LM Studio's two homes holding one repo each gave two rows of one id, and
    the table's DuplicateKey ended the app."""
    from pathlib import Path

    home, repo = Path(stores).parents[4], Path(stores).parent.relative_to(Path(stores).parents[2])
    tiny_gguf(home / ".cache" / "lm-studio" / "models" / repo / "other.gguf")  # the home read first
    app, _ = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        picker = await open_picker(pilot)
        ids = row_ids(picker.query_one("#models-table"))
        assert ids.count(SMOL_ID) == 2
        await pilot.press(*["down"] * (len(ids) - 1 - ids[::-1].index(SMOL_ID)))
        assert detail(picker).startswith(f"{SMOL_ID} cannot be used: ") and "has the same id" in detail(picker)
        await pilot.press("enter")
        assert app.screen is picker and detail(picker).startswith(f"Not loaded: {SMOL_ID} cannot be used")


async def test_the_picker_reads_models_toml_again_when_it_opens(stores, app_on, isolated_dirs):
    """Entries added to models.toml after the launch were not listed until a relaunch."""
    app, _ = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        user = isolated_dirs["CHATTERM_CONFIG_DIR"] / "models.toml"
        user.parent.mkdir(parents=True, exist_ok=True)
        user.write_text(f'[models.added-later]\nsource = "{stores}"\nn_ctx = 2048\n')
        picker = await open_picker(pilot)
        assert "added-later" in row_ids(picker.query_one("#models-table"))
        await pilot.press("escape")
        # Saved half-edited: the models read before stay (the running one and
        # the one added), and the problem is told once, not on every open.
        user.write_text(user.read_text() + '\n[models.broken-later]\nsource = "x.gguf"\nn_ctx = "big"\n')
        for _ in range(2):
            picker = await open_picker(pilot)
            listed = row_ids(picker.query_one("#models-table"))
            assert "added-later" in listed and app.spec.id in listed
            await pilot.press("escape")
        toasts = [n.message for n in app._notifications if "broken-later" in n.message]
        assert len(toasts) == 1 and toasts[0].startswith("skipped: ") and "n_ctx" in toasts[0]
        assert toasts[0].endswith("(the models read before are kept until it is fixed)")
        user.write_text("[models.unclosed\n")  # not TOML at all
        picker = await open_picker(pilot)
        assert "added-later" in row_ids(picker.query_one("#models-table"))
        assert app.workspace.catalog.get(app.spec.id) == app.spec


async def test_prices_edited_in_models_toml_apply_to_the_next_turn(stores, app_on, isolated_dirs):
    """They applied to F5's what-if and to exports; the running engine kept the old ones."""
    app, _ = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "hello")
        before = app.conversation.turns[-1]
        user = isolated_dirs["CHATTERM_CONFIG_DIR"] / "models.toml"
        user.parent.mkdir(parents=True, exist_ok=True)
        user.write_text('[prices."gpt-4.1"]\ninput = 1000\ncached_input = 0.00001\noutput = 3000\nlabel = "Dear"\n')
        await open_picker(pilot)
        await pilot.press("escape")
        await send(pilot, "and again")
        after = app.conversation.turns[-1]
        assert after.price_profile == before.price_profile == "gpt-4.1"
        assert after.cost_output_usd == pytest.approx(after.generated_tokens * 3000 / 1e6)
        assert before.cost_output_usd < before.generated_tokens * 3000 / 1e6 / 10
        told = [n.message for n in app._notifications if "priced as models.toml now sets Dear" in n.message]
        assert told == ["The next turns are priced as models.toml now sets Dear: $1,000.00 per 1M input tokens "
                        "($0.00001 cached), $3,000.00 per 1M output."]


async def test_switching_loads_the_default_models_file_and_chats_on_it(stores, app_on):
    app, engines = app_on()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        old = engines[0]
        app.query_one("#conversation").focus()  # Tab there before the switch: the keys come back to the prompt
        picker = await open_picker(pilot)
        await choose(pilot, picker, SMOL_ID)
        await wait_for(pilot, lambda: app.spec.id == SMOL_ID and app.conversation is not None
                       and app.conversation.engine is app.lease.engine, timeout=120, what="the switch")
        await wait_for(pilot, lambda: isinstance(app.focused, PromptArea), what="the prompt's focus")
        engine = app.lease.engine
        assert isinstance(engine, LocalEngine) and engine.spec.model_path() == stores
        assert old.closed  # the replaced engine, idle, is closed at once
        assert "Now on " + SMOL_ID in " ".join(str(n.content) for n in app.query("Notice"))
        await send(pilot, "Say hi.")
        assert app.conversation.turns[-1].model_id == SMOL_ID
        assert app.conversation.turns[-1].generated_tokens > 0


async def continue_on(pilot, picker: ModelPicker, model_id: str) -> None:
    """`c` on `model_id` in the open picker, and the switch done."""
    app = pilot.app
    table = picker.query_one("#models-table")
    table.move_cursor(row=row_ids(table).index(model_id))
    await pilot.pause()
    await pilot.press("c")
    await wait_for(pilot, lambda: app.spec.id == model_id and app.conversation is not None
                   and app.conversation.engine is app.lease.engine, timeout=120, what="the switch")


@pytest.mark.parametrize("then", ["a turn", "a fork"])
async def test_c_continues_the_stored_session_on_the_new_model(stores, app_on, workspace, then):
    """Without a warning that it goes on on another model: it was asked for. Nor
    after a fork made at once ("session 5 was recorded with ..." of a session
    made a moment before)."""
    store = SessionStore(workspace.db_path)
    app, engines = app_on(store=store)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await send(pilot, "hello")
            session = app.conversation.session_id
            picker = await open_picker(pilot)
            hint = " ".join(str(s.content) for s in picker.query(".modal-hint"))
            assert f"c: load it, session {session} continues there" in hint
            await continue_on(pilot, picker, SMOL_ID)
            assert app.conversation.session_id == session and len(app.conversation.turns) == 1
            assert engines[0].closed
            if then == "a turn":
                await send(pilot, "And again?")
                assert [t.model_id for t in app.conversation.turns][-1] == SMOL_ID
                assert [s.id for s in store.sessions()] == [session]  # the same session, now on the new model
            else:
                app.query_one("#conversation").focus()
                await pilot.press("shift+up", "f")
                await wait_for(pilot, lambda: app.conversation is not None
                               and app.conversation.session_id != session
                               and len(app.conversation.history) == 2, what="the fork")
                await pilot.pause(0.2)
                assert app.spec.id == SMOL_ID
            assert not [n.message for n in app._notifications if "was recorded with" in n.message]
    finally:
        store.close()


async def test_c_while_a_reply_streams_continues_with_that_reply_stopped_and_shown(stores, app_on, workspace):
    """The session was read before the stopped reply was stored: the turn hid
    from the screen, though the next prompt held it, and the old turn's end
    then put its figures on the dashboard."""
    from chatterm.ui.chat_view import TurnPhase
    from chatterm.ui.transcript import AssistantReply, UserMessage

    store = SessionStore(workspace.db_path)
    app, engines = app_on(store=store)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await send(pilot, "hello")
            session = app.conversation.session_id
            engines[0].replies = ["one two three four five six seven eight"]
            engines[0].hold_after = 2
            app.query_one(PromptArea).insert("tell me more")
            await pilot.press("enter")
            await wait_for(pilot, engines[0].held.is_set, what="the stream to be held")
            picker = await open_picker(pilot)
            table = picker.query_one("#models-table")
            table.move_cursor(row=row_ids(table).index(TINY_ID))
            await pilot.pause()

            def release_once_switching() -> None:
                # From a thread: a Pilot pause waits for every handler, the
                # switch's own (waiting for this very turn to end) included.
                while not (len(engines) > 1 and engines[1].loaded):
                    time.sleep(0.01)
                time.sleep(0.2)  # the switch has begun: the stopped turn ends only now
                engines[0].gate.set()

            threading.Thread(target=release_once_switching, daemon=True).start()
            await pilot.press("c")
            await wait_for(pilot, lambda: app.spec.id == TINY_ID and app.conversation is not None
                           and app.conversation.engine is app.lease.engine
                           and app.chat.phase is TurnPhase.IDLE, what="the switch")
            assert app.conversation.session_id == session
            stopped = app.conversation.turns[-1]
            assert len(app.conversation.turns) == 2 and stopped.stop_reason == "cancelled"
            await wait_for(pilot, lambda: [u.text for u in app.query(UserMessage)] == ["hello", "tell me more"],
                           what="both messages on screen")
            assert "stopped" in app.query(AssistantReply)[-1].footer_text
    finally:
        store.close()


async def test_escape_while_loading_keeps_the_old_model(stores, app_on):
    gate = threading.Event()
    app, engines = app_on(gate)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            old, spec = engines[0], app.spec
            picker = await open_picker(pilot)
            await choose(pilot, picker, TINY_ID)
            await wait_for(pilot, lambda: len(engines) == 2 and engines[1].loading.is_set(), what="the load")
            assert "Loading " + TINY_ID in detail(picker)
            await pilot.press("escape")
            assert not isinstance(app.screen, ModelPicker)
            gate.set()
            await wait_for(pilot, lambda: engines[1].closed, what="the abandoned engine's close")
            assert app.lease.engine is old and app.spec is spec and not old.closed
            await send(pilot, "hello")
            assert old.received  # the old model still answers
    finally:
        gate.set()


def test_a_replaced_engine_in_use_is_closed_when_its_worker_lets_go(workspace):
    from chatterm.ui.engine_lease import EngineLease

    spec = workspace.catalog.get(None)
    old, new = (FakeEngine(spec, workspace.catalog.price(spec.price_profile)) for _ in range(2))
    lease = EngineLease()
    lease.adopt(old)
    with lease.use() as engine:
        assert engine is old
        lease.replace(new)
        assert lease.engine is new and not old.closed  # a turn on the old model is still running
    assert old.closed and not new.closed
    lease.close_when_idle()
    assert new.closed
    late = FakeEngine(spec, workspace.catalog.price(spec.price_profile))
    lease.replace(late)  # a load that finishes after the app quit
    assert late.closed and lease.engine is None
