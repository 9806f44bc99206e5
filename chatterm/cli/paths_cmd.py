"""`chatterm paths`: where chatterm reads and writes its files, and what it loaded
(skipped models.toml entries and persona files are warned about on stderr, as
by every command that loads them)."""

from __future__ import annotations

import argparse

from chatterm.cli.common import workspace
from chatterm.core.config import paths
from chatterm.errors import ChattermError


def register(sub, common) -> None:
    p = sub.add_parser("paths", parents=[common], help="show config, data and cache locations")
    p.set_defaults(func=run)


def _default_model(ws) -> str:
    try:
        return f"{ws.catalog.default_model} -> {ws.catalog.get(None).source}"
    except ChattermError as exc:
        return str(exc)


def _gpu_offload() -> str:
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        return "available (this llama-cpp-python was built with a GPU backend)"
    return "not available (CPU build of llama-cpp-python; see docs/gpu.md)"


def run(args: argparse.Namespace) -> int:
    ws = workspace(args)
    user_models = paths.user_models_file()
    rows = [
        ("config folder", paths.config_dir()),
        ("models.toml files read", ", ".join(str(f) for f in ws.catalog.files)),
        ("user models.toml", f"{user_models}{'' if user_models.exists() else ' (not created yet)'}"),
        ("user personas", paths.user_personas_dir()),
        ("user themes", paths.user_themes_dir()),
        ("session database", ws.db_path),
        ("exports", paths.exports_dir()),
        ("KV cache (personas, sessions)", ws.kv_dir),
        ("default model", _default_model(ws)),
        ("GPU offload", _gpu_offload()),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0
