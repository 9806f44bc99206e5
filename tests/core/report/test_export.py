"""Export formats (golden files, parseability, literal rendering of model text),
atomic writes, and the `chatterm export` command. The reports' charts and
figures: tests/core/report/test_report.py.

Regenerate the golden files after an intended format change with
`UPDATE_GOLDEN=1 .venv/bin/pytest tests/core/report/test_export.py` and review the diff.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import multiprocessing
import os
import re
import sqlite3
from datetime import datetime
from pathlib import Path

import pytest

from chatterm.cli import main
from chatterm.core.config.catalog import PriceProfile
from chatterm.core.metrics.cost import apply_cost
from chatterm.core.metrics.turn_metrics import TURN_FIELDS, TurnMetrics
from chatterm.core.report import export
from chatterm.core.report.escape import md_block, md_escape
from chatterm.core.report.export import ROW_FIELDS, TEXT_FIELDS
from chatterm.core.report.words import TURN_HEADER
from chatterm.core.store.session_store import SessionStore
from chatterm.core.system import atomic
from chatterm.errors import ChattermError
from tests.conftest import export_text

GOLDEN = Path(__file__).parents[2] / "golden"

PRICES = {
    "turbo": PriceProfile(id="turbo", label="Turbo | no discount", input_per_m=10.0,
                          cached_input_per_m=10.0, output_per_m=30.0, as_of="2024-04-09"),
    "gpt-4.1": PriceProfile(id="gpt-4.1", label="GPT-4.1", input_per_m=2.0, cached_input_per_m=0.5,
                            output_per_m=8.0, as_of="2025-04-14"),
    "sonnet": PriceProfile(id="sonnet", label="Sonnet", input_per_m=3.0, cached_input_per_m=0.3,
                           output_per_m=15.0, as_of="2025-05-22"),
}
"""Fixed profiles for the golden reports (the bundled models.toml may change)."""


def priced(m: TurnMetrics) -> TurnMetrics:
    """Costs filled in as the engine does, with the sample's profile."""
    apply_cost(m, PRICES[m.price_profile])
    return m

NASTY_REPLY = (
    "\x1b[31mSure\u202e | [click](http://x)\r\n| a |\n<script>alert(1)</script> "
    "*bold* `code` $x$ \x1b[0m\r\nend\u2028more"
)


def build_sample(db: Path) -> tuple[int, int]:
    """Two sessions with fixed content covering restore (in the turn and at the
    persona switch), a wait for the engine, cold, cancel, error, energy."""
    with SessionStore(db) as store:
        first = store.create_session(
            model_id="smollm2-135m",
            model_identity="sha256:3f2a",
            engine="local",
            device="AMD EPYC (CPU)",
            persona_id="assistant",
            started_at=1_700_000_000.0,
        )
        base = dict(
            engine="local", model_id="smollm2-135m", persona_id="assistant", price_profile="gpt-4.1"
        )
        store.record_turn(first, "Hi!", "Hello! How can I help?", priced(TurnMetrics(
            **base, submitted_at=1_700_000_001.5, cache_outcome="restored",
            cache_detail="state file 4.2 MB", restore_ms=38.25, prefill_ms=61.0, prompt_tokens=180,
            cached_tokens=170, prefilled_tokens=10, generated_tokens=9, seed=1234, ttft_ms=105.5, decode_ms=96.0,
            total_ms=210.0, stop_reason="eos", saved_prefill_ms=2900.0,
        )))
        store.record_turn(first, "=cmd|' /C calc'!A0", NASTY_REPLY, priced(TurnMetrics(
            **base, submitted_at=1_700_000_010.0, cache_outcome="restored", restore_ms=9.5,
            restore_at_switch=True, wait_ms=15.0, prefill_ms=120.5,
            prompt_tokens=230, cached_tokens=200, ahead_tokens=24, ahead_ms=30.0, prefilled_tokens=30,
            generated_tokens=41,
            ttft_ms=140.0, decode_ms=500.0, total_ms=660.0, stop_reason="cancelled",
            saved_prefill_ms=500.0, dropped_turns=1,
        )))
        store.record_turn(first, "and now?", "", priced(TurnMetrics(
            **base, submitted_at=1_700_000_020.0, cache_outcome="memory", prompt_tokens=260,
            cached_tokens=250, prefilled_tokens=10, total_ms=12.0, stop_reason="error",
            error="llama_decode returned -1 | out of memory",
        )))
        second = store.create_session(
            model_id="remote-gpt",
            model_identity="http://127.0.0.1:8000/v1 qwen",
            engine="openai",
            device="remote",
            persona_id="terse-coder",
            started_at=1_700_003_600.0,
        )
        store.record_turn(second, "Write fizzbuzz", "for i in range(1, 101): ...", TurnMetrics(
            engine="openai", model_id="remote-gpt", persona_id="terse-coder",
            submitted_at=1_700_003_601.0, price_profile="free", cache_outcome="server",
            prompt_tokens=50, generated_tokens=1, ttft_ms=210.0, total_ms=215.0, stop_reason="length",
            tokens_estimated=True, energy_wh=0.0125, energy_cost_usd=0.00000375,
        ))
    return first, second


