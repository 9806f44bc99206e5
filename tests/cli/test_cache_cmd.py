"""`chatterm cache ls | clear | verify` as a user runs them, on real state files."""

from __future__ import annotations

import re
import subprocess

from fake_states import fake_state

from chatterm.core.cache.prompt_cache import PromptCache, Slot
from chatterm.core.discovery.row_text import fmt_bytes
from tests.cli.test_cli_core import chatterm
from tests.conftest import CHATTERM, run_in_terminal, subprocess_env

COMPAT = {"model_sha256": "ab" * 32}


def seed(tmp_path) -> PromptCache:
    cache = PromptCache(tmp_path / "cache" / "kv")
    cache.save("smollm2-135m", Slot.persona("quick"), list(range(40)), bytes(300_000), COMPAT)
    cache.save("smollm2-135m", Slot.persona("terse-coder"), list(range(50)), bytes(300_000), COMPAT)
    cache.save("smollm2-135m", Slot.session(7), list(range(900)), bytes(2_000_000), COMPAT)
    return cache


def test_ls_shows_kind_tokens_bytes_and_tier(tmp_path):
    seed(tmp_path)
    env = {k: v for k, v in subprocess_env(tmp_path).items() if k != "COLUMNS"}  # piped, no width asked for
    listing = subprocess.run([*CHATTERM, "cache", "ls"], capture_output=True, text=True, env=env, timeout=60)
    assert listing.returncode == 0, listing.stderr
    # Columns two spaces apart (no rules: cut and paste, awk -F'  +').
    rows = {cells[0]: cells for line in listing.stdout.splitlines() if len(cells := re.split(r" {2,}", line)) > 5}
    assert set(rows) >= {"persona quick", "persona terse-coder", "session 7"}
    session = rows["session 7"]
    size = (tmp_path / "cache" / "kv" / "smollm2-135m" / "session-7.kvstate").stat().st_size
    assert session[1:5] == ["smollm2-135m", "900", f"{size:,}", "disk"]
    assert session[6] == "ok"


def test_ls_in_an_80_column_terminal_fits_with_short_sizes_and_times(tmp_path):
    seed(tmp_path).save("hf:bartowski/Qwen2.5-7B-Instruct", Slot.persona("terse-coder"), list(range(40)),
                        bytes(1000), COMPAT)
    out = run_in_terminal([*CHATTERM, "cache", "ls"], subprocess_env(tmp_path), tmp_path)
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in out.splitlines()]
    assert lines and all(len(line) <= 80 for line in lines), lines
    size = (tmp_path / "cache" / "kv" / "smollm2-135m" / "session-7.kvstate").stat().st_size
    row = next(line for line in lines if "session 7" in line)
    # The size as a reader takes it in; saved just now, so today's time alone.
    assert re.search(rf"  {re.escape(fmt_bytes(size))}  disk  \d\d:\d\d ", row), row
    # The names `cache clear` takes, whole ("persona assista…" beside a 24-character model id).
    assert any(line.startswith("persona terse-coder ") for line in lines), lines


def test_ls_piped_with_columns_fits_that_width_as_a_terminal_would(tmp_path):
    seed(tmp_path).save("hf:bartowski/Qwen2.5-7B-Instruct", Slot.persona("terse-coder"), list(range(40)),
                        bytes(1000), COMPAT)
    size = (tmp_path / "cache" / "kv" / "smollm2-135m" / "session-7.kvstate").stat().st_size
    narrow = chatterm(tmp_path, "cache", "ls", COLUMNS="80")
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    row = next(line for line in lines if "session 7" in line)
    assert f"  {fmt_bytes(size)}  disk  " in row, row
    assert any(line.startswith("persona terse-coder ") for line in lines), lines
    for useless in ("0", "10", "", "wide"):  # no width a row fits: exact figures, every row
        listing = chatterm(tmp_path, "cache", "ls", COLUMNS=useless)
        assert listing.returncode == 0, listing.stderr
        assert f"{size:,}" in next(line for line in listing.stdout.splitlines() if "session 7" in line)


