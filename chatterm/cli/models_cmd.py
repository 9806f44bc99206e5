"""`chatterm models`: the GGUFs already on this machine (the models models.toml
defines, the default one among them, then Ollama, LM Studio, the Hugging Face
cache and models.toml's `model_folders`), one row a model (one block a model
in a terminal narrower than the table; piped, always one aligned row).

Each row: the id `--model` takes, architecture, parameters, quantization,
file size, trained context, chat template, KV bytes per token, whether it
fits this machine's memory (GPU when one is seen, else RAM) and at what
default context, and where it was found. Entries that cannot be used are
listed after, each with its reason; they never make the command fail.
`--json` prints one object: the memory judged against, every store folder
looked in (and whether it was scanned) and every row. `-v` first lists the
store folders: where chatterm looked, and why a folder was not scanned (not
there, the same folder as another, a system-wide one this user cannot read).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from chatterm.cli.common import catalog, write_stdout
from chatterm.core.discovery.fit import BUDGET_SHARE, machine_memory
from chatterm.core.discovery.listing import configured, list_models, store_roots
from chatterm.core.discovery.row_text import COLUMNS, cells, memory_label, problem_text
from chatterm.core.metrics.format import printable
from chatterm.core.report.escape import json_document, one_line


def register(sub, common) -> None:
    p = sub.add_parser(
        "models", parents=[common],
        help="list the GGUF models on this machine (models.toml, Ollama, LM Studio, HF cache)",
        description="List the GGUF models models.toml defines (the default one among them), those Ollama, "
        "LM Studio and the Hugging Face cache keep on this machine, and those in models.toml's [defaults] "
        "model_folders. Each id works as --model.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (memory and every row)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    models = catalog(args)
    folders = [Path(f) for f in models.defaults.model_folders]
    memory = machine_memory()
    rows = list_models(folders, memory=memory, configured=configured(models))
    roots = store_roots()
    if args.json:
        write_stdout([json_document({
            "memory": {"kind": memory.kind, "available_bytes": memory.available_bytes,
                       "budget_share": BUDGET_SHARE},
            "stores": [{"store": r.store, "path": str(r.path), "scanned": r.scanned, "state": r.state}
                       for r in roots],
            "models": [row.to_dict() for row in rows],
        })])
        return 0
    if args.verbose:
        print("Store folders:")
        for root in roots:
            print(f"  {root.store}: {printable(str(root.path))}: {printable(root.state)}")
        for folder in folders:
            print(f"  model_folders: {printable(str(folder))}")
        print()
    usable = [row for row in rows if row.usable]
    unusable = [row for row in rows if not row.usable]
    if not rows:
        print("No GGUF models found (see docs/models.md for where chatterm looks).")
        return 0
    if usable:
        _print_table(COLUMNS, [cells(row) for row in usable])
        print(f"\nfits: weights + KV cache at the n_ctx it loads with, against {memory_label(memory)}")
    if unusable:
        print(f"\n{len(unusable)} unusable:")
        for row in unusable:
            print(f"  {one_line(row.id)}: {one_line(problem_text(row))}")
    return 0


def _print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in (header, *rows)
    ]
    width = shutil.get_terminal_size().columns
    if sys.stdout.isatty() and max(map(len, lines)) > width:
        _print_stanzas(header, rows, width)  # a terminal too narrow: each row wrapped mid-cell otherwise
        return
    print("\n".join(lines))  # piped: one line a model, columns aligned, for grep and awk


def _print_stanzas(header: tuple[str, ...], rows: list[tuple[str, ...]], width: int) -> None:
    """One model per block: its id; its facts as `column value`, as many to a
    line as fit; where it was found, whole (a path to copy)."""
    for n, row in enumerate(rows):
        if n:
            print()
        print(row[0])
        line = ""
        for fact in (f"{h} {c}" for h, c in zip(header[1:-1], row[1:-1], strict=True)):
            if line and len(line) + 3 + len(fact) > width - 2:
                print(f"  {line}")
                line = ""
            line = f"{line} · {fact}" if line else fact
        print(f"  {line}")
        print(f"  {header[-1]} {row[-1]}")