@pytest.fixture
def sample(tmp_path):
    db = tmp_path / "chatterm.db"
    ids = build_sample(db)
    return db, ids


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def new_file_mode() -> int:
    """What a new file's mode is under this process's umask: 0666 less it."""
    umask = os.umask(0)  # the only way to read it
    os.umask(umask)
    return 0o666 & ~umask


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o640
    os.umask(old)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "md", "html"])
def test_golden(sample, fmt):
    db, ids = sample
    with SessionStore(db, readonly=True) as store:
        text = export_text(store, ids, fmt, PRICES)
    golden = GOLDEN / f"sessions.{fmt}"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_bytes(text.encode("utf-8"))
    assert text == golden.read_bytes().decode("utf-8"), f"differs from {golden}; UPDATE_GOLDEN=1 regenerates"


def test_jsonl_is_exact_and_parseable(sample):
    db, (first, second) = sample
    with SessionStore(db, readonly=True) as store:
        text = export_text(store, [first, second], "jsonl")
        turns = store.turns(first) + store.turns(second)
    lines = text.splitlines()  # splits on U+2028 too: none may be raw
    assert len(lines) == 4
    rows = [json.loads(line) for line in lines]
    assert all(list(row) == list(ROW_FIELDS) + list(TEXT_FIELDS) for row in rows)
    assert rows[1]["reply"] == NASTY_REPLY and rows[1]["user_text"] == "=cmd|' /C calc'!A0"
    assert "\x1b" not in text  # safe to print on a terminal
    for row, record in zip(rows, turns, strict=False):
        assert TurnMetrics.from_dict(row) == record.metrics
        assert row["decode_tok_s"] == record.metrics.to_dict()["decode_tok_s"]  # rounded: 83.333
    assert [r["session_id"] for r in rows] == [first, first, first, second]
    assert [r["turn_index"] for r in rows] == [1, 2, 3, 1]
    assert rows[3]["tokens_estimated"] is True and rows[2]["ttft_ms"] is None


def test_csv_reads_back_with_metrics_and_no_texts(sample):
    db, (first, second) = sample
    with SessionStore(db, readonly=True) as store:
        text = export_text(store, [first, second], "csv")
        turns = store.turns(first)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 4 and list(rows[0]) == list(ROW_FIELDS)
    assert set(TURN_FIELDS) <= set(rows[0])
    assert not set(TEXT_FIELDS) & set(rows[0])
    assert "Sure" not in text and "calc" not in text
    assert float(rows[0]["ttft_ms"]) == turns[0].metrics.ttft_ms
    assert float(rows[0]["decode_tok_s"]) == round(turns[0].metrics.decode_tok_s, 3) == 83.333
    assert rows[2]["ttft_ms"] == "" and rows[2]["stop_reason"] == "error"
    assert rows[3]["tokens_estimated"] == "true" and rows[0]["tokens_estimated"] == "false"
    assert int(rows[1]["reply_chars"]) == len(NASTY_REPLY)
    # Timestamps: ISO 8601 UTC (JSONL keeps Unix seconds).
    assert rows[3]["session_started_at"] == "2023-11-14T23:13:20.000Z"
    assert rows[0]["submitted_at"] == "2023-11-14T22:13:21.500Z"
    for row, record in zip(rows, turns, strict=False):
        parsed = datetime.fromisoformat(row["submitted_at"])
        assert parsed.tzinfo is not None and parsed.utcoffset().total_seconds() == 0
        assert abs(parsed.timestamp() - record.metrics.submitted_at) < 0.001


