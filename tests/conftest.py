"""Shared fixtures: every test runs with chatterm's folders in its own tmp_path,
and the real default model is loaded once per module where engine tests need it;
`run_in_terminal` runs a command on a pseudo-terminal of a given size."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHATTERM = [sys.executable, "-m", "chatterm"]


def _dirs(base: Path) -> dict[str, Path]:
    return {"CHATTERM_CONFIG_DIR": base / "config", "CHATTERM_DATA_DIR": base / "data",
            "CHATTERM_CACHE_DIR": base / "cache"}


@pytest.fixture(scope="module", autouse=True)
def isolated_module_dirs(tmp_path_factory):
    """The same for a module's shared fixtures (an engine loaded once for a
    file's tests): they are set up before any test's own `isolated_dirs`, and
    without this their prompt cache was the user's, kept from run to run."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in _dirs(tmp_path_factory.mktemp("module-home")).items():
            patch.setenv(name, str(value))
        patch.delenv("CHATTERM_DB", raising=False)
        yield


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Point every chatterm folder at tmp_path so tests never touch the user's files."""
    dirs = _dirs(tmp_path)
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


def run_in_terminal(argv: list[str], env: dict[str, str], cwd: Path, columns: int = 80, rows: int = 24) -> str:
    """Run a command with its stdout on a pseudo-terminal of `columns` x `rows`
    (what a user's terminal shows it, not what a pipe gets); its output, with
    plain line ends. Fails on a non-zero exit."""
    import fcntl
    import pty
    import struct
    import termios

    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    with subprocess.Popen(argv, stdout=secondary, stderr=subprocess.PIPE, env=env, cwd=cwd) as proc:
        os.close(secondary)
        out = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    os.close(primary)
    return out.decode().replace("\r\n", "\n")


def export_text(store, session_ids, fmt, prices=None) -> str:
    """What `chatterm export ID... --format fmt` writes, as text."""
    from chatterm.core.report.export import export_chunks, sessions_to_export

    chunks = export_chunks(store, sessions_to_export(store, session_ids), fmt, prices)
    return b"".join(chunks).decode("utf-8")
