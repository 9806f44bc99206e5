"""`chatterm ask`: one turn without the TUI, for scripts and quick checks.

The reply streams to stdout; the turn's metrics line goes to stderr (or one
JSON object to stdout with --json). It uses and fills the persona KV cache and
the session store exactly like the TUI, so a second `ask` with the same
persona reports a restore from disk. Exit status: 0 when the reply finished,
1 when the turn failed, 2 for bad input, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys

from chatterm.cli.common import add_model_persona_options, workspace
from chatterm.core.conversation import Conversation
from chatterm.core.errors import ChattermError
from chatterm.core.format import footer_line, printable
from chatterm.core.store import SessionStore


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
    p.add_argument("--session", type=int, metavar="ID", help="continue stored session ID")
    p.add_argument("--no-store", action="store_true", help="do not record the turn in the session database")
    p.set_defaults(func=run)


def _message(args: argparse.Namespace) -> str:
    if args.message is not None:
        text = args.message
    elif not sys.stdin.isatty():
        text = sys.stdin.read()
    else:
        raise ChattermError("no message: pass it as an argument or on standard input")
    if not text.strip():
        raise ChattermError("the message is empty")
    return text


def run(args: argparse.Namespace) -> int:
    ws = workspace(args)
    text = _message(args)
    store = None if args.no_store else SessionStore(ws.db_path)
    try:
        history, turns, persona_id, model_id = [], [], args.persona, args.model
        if args.session is not None:
            if store is None:
                raise ChattermError("--session needs the session database (drop --no-store)")
            info = store.session(args.session)
            if args.persona and args.persona != info.persona_id:
                raise ChattermError(
                    f"session {args.session} uses persona {info.persona_id!r}, not {args.persona!r}"
                )
            if args.model and args.model != info.model_id:
                raise ChattermError(
                    f"session {args.session} uses model {info.model_id!r}, not {args.model!r}"
                )
            persona_id, model_id = info.persona_id, info.model_id
            history = store.history(args.session)
            turns = [record.metrics for record in store.turns(args.session)]
        spec, persona = ws.resolve(model_id, persona_id)
        engine = ws.make_engine(spec)
        engine.load()
        try:
            conversation = Conversation(
                engine, persona, store=store, session_id=args.session, history=history, turns=turns
            )
            turn = conversation.send(text)
            try:
                for delta in turn.stream():
                    if not args.json:
                        sys.stdout.write(printable(delta))
                        sys.stdout.flush()
            except KeyboardInterrupt:
                turn.cancel()
            m = turn.metrics
        finally:
            engine.close()  # waits for a background state-file write
        # The state file is written after the reply; a failed write shows up here.
        late = engine.cache_notice()
        if late:
            turn.notices.append(late)
        if args.json:
            print(json.dumps({
                "reply": turn.reply,
                "session_id": conversation.session_id,
                "notices": turn.notices,
                "store_error": conversation.store_error,
                "metrics": m.to_dict(),
            }, indent=2))
        else:
            if turn.reply and not turn.reply.endswith("\n"):
                sys.stdout.write("\n")
            sys.stdout.flush()
            for notice in turn.notices:
                print(f"note: {printable(notice)}", file=sys.stderr)
            print(footer_line(m), file=sys.stderr)
            if conversation.store_error:
                print(f"warning: {printable(conversation.store_error)}", file=sys.stderr)
        if m.stop_reason == "error":
            print(f"chatterm: error: {printable(m.error or '')}", file=sys.stderr)
            return 1
        return 130 if m.stop_reason == "cancelled" else 0
    finally:
        if store is not None:
            store.close()