def _cells(line: str) -> list[str]:
    """Split a Markdown table row on pipes that are not backslash-escaped."""
    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


def test_markdown_renders_model_text_literally(sample):
    db, (first, _) = sample
    with SessionStore(db, readonly=True) as store:
        text = export_text(store, [first], "md")
    lines = text.splitlines()

    def table_at(start: str) -> list[str]:
        header = next(i for i, line in enumerate(lines) if line.startswith(start))
        table = []
        for line in lines[header:]:
            if not line.startswith("|"):
                break
            table.append(line)
        return table

    turns = table_at("| # | TTFT ms |")
    assert len(turns) == 2 + 3 and all(len(_cells(line)) == len(TURN_HEADER) == 13 for line in turns)
    # The messages are whole, each in a fenced block that renders it as written:
    # the reply's lines kept, its controls made visible, nothing in it markup.
    nasty = text[text.index("**Turn 2: reply**"):text.index("**Turn 3: you**")]
    assert nasty == (
        "**Turn 2: reply**\n\n```text\n␛[31mSure\ufffd | [click](http://x)\n| a |\n"
        "<script>alert(1)</script> *bold* `code` $x$ ␛[0m\nend\nmore\n```\n\n"
    )
    assert "\x1b" not in text and "\u202e" not in text
    assert "**Turn 3: reply**\n\n*(no reply)*" in text
    # A text holding fences gets a longer fence of its own.
    assert md_block("a\n```\nb ```` c") == "`````text\na\n```\nb ```` c\n`````\n"
    assert "Turn 3: error: llama\\_decode returned -1 \\| out of memory" in text
    assert "| TTFT p50 / p95 / max (ms) | 122.8 / 138.3 / 140.0 |" in text


def test_md_escape_limits_and_escapes():
    assert md_escape("a|b\nc") == "a\\|b↵c"
    assert md_escape("x" * 60, limit=10) == "x" * 9 + "…"
    assert md_escape("\x00\x07\x7f\x9b") == "␀␇␡\ufffd"


def test_export_never_changes_the_database(sample):
    db, ids = sample
    before = sha(db)
    for fmt in export.FORMATS:
        with SessionStore(db, readonly=True) as store:
            export_text(store, ids, fmt)
    assert sha(db) == before
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0


def test_export_session_writes_the_default_path(sample, tmp_path, monkeypatch, umask_027):
    monkeypatch.setenv("CHATTERM_DATA_DIR", str(tmp_path / "data"))
    db, (first, _) = sample
    with SessionStore(db) as store:
        path = export.export_session(store, first, "md")
        assert path == tmp_path / "data" / "exports" / f"session-{first}.md"
        assert path.read_text(encoding="utf-8") == export_text(store, [first], "md")
        assert path.stat().st_mode & 0o777 == umask_027  # a new file's mode, not the temp file's 0600
        with pytest.raises(ChattermError, match="unknown session 99"):
            export.export_session(store, 99, "csv")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.parametrize("where", ["missing-dir/out.csv", "a-file/out.csv", "."])
def test_unwritable_path_leaves_nothing(tmp_path, where):
    (tmp_path / "a-file").write_text("not a folder")
    before = sorted(p.name for p in tmp_path.iterdir())
    target = tmp_path / where
    with pytest.raises(ChattermError, match="cannot write|is a folder") as err:
        atomic.replace_output(target, [b"data"])
    assert str(target) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_failed_replace_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "out.md"
    target.write_text("old report")
    target.chmod(0o644)

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", fail)
    with pytest.raises(ChattermError, match="No space left"):
        atomic.replace_output(target, [b"new report"])
    assert target.read_text() == "old report"
    assert [p.name for p in tmp_path.iterdir()] == ["out.md"]
    monkeypatch.undo()
    atomic.replace_output(target, [b"new report"])
    assert target.read_text() == "new report" and target.stat().st_mode & 0o777 == 0o644


