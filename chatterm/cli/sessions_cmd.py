"""`chatterm sessions`: list the stored sessions, newest first.

Reads the database without creating or changing it; a missing or empty one
gives a single friendly line (with --json: no line at all). The model catalog
is not needed: only an --models FILE the user named is read (a missing or
broken one is an error, as for every command). Personas and models are shown
literally (rich `Text`, never markup; control characters made visible) and
whole: no cell is ever cut, folded or wrapped, since an id cut short can read
as another id ("smollm2-13…"); a table wider than the terminal is printed at
its own width. Figures use the same formatting as the TUI
(`chatterm.core.metrics.format`). --json prints each session's `SessionInfo` as one
JSON line instead (raw numbers, Unix seconds), the way export writes JSONL.
"""

from __future__ import annotations

import argparse
import dataclasses
from datetime import datetime

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from chatterm.cli.common import catalog, db_path, require_positive, write_stdout
from chatterm.core.metrics.format import fmt_ms, printable, usd_number
from chatterm.core.report.escape import json_line
from chatterm.core.store.session_store import SessionInfo, SessionStore

JSON_FIELDS = tuple(f.name for f in dataclasses.fields(SessionInfo))
_UNBOUNDED = 1 << 16
"""The console width: wider than any table of sessions."""


def register(sub, common) -> None:
    p = sub.add_parser(
        "sessions",
        parents=[common],
        help="list stored sessions (id, date, persona, model, turns, TTFT p50, cost)",
        description="List the sessions in the session database, newest first. "
        "Resume one with `chatterm launch --resume ID`; export with `chatterm export ID`.",
    )
    p.add_argument("-n", "--limit", type=int, metavar="N", help="show only the N newest sessions")
    p.add_argument(
        "--json", action="store_true",
        help="print one JSON object per session and line instead of the table, with raw numbers: "
        + ", ".join(JSON_FIELDS) + " (started_at in Unix seconds; ttft_p50_ms null without a first token)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.limit is not None:
        require_positive("--limit", args.limit)
    if args.models is not None:
        catalog(args)
    db = db_path(args)
    with SessionStore(db, readonly=True) as store:
        sessions = store.sessions()
    shown = sessions[: args.limit] if args.limit else sessions
    if args.json:
        write_stdout(json_line(dataclasses.asdict(s)) for s in shown)
        return 0
    # Rich cuts even no_wrap cells ("…") to fit its width, so there is none to
    # fit: a table wider than the terminal comes out at its own width (the
    # terminal wraps its lines), and a pipe gets whole lines.
    console = Console(width=_UNBOUNDED)
    if not sessions:
        console.print(Text(f"No sessions yet in {db}. Start one with `chatterm launch`."))
        return 0
    # A header rule and no column lines: the usual ids fit 80 columns
    # (a full box needed 89 for `shop-support` on `smollm2-135m-q8kv`).
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    # Cost in a "USD" column without the sign: the app's six decimals still fit 80 columns.
    for name in ("ID", "Date", "Persona", "Model", "Turns", "TTFT p50", "USD"):
        table.add_column(name, justify="left" if name in ("Date", "Persona", "Model") else "right")
    for s in shown:
        table.add_row(
            str(s.id),
            datetime.fromtimestamp(s.started_at).strftime("%Y-%m-%d %H:%M"),
            Text(printable(s.persona_id)),
            Text(printable(s.model_id)),
            str(s.turns),
            fmt_ms(s.ttft_p50_ms),
            usd_number(s.cost_usd),
        )
    console.print(Text(f"Sessions in {db}", style="table.title"))  # not the table's title: that wraps at its width
    console.print(table)
    if len(shown) < len(sessions):
        console.print(Text(f"({len(sessions) - len(shown)} older sessions not shown)"))
    return 0
