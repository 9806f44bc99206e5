"""SessionStore on real SQLite files: round trip, schema versions, refusals,
read-only use, threads, and the `chatterm sessions` command."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from chatterm.cli import main
from chatterm.core.engine.interface import ChatMessage, ReplyTokens
from chatterm.core.metrics.turn_metrics import TURN_FIELDS, TurnMetrics
from chatterm.core.store import schema as store_schema
from chatterm.core.store.resume import history_of
from chatterm.core.store.session_store import SCHEMA_VERSION, SessionStore
from chatterm.errors import ChattermError

V1_SQL = Path(__file__).parents[2] / "golden" / "store-v1.sql"


def full_metrics(i: int = 0, **changes) -> TurnMetrics:
    """Every field set to a non-default value, so a lost column shows up."""
    values = dict(
        engine="local",
        model_id="smollm2-135m",
        persona_id="assistant",
        submitted_at=1_700_000_000.25 + i,
        price_profile="gpt-4-turbo",
        cache_outcome="restored",
        cache_detail="state file 12 KB",
        restore_ms=4.5 + i,
        prefill_ms=12.25,
        prompt_tokens=120 + i,
        cached_tokens=100,
        prefilled_tokens=20 + i,
        ahead_tokens=12,
        ahead_ms=150.5,
        generated_tokens=33,
        ttft_ms=40.0 + 10 * i,
        decode_ms=320.0,
        total_ms=380.5,
        stop_reason="eos",
        error="boom",
        dropped_turns=2,
        tokens_estimated=True,
        cost_input_usd=0.0002,
        cost_cached_input_usd=0.0005,
        cost_output_usd=0.00099,
        saved_prefill_ms=800.0,
        saved_usd=0.0005,
        energy_wh=0.125,
        energy_cost_usd=0.0000375,
    )
    values.update(changes)
    return TurnMetrics(**values)


def old_database(path, version: int) -> sqlite3.Connection:
    """A database as an older chatterm left it: migrated to `version` only (still open)."""
    conn = sqlite3.connect(path)
    for migration in store_schema.MIGRATIONS[:version]:
        migration(conn)
    conn.execute(f"PRAGMA user_version = {version}")
    return conn


def new_session(store: SessionStore, persona: str = "assistant", started_at: float | None = None) -> int:
    return store.create_session(
        model_id="smollm2-135m",
        model_identity="sha256:abc",
        engine="local",
        device="CPU",
        persona_id=persona,
        started_at=started_at,
    )


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_round_trip_keeps_every_metric(tmp_path):
    db = tmp_path / "data" / "chatterm.db"
    with SessionStore(db) as store:
        sid = new_session(store)
        sent = [full_metrics(i) for i in range(3)]
        indexes = [store.record_turn(sid, f"question {i}", f"answer {i}", m) for i, m in enumerate(sent)]
    assert indexes == [1, 2, 3]
    with SessionStore(db) as store:
        records = store.turns(sid)
        assert [r.metrics for r in records] == sent
        assert [(r.index, r.user_text, r.reply) for r in records] == [
            (i + 1, f"question {i}", f"answer {i}") for i in range(3)
        ]
        assert records[0].metrics.tokens_estimated is True
        # Derived fields are stored as columns too, for plain SQL queries.
        row = sqlite3.connect(db).execute(
            "SELECT decode_tok_s, cost_usd FROM turns WHERE turn_index = 1"
        ).fetchone()
        assert row == pytest.approx((sent[0].decode_tok_s, sent[0].cost_usd))


def test_every_turn_field_has_a_column_of_the_same_name(tmp_path):
    db = tmp_path / "c.db"
    SessionStore(db).close()
    columns = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(turns)")}
    missing = set(TURN_FIELDS) - columns
    assert not missing, f"add a migration for {sorted(missing)}"


def test_sessions_listing_newest_first_with_aggregates(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        assert store.sessions() == []
        assert store.latest_session_id() is None and not store.has_sessions()
        old = new_session(store, "terse-coder", started_at=1000.0)
        assert store.has_sessions()
        new = new_session(store, "assistant", started_at=2000.0)
        assert store.latest_session_id() == new  # no turn yet: the newest session
        for i, ttft in enumerate([30.0, 10.0, 20.0, None]):
            store.record_turn(old, "q", "a", full_metrics(i, ttft_ms=ttft))
        infos = store.sessions()
        # Newest activity first, and `--resume` without an id takes the first listed.
        assert [s.id for s in infos] == [old, new]
        assert store.latest_session_id() == old  # the session last talked in, not the newest
        assert infos[0].active_at >= infos[0].started_at and infos[1].active_at == 2000.0
        info = store.session(old)
        assert (info.persona_id, info.turns, info.ttft_p50_ms) == ("terse-coder", 4, 20.0)
        assert info.cost_usd == pytest.approx(4 * full_metrics().cost_usd)
        assert info.started_at == 1000.0 and info.model_identity == "sha256:abc"
        empty = store.session(new)
        assert (empty.turns, empty.ttft_p50_ms, empty.cost_usd) == (0, None, 0.0)


def test_unknown_session_is_named(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        new_session(store)
        for call in (store.session, store.turns, store.turn_metrics):
            with pytest.raises(ChattermError, match="unknown session 42"):
                call(42)
        with pytest.raises(ChattermError, match="unknown session 42"):
            store.record_turn(42, "q", "a", full_metrics())
        assert sqlite3.connect(store.path).execute("SELECT count(*) FROM turns").fetchone() == (0,)


def test_history_alternates_and_skips_turns_that_failed_without_text(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = new_session(store)
        store.record_turn(sid, "hello", "hi there", full_metrics(stop_reason="eos"))
        store.record_turn(sid, "crash?", "", full_metrics(stop_reason="error", error="oom"))
        store.record_turn(sid, "long story", "once upon", full_metrics(stop_reason="cancelled"))
        assert history_of(store.turns(sid)) == [
            ChatMessage("user", "hello"),
            ChatMessage("assistant", "hi there"),
            ChatMessage("user", "long story"),
            ChatMessage("assistant", "once upon"),
        ]
        # The failed turn is still recorded, marked by its stop reason.
        assert [r.metrics.stop_reason for r in store.turns(sid)] == ["eos", "error", "cancelled"]


def test_database_is_in_wal_mode_with_current_version(tmp_path):
    db = tmp_path / "s.db"
    SessionStore(db).close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 11


def make_v1_database(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(V1_SQL.read_text())
    conn.commit()
    conn.close()


def test_v1_migration_in_code_matches_the_released_v1_schema(tmp_path):
    """Released migrations must never change: the fixture is the v1 schema as shipped."""
    fixture, fresh = tmp_path / "fixture.db", tmp_path / "fresh.db"
    make_v1_database(fixture)
    conn = sqlite3.connect(fresh)
    store_schema.MIGRATIONS[0](conn)
    conn.commit()

    def schema(path):
        return sorted(sqlite3.connect(path).execute("SELECT name, sql FROM sqlite_master").fetchall())

    assert schema(fresh) == schema(fixture)


def test_migration_from_v1_keeps_data_and_adds_the_later_versions(tmp_path):
    db = tmp_path / "old.db"
    make_v1_database(db)
    before = sha(db)
    # Read-only use of an old database works without migrating it.
    with SessionStore(db, readonly=True) as store:
        (info,) = store.sessions()
        (old,) = store.turns(info.id)
        assert old.metrics.energy_wh is None and old.metrics.ttft_ms == 55.5
        assert old.reply_tokens is None  # v11's columns are not there
    assert sha(db) == before
    with SessionStore(db) as store:
        assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        (old,) = store.turns(info.id)
        assert (old.index, old.user_text, old.reply) == (1, "hi | there", "hello\nworld")
        assert old.metrics.tokens_estimated is False and old.metrics.cache_outcome == "restored"
        assert old.metrics.energy_wh is None and old.metrics.ahead_tokens == 0
        assert store.record_turn(info.id, "again", "yes", full_metrics()) == 2
        assert store.turns(info.id)[1].metrics.energy_wh == 0.125
        # v8: the old turn starts the main line, and its texts are searchable.
        first, second = store.turns(info.id)
        assert (first.parent, first.branch, second.parent, second.branch) == (None, "main", 1, "main")
        assert [h.turn_index for h in store.search("world")] == [1]
        assert store.session(info.id).title == "hi | there"
    conn = sqlite3.connect(db)
    # v3: the messages view lists the conversation in order, both roles.
    rows = conn.execute("SELECT turn_index, role, content FROM messages").fetchall()
    assert rows == [(1, "user", "hi | there"), (1, "assistant", "hello\nworld"),
                    (2, "user", "again"), (2, "assistant", "yes")]
    indexes = {r[1] for r in conn.execute("PRAGMA index_list(turns)")}
    assert {"turns_by_session", "turns_summary"} <= indexes  # v2, v4
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO turns (session_id, turn_index, recorded_at, user_text, reply) "
            "VALUES (?, 1, 0, '', '')",
            (info.id,),
        )


def test_a_replys_sampled_tokens_are_kept_with_its_history_and_forks_but_not_exported(tmp_path):
    db = tmp_path / "s.db"
    sampled = ReplyTokens.of("sha256:tokens-model", (1, 7654321, 2**31 - 1))
    assert sampled.ids == [1, 7654321, 2**31 - 1] and len(sampled.data) == 12
    with SessionStore(db) as store:
        sid = new_session(store, "p", 1000.0)
        store.record_turn(sid, "hi", "hello", full_metrics(), reply_tokens=sampled)
        store.record_turn(sid, "and?", "served", full_metrics())  # a remote engine's: no tokens
        assert [r.reply_tokens for r in store.turns(sid)] == [sampled, None]
        assert [m.tokens for m in history_of(store.turns(sid))[1::2]] == [sampled, None]
        fork, _ = store.fork_session(sid, 1)
        assert store.turns(fork)[0].reply_tokens == sampled
        exported = repr(store.export_rows(sid))
    assert "7654321" not in exported and "tokens-model" not in exported
    # Damaged tokens read as none: the reply's text is tokenized instead.
    conn = sqlite3.connect(db)
    conn.execute("UPDATE turns SET reply_tokens = x'0102'")  # not whole int32s
    conn.commit()
    conn.close()
    with SessionStore(db, readonly=True) as store:
        assert [r.reply_tokens for r in store.turns(sid)] == [None, None]


@pytest.mark.parametrize("readonly", [False, True])
def test_newer_schema_is_refused_and_untouched(tmp_path, readonly):
    db = tmp_path / "future.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE sessions (id INTEGER PRIMARY KEY, whatever TEXT)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    before = sha(db)
    with pytest.raises(ChattermError) as err:
        SessionStore(db, readonly=readonly)
    message = str(err.value)
    assert str(db) in message and "newer chatterm" in message and "\n" not in message
    assert sha(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["future.db"]


@pytest.mark.parametrize("readonly", [False, True])
def test_corrupt_file_is_named_and_untouched(tmp_path, readonly):
    db = tmp_path / "chatterm.db"
    db.write_bytes(b"this is not an SQLite database\n" * 200)
    before = sha(db)
    with pytest.raises(ChattermError) as err:
        SessionStore(db, readonly=readonly)
    message = str(err.value)
    assert str(db) in message and "--db" in message and "\n" not in message
    assert sha(db) == before


def test_foreign_sqlite_database_is_refused_and_untouched(tmp_path):
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE sessions (x)")
    conn.commit()
    conn.close()
    before = sha(db)
    with pytest.raises(ChattermError, match="not a chatterm one"):
        SessionStore(db)
    assert sha(db) == before


def test_read_only_store_never_creates_or_writes(tmp_path):
    missing = tmp_path / "none" / "chatterm.db"
    with SessionStore(missing, readonly=True) as store:
        assert store.sessions() == [] and store.latest_session_id() is None and not store.has_sessions()
        with pytest.raises(ChattermError, match="unknown session 1"):
            store.turns(1)
    assert not missing.parent.exists()

    db = tmp_path / "real.db"
    with SessionStore(db) as store:
        sid = new_session(store)
        store.record_turn(sid, "q", "a", full_metrics())
    before = sha(db)
    with SessionStore(db, readonly=True) as store:
        assert len(store.turns(sid)) == 1
        with pytest.raises(ChattermError, match="read-only"):
            store.record_turn(sid, "q", "a", full_metrics())
        with pytest.raises(ChattermError, match="read-only"):
            new_session(store)
    assert sha(db) == before


def test_unopenable_path_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ChattermError, match="cannot open .*a-file"):
        SessionStore(blocker / "chatterm.db")
    for readonly in (True, False):  # a folder, not a file: SQLite's words differ by mode, ours do not
        with pytest.raises(ChattermError, match=f"^{tmp_path} is a directory, not a database file"):
            SessionStore(tmp_path, readonly=readonly)


def test_a_database_sqlite_cannot_create_blames_the_folder_not_a_file_that_is_not_there(tmp_path, monkeypatch):
    # What SQLite raises for a new file in a folder it may not write to (as
    # root, which these tests may run as, no folder refuses it: so raised here).
    def cannot_open(*args, **kwargs):
        error = sqlite3.OperationalError("unable to open database file")
        error.sqlite_errorname = "SQLITE_CANTOPEN"
        raise error

    monkeypatch.setattr(sqlite3, "connect", cannot_open)
    path = tmp_path / "chatterm.db"
    with pytest.raises(ChattermError) as info:
        SessionStore(path)
    message = str(info.value)
    assert message.startswith(f"cannot create {path}: ") and f"is its folder {tmp_path} writable" in message
    assert "not a usable chatterm database" not in message


def test_a_database_name_too_long_for_the_file_system_is_one_error(tmp_path):
    path = tmp_path / ("x" * 300 + ".db")
    with pytest.raises(ChattermError, match=f"^cannot open {path}: File name too long"):
        SessionStore(path)
    assert list(tmp_path.iterdir()) == []


def test_numbers_from_c_libraries_are_stored(tmp_path):
    """sqlite3 would store numpy and ctypes numbers as BLOBs (buffer protocol)."""
    import ctypes

    import numpy

    with SessionStore(tmp_path / "s.db") as store:
        sid = new_session(store)
        m = full_metrics()
        m.prompt_tokens = numpy.int64(7)
        m.ttft_ms = numpy.float32(1.5)
        m.tokens_estimated = numpy.bool_(False)
        m.cache_detail = ctypes.c_int(5)  # unexpected type: stored as text, not lost
        store.record_turn(sid, "q", "a", m)
        (record,) = store.turns(sid)
        assert (record.metrics.prompt_tokens, record.metrics.ttft_ms) == (7, 1.5)
        assert type(record.metrics.prompt_tokens) is int
        assert record.metrics.tokens_estimated is False
        assert record.metrics.cache_detail == "c_int(5)"


def test_closed_store_says_so(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    store.close()
    store.close()
    with pytest.raises(ChattermError, match="closed"):
        store.sessions()


def test_worker_threads_share_one_store(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        sid = new_session(store)
        errors = []

        def worker(n):
            try:
                for i in range(20):
                    store.record_turn(sid, f"t{n}-{i}", "a", full_metrics(i))
                    store.sessions()
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        records = store.turns(sid)
        assert [r.index for r in records] == list(range(1, 81))
        assert len({r.user_text for r in records}) == 80


# -- chatterm sessions -------------------------------------------------------------
@pytest.fixture
def env(tmp_path, monkeypatch):
    for name in ("CONFIG", "DATA", "CACHE"):
        monkeypatch.setenv(f"CHATTERM_{name}_DIR", str(tmp_path / name.lower()))
    db = tmp_path / "data" / "chatterm.db"
    db.parent.mkdir()  # a named database's folder must exist
    monkeypatch.setenv("CHATTERM_DB", str(db))
    monkeypatch.setenv("COLUMNS", "160")
    return db


def test_sessions_command_on_missing_database(env, capsys):
    assert main(["sessions"]) == 0
    out = capsys.readouterr().out
    assert "No sessions yet" in out and len(out.strip().splitlines()) == 1
    assert not env.exists()


def test_sessions_command_lists_sessions(env, capsys):
    with SessionStore(env) as store:
        first = new_session(store, "terse-coder", started_at=1000.0)
        second = new_session(store, "[bold]odd[/]", started_at=2000.0)
        for i in range(3):
            store.record_turn(first, "q", "a", full_metrics(i))
    before = sha(env)
    assert main(["sessions"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    row_first = next(line for line in lines if "terse-coder" in line)
    assert row_first.split()[0] == str(first)  # no border: the id comes first
    assert "smollm2-135m" in row_first and " 3 " in row_first and "50 ms" in row_first
    assert "0.005070" in row_first  # 3 x 0.00169
    # Persona ids are shown literally, newest activity first; under each row
    # its title (the first user message) and its last exchange.
    assert "[bold]odd[/]" in out and out.index("terse-coder") < out.index("[bold]odd[/]")
    assert lines[lines.index(row_first) + 1].split() == ["q", "·", "q", "→", "a"]
    assert "(no turns)" in out
    assert sha(env) == before
    assert main(["sessions", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "[bold]odd[/]" not in out and "1 older sessions not shown" in out
    assert second


def test_sessions_command_on_corrupt_database(env, capsys):
    env.write_bytes(b"garbage" * 100)
    assert main(["sessions"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(env) in err and "--db" in err


def test_sessions_table_never_cuts_an_id_or_wraps_a_date(env, capsys, monkeypatch):
    """Piped at 80 columns (and narrower than the table, as in a small
    terminal): every session is one whole line."""
    long_model = "smollm2-135m-q8kv-" + "x" * 40
    with SessionStore(env) as store:
        for i, (model, persona) in enumerate(((long_model, "a-persona-with-a-long-name"),
                                              ("smollm2-135m-q8kv", "shop-support"), ("smollm2-135m", "assistant"))):
            sid = store.create_session(model_id=model, model_identity="m", engine="local", device="CPU",
                                       persona_id=persona, started_at=1_700_000_000.0 + i)
            store.record_turn(sid, "q", "a", full_metrics())
    for columns in ("80", "40"):
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["sessions"]) == 0
        lines = capsys.readouterr().out.splitlines()
        rows = [line.split() for line in lines if line.split()[0].isdigit()]
        assert len(rows) == 3 and "…" not in "".join(lines)
        # id, date, time, persona, model, ...: nothing cut, nothing wrapped.
        assert [row[3:5] for row in rows] == [["assistant", "smollm2-135m"],
                                              ["shop-support", "smollm2-135m-q8kv"],
                                              ["a-persona-with-a-long-name", long_model]]
    # The usual ids fit 80 columns (the two newest sessions).
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["sessions", "-n", "2"]) == 0
    title, *table = capsys.readouterr().out.splitlines()
    assert title == f"Sessions in {env}"  # whole, however long the path
    # header, rule, 2 x (row, title line), "1 older session not shown"
    assert len(table) == 7 and max(len(line) for line in table) <= 80


def test_sessions_json_is_one_session_info_per_line(env, capsys):
    assert main(["sessions", "--json"]) == 0
    assert capsys.readouterr().out == ""  # no sessions: no line to parse
    with SessionStore(env) as store:
        first = new_session(store, "terse-coder", started_at=1000.5)
        for i in range(3):
            store.record_turn(first, "q", "a", full_metrics(i))
        second = new_session(store, "odd\x1b[31m\u202e", started_at=2000.0)
    assert main(["sessions", "--json"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out  # escaped, as export's JSONL
    rows = [json.loads(line) for line in out.splitlines()]
    with SessionStore(env, readonly=True) as store:
        assert rows == [dataclasses.asdict(info) for info in store.sessions()]
    assert [r["id"] for r in rows] == [first, second]  # the one talked in last first
    assert rows[1]["persona_id"] == "odd\x1b[31m\u202e" and rows[1]["ttft_p50_ms"] is None
    assert rows[0]["started_at"] == 1000.5 and rows[0]["turns"] == 3
    assert rows[0]["ttft_p50_ms"] == 50.0 and rows[0]["cost_usd"] == pytest.approx(0.00507)
    assert (rows[0]["title"], rows[0]["preview"], rows[0]["forked_from"]) == ("q", "q → a", None)
    assert rows[1]["active_at"] == 2000.0 and rows[0]["active_at"] > 2000.0
    assert main(["sessions", "--json", "-n", "1"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [first]


def database_in_a_folder_made_read_only(tmp_path) -> Path:
    """A database holding one turn ("kept"), in a folder of mode 555."""
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "chatterm.db"
    with SessionStore(db) as store:
        store.record_turn(new_session(store), "kept", "safe", full_metrics())
    folder.chmod(0o555)
    return db


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder holding a database, made so that it cannot be written (chmod;
    as root, which chmod does not stop, the immutable flag), or a skip."""
    import subprocess

    from chatterm.core.system.atomic import cannot_create_in

    db = database_in_a_folder_made_read_only(tmp_path)
    folder = db.parent
    flagged = False
    if cannot_create_in(folder) is None:
        flagged = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    try:
        if cannot_create_in(folder) is None:
            pytest.skip("cannot make a folder read-only here")
        yield db
    finally:
        if flagged:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_a_database_in_a_folder_that_cannot_be_written(read_only_folder):
    db = read_only_folder
    # Read-only uses read it (export, sessions): SQLite's WAL needs the folder even
    # to read, and said "unable to open database file", reported as a corrupt file.
    with SessionStore(db, readonly=True) as store:
        assert [r.user_text for r in store.turns(store.latest_session_id())] == ["kept"]
    with pytest.raises(ChattermError) as refused:
        SessionStore(db)
    message = str(refused.value)
    assert f"its folder {db.parent} cannot be written" in message and "not a usable" not in message


