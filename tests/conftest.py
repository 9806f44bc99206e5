"""Shared fixtures: every test runs with chatterm's folders in its own tmp_path,
and the real default model is loaded once per module where engine tests need it."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHATTERM = [sys.executable, "-m", "chatterm"]


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Point every chatterm folder at tmp_path so tests never touch the user's files."""
    dirs = {
        "CHATTERM_CONFIG_DIR": tmp_path / "config",
        "CHATTERM_DATA_DIR": tmp_path / "data",
        "CHATTERM_CACHE_DIR": tmp_path / "cache",
    }
    for name, value in dirs.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("CHATTERM_DB", raising=False)
    return dirs


def greedy(persona, max_tokens: int = 24):
    """The persona with deterministic (temperature 0) sampling and a short reply."""
    return replace(persona, sampling=replace(persona.sampling, temperature=0.0, max_tokens=max_tokens))


def subprocess_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CHATTERM_CONFIG_DIR=str(tmp_path / "config"),
        CHATTERM_DATA_DIR=str(tmp_path / "data"),
        CHATTERM_CACHE_DIR=str(tmp_path / "cache"),
    )
    env.pop("CHATTERM_DB", None)
    env.update(extra)
    return env


def export_text(store, session_ids, fmt, prices=None) -> str:
    """What `chatterm export ID... --format fmt` writes, as text."""
    from chatterm.core.report.export import export_chunks, sessions_to_export

    chunks = export_chunks(store, sessions_to_export(store, session_ids), fmt, prices)
    return b"".join(chunks).decode("utf-8")
