"""`chatterm export`: write session latency logs as JSONL, CSV or Markdown.

Reads the database read-only (export never changes it). Output goes to stdout,
or atomically to `-o FILE`: an unknown id or an unwritable path is one line on
stderr, exit status 2, and no file left behind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chatterm.core import paths
from chatterm.core.errors import ChattermError
from chatterm.core.export import FORMATS, collect, render, write_atomic
from chatterm.core.store import SessionStore

_SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".md": "md"}


def register(sub, common) -> None:
    p = sub.add_parser(
        "export",
        parents=[common],
        help="export session latency logs (jsonl, csv, md)",
        description="Export turns and their metrics, one row per turn. Without ID or --all the "
        "latest session is exported. JSONL includes the conversation texts; CSV has metrics "
        "only (plus text lengths); md is a readable report. Field names and units: "
        "docs/export-format.md.",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "session_id", nargs="?", type=int, metavar="ID", help="session to export (default: the latest)"
    )
    which.add_argument("--all", action="store_true", help="export every session, oldest first")
    p.add_argument(
        "-f",
        "--format",
        choices=FORMATS,
        help="output format (default: from the -o suffix .jsonl/.csv/.md, else jsonl)",
    )
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write to FILE (replaced atomically) instead of stdout"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    db = args.db or paths.default_db_path()
    output = Path(args.output) if args.output else None
    fmt = args.format or (_SUFFIX_FORMATS.get(output.suffix.lower(), "jsonl") if output else "jsonl")
    with SessionStore(db, readonly=True) as store:
        if args.all:
            ids = sorted(info.id for info in store.sessions())
        elif args.session_id is not None:
            ids = [args.session_id]
        else:
            latest = store.latest_session_id()
            if latest is None:
                raise ChattermError(f"no sessions to export in {db}")
            ids = [latest]
        text = render(collect(store, ids), fmt)
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomic(output, text)
        print(f"wrote {len(ids)} session(s) to {output}", file=sys.stderr)
    return 0
