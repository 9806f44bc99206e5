"""`chatterm bench`: cold vs restored vs in-memory TTFT on this machine (see core.bench).

Every command's module is imported to build the parser, so the runner and rich
are imported when the benchmark runs, not when another command starts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from chatterm.cli.common import literal, require_positive, workspace
from chatterm.core.metrics.format import counted, fmt_ms, fmt_tok_s
from chatterm.core.system.atomic import cannot_create_in, refuse_database
from chatterm.errors import ChattermError

if TYPE_CHECKING:  # rich is imported when the benchmark runs
    from rich.text import Text

LONG_PERSONA = "shop-support"
WARM_OVERHEAD_TARGET = 1.05
"""A turn on a persona prefix in memory against llama-cpp-python's own warm
create_chat_completion: chatterm's per-turn overhead."""
MIN_JUDGED_RUNS = 3
"""Fewer runs give no median worth a verdict: one noisy run read as a missed
target. Their ratios are shown, marked "not judged"."""


def register(sub, common) -> None:
    p = sub.add_parser(
        "bench",
        parents=[common],
        help="measure the persona cache's gain on this machine",
        description="Headless benchmark: median of N runs after a warm-up, in one process.",
    )
    p.add_argument("--model", metavar="ID", help="model id (default: the catalog default)")
    p.add_argument("--persona", metavar="NAME", default=LONG_PERSONA, help=f"persona (default: {LONG_PERSONA})")
    p.add_argument("--runs", type=int, default=5, metavar="N", help="measured runs per series (default: 5)")
    p.add_argument("--max-tokens", type=int, default=32, metavar="N", help="reply length per run (default: 32)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    p.add_argument("--resume", action="store_true",
                   help="add the resume series: next turn of a 3,000-token conversation, four ways")
    p.set_defaults(func=run)


def _fmt_ratio(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}x"


def _against(value: float | None, limit: float, digits: int = 2, *, judged: bool = True) -> Text:
    """A ratio beside its target (at most `limit`): marked met or missed, so a
    reader of the table need not compare the digits with the row's name
    (`judged` False: too few runs for a verdict, said so instead)."""
    from rich.text import Text

    shown = _fmt_ratio(value, digits)
    if value is None:
        return Text(shown)
    if not judged:
        return Text.assemble(shown, (" · not judged", "dim"))
    if value <= limit:
        return Text.assemble(shown, (" ✓ met", "green"))
    return Text.assemble(shown, (" ✗ missed", "bold red"))


def _target_row(label: str, value: float | None, limit: float, digits: int = 2, *,
                judged: bool = True) -> tuple[str, Text]:
    """A table row of a ratio with a target, the target in its name."""
    return f"{label} (<= {limit:g}x)", _against(value, limit, digits, judged=judged)