def test_a_new_export_gets_a_new_files_mode_and_a_replaced_one_keeps_its_own(sample, tmp_path, umask_027):
    db, (first, _) = sample
    new, old = tmp_path / "new.csv", tmp_path / "old.csv"
    old.write_text("old")
    old.chmod(0o604)
    for target in (new, old):
        assert main(["--db", str(db), "export", str(first), "-o", str(target)]) == 0
    assert new.stat().st_mode & 0o777 == umask_027 and old.stat().st_mode & 0o777 == 0o604
    assert new.read_bytes() == old.read_bytes() != b"old"
    # What should stay private still does: the atomic writer's default is 0600.
    atomic.atomic_write_bytes(tmp_path / "state", b"x")
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o600
    assert list(tmp_path.glob(".*.tmp")) == []


# -- chatterm export ---------------------------------------------------------------
@pytest.fixture
def env(tmp_path, monkeypatch):
    for name in ("CONFIG", "DATA", "CACHE"):
        monkeypatch.setenv(f"CHATTERM_{name}_DIR", str(tmp_path / name.lower()))
    db = tmp_path / "data" / "chatterm.db"
    db.parent.mkdir()  # a named database's folder must exist
    monkeypatch.setenv("CHATTERM_DB", str(db))
    return db


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_export_command_defaults_to_latest_session_jsonl(env, capsys):
    first, second = build_sample(env)
    assert main(["export"]) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["session_id"] for r in rows] == [second]