def test_a_database_another_process_is_writing(tmp_path, monkeypatch):
    """A current database opens beside another process's long write (no write
    lock is needed to open it), and a write that times out behind it says so,
    not "not a usable chatterm database"."""
    from chatterm.core.store import opening

    db = tmp_path / "chatterm.db"
    with SessionStore(db) as store:
        sid = new_session(store)
        store.record_turn(sid, "kept", "safe", full_metrics())
    old_database(tmp_path / "old.db", 7).close()
    monkeypatch.setattr(opening, "BUSY_TIMEOUT_S", 0.2)
    holders = []
    for path in (db, tmp_path / "old.db"):
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        holders.append(holder)
    try:
        with SessionStore(db) as store:
            assert [t.user_text for t in store.turns(sid)] == ["kept"]
            with pytest.raises(ChattermError) as refused:
                store.rename_session(sid, "new")
            assert str(refused.value) == (f"{db}: could not rename session {sid}: another process is writing it "
                                          "and held its lock for over 0.2 s")
            assert store.record_turn(sid, "more", "text", full_metrics()) is None
            assert "another process is writing it" in store.write_error
        with pytest.raises(ChattermError) as refused:
            SessionStore(tmp_path / "old.db")  # to migrate, it needs the lock
        assert str(refused.value) == (f"cannot open {tmp_path / 'old.db'}: another process is writing it and "
                                      "held its lock for over 0.2 s; try again")
    finally:
        for holder in holders:
            holder.execute("ROLLBACK")
            holder.close()


