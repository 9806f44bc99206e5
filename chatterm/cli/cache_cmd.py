"""`chatterm cache ls | clear [PERSONA]`: the persona KV state files on disk."""

from __future__ import annotations

import argparse
import datetime as dt

from rich.console import Console
from rich.table import Table

from chatterm.cli.common import workspace
from chatterm.core.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("cache", parents=[common], help="list or clear persona KV state files")
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", parents=[common], help="list state files (persona, model, tokens, bytes, last used)")
    ls.set_defaults(func=run_ls)
    clear = actions.add_parser("clear", parents=[common], help="delete state files (all, or one persona's)")
    clear.add_argument("persona", nargs="?", help="only this persona")
    clear.set_defaults(func=run_clear)


def run_ls(args: argparse.Namespace) -> int:
    ws = workspace(args)
    cache = ws.kv_cache()
    entries = cache.entries()
    console = Console()
    if not entries:
        console.print(f"No persona state files in {cache.folder}", markup=False, highlight=False)
        return 0
    table = Table(title=f"Persona KV cache · {cache.folder}")
    for column in ("persona", "model", "tokens", "bytes", "last used"):
        table.add_column(column, justify="right" if column in ("tokens", "bytes") else "left")
    for e in sorted(entries, key=lambda e: -e.last_used):
        table.add_row(
            e.persona_id if e.valid else f"{e.persona_id} (unreadable)",
            e.model_id,
            f"{e.tokens:,}",
            f"{e.bytes:,}",
            dt.datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M:%S"),
        )
    total = sum(e.bytes for e in entries)
    table.caption = f"{total / (1 << 20):,.1f} MiB of {cache.budget_bytes / (1 << 20):,.0f} MiB budget"
    console.print(table)
    return 0


def run_clear(args: argparse.Namespace) -> int:
    ws = workspace(args)
    cache = ws.kv_cache()
    if args.persona is not None:
        known = {e.persona_id for e in cache.entries()}
        if args.persona not in known:
            valid = ", ".join(sorted(known)) or "none cached"
            raise ChattermError(f"no state file for persona {args.persona!r} (cached: {valid})")
    removed = cache.clear(args.persona)
    print(f"removed {removed} state file{'s' if removed != 1 else ''}")
    return 0
