"""`chatterm cache ls | clear | verify`: the prompt cache's state files on disk.

- `ls` lists every entry: kind (persona ID / session N), model, tokens, bytes,
  tier and last use, with the reason when a file cannot be used; then, per
  model, the block tier: bytes per token, blocks, bytes, and the bytes of
  blocks that several entries share (stored once). Whole-state files (an
  older chatterm's, or a model whose states are kept whole) are counted in
  the caption. In a terminal, or piped with COLUMNS set, sizes and times are
  short (`1.2 MB`, `14:02`) and the table fits that width; otherwise piped,
  bytes are exact and times whole.
- `clear` removes all entries, one persona's (`clear PERSONA`), one kind
  (`--kind persona|session`) or one conversation's (`--session N`).
- `verify` checks every file: a state file's header, size, payload sha256 and
  chunk CRC-32s, every block's sha256 and CRC-32, every chain record; it lists
  the entries and any bad block (`--all`: every block too, a cache holds
  hundreds) and exits 1 when one fails (nothing is deleted: `clear` does that).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os

from rich import box
from rich.console import Console
from rich.table import Table

from chatterm.cli.common import literal, session_id, workspace
from chatterm.core.cache.prompt_cache import KINDS, PromptCache
from chatterm.core.discovery.row_text import fmt_bytes
from chatterm.core.metrics.format import counted, fmt_recent_time, printable
from chatterm.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("cache", parents=[common], help="list, clear or verify cached KV states")
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", parents=[common], help="list cached states (kind, model, tokens, bytes, tier)")
    ls.set_defaults(func=run_ls)
    clear = actions.add_parser(
        "clear", parents=[common], help="delete cached states (all, a kind, a persona's, a session's)"
    )
    # Not dest "persona": that is how cli.common.workspace knows a command will
    # load a persona (and leaves its file out of the skipped-file warnings).
    clear.add_argument("persona_id", nargs="?", metavar="PERSONA", help="only this persona's prefix state")
    clear.add_argument("--kind", choices=KINDS, help="only persona prefixes, or only conversations")
    clear.add_argument("--session", metavar="ID", type=session_id, help="only this session's conversation state")
    clear.set_defaults(func=run_clear)
    verify = actions.add_parser("verify", parents=[common], help="check every state file's digests")
    verify.add_argument("--all", action="store_true", help="list every block file, not only the bad ones")
    verify.set_defaults(func=run_verify)


def _cache(args: argparse.Namespace) -> PromptCache:
    return workspace(args).kv_cache()


def _listing(title) -> Table:
    """A table with a header rule only, columns two spaces apart: no vertical
    rules to take the room a name needs at 80 columns (a long model id folds)."""
    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1), collapse_padding=True,
                 pad_edge=False)


MIN_COLUMNS = 40
"""The narrowest COLUMNS a piped `ls` fits: below it rich would drop every row."""


def run_ls(args: argparse.Namespace) -> int:
    cache = _cache(args)
    entries = cache.entries()
    console = Console()
    # A terminal, or a pipe given a width in COLUMNS, gets sizes and times to
    # read at a glance, to fit that width; a plain pipe (or a COLUMNS too
    # narrow for any row) gets exact bytes and whole timestamps, unfitted.
    asked = os.environ.get("COLUMNS", "")
    fit = console.is_terminal or (asked.isdigit() and int(asked) >= MIN_COLUMNS)
    if not fit:
        console = Console(width=200)
    size = fmt_bytes if fit else (lambda n: f"{n:,}")
    when = fmt_recent_time if fit else (lambda ts: dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S"))
    if not entries:
        console.print(literal(f"No cached states in {cache.folder}"))
        return 0
    # At 80 columns vertical rules took the room "persona assistant" needs: it
    # was cut to "persona assista…" (what `cache clear` takes).
    table = _listing(literal(f"Prompt cache · {cache.folder}"))
    for column in ("kind", "model", "tokens", "bytes", "tier", "last used", "status"):
        table.add_column(column, justify="right" if column in ("tokens", "bytes") else "left",
                         no_wrap=column not in ("model", "status"), overflow="fold")
    for e in entries:
        table.add_row(
            literal(e.slot.label),  # ids from files and headers: never markup
            literal(e.model_id),
            f"{len(e.tokens):,}",
            size(e.nbytes),
            e.tier,
            when(e.last_used),
            literal(e.problem or "ok"),
        )
    usage = cache.usage()
    whole = [e for e in entries if e.chain is None and e.tier == "disk"]
    total = sum(e.nbytes for e in whole) + sum(u.bytes for u in usage)
    table.caption = (
        f"{total / (1 << 20):,.1f} MiB on disk of a {cache.disk_budget_bytes / (1 << 20):,.0f} MiB budget "
        "(the RAM tier lives inside each running chatterm)"
    )
    if whole:
        table.caption += (f"; {counted(len(whole), 'whole-state file')} "
                          "(stored as blocks when saved again, where the model allows)")
    console.print(table)
    if usage:
        blocks = _listing("Blocks by model (a block shared by several entries is stored once)")
        for column in ("model", "bytes/token", "blocks", "bytes", "shared bytes", "entries"):
            blocks.add_column(column, justify="left" if column == "model" else "right",
                              no_wrap=column != "model", overflow="fold")
        for u in usage:
            blocks.add_row(literal(u.model_id), f"{u.bytes_per_token:,}", f"{u.blocks:,}", size(u.bytes),
                           size(u.shared_bytes), f"{u.chains:,}")
        console.print(blocks)
    return 0


def run_clear(args: argparse.Namespace) -> int:
    cache = _cache(args)
    kind, key = args.kind, None
    if args.persona_id is not None and args.session is not None:
        raise ChattermError("give a persona or --session, not both")
    if args.persona_id is not None:
        if kind == "session":
            raise ChattermError(f"--kind session does not go with persona {args.persona_id!r}")
        kind, key = "persona", args.persona_id
    elif args.session is not None:
        if kind == "persona":
            raise ChattermError(f"--kind persona does not go with --session {args.session}")
        kind, key = "session", cache.session_slot(args.session).key  # this database's session
    if key is not None:
        slots = {e.slot for e in cache.entries() if e.slot.kind == kind}
        if key not in {slot.key for slot in slots}:
            if kind == "session":  # this database's: ids, as the user gives them
                known, asked = sorted(s.session_id for s in slots if s.scope == cache.session_scope), str(args.session)
            else:
                known, asked = sorted(s.key for s in slots), key
            cached = f"cached: {', '.join(known)}" if known else (
                "no session of this database is cached" if kind == "session" else "no persona is cached")
            raise ChattermError(f"no cached state for {kind} {asked!r} ({cached})")
    removed = cache.clear(kind, key)
    print(f"removed {counted(removed, 'state file')}")
    left = [e for e in cache.entries() if e.tier == "disk" and e.slot.is_of(kind, key)]
    if left:
        where = left[0].path or cache.folder
        raise ChattermError(f"{counted(len(left), 'state file')} could not be removed, such as {where}: "
                            "check the folder's permissions")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    cache = _cache(args)
    checks = cache.verify_files()
    if not checks:
        print(printable(f"No state files in {cache.folder}"))
        return 0
    for check in checks:
        if args.all or not check.block or not check.ok:
            status = "ok " if check.ok else "BAD"
            print(printable(f"{status} {check.label}: {check.detail} ({check.path})"))
    bad = sum(not c.ok for c in checks)
    blocks = sum(c.block for c in checks)
    in_blocks = f" ({blocks:,} of them blocks{'' if args.all else ', --all lists each'})" if blocks else ""
    print(f"{len(checks) - bad:,} of {len(checks):,} files verified{in_blocks}")
    return 1 if bad else 0
