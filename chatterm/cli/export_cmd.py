"""`chatterm export`: write session latency logs as JSONL or CSV, or a report
(Markdown or self-contained HTML) that charts and compares sessions.

Reads the database read-only (export never changes it). Several ids put several
sessions in one file (the reports chart them together). Reports price the
sessions under every profile of the model catalog (`--models` or bundled + user
models.toml); JSONL and CSV read only an `--models` FILE the user named. Output
goes to stdout (also `-o -`; on a terminal a line on stderr then says how to
write a file), or atomically to `-o FILE`, in the format its
suffix names (JSONL without a suffix): an unknown id, a session without turns,
a broken catalog, a suffix that names no format (without --format) or an
unwritable path is one line on stderr, exit status 2, and no file left behind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chatterm.cli.common import catalog, db_path, named, session_id, write_stdout
from chatterm.core.metrics.format import counted
from chatterm.core.report.export import FORMATS, REPORT_FORMATS, export_chunks, sessions_to_export
from chatterm.core.store.session_store import SessionStore
from chatterm.core.system.atomic import replace_output
from chatterm.errors import ChattermError

_SUFFIX_FORMATS = {
    ".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".md": "md", ".html": "html", ".htm": "html",
}


def register(sub, common) -> None:
    p = sub.add_parser(
        "export",
        parents=[common],
        help="export session latency logs (jsonl, csv) or reports with charts (md, html)",
        description="Export turns and their metrics. Without ID or --all the session last talked in is "
        "exported. JSONL includes the conversation texts; CSV has metrics only (plus text "
        "lengths); md and html are reports with charts, per-turn timelines, per-token costs and "
        "the cost under every price profile; several IDs share the same charts. Field names "
        "and units: docs/export-format.md.",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "session_ids", nargs="*", type=session_id, default=[], metavar="ID",
        help="sessions to export, in this order (default: the session last talked in)",
    )
    which.add_argument("--all", action="store_true", help="export every session, oldest first")
    p.add_argument(
        "-f",
        "--format",
        choices=FORMATS,
        help="output format (default: from the -o suffix, .jsonl .json .csv .md .html .htm; "
        "jsonl for stdout or a file without a suffix)",
    )
    p.add_argument(
        "-o", "--output", metavar="FILE", type=named,
        help="write to FILE (replaced atomically) instead of stdout; - is stdout",
    )
    p.set_defaults(func=run)


def _format_of(output: Path | None) -> str:
    """The format an output path's suffix names. An unknown suffix is an error,
    not JSONL: `-o r.pdf` must not leave JSON in a file named like a PDF."""
    if output is None or not output.suffix:
        return "jsonl"
    try:
        return _SUFFIX_FORMATS[output.suffix.lower()]
    except KeyError:
        raise ChattermError(
            f"{output}: {output.suffix!r} is not an export suffix ({' '.join(_SUFFIX_FORMATS)}); "
            f"pass --format {'|'.join(FORMATS)} to write it anyway"
        ) from None


def run(args: argparse.Namespace) -> int:
    db = db_path(args)
    # "-" is stdout, as for most Unix tools (not a file named "-").
    output = Path(args.output) if args.output and args.output != "-" else None
    fmt = args.format or _format_of(output)
    # The catalog first: a broken models.toml fails before anything is read.
    # JSONL and CSV need none, but an --models FILE the user named is checked.
    models = catalog(args) if fmt in REPORT_FORMATS or args.models is not None else None
    prices = models.prices if fmt in REPORT_FORMATS else None
    with SessionStore(db, readonly=True) as store:
        known = None
        if args.all:
            known = {info.id: info for info in store.sessions()}  # one query for every session
            ids = sorted(known)
        elif args.session_ids:
            ids = list(dict.fromkeys(args.session_ids))
        else:
            latest = store.latest_session_id()
            if latest is None:
                raise ChattermError(f"no sessions to export in {db}")
            ids = [latest]
            # Named on stderr: the output (stdout or the file) is only the export.
            print(f"chatterm: exporting session {latest}, the one last talked in (name IDs for others)",
                  file=sys.stderr)
        sessions = sessions_to_export(store, ids, skip_empty=args.all, infos=known)
        chunks = export_chunks(store, sessions, fmt, prices)
        if output is None:
            write_stdout(chunks)
        else:
            replace_output(output, chunks, database=db)
    if output is not None:
        print(f"wrote {counted(len(sessions), 'session')} to {output}", file=sys.stderr)
    elif args.output is None and sys.stdout.isatty():  # `-o -` chose stdout
        # Read on a terminal, the export was likely meant as a file.
        print(f"chatterm: that was {fmt.upper()} on the terminal; -o FILE writes a file "
              f"(.jsonl .csv, or .md .html for a report with charts)", file=sys.stderr)
    return 0
