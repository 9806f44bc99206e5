"""Store load benchmark: `chatterm sessions` and `chatterm export --all` on a big database.

Builds a session database through the real store API (`SessionStore.batch()`:
one transaction) — by default 1,000 sessions and 100,000 turns, each turn a
short question and a reply of `--reply-words` words of Markdown — then times,
as the median of `--runs`:
- each command in this process (`chatterm.cli.main`, output discarded), and
- each command as a subprocess (`python -m chatterm ...`: what a user waits
  for, interpreter start-up and imports included), with its peak RSS (the
  export streams a session at a time: memory must not grow with the database).
The export is timed as JSONL (the default, texts included) and as CSV.
It prints the query plans of every query the listing runs, its own SQL
recorded as it runs (the figures must come from the covering index
`turns_summary`, and no query may scan the turn rows) and a CPU calibration
(`sum(range(10**6))` with timeit), and checks that the export holds every turn.

Run: .venv/bin/python benchmarks/store_load.py [--sessions N] [--turns N] [--reply-words N] [--runs N] [--json FILE]
Exit status 1 when a subprocess median is over TARGET_S, a plan reads the turn
rows as above, or the export misses turns.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import finish  # noqa: E402

from chatterm.cli import main as chatterm_main  # noqa: E402
from chatterm.core.metrics.turn_metrics import TurnMetrics  # noqa: E402
from chatterm.core.store import listing  # noqa: E402
from chatterm.core.store.session_store import SessionStore  # noqa: E402
from chatterm.core.system.machine import calibration_ms, cpu_name  # noqa: E402

TARGET_S = 2.0
WORDS = ("the model **streams** tokens while the `cache` keeps a persona prefix; latency is measured "
         "per turn and _exported_ with its units").split()


def build(db: Path, sessions: int, turns: int, reply_words: int) -> float:
    reply = " ".join(WORDS[i % len(WORDS)] for i in range(reply_words))
    per_session, extra = divmod(turns, sessions)
    t0 = time.perf_counter()
    with SessionStore(db) as store, store.batch():
        for s in range(sessions):
            sid = store.create_session(model_id="smollm2-135m", model_identity="sha256:bench", engine="local",
                                       device="CPU", persona_id="assistant", started_at=1.7e9 + s * 60.0)
            for t in range(per_session + (1 if s < extra else 0)):
                m = TurnMetrics(engine="local", model_id="smollm2-135m", persona_id="assistant",
                                submitted_at=1.7e9 + s * 60.0 + t, price_profile="gpt-4.1", cache_outcome="memory",
                                prompt_tokens=400 + t, cached_tokens=380, prefilled_tokens=20 + t,
                                generated_tokens=reply_words, ttft_ms=100.0 + (t % 50), decode_ms=2000.0,
                                total_ms=2100.0, stop_reason="eos", cost_input_usd=0.0001, cost_output_usd=0.0004)
                store.record_turn(sid, f"Question {t} of session {s}: what does the cache save here?", reply, m)
    return time.perf_counter() - t0


TURN_STEP = re.compile(r"^(SCAN|SEARCH) (t|f|c|turns)\b")
"""A plan step reading the turns table (the aliases the listing's SQL gives it)."""


def plans(db: Path) -> list[tuple[str, list[str]]]:
    """(SQL, EXPLAIN QUERY PLAN steps) of every query the listing runs: the
    store's own SQL (`listing.session_infos`, as `SessionStore.sessions` calls
    it), recorded while it runs against the database."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    ran: list[tuple[str, tuple]] = []

    def query(sql: str, params: tuple) -> list[tuple]:
        ran.append((sql, params))
        return conn.execute(sql, params).fetchall()

    listing.session_infos(query, True, "", ())
    found = [(sql, [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]) for sql, params in ran]
    conn.close()
    return found


def plan_failures(sql: str, steps: list[str]) -> list[str]:
    """What is wrong with one query's plan: the figures over every turn must come
    from the covering index `turns_summary`, and no query may scan turn rows."""
    turn_steps = [step for step in steps if TURN_STEP.match(step)]
    failures = [f"a listing query scans the turn rows: {step}" for step in turn_steps if "INDEX" not in step]
    figures = "COUNT(t.id)" in sql or "t.ttft_ms" in sql
    if figures and not all("COVERING INDEX turns_summary" in step for step in turn_steps):
        failures.append(f"a figures query reads the turn rows: {' | '.join(steps)}")
    return failures


def in_process(argv: list[str]) -> float:
    sink = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        status = chatterm_main(argv)
    elapsed = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"chatterm {' '.join(argv)} exited {status}: {sink.getvalue()[-500:]}")
    return elapsed


def as_subprocess(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of `python -m chatterm ARGV`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "chatterm", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"chatterm {' '.join(argv)} exited {proc.returncode}")
    return elapsed, usage.ru_maxrss / 1024.0


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--reply-words", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    opts = parser.parse_args(args)

    with tempfile.TemporaryDirectory(prefix="chatterm-store-load-") as tmp:
        tmp_path = Path(tmp)
        db, out = tmp_path / "chatterm.db", tmp_path / "all.jsonl"
        env = {**os.environ, "PYTHONPATH": str(REPO), "CHATTERM_CONFIG_DIR": str(tmp_path / "config"),
               "CHATTERM_DATA_DIR": str(tmp_path / "data"), "CHATTERM_CACHE_DIR": str(tmp_path / "cache")}
        os.environ.update({k: env[k] for k in ("CHATTERM_CONFIG_DIR", "CHATTERM_DATA_DIR", "CHATTERM_CACHE_DIR")})
        build_s = build(db, opts.sessions, opts.turns, opts.reply_words)
        db_mb = db.stat().st_size / 1e6
        commands = {
            "sessions": ["--db", str(db), "sessions"],
            "export --all": ["--db", str(db), "export", "--all", "-o", str(out)],
            "export --all csv": ["--db", str(db), "export", "--all", "-o", str(out.with_suffix(".csv"))],
        }
        results: dict[str, dict[str, float]] = {}
        for name, argv in commands.items():
            inproc = [in_process(argv) for _ in range(opts.runs)]
            sub = [as_subprocess(argv, env) for _ in range(opts.runs)]
            results[name] = {"in_process_s": statistics.median(inproc),
                             "subprocess_s": statistics.median(s for s, _ in sub),
                             "peak_rss_mib": max(rss for _, rss in sub)}
        exported = sum(1 for _ in out.open("rb"))
        out_mb = out.stat().st_size / 1e6
        query_plans = plans(db)

    calib = calibration_ms()
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores); calibration sum(range(10**6)) = {calib:.1f} ms")
    print(f"built {opts.sessions:,} sessions / {opts.turns:,} turns ({opts.reply_words}-word replies) in "
          f"{build_s:.1f} s; database {db_mb:.0f} MB; JSONL export {out_mb:.0f} MB, {exported:,} rows")
    failures = []
    for name, figures in results.items():
        ok = figures["subprocess_s"] <= TARGET_S
        print(f"chatterm {name:<17} in process {figures['in_process_s']:.2f} s · as a command "
              f"{figures['subprocess_s']:.2f} s, peak RSS {figures['peak_rss_mib']:.0f} MiB "
              f"(target <= {TARGET_S:.1f} s) {'ok' if ok else 'MISS'}")
        if not ok:
            failures.append(f"{name} took {figures['subprocess_s']:.2f} s")
    for sql, steps in query_plans:
        print(f"plan of {sql[:60]}…: {' | '.join(steps)}")
        failures += plan_failures(sql, steps)
    if exported != opts.turns:
        failures.append(f"the export holds {exported} of {opts.turns} turns")
    return finish(failures, opts.json, {
        "cpu": cpu_name(), "cores": os.cpu_count(), "calibration_ms": calib, "sessions": opts.sessions,
        "turns": opts.turns, "reply_words": opts.reply_words, "build_s": build_s, "db_mb": db_mb,
        "export_mb": out_mb, "runs": opts.runs, "results": results,
        "plans": [" | ".join(steps) for _, steps in query_plans],
        "target_s": TARGET_S,
    })


if __name__ == "__main__":
    sys.exit(main())
