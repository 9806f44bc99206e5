"""`chatterm ask`: one turn without the TUI, for scripts and quick checks.

The reply streams to stdout; the turn's metrics line goes to stderr, then,
for a new session, its id (or one JSON object to stdout with --json). It
uses and fills the persona KV cache and the session store exactly like the
TUI, so a second `ask` with the same persona reports a restore from disk. `--fork ID[:TURN]` first makes a new
session holding session ID's conversation up to turn TURN (default: its
current reply) with the parent's KV states, then asks in it: the question
restores the shared history instead of prefilling it (an unknown session or
turn is bad input, and makes nothing). Exit status: 0 when the reply finished,
1 when the turn failed, 2 for bad input (a local model's file missing or not a
GGUF included, found before the session database is touched), 130 when
interrupted. When stderr is a terminal, the model load's progress and then a
long prefill's are shown there, on one line rewritten in place and cleared
before the reply. A local model is loaded with the context this one turn
needs (`one_turn_context`), not its whole `n_ctx`: the KV buffer is
allocated and cleared at load. Its file starts loading while llama-cpp-python
is still importing (`early_load`), and the store opens meanwhile.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import threading
from typing import TYPE_CHECKING, Callable

from chatterm.cli.common import add_model_persona_options, db_path, session_id, workspace, write_stdout
from chatterm.core.config.catalog import ModelSpec
from chatterm.core.config.personas import Persona
from chatterm.core.engine.context_window import one_turn_context
from chatterm.core.metrics.format import footer_line, prefill_progress_line, printable
from chatterm.core.metrics.turn_metrics import StopReason
from chatterm.core.workspace import Workspace
from chatterm.errors import ChattermError

# The store and the conversation are imported where they are used: a new
# conversation imports them while its model file loads (`Workspace.make_engine`).
if TYPE_CHECKING:
    from chatterm.core.store.resume import Continuation
    from chatterm.core.store.session_store import SessionStore

log = logging.getLogger(__name__)


def register(sub, common) -> None:
    p = sub.add_parser(
        "ask",
        parents=[common],
        help="ask one question and stream the reply (metrics on stderr)",
        description="Ask one question without the TUI. The message comes from the "
        "argument or, when absent, from standard input.",
    )
    add_model_persona_options(p)
    p.add_argument("message", nargs="?", help="the message (default: read standard input)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the reply and all metrics")
    p.add_argument("--session", type=session_id, metavar="ID", help="continue stored session ID")
    p.add_argument(
        "--fork", metavar="ID[:TURN]",
        help="ask in a new session that starts as session ID up to turn TURN (default: its current reply)",
    )
    p.add_argument("--no-store", action="store_true", help="do not record the turn in the session database")
    p.set_defaults(func=run)


def _message(args: argparse.Namespace) -> str:
    if args.message is not None:
        text = args.message
    elif sys.stdin is not None and not sys.stdin.isatty():  # None: started with stdin closed
        data = sys.stdin.buffer.read()
        try:
            # `echo ... |` and heredocs end with a newline the user did not write.
            text = data.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise ChattermError(
                f"the message on standard input is not UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})"
            ) from None
    else:
        raise ChattermError("no message: pass it as an argument or on standard input")
    if not text.strip():
        raise ChattermError("the message is empty")
    return text


class _LoadProgress:
    """The model load's progress on stderr, from before the engine is imported
    (that import is part of the wait) until `clear()`."""

    def __init__(self, spec: ModelSpec):
        self._label = printable(spec.label)
        self._shown: int | None = None

    def __call__(self, fraction: float) -> bool:
        percent = int(fraction * 100)
        if percent != self._shown:
            sys.stderr.write(f"\r\x1b[Kloading {self._label} · {percent} %")
            sys.stderr.flush()
            self._shown = percent
        return True  # never abandon the load

    def clear(self) -> None:
        if self._shown is not None:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = None


def _show_progress(turn) -> Callable[[], None]:
    """Show a long prefill's progress on stderr (a terminal) until the returned
    function is called: from one second in, rewritten in place twice a second."""
    stop = threading.Event()

    def show() -> None:
        shown = False
        if not stop.wait(1.0):
            while not stop.is_set():
                progress = turn.prefill_progress
                if progress is not None and progress.done < progress.total:
                    sys.stderr.write("\r\x1b[K" + prefill_progress_line(progress))
                    sys.stderr.flush()
                    shown = True
                stop.wait(0.5)
        if shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    thread = threading.Thread(target=show, name="prefill-progress", daemon=True)
    thread.start()

    def done() -> None:
        stop.set()
        thread.join()

    return done


def _sized_for_the_turn(spec: ModelSpec, persona: Persona, text: str, continuation: "Continuation | None") -> ModelSpec:
    """A local model's spec with the context this one turn needs
    (`one_turn_context`): its KV buffer is allocated and cleared at load, so
    cells the turn never uses cost start-up time and memory. A stored state
    restores into any context with room for its cells."""
    if spec.kind != "local":
        return spec
    texts = [persona.system_prompt, text, *(m.content for m in (continuation.history if continuation else ()))]
    n_ctx = one_turn_context(spec.n_ctx, persona.sampling.max_tokens, texts)
    log.debug("context for this turn: %d of the model's %d tokens", n_ctx, spec.n_ctx)
    return dataclasses.replace(spec, n_ctx=n_ctx)


def _fork_point(value: str) -> tuple[int, int | None]:
    """`--fork ID[:TURN]` as (session id, turn index or None)."""
    sid, sep, turn = value.partition(":")
    try:
        return session_id(sid), session_id(turn) if sep else None  # a turn index is as wide
    except argparse.ArgumentTypeError:
        raise ChattermError(f"--fork takes ID or ID:TURN (numbers from 1), not {value!r}") from None


def _fork(store: "SessionStore", ws: Workspace, args: argparse.Namespace) -> int:
    """Check the fork's source (session, turn, model, persona), then make the
    fork; its id. Bad input leaves nothing behind."""
    from chatterm.core.store.lifecycle import fork_session
    from chatterm.core.store.resume import plan_resume

    source, turn = _fork_point(args.fork)
    parent = plan_resume(store, ws, source, model_id=args.model, persona_id=args.persona)
    if turn is not None:
        store.turn(source, turn)  # unknown turn: named
    parent.spec.check_file()
    return fork_session(store, ws.kv_cache(), source, turn).session_id


def run(args: argparse.Namespace) -> int:
    ws = workspace(args)
    text = _message(args)
    continued = args.session is not None or args.fork is not None
    if args.session is not None and args.fork is not None:
        raise ChattermError("--session and --fork are two ways to choose the conversation: pass one")
    if continued and args.no_store:
        raise ChattermError(f"{'--session' if args.session is not None else '--fork'} needs the session "
                            "database (drop --no-store)")
    if args.fork is not None:
        _fork_point(args.fork)
    if not continued:  # bad input must not leave a new database behind
        spec, persona = ws.resolve(args.model, args.persona)
        spec.check_file()
    db = db_path(args)
    if continued and not db.exists():
        wanted = args.session if args.session is not None else args.fork.partition(":")[0]
        raise ChattermError(f"unknown session {wanted}: there is no session database at {db}")
    store: SessionStore | None = None
    try:
        plan = continuation = None
        if continued:
            from chatterm.core.store.resume import plan_resume, read_continuation
            from chatterm.core.store.session_store import SessionStore

            store = SessionStore(db)
            session = args.session if args.fork is None else _fork(store, ws, args)
            plan = plan_resume(store, ws, session, model_id=args.model, persona_id=args.persona)
            spec, persona = plan.spec, plan.persona
            spec.check_file()
            continuation = read_continuation(store, plan)
            if not args.json:  # before the wait it explains (a whole history prefilled again)
                for warning in plan.warnings:
                    print(f"note: {printable(warning)}", file=sys.stderr)
        load_progress = _LoadProgress(spec) if sys.stderr.isatty() else None
        try:
            if load_progress is not None:
                load_progress(0.0)
            engine = ws.make_engine(_sized_for_the_turn(spec, persona, text, continuation))
            try:
                # The model file is loading now (`early_load`): what the turn
                # needs besides the model is imported and opened meanwhile.
                from chatterm.core.engine.conversation import Conversation
                from chatterm.core.store.resume import resume_conversation
                from chatterm.core.store.session_store import SessionStore

                if store is None and not args.no_store:
                    store = SessionStore(db)
                if plan is not None:
                    engine.note_conversation(plan.session_id)  # its state's memory is readied during the load
                engine.load(load_progress)
            except BaseException:
                engine.close()  # stops and frees the early load, if it still runs
                raise
        finally:
            if load_progress is not None:
                load_progress.clear()
        try:
            if plan is not None:
                conversation = resume_conversation(plan, store, engine, continuation=continuation)
            else:
                conversation = Conversation(engine, persona, store=store)
            turn = conversation.send(text)
            stop_progress = _show_progress(turn) if sys.stderr.isatty() else None
            try:
                for delta in turn.stream():
                    if stop_progress is not None:
                        stop_progress()
                        stop_progress = None
                    if not args.json:
                        sys.stdout.write(printable(delta))
                        sys.stdout.flush()
            except KeyboardInterrupt:
                turn.abandon()  # before any text: no session is left behind
            finally:
                if stop_progress is not None:
                    stop_progress()
            m = turn.metrics
        finally:
            engine.close()  # waits for a background state-file write
        # The state file is written after the reply; a failed write shows up here.
        late = engine.cache_notice()
        if late:
            turn.notices.append(late)
        if args.json:
            from chatterm.core.report.escape import json_document  # orjson, only for --json

            write_stdout([json_document({
                "reply": turn.reply,
                "session_id": conversation.session_id,
                "notices": [*(plan.warnings if plan else []), *turn.notices],
                "store_error": conversation.store_error,
                "metrics": m.to_dict(),
            })])
        else:
            if turn.reply and not turn.reply.endswith("\n"):
                sys.stdout.write("\n")
            sys.stdout.flush()
            for notice in turn.notices:
                print(f"note: {printable(notice)}", file=sys.stderr)
            print(footer_line(m), file=sys.stderr)
            if conversation.store_error:
                print(f"warning: {printable(conversation.store_error)}", file=sys.stderr)
            elif conversation.session_id is not None and args.session is None:
                # A new session (a fork's too): its id, which the next `ask` needs.
                sid = conversation.session_id
                print(f"session {sid}: chatterm ask --session {sid} continues it", file=sys.stderr)
        if m.stop_reason == StopReason.ERROR:
            print(f"chatterm: error: {printable(m.error or '')}", file=sys.stderr)
            return 1
        if m.stop_reason == StopReason.CANCELLED:
            return 130
        # Answered, but not stored (a read-only or damaged database): a script
        # continuing with --session must know, as the warning tells a reader.
        return 1 if conversation.store_error else 0
    finally:
        if store is not None:
            store.close()