def test_a_listing_reads_one_state_of_the_file_while_another_store_deletes(tmp_path):
    """`sessions()` is several queries: a session deleted by another process
    between two of them raised KeyError; they now read one snapshot."""
    db = tmp_path / "chatterm.db"
    with SessionStore(db) as store:
        ids = [new_session(store) for _ in range(3)]
        for sid in ids:
            store.record_turn(sid, f"q{sid}", "a", full_metrics())
    with SessionStore(db, readonly=True) as reader, SessionStore(db) as other:
        query, calls = reader._query, []

        def query_then_delete(sql, params=()):
            rows = query(sql, params)
            calls.append(sql)
            if len(calls) == 1:
                assert other.delete_session(ids[1]) == 1
            return rows

        reader._query = query_then_delete
        assert [info.id for info in reader.sessions()] == ids[::-1]  # as it was when the listing began
        assert len(calls) > 1
        assert [info.id for info in reader.sessions()] == [ids[2], ids[0]]


_AS_ANOTHER_USER = """
import sys
from pathlib import Path
from chatterm.core.store.session_store import SessionStore
from chatterm.errors import ChattermError
db = Path(sys.argv[1])
with SessionStore(db, readonly=True) as store:
    print([r.user_text for r in store.turns(store.latest_session_id())])
try:
    SessionStore(db)
except ChattermError as exc:
    print(exc)
"""


