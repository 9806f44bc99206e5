"""`chatterm launch`: the chat app.

Bad ids (model, persona, theme, session), and a local model whose file is
missing or not a GGUF, are reported as one line with exit status 2 before the
terminal is taken over, as `chatterm ask` reports them; a model that llama.cpp
then fails to load is reported in the app, which is on screen by then. Textual is imported only here, so
other subcommands do not pay for it. Quitting while the model still loads ends
the process at once: llama.cpp cannot be interrupted, and it has nothing to
save (`ChatApp.model_loading`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Iterator

from chatterm.cli import early_keys
from chatterm.cli.common import add_model_persona_options, db_path, session_id, workspace
from chatterm.core.config import paths
from chatterm.core.metrics.format import printable
from chatterm.errors import ChattermError


def _session_id(value: str) -> int | str:
    if value == "latest":  # argparse passes the const through `type` too
        return value
    return session_id(value)


def register(sub, common) -> None:
    p = sub.add_parser(
        "launch",
        parents=[common],
        help="open the chat app (streaming replies, live latency dashboard)",
        description="Open the chat app. With no options: the default model and the "
        "'assistant' persona. F1 in the app lists every key.",
    )
    add_model_persona_options(p)
    p.add_argument("--theme", metavar="NAME", help="colour theme for this run (the palette's choice is remembered)")
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        type=_session_id,
        metavar="ID",
        help="continue a stored session (the one last talked in when no ID is given; `chatterm sessions` lists them)",
    )
    p.add_argument(
        "--no-type-ahead",
        dest="type_ahead",
        action="store_false",
        help="do not prefill a message while it is typed (settings.toml: [tui] type_ahead = false)",
    )
    p.set_defaults(func=run)


@contextlib.contextmanager
def _logging_to_file() -> Iterator[None]:
    """While the app owns the terminal, log records go to the data folder's
    launch.log: a record written to stderr would draw over the screen."""
    root = logging.getLogger()
    handlers = root.handlers[:]
    path = paths.launch_log_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_symlink():  # a link the user made (to /dev/null, say) is theirs to keep as it is
            path.touch(mode=0o600)  # the user's own: it may quote prompts and server replies
            path.chmod(0o600)
        handler: logging.Handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for old in handlers:
        root.removeHandler(old)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for old in handlers:
            root.addHandler(old)


def _require_terminal() -> None:
    not_terminals = [name for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)) if not stream.isatty()]
    if not_terminals:  # a pipe would get the screen's escape codes, and no key could reach the app
        raise ChattermError(
            f"launch is a full-screen app: {' and '.join(not_terminals)} must be a terminal; "
            "for scripts use `chatterm ask`"
        )


def run(args: argparse.Namespace) -> int:
    early_keys.hold()  # first: an Enter typed while the rest starts must stay an Enter
    from chatterm.core.store.session_store import SessionStore
    from chatterm.ui.launch import make_app, require_theme

    ws = workspace(args)
    db = db_path(args)
    # Bad input must not leave an empty database behind: check what can be
    # checked before the store creates its file.
    if args.resume is None:
        ws.resolve(args.model, args.persona)[0].check_file()
    elif not db.exists():
        raise ChattermError(f"no stored session to resume: {db} does not exist yet")
    require_theme(args.theme)
    if args.resume is None:
        _require_terminal()  # before the store creates its file
    store = SessionStore(db)
    try:
        app = make_app(
            ws,
            model_id=args.model,
            persona_id=args.persona,
            theme=args.theme,
            resume=args.resume,
            store=store,
            type_ahead=args.type_ahead,
        )
        if args.resume is not None:
            app.spec.check_file()  # the resumed session's model
        _require_terminal()  # a resume's session is checked first: its error says more
        from chatterm.ui.paste_input import PasteSafeParser

        PasteSafeParser.typed_before_start = early_keys.take_typed()  # read before what follows
        with _logging_to_file():
            app.run()
    finally:
        store.close()
    if app.fatal is not None:  # the terminal is the user's again: the line the CLI gives any error
        print(f"chatterm: error: {printable(app.fatal)}", file=sys.stderr)
    if app.model_loading:
        # The user quit during the load: the terminal is already restored and
        # every turn is committed; waiting for llama.cpp would only show a blank
        # screen. _exit skips the thread join (and llama.cpp's C++ teardown,
        # which must not run under a load in progress).
        sys.stdout.flush()
        sys.stderr.flush()
        early_keys.restore()  # _exit runs no atexit handler
        os._exit(app.return_code or 0)
    early_keys.restore()
    return app.return_code or 0