def test_clear_takes_either_kind_one_persona_or_one_session(tmp_path):
    seed(tmp_path)
    assert "removed 1 state file" in chatterm(tmp_path, "cache", "clear", "--session", "7").stdout
    bad = chatterm(tmp_path, "cache", "clear", "--session", "7")
    assert bad.returncode == 2 and "no cached state for session '7'" in bad.stderr
    assert "removed 1 state file" in chatterm(tmp_path, "cache", "clear", "quick").stdout
    seed(tmp_path)
    assert "removed 2 state files" in chatterm(tmp_path, "cache", "clear", "--kind", "persona").stdout
    listing = chatterm(tmp_path, "cache", "ls", COLUMNS="200").stdout
    assert "session 7" in listing and "persona" not in listing.replace("Prompt cache", "")
    assert "removed 1 state file" in chatterm(tmp_path, "cache", "clear").stdout
    assert "No cached states" in chatterm(tmp_path, "cache", "ls").stdout
    mixed = chatterm(tmp_path, "cache", "clear", "quick", "--session", "7")
    assert mixed.returncode == 2 and "not both" in mixed.stderr
    word = chatterm(tmp_path, "cache", "clear", "--session", "abc")  # refused as every other id is
    assert word.returncode == 2 and "session id must be a number, not 'abc'" in word.stderr


def test_verify_checks_payload_sha256_and_exits_1_on_a_bad_file(tmp_path):
    cache = seed(tmp_path)
    good = chatterm(tmp_path, "cache", "verify")
    assert good.returncode == 0 and "3 of 3 files verified" in good.stdout
    path = cache.path_for("smollm2-135m", Slot.session(7))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01
    path.write_bytes(bytes(data))
    bad = chatterm(tmp_path, "cache", "verify")
    assert bad.returncode == 1
    assert "BAD session 7 · smollm2-135m: payload sha256 mismatch" in bad.stdout
    assert "2 of 3 files verified" in bad.stdout


def test_verify_lists_blocks_only_when_bad_or_asked(tmp_path):
    cache = PromptCache(tmp_path / "cache" / "kv", block_tokens=64)
    tokens = list(range(1, 201))  # four blocks: 64, 64, 64 and 8 tokens
    assert cache.save("m", Slot.session(3), tokens, bytes(fake_state(tokens)), COMPAT) is not None
    good = chatterm(tmp_path, "cache", "verify")
    assert good.returncode == 0, good.stderr
    assert "ok  session 3 · m: 200 tokens in 4 blocks" in good.stdout and "ok  block" not in good.stdout
    assert "5 of 5 files verified (4 of them blocks, --all lists each)" in good.stdout
    assert chatterm(tmp_path, "cache", "verify", "--all").stdout.count("ok  block ") == 4
    block = sorted((tmp_path / "cache" / "kv" / "m" / "blocks").glob("*.kvblock"))[0]
    data = bytearray(block.read_bytes())
    data[-5] ^= 0x01
    block.write_bytes(bytes(data))
    bad = chatterm(tmp_path, "cache", "verify")
    assert bad.returncode == 1
    shown = [line for line in bad.stdout.splitlines() if re.match(r"(ok  |BAD )block ", line)]
    assert len(shown) == 1 and shown[0].startswith(f"BAD block {block.stem[:12]} · m: ") and str(block) in shown[0]
    assert "4 of 5 files verified" in bad.stdout


def test_ids_from_files_are_shown_as_written_never_as_markup_or_escapes(tmp_path):
    cache = PromptCache(tmp_path / "cache" / "kv")
    persona = "[reverse]team[link=https://evil.example]bot"
    cache.save("m\x1b[31mx", Slot.persona(persona), list(range(40)), bytes(300_000), COMPAT)
    listing = chatterm(tmp_path, "cache", "ls", COLUMNS="200")
    assert listing.returncode == 0, listing.stderr
    assert f"persona {persona}" in listing.stdout and "m␛[31mx" in listing.stdout
    assert "\x1b" not in listing.stdout
    verify = chatterm(tmp_path, "cache", "verify", "--all")
    assert "m␛[31mx" in verify.stdout and "\x1b" not in verify.stdout


def test_clear_counts_only_what_it_removed_and_names_what_it_could_not(tmp_path):
    seed(tmp_path)
    # A folder where a state file should be: it cannot be unlinked.
    stuck = tmp_path / "cache" / "kv" / "smollm2-135m" / "session-9.kvstate"
    stuck.mkdir()
    (stuck / "x").write_text("x")
    listed = chatterm(tmp_path, "cache", "ls", COLUMNS="200").stdout
    assert "session 9" in listed, listed
    out = chatterm(tmp_path, "cache", "clear", "--kind", "session")
    assert "removed 1 state file" in out.stdout  # session 7; session 9 is still there
    assert out.returncode == 2 and "1 state file could not be removed" in out.stderr and str(stuck) in out.stderr
