"""`chatterm sessions`: list the stored sessions, newest first.

Reads the database without creating or changing it; a missing or empty one
gives a single friendly line. The model catalog is not needed: only an
--models FILE the user named is read (a missing or broken one is an error,
as for every command). Personas and models are shown literally (rich
`Text`, never markup; control characters made visible); figures use the same
formatting as the TUI (`chatterm.core.format`).
"""

from __future__ import annotations

import argparse
from datetime import datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from chatterm.cli.common import catalog, db_path, require_positive
from chatterm.core.format import fmt_ms, fmt_usd, printable
from chatterm.core.store import SessionStore


def register(sub, common) -> None:
    p = sub.add_parser(
        "sessions",
        parents=[common],
        help="list stored sessions (id, date, persona, model, turns, TTFT p50, cost)",
        description="List the sessions in the session database, newest first. "
        "Resume one with `chatterm launch --resume ID`; export with `chatterm export ID`.",
    )
    p.add_argument("-n", "--limit", type=int, metavar="N", help="show only the N newest sessions")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.limit is not None:
        require_positive("--limit", args.limit)
    if args.models is not None:
        catalog(args)
    db = db_path(args)
    with SessionStore(db, readonly=True) as store:
        sessions = store.sessions()
    console = Console()
    if not sessions:
        console.print(Text(f"No sessions yet in {db}. Start one with `chatterm launch`."))
        return 0
    shown = sessions[: args.limit] if args.limit else sessions
    table = Table(title=Text(f"Sessions in {db}"), title_justify="left")
    table.add_column("ID", justify="right")
    table.add_column("Date")
    table.add_column("Persona")
    table.add_column("Model")
    table.add_column("Turns", justify="right")
    table.add_column("TTFT p50", justify="right")
    table.add_column("Cost", justify="right")
    for s in shown:
        table.add_row(
            str(s.id),
            datetime.fromtimestamp(s.started_at).strftime("%Y-%m-%d %H:%M"),
            Text(printable(s.persona_id)),
            Text(printable(s.model_id)),
            str(s.turns),
            fmt_ms(s.ttft_p50_ms),
            fmt_usd(s.cost_usd),
        )
    console.print(table)
    if len(shown) < len(sessions):
        console.print(Text(f"({len(sessions) - len(shown)} older sessions not shown)"))
    return 0
