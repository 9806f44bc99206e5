"""`chatterm paths`: where chatterm reads and writes its files, and what it loaded."""

from __future__ import annotations

import argparse

from chatterm.cli.common import workspace
from chatterm.core import paths


def register(sub, common) -> None:
    p = sub.add_parser("paths", parents=[common], help="show config, data and cache locations")
    p.set_defaults(func=run)


def _gpu_offload() -> str:
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        return "available (this llama-cpp-python was built with a GPU backend)"
    return "not available (CPU build of llama-cpp-python; see README, GPU)"


def run(args: argparse.Namespace) -> int:
    ws = workspace(args)
    rows = [
        ("config folder", paths.config_dir()),
        ("models files", ", ".join(str(f) for f in ws.catalog.files)),
        ("user personas", paths.user_personas_dir()),
        ("user themes", paths.user_themes_dir()),
        ("session database", ws.db_path),
        ("exports", paths.exports_dir()),
        ("persona KV cache", ws.kv_dir),
        ("default model", f"{ws.catalog.default_model} -> {ws.catalog.get(None).source}"),
        ("GPU offload", _gpu_offload()),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for error in ws.personas.errors:
        print(f"warning: persona skipped: {error}")
    return 0