def _fmt_counts(counts: list[int]) -> str:
    """"2", or "1–2" when the count changed between runs."""
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}–{high}"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from chatterm.core.bench.runner import run_bench, write_json

    err = Console(stderr=True)
    require_positive("--runs", args.runs)
    require_positive("--max-tokens", args.max_tokens)
    ws = workspace(args)
    if args.json is not None:
        _require_writable(args.json, ws.db_path)  # before minutes of runs, not after
    spec = ws.catalog.get(args.model)
    persona = ws.personas.get(args.persona)
    engine = ws.make_engine(spec)
    # Measured with the default model on a 2-core CPU: 2.5 min, 5.5 with
    # --resume (its history prefill dominates). A larger model takes longer.
    took = "5-6 minutes" if args.resume else "2-3 minutes"
    err.print(f"chatterm bench: {counted(args.runs, 'run')} per series; at 5, about {took} with the default model "
              "on 2 CPU cores, longer with a larger one. Ctrl+C stops it.", markup=False, highlight=False)
    started = time.monotonic()

    def progress(status, msg: str) -> None:
        line = f"bench {persona.id}: {msg} ({time.monotonic() - started:.0f} s)"
        if err.is_terminal:
            status.update(literal(line))
        else:  # a log or a pipe gets one line per step instead of a spinner it cannot show
            err.print(literal(line))

    with err.status(literal(f"loading {spec.id}…")) as status:
        progress(status, f"loading {spec.id}")
        engine.load()
        try:
            result = run_bench(
                engine, persona, runs=args.runs, max_tokens=args.max_tokens,
                report=lambda msg: progress(status, msg),
                resume=args.resume,
            )
        finally:
            engine.close()
    # What was measured in the title, how in the caption: in one line, the
    # title wrapped to the table's width read "median of" / "2" at 80 columns.
    table = Table(title=literal(f"chatterm bench · {spec.id} · persona {persona.id}"))
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = []
    judged = args.runs >= MIN_JUDGED_RUNS
    if engine.capabilities.kv_control:
        r = result["ratios"]
        rows = [
            ("persona prefix", f"{result['prefix_tokens']:,} tokens"),
            ("TTFT cold (full prefill)", fmt_ms(result["ttft_cold_ms"])),
            ("TTFT restored from disk", fmt_ms(result["ttft_restored_ms"])),
            ("TTFT prefix in memory", fmt_ms(result["ttft_memory_ms"])),
            ("restored / cold", _fmt_ratio(r["restored_over_cold"])),
            ("restored / in memory", _fmt_ratio(r["restored_over_memory"], 2)),
            ("restore", fmt_ms(result["restore_ms"])),
            ("read same bytes", fmt_ms(result["state_read_ms"])),
            ("restore / read", _fmt_ratio(r["restore_over_read"], 2)),
            ("state bytes (llama_state_get_size)", f"{result['state_bytes']:,}"),
            ("state file bytes", f"{result['state_file_bytes']:,} ({_fmt_ratio(r['file_over_state_bytes'], 4)})"),
            ("decode", fmt_tok_s(result["decode_tok_s"])),
            ("decode (llama.cpp perf counters)", fmt_tok_s(result["decode_tok_s_llama_perf"])),
            ("threads: decode / prefill", f"{_fmt_counts(result['threads']['decode'])} / "
                                          f"{_fmt_counts(result['threads']['prefill'])} "
                                          f"of {result['host']['physical_cores']} cores"),
            ("baseline create_chat_completion cold", fmt_ms(result["baseline_ttft_cold_ms"])),
            ("baseline create_chat_completion warm", fmt_ms(result["baseline_ttft_warm_ms"])),
            _target_row("in memory / library warm", r["memory_over_baseline_warm"], WARM_OVERHEAD_TARGET,
                        judged=judged),
        ]
        if "resume" in result:
            resume = result["resume"]
            rr = resume["ratios"]
            rows += [
                ("resume: conversation", f"{resume['conversation_tokens']:,} tokens"),
                ("resume TTFT in memory", fmt_ms(resume["ttft_memory_ms"])),
                ("resume TTFT restored from RAM", fmt_ms(resume["ttft_ram_ms"])),
                ("resume TTFT restored from disk", fmt_ms(resume["ttft_disk_ms"])),
                ("resume TTFT persona only + history prefill", fmt_ms(resume["ttft_persona_only_ms"])),
                ("resume restore from RAM / disk", f"{fmt_ms(resume['restore_ram_ms'])} / "
                                                   f"{fmt_ms(resume['restore_disk_ms'])}"),
                *(_target_row(label, rr[key], resume["targets"][key], digits, judged=judged)
                  for label, key, digits in (
                    ("disk / persona only", "disk_over_persona_only", 3),
                    ("disk / in memory", "disk_over_memory", 2),
                    ("RAM / in memory", "ram_over_memory", 2),
                )),
            ]
    else:
        rows = [("TTFT", fmt_ms(result["ttft_ms"])), ("decode", fmt_tok_s(result["decode_tok_s"]))]
    for name, value in rows:
        table.add_row(name, value)
    host = result["host"]
    table.caption = literal(f"median of {counted(args.runs, 'run')} after a warm-up · {host['cpu']} · "
                            f"{host['cores']} cores · calibration sum(range(10**6)) "
                            f"{host['calibration_ms']:.1f} ms before, {host['calibration_after_ms']:.1f} ms after")
    Console().print(table)
    if not judged and engine.capabilities.kv_control:  # in the JSON too: no verdict was given
        result["warnings"].append(f"targets not judged on {counted(args.runs, 'run')}: "
                                  f"pass --runs {MIN_JUDGED_RUNS} or more for a median")
    for warning in result["warnings"]:
        err.print(literal(f"warning: {warning}"), style="yellow")
    if args.json:
        write_json(result, args.json, ws.db_path)  # after the table: a write that fails now loses no figure
        err.print(f"wrote {args.json}")
    return 0


def _require_writable(path: Path, database: Path) -> None:
    """A ChattermError naming `path` when the JSON could not be written there."""
    refuse_database(path, database)
    if not path.parent.is_dir():
        raise ChattermError(f"{path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise ChattermError(f"{path} is a folder; name a file for --json")
    why = cannot_create_in(path.parent)  # the way it is written: a new file beside it, renamed
    if why is not None:
        raise ChattermError(f"cannot write {path}: {why}")