def test_export_command_all_and_file_outputs(env, tmp_path, capsys):
    first, second = build_sample(env)
    before = sha(env)
    out_csv = tmp_path / "all.csv"
    assert main(["export", "--all", "-o", str(out_csv)]) == 0  # format from the suffix
    assert f"to {out_csv}" in capsys.readouterr().err
    rows = list(csv.DictReader(out_csv.open(newline="")))
    assert [int(r["session_id"]) for r in rows] == [first, first, first, second]
    assert main(["export", str(first), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert f"## Session {first}" in md and f"## Session {second}" not in md
    assert main(["--db", str(env), "export", str(second), "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert sha(env) == before


def test_export_dash_output_is_stdout(env, tmp_path, capsys, monkeypatch):
    first, _ = build_sample(env)
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(first), "-o", "-"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["session_id"] for r in rows] == [first] * 3
    assert not (tmp_path / "-").exists()


def test_export_command_unknown_id(env, tmp_path, capsys):
    build_sample(env)
    target = tmp_path / "out.jsonl"
    assert main(["export", "42", "-o", str(target)]) == 2
    line = one_line_error(capsys)
    assert "unknown session 42" in line
    assert not target.exists()


def test_export_command_unwritable_output(env, tmp_path, capsys):
    build_sample(env)
    target = tmp_path / "no-such-dir" / "out.md"
    assert main(["export", "--all", "--format", "md", "-o", str(target)]) == 2
    line = one_line_error(capsys)
    assert "cannot write" in line and str(target) in line
    assert not target.parent.exists()


def test_export_command_without_sessions(env, capsys):
    assert main(["export"]) == 2
    assert "no sessions to export" in one_line_error(capsys)
    assert not env.exists()
    assert main(["export", "--all", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == [",".join(ROW_FIELDS)]


def test_export_command_refuses_bad_databases(env, capsys):
    env.write_bytes(b"\x00garbage" * 64)
    assert main(["export", "--all"]) == 2
    line = one_line_error(capsys)
    assert str(env) in line and "--db" in line


def test_non_finite_numbers_are_null_in_jsonl(tmp_path):
    """SQLite stores NaN as NULL; infinities are stored and reach the JSON encoder."""
    metrics = TurnMetrics(engine="local", model_id="m", persona_id="assistant", submitted_at=1_700_000_001.0,
                          ttft_ms=float("nan"), prefill_ms=float("inf"), decode_ms=float("-inf"),
                          stop_reason="eos")
    with SessionStore(tmp_path / "s.db") as store:
        sid = store.create_session(model_id="m", model_identity="x", engine="local", device="CPU",
                                   persona_id="assistant")
        store.record_turn(sid, "q", "a", metrics)
        row = json.loads(export_text(store, [sid], "jsonl"))
    assert row["ttft_ms"] is None and row["prefill_ms"] is None and row["decode_ms"] is None
    assert row["reply"] == "a"


NULLABLE_METRICS = ("prompt_tokens", "cached_tokens", "prefilled_tokens", "generated_tokens", "prefill_ms",
                    "cost_input_usd", "cost_cached_input_usd", "cost_output_usd", "saved_prefill_ms", "saved_usd")


def test_null_metric_columns_read_as_their_defaults_in_the_reports(tmp_path):
    """The schema lets metric columns be NULL (an early chatterm, NaN, a hand
    edit): the reports add and compare them, and raised TypeError."""
    db = tmp_path / "s.db"
    first, _ = build_sample(db)
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE turns SET {', '.join(f'{name} = NULL' for name in NULLABLE_METRICS)}")
    with SessionStore(db, readonly=True) as store:
        metrics = store.turn_metrics(first)
        assert {getattr(m, name) for m in metrics for name in NULLABLE_METRICS} == {0}
        for fmt in ("md", "html"):
            assert "Hello! How can I help?" in export_text(store, [first], fmt)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_two_processes_write_exactly_what_one_does(sample, monkeypatch, fmt):
    db, ids = sample
    with SessionStore(db, readonly=True) as store:
        one = export_text(store, ids, fmt)
        monkeypatch.setattr(export, "PARALLEL_TURNS", 1)  # the forked worker renders the second session
        two = export_text(store, ids, fmt)
    assert two == one and one.count("\n") >= 4


def test_a_failing_export_worker_is_one_error_and_leaves_no_temp_file(sample, tmp_path, monkeypatch):
    db, ids = sample
    monkeypatch.setattr(export, "PARALLEL_TURNS", 1)
    monkeypatch.setattr(export.tempfile, "tempdir", str(tmp_path))
    moved = tmp_path / "moved.db"
    with SessionStore(db, readonly=True) as store:
        db.rename(moved)  # this process's connection still reads it; the worker's cannot open it
        with pytest.raises(ChattermError, match="export: "):
            export_text(store, ids, "jsonl")
    assert not list(tmp_path.glob("chatterm-export-*"))


def test_a_reader_that_stops_early_ends_the_worker_and_its_temp_file(sample, tmp_path, monkeypatch):
    db, ids = sample  # as `chatterm export --all | head -1` does
    monkeypatch.setattr(export, "PARALLEL_TURNS", 1)
    monkeypatch.setattr(export.tempfile, "tempdir", str(tmp_path))
    with SessionStore(db, readonly=True) as store:
        chunks = export.export_chunks(store, export.sessions_to_export(store, ids), "jsonl")
        assert next(chunks).startswith(b"{")
        assert len(list(tmp_path.glob("chatterm-export-*"))) == 1
        chunks.close()
    assert not list(tmp_path.glob("chatterm-export-*"))
    assert not multiprocessing.active_children()


def test_export_never_replaces_the_database_a_device_a_fifo_or_a_link(env, tmp_path, capsys):
    import threading

    build_sample(env)
    before = env.read_bytes()
    # The database itself (a new user's slip: -o with the --db path), or its WAL.
    for target in (env, Path(f"{env}-wal")):
        if target.exists():
            assert main(["export", "1", "--format", "jsonl", "-o", str(target)]) == 2
            assert "is the session database" in one_line_error(capsys)
    assert env.read_bytes() == before
    with SessionStore(env, readonly=True) as store:
        assert store.session(1).turns >= 1
    # /dev/null stays a device; a FIFO is written to, not replaced by a file.
    assert main(["export", "1", "-o", os.devnull]) == 0
    assert os.path.exists(os.devnull) and not Path(os.devnull).is_file()
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert main(["export", "1", "-o", str(fifo)]) == 0
    reader.join(10)
    assert fifo.is_fifo() and json.loads(got[0].splitlines()[0])["session_id"] == 1
    # A link to a file: the file it names is replaced, the link stays a link.
    real = tmp_path / "real.jsonl"
    real.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    assert main(["export", "1", "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(real.read_text().splitlines()[0])["session_id"] == 1
