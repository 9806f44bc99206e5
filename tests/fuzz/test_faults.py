"""Faults: disk full, a killed writer, a database that stops taking writes.

- Disk full (a file-size limit, RLIMIT_FSIZE with SIGXFSZ ignored, in a child
  process: writes fail with EFBIG as they would with ENOSPC) while writing a
  persona state file, an export and a SQLite commit: nothing half-written is
  left (no partial file, no temp file, the previous file intact, the database
  passes `integrity_check` and holds exactly the acknowledged turns), chat goes
  on, and the reason is given once.
- A state-file writer SIGKILLed at random points, many times: the file on disk
  is always absent or the whole of one save, never torn or half-valid.
- A database that refuses writes while the app runs (SQLite's "attempt to
  write a readonly database"): chat continues, the user is told once that turns
  are no longer stored, and nothing raises. On Linux a chmod does not take
  write access away from an open database, so the refusal is produced inside
  SQLite (`PRAGMA query_only`), which answers exactly as for a read-only file.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fuzzing import LONG_FACTOR, PROFILE

from chatterm.core.cache.prompt_cache import Miss, OpenedState, PromptCache, Slot
from chatterm.core.metrics.turn_metrics import TurnMetrics
from chatterm.core.store.session_store import SessionStore
from chatterm.core.system.atomic import sweep_temp_files

resource = pytest.importorskip("resource")  # POSIX only
if not hasattr(signal, "SIGXFSZ"):
    pytest.skip("needs SIGXFSZ", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
COMPAT = {"model_sha256": "cd" * 32}
TOKENS = [5, 6, 7]
SLOT = Slot.persona("p")


def load(cache: PromptCache) -> OpenedState | Miss:
    """The slot's state as a turn would get it: the best candidate opened, or a miss."""
    found = cache.lookup("m", COMPAT, TOKENS + [0], expect=[SLOT])
    if not found.candidates:
        return Miss(found.misses[0] if found.misses else "no candidate")
    return cache.open(found.candidates[0])


def metrics(i: int = 0) -> TurnMetrics:
    return TurnMetrics(engine="local", model_id="m", persona_id="p", submitted_at=time.time(), ttft_ms=10.0 + i,
                       generated_tokens=i, stop_reason="eos")


def limited(limit_bytes: int):
    """preexec_fn: files may not grow beyond `limit_bytes`; the write fails instead of killing."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited across exec
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def run_child(code: str, *args: str, limit: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, preexec_fn=limited(limit) if limit else None)


# -- disk full ------------------------------------------------------------------
STATE_WRITER = """
    import json, sys
    from pathlib import Path
    from chatterm.core.cache.prompt_cache import PromptCache, Slot
    cache = PromptCache(Path(sys.argv[1]))
    compat = json.loads(sys.argv[2])
    results = [str(cache.save("m", Slot.persona("p"), [5, 6, 7], bytes([9]) * (4 << 20), compat))
               for _ in range(2)]
    print(json.dumps({"results": results, "write_error": cache.write_error}))
