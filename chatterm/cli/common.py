"""Helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys

from chatterm.core.format import printable
from chatterm.core.workspace import Workspace


def workspace(args: argparse.Namespace) -> Workspace:
    ws = Workspace.load(models_file=args.models, db_path=args.db)
    for error in ws.catalog.errors:  # skipped models.toml entries: the rest still works
        print(f"chatterm: warning: model entry skipped: {printable(error)}", file=sys.stderr)
    return ws


def add_model_persona_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="ID", help="model id from models.toml (default: the catalog default)")
    parser.add_argument("--persona", metavar="NAME", help="persona id (default: assistant)")
