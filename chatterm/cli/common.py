"""Helpers shared by the subcommands."""

from __future__ import annotations

import argparse

from chatterm.core.workspace import Workspace


def workspace(args: argparse.Namespace) -> Workspace:
    return Workspace.load(models_file=args.models, db_path=args.db)


def add_model_persona_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="ID", help="model id from models.toml (default: the catalog default)")
    parser.add_argument("--persona", metavar="NAME", help="persona id (default: assistant)")