"""


def test_disk_full_while_writing_a_state_file(tmp_path):
    folder = tmp_path / "kv"
    cache = PromptCache(folder)
    old = cache.save("m", SLOT, TOKENS, bytes([1]) * (256 << 10), COMPAT)
    before = old.read_bytes()
    child = run_child(STATE_WRITER, str(folder), json.dumps(COMPAT), limit=1 << 20)
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout)
    assert out["results"] == ["None", "None"]  # the second save is not even tried
    assert "File too large" in out["write_error"] and str(old) in out["write_error"]
    assert old.read_bytes() == before  # the previous state is intact
    assert sorted(p.name for p in old.parent.iterdir()) == ["persona-p.kvstate"]  # no temp file left
    loaded = load(cache)
    assert isinstance(loaded, OpenedState) and loaded.verify()
    loaded.close()


def test_disk_full_while_exporting(tmp_path):
    db = tmp_path / "chatterm.db"
    with SessionStore(db) as store:
        sid = store.create_session(model_id="m", model_identity="x", engine="local", device="CPU", persona_id="p")
        for i in range(20):
            store.record_turn(sid, f"question {i}", "answer " * 400, metrics(i))
    out = tmp_path / "exports" / "all.jsonl"
    out.parent.mkdir()
    out.write_text("previous export\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}

    def export(limit: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "chatterm", "--db", str(db), "export", "--all", "-o", str(out)],
                              capture_output=True, text=True, env=env, timeout=60, preexec_fn=limited(limit))

    # Room to open the database (its 32 KiB shared-memory file) but not for the export.
    result = export(48 << 10)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and "File too large" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    # No room even to open the database: the disk is blamed, not the database.
    result = export(16 << 10)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "disk full" in result.stderr and "not a usable" not in result.stderr
    assert out.read_text() == "previous export\n"  # untouched
    assert sorted(p.name for p in out.parent.iterdir()) == ["all.jsonl"]  # no partial or temp file
    with SessionStore(db, readonly=True) as store:
        assert len(store.turns(sid)) == 20


SQLITE_WRITER = """
    import json, resource, signal, sys, time
    from pathlib import Path
    from chatterm.core.metrics.turn_metrics import TurnMetrics
    from chatterm.core.store.session_store import SessionStore
    db = Path(sys.argv[1])
    store = SessionStore(db)
    sid = int(sys.argv[2])
    # Files may grow 256 KiB past their size now: the WAL soon hits the limit.
    size = max(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + (256 << 10),) * 2)
    acked, notices = [], []
    for i in range(200):
        m = TurnMetrics(engine="local", model_id="m", persona_id="p", submitted_at=time.time(), stop_reason="eos")
        index = store.record_turn(sid, f"q{i}", "reply " * 2000, m)
        notice = store.take_write_notice()
        if notice:
            notices.append(notice)
        if index is not None:
            acked.append(index)
    print(json.dumps({"acked": acked, "notices": notices, "readable": len(store.turns(sid))}))
