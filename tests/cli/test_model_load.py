"""What `chatterm ask` and `chatterm launch` say about the model before and while
it loads: a missing file is one line and exit 2 before anything is created or
drawn, the load shows its progress on a terminal, and a user's own model needs
only its `source`. Real processes, the real default model."""

from __future__ import annotations

import json
import os
import pty
import subprocess

from tests.cli.test_cli_core import chatterm, write_greedy_persona
from tests.conftest import CHATTERM, subprocess_env

MISSING = 'source = "missing/model.gguf"\n'


def user_models(tmp_path, text: str) -> None:
    config = tmp_path / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "models.toml").write_text(text)


def database(tmp_path):
    return tmp_path / "data" / "chatterm.db"


def test_ask_with_a_missing_model_file_leaves_no_database(tmp_path):
    user_models(tmp_path, f"[models.gone]\n{MISSING}")
    result = chatterm(tmp_path, "ask", "--model", "gone", "hi")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    path = tmp_path / "config" / "missing" / "model.gguf"
    models = tmp_path / "config" / "models.toml"
    assert result.stderr.strip() == (
        f"chatterm: error: {path}: model file not found (model 'gone', [models.gone] in {models})")
    assert not database(tmp_path).exists()


def test_launch_with_a_missing_model_file_is_one_line_before_the_screen(tmp_path):
    # No terminal: had the check come after the screen was taken over, the
    # error would be "must be a terminal" instead.
    user_models(tmp_path, f"[models.gone]\n{MISSING}")
    result = subprocess.run([*CHATTERM, "launch", "--model", "gone"], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, env=subprocess_env(tmp_path), cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    path = tmp_path / "config" / "missing" / "model.gguf"
    models = tmp_path / "config" / "models.toml"
    assert result.stderr.strip() == (
        f"chatterm: error: {path}: model file not found (model 'gone', [models.gone] in {models})")
    assert not database(tmp_path).exists()


def test_launch_resuming_a_session_whose_model_file_is_gone_says_so(tmp_path):
    write_greedy_persona(tmp_path)
    first = chatterm(tmp_path, "ask", "--persona", "quick", "--json", "hi")
    assert first.returncode == 0, first.stderr
    # The session's model entry now points at a file that is not there.
    user_models(tmp_path, f"[models.smollm2-135m]\n{MISSING}")
    result = subprocess.run([*CHATTERM, "launch", "--resume"], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, env=subprocess_env(tmp_path), cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert "model.gguf: model file not found (model 'smollm2-135m', [models.smollm2-135m] in " in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def run_with_terminal_stderr(tmp_path, *args: str) -> tuple[int, str, str]:
    """`chatterm ARGS` with stderr on a pseudo-terminal (stdout a pipe)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*CHATTERM, *args], stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL,
                            env=subprocess_env(tmp_path), cwd=tmp_path)
    os.close(follower)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the follower side closed: the process ended
            break
        if not chunk:
            break
        seen += chunk
    stdout = proc.stdout.read().decode()
    proc.wait(timeout=300)
    os.close(leader)
    return proc.returncode, stdout, seen.decode("utf-8", "replace")


def test_ask_shows_the_load_progress_on_a_terminal_and_clears_it(tmp_path):
    write_greedy_persona(tmp_path)
    status, stdout, stderr = run_with_terminal_stderr(tmp_path, "ask", "--persona", "quick", "What is the sun?")
    assert status == 0, stderr
    assert stdout.strip()
    assert "\r\x1b[Kloading SmolLM2-135M-Instruct Q4_1 · 0 %" in stderr
    assert "\r\x1b[Kloading SmolLM2-135M-Instruct Q4_1 · 100 %" in stderr
    # Cleared before the footer: the footer starts on a clean line.
    after_load = stderr[stderr.rindex("100 %"):]
    assert after_load.startswith("100 %\r\x1b[K") and "TTFT" in after_load


def test_ask_without_a_terminal_prints_no_progress(tmp_path):
    write_greedy_persona(tmp_path)
    result = chatterm(tmp_path, "ask", "--persona", "quick", "What is the sun?")
    assert result.returncode == 0, result.stderr
    assert "loading" not in result.stderr and "\x1b" not in result.stderr


def test_a_users_model_with_only_a_source_is_priced_with_the_default_profile(tmp_path):
    from chatterm.core.config.catalog import load_catalog

    gguf = load_catalog().get("smollm2-135m").model_path()
    write_greedy_persona(tmp_path)
    user_models(tmp_path, f'[models.mine]\nsource = "{gguf}"\n'
                          f'[models.mine-cheap]\nsource = "{gguf}"\nprice_profile = "cheap"\n'
                          "[prices.cheap]\ninput = 0.1\noutput = 0.4\n")
    result = chatterm(tmp_path, "ask", "--model", "mine", "--persona", "quick", "--json", "hi")
    assert result.returncode == 0, result.stderr
    assert "skipped" not in result.stderr
    assert json.loads(result.stdout)["metrics"]["price_profile"] == "gpt-4.1"
    cheap = chatterm(tmp_path, "ask", "--model", "mine-cheap", "--persona", "quick", "--json", "hi")
    assert cheap.returncode == 0, cheap.stderr
    assert json.loads(cheap.stdout)["metrics"]["price_profile"] == "cheap"