def test_a_database_in_a_folder_whose_mode_refuses_its_user(tmp_path):
    """Where the folder's mode refuses the user (EACCES: SQLite says
    READONLY_DIRECTORY, not the CANTOPEN of an immutable folder), the database
    reads as it is and a write names the folder. Root is made an ordinary
    user for it: without the capability to override file modes."""
    import shutil
    import subprocess
    import sys

    db = database_in_a_folder_made_read_only(tmp_path)
    folder = db.parent
    command = [sys.executable, "-c", _AS_ANOTHER_USER, str(db)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("no setpriv to run without the capability to override file modes")
        dropped = "-dac_override,-dac_read_search"
        command = ["setpriv", f"--inh-caps={dropped}", f"--bounding-set={dropped}", *command]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        folder.chmod(0o755)
    assert run.returncode == 0, run.stderr
    kept, refused = run.stdout.splitlines()
    assert kept == "['kept']"
    assert f"its folder {folder} cannot be written" in refused and "not a usable" not in refused


def damaged_past_its_header(db) -> None:
    """A database at `db` that opens (its header and schema are whole) and
    fails on the first read of a turn, and on writes: pages 3-9 overwritten."""
    with SessionStore(db) as store:
        sid = new_session(store)
        for n in range(40):
            store.record_turn(sid, f"question {n} " + "word " * 200, "answer " * 100, full_metrics())
    data = bytearray(db.read_bytes())
    data[8192:40000] = b"\xab" * (40000 - 8192)
    db.write_bytes(bytes(data))
