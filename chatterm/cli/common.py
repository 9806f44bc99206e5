"""Helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys

from chatterm.core.format import printable
from chatterm.core.workspace import Workspace


def workspace(args: argparse.Namespace) -> Workspace:
    """The workspace, with one warning per skipped models.toml entry (the rest
    still works). A command that loads a model (it has --model) leaves out the
    entry it will ask for: asking for it fails with that same line as the error."""
    ws = Workspace.load(models_file=args.models, db_path=args.db)
    wanted = ws.catalog.broken.get(args.model or ws.catalog.default_model) if hasattr(args, "model") else None
    for error in ws.catalog.errors:
        if error != wanted:
            print(f"chatterm: warning: skipped: {printable(error)}", file=sys.stderr)
    return ws


def add_model_persona_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="ID", help="model id from models.toml (default: the catalog default)")
    parser.add_argument("--persona", metavar="NAME", help="persona id (default: assistant)")
