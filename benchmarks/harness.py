"""What several benchmarks share: a throwaway chatterm home with a greedy
persona, and the closing lines of a run (its JSON and its misses).

`in_temp_home(run, args)` points chatterm's config, data and cache folders at
a new temp folder (removed afterwards, also on failure) and calls
`run(args, tmp)`; `bench_workspace(tmp)` is the Workspace there, with the
`bench` persona: a short system prompt, temperature 0, `max_tokens` tokens.
`finish(failures, path, figures)` writes the figures (and the failures) as
JSON when a path is given, prints each failure on stderr, and is the exit
status: 1 when something missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from chatterm.core.workspace import Workspace


def in_temp_home(run: Callable[[argparse.Namespace, Path], int], args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="chatterm-bench-"))
    try:
        for name in ("CONFIG", "DATA", "CACHE"):
            os.environ[f"CHATTERM_{name}_DIR"] = str(tmp / name.lower())
        os.environ.pop("CHATTERM_DB", None)
        return run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_workspace(tmp: Path, max_tokens: int = 8) -> Workspace:
    from chatterm.core.config import paths
    from chatterm.core.workspace import Workspace

    folder = paths.user_personas_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.toml").write_text(
        'name = "Bench"\nsystem_prompt = "You are a concise analyst."\n'
        f"[sampling]\ntemperature = 0.0\nmax_tokens = {max_tokens}\n"
    )
    return Workspace.load(db_path=tmp / "bench.db")


def finish(failures: list[str], path: Path | None, figures: dict[str, Any]) -> int:
    if path is not None:
        path.write_text(json.dumps({**figures, "failures": failures}, indent=2) + "\n")
    for failure in failures:
        print(f"MISS: {failure}", file=sys.stderr)
    return 1 if failures else 0
