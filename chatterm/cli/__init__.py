"""The `chatterm` command line.

Each subcommand lives in its own module with a `register(subparsers, common)`
function; they all share the core through `Workspace`. A `ChattermError`
anywhere becomes one line on stderr and exit status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from chatterm import __version__
from chatterm.cli.stdout_guard import StdoutError, guarded_stdout, silence
from chatterm.core.config import paths
from chatterm.core.metrics.format import printable
from chatterm.errors import ChattermError

# Subcommand modules, in the order `chatterm --help` lists them.
COMMAND_MODULES = ("launch", "ask", "bench", "sessions", "export", "cache", "models", "paths")


def _common_options() -> argparse.ArgumentParser:
    # SUPPRESS defaults let the options go before or after the subcommand
    # (`chatterm --db X sessions` and `chatterm sessions --db X`) without the
    # subparser's default overwriting the top-level value.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument(
        "--models", type=Path, metavar="FILE", help="use this models.toml instead of the bundled + user ones"
    )
    common.add_argument(
        "--db", type=Path, metavar="FILE",
        help="session database, in a folder that exists (default: $CHATTERM_DB, else the data folder's)",
    )
    common.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    return common


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line like every other error (the
    usage block it prints by default buries the line that matters). Its
    subcommands' parsers are of this class too (argparse makes them so)."""

    def error(self, message: str):
        self.exit(2, f"chatterm: error: {message} (see `{self.prog} --help`)\n")


def _named_command(argv: list[str]) -> str | None:
    """The subcommand argv names, found without parsing it: the first word that
    is not an option or the value of --models / --db."""
    words = iter(argv)
    for word in words:
        if word in ("--models", "--db"):
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMAND_MODULES else None
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for argv: every subcommand, or, when argv names one, only
    that one. Each command module imports what its command needs (rich, the
    store, the report writers); `chatterm ask` should not wait for the others'
    imports before its model starts loading (docs/llama-server.md)."""
    import importlib

    common = _common_options()
    parser = _Parser(
        prog="chatterm",
        description="Chat with local GGUF models and see (and control) every millisecond of latency.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"chatterm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    named = _named_command(sys.argv[1:] if argv is None else argv)
    for name in (named,) if named else COMMAND_MODULES:
        module = importlib.import_module(f"chatterm.cli.{name}_cmd")
        module.register(sub, common)
    return parser


PATH_OPTIONS = {"db", "models", "output", "json"}
"""Options that only name a file: on Linux a file name may be any bytes."""


def _not_utf8(args: argparse.Namespace) -> str | None:
    """The first argument that becomes text (a message, a title, a search, an
    id) and is not UTF-8, as its bytes: Python hands such bytes over as lone
    surrogates, which fail wherever the text is written."""
    for dest, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if dest in PATH_OPTIONS or not isinstance(item, str):
                continue
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return repr(item.encode("utf-8", "surrogateescape"))
    return None


def main(argv: list[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        if sys.stderr is not None:
            print("chatterm: error: standard output is closed", file=sys.stderr)
        return 2
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    bad = _not_utf8(args)
    if bad is not None:
        print(f"chatterm: error: argument {bad} is not UTF-8", file=sys.stderr)
        return 2
    folder = paths.folder_problem()
    if folder is not None:
        print(f"chatterm: error: {printable(folder)}", file=sys.stderr)
        return 2
    for name, default in (("models", None), ("db", None), ("verbose", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # -v is chatterm's and llama.cpp's detail: markdown-it logs every block rule
    # it tries (thousands of lines per reply) at DEBUG.
    logging.getLogger("markdown_it").setLevel(logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with guarded_stdout():
            return int(args.func(args) or 0)
    except ChattermError as exc:
        print(f"chatterm: error: {printable(str(exc))}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("chatterm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except StdoutError as exc:
        silence()
        print(f"chatterm: error: cannot write to standard output: {exc.strerror or exc}", file=sys.stderr)
        return 2
