"""Durability and sharing across real processes.

- A process SIGKILLed mid-reply loses at most the turn in flight: the database
  holds exactly the turns whose `record_turn` returned, and passes
  `PRAGMA integrity_check`. Two kill points: while streaming (no write open) and
  inside `record_turn` with the row inserted but the COMMIT not yet run.
- Two processes writing the same database (and the same session) both succeed
  and never share a turn index.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chatterm.core.store.session_store import SessionStore

if not hasattr(signal, "SIGKILL"):
    pytest.skip("needs SIGKILL", allow_module_level=True)

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from chatterm.core.metrics.turn_metrics import TurnMetrics
    from chatterm.core.store.session_store import SessionStore

    db, n, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    store = SessionStore(db)
    sid = store.create_session(model_id="m", model_identity="sha256:x", engine="local",
                               device="CPU", persona_id="assistant")

    def metrics(i):
        return TurnMetrics(engine="local", model_id="m", persona_id="assistant",
                           submitted_at=time.time(), ttft_ms=10.0 + i, generated_tokens=i,
                           stop_reason="eos")

    for i in range(n):
        store.record_turn(sid, f"question {i}", f"answer {i}", metrics(i))
        print(f"committed {i + 1}", flush=True)

    if mode == "in-commit":
        # Stop inside record_turn of the next turn: the INSERT has run, the
        # COMMIT is about to. The trace callback fires before each statement.
        def trace(sql):
            if sql.strip().upper() == "COMMIT":
                print("in flight", flush=True)
                time.sleep(600)
        store._conn.set_trace_callback(trace)
        store.record_turn(sid, "in flight", "half a rep", metrics(n))
    else:
        # Streaming a reply: text arrives, nothing is being written.
        reply = ""
        print("in flight", flush=True)
        while True:
            reply += "token "
            time.sleep(0.001)
    """
)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["streaming", "in-commit"])
def test_sigkill_mid_reply_keeps_exactly_the_committed_turns(tmp_path, mode):
    db, n = tmp_path / "chatterm.db", 5
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db), str(n), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        lines = []
        for line in child.stdout:
            lines.append(line.strip())
            if line.strip() == "in flight":
                break
        assert lines == [f"committed {i}" for i in range(1, n + 1)] + ["in flight"], child.stderr.read()
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()

    # The killed writer left its WAL behind (it never closed): reopening recovers it.
    with SessionStore(db) as store:
        (info,) = store.sessions()
        records = store.turns(info.id)
        assert [(r.index, r.user_text, r.reply) for r in records] == [
            (i + 1, f"question {i}", f"answer {i}") for i in range(n)
        ]
        assert [r.metrics.ttft_ms for r in records] == [10.0 + i for i in range(n)]
        assert store.record_turn(info.id, "after", "the crash", records[0].metrics) == n + 1
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchall() == [("ok",)]


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from chatterm.core.metrics.turn_metrics import TurnMetrics
    from chatterm.core.store.session_store import SessionStore

    db, shared, name, go = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    while not go.exists():  # start both writers together
        time.sleep(0.005)
    with SessionStore(db) as store:
        own = store.create_session(model_id="m", model_identity="x", engine="local",
                                   device="CPU", persona_id=name)
        for i in range(40):
            m = TurnMetrics(engine="local", model_id="m", persona_id=name, submitted_at=time.time())
            store.record_turn(shared, f"{name} {i}", "a", m)
            store.record_turn(own, f"{name} {i}", "a", m)
            store.sessions()  # a reader beside the other writer
    print("done", flush=True)
    """
)


@pytest.mark.timeout(180)
def test_two_processes_write_the_same_database(tmp_path):
    db, go = tmp_path / "chatterm.db", tmp_path / "go"
    with SessionStore(db) as store:
        shared = store.create_session(
            model_id="m", model_identity="x", engine="local", device="CPU", persona_id="shared"
        )
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db), str(shared), name, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for name in ("alpha", "beta")
    ]
    go.touch()
    results = [w.communicate(timeout=150) for w in writers]
    for writer, (out, err) in zip(writers, results, strict=True):
        assert writer.returncode == 0 and out.strip() == "done", err

    with SessionStore(db, readonly=True) as store:
        shared_turns = store.turns(shared)
        assert [r.index for r in shared_turns] == list(range(1, 81))
        for name in ("alpha", "beta"):
            # Each writer's turns are all there, in the order it wrote them.
            mine = [r.user_text for r in shared_turns if r.user_text.startswith(name)]
            assert mine == [f"{name} {i}" for i in range(40)]
        own = {s.persona_id: s for s in store.sessions() if s.id != shared}
        assert sorted(own) == ["alpha", "beta"]
        assert all(s.turns == 40 for s in own.values())
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchall() == [("ok",)]


OPENER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from chatterm.core.store.session_store import SessionStore

    db, name, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    while not go.exists():
        time.sleep(0.001)
    with SessionStore(db) as store:
        store.create_session(model_id="m", model_identity="x", engine="local",
                             device="CPU", persona_id=name)
    """
)


@pytest.mark.timeout(120)
def test_processes_creating_a_new_database_together(tmp_path):
    """Three first launches at once: one creates the schema, none is refused."""
    db, go = tmp_path / "new" / "chatterm.db", tmp_path / "go"
    names = ("one", "two", "three")
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(db), name, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for name in names
    ]
    time.sleep(0.5)  # let all three reach the start line; correctness does not depend on it
    go.touch()
    for opener in openers:
        _, err = opener.communicate(timeout=100)
        assert opener.returncode == 0, err
    with SessionStore(db, readonly=True) as store:
        assert sorted(s.persona_id for s in store.sessions()) == sorted(names)
