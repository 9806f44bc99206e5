"""Helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from chatterm.core.config import paths
from chatterm.core.config.catalog import ModelCatalog, load_catalog
from chatterm.core.config.personas import DEFAULT_PERSONA
from chatterm.core.config.schema import INT_MAX, skipped
from chatterm.core.metrics.format import printable
from chatterm.core.workspace import Workspace
from chatterm.errors import ChattermError

if TYPE_CHECKING:
    from rich.text import Text


def workspace(args: argparse.Namespace) -> Workspace:
    """The workspace, with one warning per skipped models.toml entry and per
    skipped persona file (the rest still works). A command that loads a model
    (it has --model) leaves out the entry it will ask for, and one that uses a
    persona (it has --persona) the file of the persona it will ask for, when
    asking for it fails with that same line as the error (not when a bundled
    entry of that name answers instead)."""
    ws = Workspace.load(models_file=args.models, db_path=_named_db(args)[0])
    # Left out only when asking for it will fail: a user's broken entry that
    # overrides a bundled one is skipped, and the bundled one answers.
    model = getattr(args, "model", None) or ws.catalog.default_model
    wanted = ws.catalog.broken.get(model) if hasattr(args, "model") and model not in ws.catalog.models else None
    _warn_skipped(ws.catalog.errors, wanted)
    persona = getattr(args, "persona", None) or DEFAULT_PERSONA
    wanted = (ws.personas.broken.get(persona)
              if hasattr(args, "persona") and persona not in ws.personas.personas else None)
    _warn_skipped(ws.personas.errors, wanted)
    return ws


def catalog(args: argparse.Namespace) -> ModelCatalog:
    """The model catalog alone (--models FILE, else bundled + user), with the
    same warnings as `workspace`, for commands that read only the database:
    `export` prices its reports with it, and `sessions` and `export` call it
    for an --models FILE the user named (it is read although it is not
    needed, so a missing or broken one is the same error as for every other
    command)."""
    models = load_catalog(args.models)
    _warn_skipped(models.errors)
    return models


def _warn_skipped(errors: list[str], leave_out: str | None = None) -> None:
    for error in errors:
        if error != leave_out:
            print(f"chatterm: warning: {printable(skipped(error))}", file=sys.stderr)


def db_path(args: argparse.Namespace) -> Path:
    """The session database for a command that opens it: --db, else $CHATTERM_DB,
    else the data folder's. A database the user named must be in a folder that
    exists: the store creates missing folders, which for a mistyped path would
    leave a new folder tree with an empty database in it (or, read-only, list
    "no sessions" where the user expects theirs). The data folder is created on
    first use, also when a database the user named is in it (a profile that
    exports the default path must work on a new machine)."""
    named, source = _named_db(args)
    if named is None:
        return paths.default_db_path()
    folder = named.parent
    if not folder.is_dir() and folder.resolve() != paths.data_dir().resolve():
        if folder.exists():
            raise ChattermError(f"{source} {named}: {folder} is not a folder; choose another path")
        raise ChattermError(f"{source} {named}: folder {folder} does not exist; create it first or choose another path")
    return named


def _named_db(args: argparse.Namespace) -> tuple[Path | None, str]:
    """The database the user named (None: the data folder's), and where they named it."""
    if args.db is not None:
        return args.db.expanduser(), "--db"  # --db=~/x.db: the shell leaves a ~ after "=" alone
    return paths.named_db_path(), "$CHATTERM_DB"


def literal(text: object) -> Text:
    """`text` for a rich table, title or status line: never read as markup
    (an id like "[link=...]x" stays as typed), control characters made visible."""
    from rich.text import Text  # imported when a table is drawn: not in `ask`'s start-up

    return Text(printable(str(text)))


def require_positive(option: str, value: int) -> None:
    """A count option (--runs, --limit) must be 1 or more: 0 or a negative
    number would otherwise quietly mean "all" or "none"."""
    if value < 1:
        raise ChattermError(f"{option} must be at least 1 (got {value})")
    if value > INT_MAX:  # llama.cpp and SQLite take C ints
        raise ChattermError(f"{option} must be at most {INT_MAX:,} (got {value:,})")


def write_stdout(chunks: Iterable[bytes]) -> None:
    """UTF-8 bytes to stdout as they are (the text layer might re-encode them)."""
    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)  # a StringIO stand-in has none
    for chunk in chunks:
        if out is not None:
            out.write(chunk)
        else:
            sys.stdout.write(chunk.decode("utf-8"))
    sys.stdout.flush()


SESSION_ID_MAX = 2**63 - 1
"""SQLite's largest integer: an id past it cannot be looked up (OverflowError)."""


def session_id(value: str) -> int:
    """An argparse type for a session id: a number from 1 to SESSION_ID_MAX."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"session id must be a number, not {value!r}") from None
    if not 1 <= number <= SESSION_ID_MAX:
        raise argparse.ArgumentTypeError(f"session id must be from 1 to {SESSION_ID_MAX}, not {value!r}")
    return number


def named(value: str) -> str:
    """An argparse type for an option that names something: "" is a mistake
    (an unset shell variable), not "the default"."""
    if not value.strip():
        raise argparse.ArgumentTypeError("needs a name, not an empty string")
    return value


def add_model_persona_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="ID", type=named,
                        help="model id from models.toml (default: the catalog default)")
    parser.add_argument("--persona", metavar="NAME", type=named, help="persona id (default: assistant)")