"""


def test_disk_full_during_a_sqlite_commit(tmp_path):
    db = tmp_path / "chatterm.db"
    with SessionStore(db) as store:
        sid = store.create_session(model_id="m", model_identity="x", engine="local", device="CPU", persona_id="p")
        store.record_turn(sid, "first", "kept", metrics())
    child = run_child(SQLITE_WRITER, str(db), str(sid))
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout)
    assert 0 < len(out["acked"]) < 200  # some turns fit, then the disk was full
    assert len(out["notices"]) == 1 and "no longer being stored" in out["notices"][0]
    assert "full" in out["notices"][0] or "I/O" in out["notices"][0]
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with SessionStore(db, readonly=True) as store:
        records = store.turns(sid)
    # Exactly the acknowledged turns: none lost, none half there.
    assert [r.index for r in records] == [1, *out["acked"]]
    assert all(r.reply == "reply " * 2000 for r in records[1:])
    assert out["readable"] == len(records)


# -- a database that stops taking writes -----------------------------------------------
def make_read_only(store: SessionStore, on: bool = True) -> None:
    """SQLite refuses every write from now on, as for a read-only database file."""
    store._conn.execute(f"PRAGMA query_only = {'ON' if on else 'OFF'}")


def test_store_that_refuses_writes_never_raises_and_tells_once(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    sid = store.create_session(model_id="m", model_identity="x", engine="local", device="CPU", persona_id="p")
    assert store.record_turn(sid, "a", "b", metrics()) == 1
    assert store.take_write_notice() is None and store.write_error is None
    make_read_only(store)
    assert store.record_turn(sid, "c", "d", metrics()) is None
    assert store.create_session(model_id="m", model_identity="x", engine="local", device="CPU",
                                persona_id="p") is None
    assert "readonly database" in store.write_error and str(store.path) in store.write_error
    notice = store.take_write_notice()
    assert notice.startswith("Turns are no longer being stored") and "\n" not in notice
    assert store.record_turn(sid, "e", "f", metrics()) is None
    assert store.take_write_notice() is None  # once
    assert [r.user_text for r in store.turns(sid)] == ["a"]  # reads still work
    make_read_only(store, on=False)
    assert store.record_turn(sid, "g", "h", metrics()) == 2  # writable again: stored again
    assert store.take_write_notice() is None
    store.close()


async def test_app_keeps_chatting_and_says_once_that_turns_are_not_stored(tmp_path, isolated_dirs):
    sys.path.insert(0, str(REPO / "tests" / "ui"))
    from fake_engine import FakeEngine

    from chatterm.core.workspace import Workspace
    from chatterm.ui.chat_view import TurnPhase
    from chatterm.ui.launch import make_app
    from chatterm.ui.transcript import AssistantReply

    workspace = Workspace.load(db_path=tmp_path / "chatterm.db")
    store = SessionStore(workspace.db_path)

    def factory(spec):
        return FakeEngine(spec, workspace.catalog.price(spec.price_profile), ["one", "two", "three"])

    app = make_app(workspace, store=store, engine_factory=factory, gpu_status=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        async def until(predicate):
            deadline = time.monotonic() + 10
            while not predicate():
                assert time.monotonic() < deadline
                await pilot.pause(0.02)

        async def send(text):
            before = len(app.conversation.turns)
            app.query_one("#prompt").insert(text)
            await pilot.press("enter")
            await until(lambda: len(app.conversation.turns) > before and app.chat.phase is TurnPhase.IDLE)

        await until(lambda: app.conversation is not None)
        app.query_one("#prompt").focus()
        await send("first")
        make_read_only(store)
        await send("second")
        await send("third")
        await pilot.pause()
        assert len(app.query(AssistantReply)) == 3 and app.is_running
        told = [n.message for n in app._notifications if "no longer being stored" in n.message]
        assert len(told) == 1 and "readonly" in told[0]
    with SessionStore(workspace.db_path, readonly=True) as reader:
        (info,) = reader.sessions()
        assert [r.user_text for r in reader.turns(info.id)] == ["first"]
    store.close()


# -- a writer killed at random points ---------------------------------------------------
KILLED_WRITER = """
    import json, sys
    from pathlib import Path
    from chatterm.core.cache.prompt_cache import PromptCache, Slot
    cache = PromptCache(Path(sys.argv[1]))
    compat = json.loads(sys.argv[2])
    print("ready", flush=True)
    i = int(sys.argv[3])
    while True:
        i += 1
        size = (1 + i % 7) * (512 << 10) + i  # every save has its own size and byte
        cache.save("m", Slot.persona("p"), [5, 6, 7], bytes([i % 251]) * size, compat, {"save": i})
"""


def test_state_file_writer_killed_at_random_points_never_leaves_a_torn_file(tmp_path):
    rounds = 25 * (LONG_FACTOR if PROFILE == "long" else 1)
    rng = random.Random(20261202)
    folder = tmp_path / "kv"
    cache = PromptCache(folder)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    seen = {"valid": 0, "absent": 0}
    for n in range(rounds):
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(folder),
                                  json.dumps(COMPAT), str(n * 1000)], stdout=subprocess.PIPE, env=env)
        assert child.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.15))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        reader = PromptCache(folder)  # a fresh reader, as a new process
        result = load(reader)
        if isinstance(result, Miss):
            assert result.reason == "persona p: no saved state (not kept yet, or removed)", result.reason  # never torn
            seen["absent"] += 1
            continue
        try:
            assert result.verify()
            (entry,) = reader.entries()  # the header the restore was checked against
            i = entry.info["save"]  # the whole of save number i, nothing else
            assert bytes(result.payload) == bytes([i % 251]) * ((1 + i % 7) * (512 << 10) + i)
            seen["valid"] += 1
        finally:
            result.close()
    assert seen["valid"] > 0, seen
    # Temp files of killed writers are swept, and never listed as state files.
    assert all(e.path.suffix == ".kvstate" for e in cache.entries())
    left = list(folder.glob("*/.*.tmp"))
    assert sweep_temp_files(folder, "*/.*.tmp", older_than_s=0) == len(left)
    assert not list(folder.glob("*/.*.tmp"))
