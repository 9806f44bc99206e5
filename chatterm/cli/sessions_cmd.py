"""`chatterm sessions`: list, search, rename and delete stored sessions.

- `chatterm sessions` lists them newest activity first (the order `--resume`
  without an id follows): one table row per session, then its title and the
  preview of its current exchange on the line below. Reads the database
  without creating or changing it; a missing or empty one gives a single
  friendly line (with --json: no line at all). The model catalog is not
  needed: only an --models FILE the user named is read (a missing or broken
  one is an error, as for every command). Ids are shown literally (rich
  `Text`, never markup; control characters made visible) and whole: no id
  cell is ever cut, folded or wrapped, since an id cut short can read as
  another id ("smollm2-13…"); a table wider than the terminal is printed at
  its own width. Titles and previews, free text, are cut to the terminal's
  width. Figures use the same formatting as the TUI
  (`chatterm.core.metrics.format`). --json prints each session's
  `SessionInfo` as one JSON line instead (raw numbers, Unix seconds), the way
  export writes JSONL.
- `--search TEXT` lists the matching turns instead, newest first (`ID:TURN`,
  the session's title, where the match is and the text around it); --json
  prints each `SearchHit` as a JSON line. Any text is a valid search but
  an empty one, which is an error.
- `sessions rename ID TITLE` sets a title; `sessions delete ID` removes the
  session's turns and its KV states, after a y/N question on a terminal, or
  with `--yes` (without a terminal and without --yes it refuses: nothing is
  deleted).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from chatterm.cli.common import catalog, db_path, literal, require_positive, session_id, workspace, write_stdout
from chatterm.core.metrics.format import counted, fmt_local_time, fmt_ms, printable, usd_number
from chatterm.core.report.escape import json_line
from chatterm.core.store.lifecycle import delete_session
from chatterm.core.store.records import SearchHit, one_line, turns_note
from chatterm.core.store.session_store import SessionInfo, SessionStore
from chatterm.errors import ChattermError

JSON_FIELDS = tuple(f.name for f in dataclasses.fields(SessionInfo))
HIT_FIELDS = tuple(f.name for f in dataclasses.fields(SearchHit))
SEARCH_LIMIT = 50
_UNBOUNDED = 1 << 16
"""The console width: wider than any table of sessions."""
_INDENT = "    "


def register(sub, common) -> None:
    p = sub.add_parser(
        "sessions",
        parents=[common],
        help="list, search, rename or delete stored sessions (title, preview, turns, TTFT p50, cost)",
        description="List the sessions in the session database, newest activity first, with their "
        "titles and last exchange. Resume one with `chatterm launch --resume ID` (no id: the first "
        "listed); fork one with `chatterm ask --fork ID[:TURN]`; export with `chatterm export ID`.",
    )
    p.add_argument("-n", "--limit", type=int, metavar="N",
                   help=f"show only the N newest sessions (with --search: N hits, default {SEARCH_LIMIT})")
    p.add_argument("--search", metavar="TEXT",
                   help="list the turns whose user message or reply holds every word of TEXT, newest first")
    p.add_argument(
        "--json", action="store_true",
        help="print one JSON object per session and line instead of the table, with raw numbers: "
        + ", ".join(JSON_FIELDS) + " (started_at and active_at in Unix seconds; ttft_p50_ms null "
        "without a first token); with --search: " + ", ".join(HIT_FIELDS),
    )
    p.set_defaults(func=run)
    actions = p.add_subparsers(dest="sessions_action", metavar="ACTION")
    rename = actions.add_parser("rename", parents=[common], help="give a session a title")
    rename.add_argument("session_id", type=session_id, metavar="ID")
    rename.add_argument("title", metavar="TITLE")
    rename.set_defaults(func=run_rename)
    delete = actions.add_parser("delete", parents=[common], help="delete a session and its KV states")
    delete.add_argument("session_id", type=session_id, metavar="ID")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(func=run_delete)


def run(args: argparse.Namespace) -> int:
    if args.limit is not None:
        require_positive("-n/--limit", args.limit)
    if args.models is not None:
        catalog(args)
    db = db_path(args)
    if args.search is not None:
        return _search(db, args)
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
    for name in ("ID", "Active", "Persona", "Model", "Turns", "TTFT p50", "USD"):
        table.add_column(name, justify="left" if name in ("Active", "Persona", "Model") else "right")
    for s in shown:
        table.add_row(
            str(s.id),
            fmt_local_time(s.active_at or s.started_at),
            literal(s.persona_id),
            literal(s.model_id),
            s.turns_label,
            fmt_ms(s.ttft_p50_ms),
            usd_number(s.cost_usd),
        )
    with console.capture() as captured:
        console.print(Text(f"Sessions in {db}", style="table.title"))  # not the table's title: that wraps at its width
        console.print(table)
    # The table rendered once (a print per line cost seconds for 1,000
    # sessions), then each session's title line slipped in under its row.
    title, header, rule, *rows = captured.get().splitlines()
    width = max(Console().width, 40)
    lines = [title, header, rule]
    for line, s in zip(rows, shown, strict=True):
        about = " · ".join(part for part in (s.title, s.preview) if part) or "(no turns)"
        lines += [line, _INDENT + one_line(printable(about), width - len(_INDENT))]
    if len(shown) < len(sessions):
        lines.append(f"({len(sessions) - len(shown)} older sessions not shown)")
    if note := turns_note(shown):
        lines += textwrap.wrap(note, width)  # the terminal would break it mid-word
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _search(db, args: argparse.Namespace) -> int:
    if not args.search.strip():
        raise ChattermError("--search needs a word to look for (it was empty)")
    with SessionStore(db, readonly=True) as store:
        hits = store.search(args.search, limit=args.limit or SEARCH_LIMIT)
    if args.json:
        write_stdout(json_line(dataclasses.asdict(h)) for h in hits)
        return 0
    console = Console(width=_UNBOUNDED)
    if not hits:
        console.print(Text(f"No turn in {db} matches {printable(args.search)!r}."))
        return 0
    width = max(Console().width, 40)
    # Said once: a bare "2:15" beside a listing's times read as a clock time.
    console.print(Text("SESSION:TURN  title, then the match (chatterm ask --fork SESSION:TURN forks there)",
                       style="dim"))
    for hit in hits:
        place = f"{hit.session_id}:{hit.turn_index}"
        console.print(Text(place, style="bold"), literal(hit.title), overflow="ignore", crop=False)
        who = "you" if hit.role == "user" else "reply"
        console.print(Text(_INDENT + one_line(f"{who}: {printable(hit.snippet)}", width - len(_INDENT)),
                           style="dim"))
    return 0


def _writable_store(args: argparse.Namespace) -> SessionStore:
    """The database, opened to change a session in it (never created for that)."""
    db = db_path(args)
    if not db.exists():
        raise ChattermError(f"unknown session {args.session_id}: there is no session database at {db}")
    return SessionStore(db)


def run_rename(args: argparse.Namespace) -> int:
    with _writable_store(args) as store:
        title = store.rename_session(args.session_id, args.title)
    print(f"session {args.session_id} is now {printable(title)!r}")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    ws = workspace(args)
    with _writable_store(args) as store:
        info = store.session(args.session_id)  # unknown id: named, before any question
        store.check_deletable(info.id)  # open in another chatterm: refused before it, too
        if not args.yes:
            if sys.stdin is None or not sys.stdin.isatty():
                raise ChattermError(
                    f"not deleting session {info.id} without confirmation: pass --yes (no terminal to ask on)"
                )
            try:
                answer = input(f"Delete session {info.id} ({printable(info.title)!r}, "
                               f"{counted(info.turns, 'turn')}) and its KV states? [y/N] ")
            except EOFError:  # Ctrl+D: no answer is a no
                print()
                answer = ""
            if answer.strip().lower() not in ("y", "yes"):
                print("Nothing deleted.")
                return 1
        deleted = delete_session(store, ws.kv_cache(), info.id)
    print(deleted.summary(info.id))
    return 0
